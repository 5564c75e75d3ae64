"""Schemathesis against the coordinator's OpenAPI schema, with valid tokens: no input makes it
answer 5xx, and every answer (status, content type, body) is one the schema lists."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration  # schemathesis against the server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

import labfbo  # noqa: E402
from labfbo.server.app import CoordinatorServer  # noqa: E402
from labfbo.server.config import ServerConfig, new_token  # noqa: E402

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
TOKEN, TOKEN_HASH = new_token()
ADMIN, ADMIN_HASH = new_token()
SERVER = CoordinatorServer(ServerConfig(
    protocol="distribution", sites={"a": TOKEN_HASH, "b": new_token()[1]}, admin_token_sha256=ADMIN_HASH,
    space=SPACE.model_dump(mode="json"), poll_wait_max=0.2, deadline=0.5, quorum=1,
    options={"M": 16, "candidates": 32, "num_restarts": 1, "raw_samples": 16}))
schema = schemathesis.openapi.from_asgi("/openapi.json", SERVER.app)


CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.content_type_conformance, schemathesis.checks.response_schema_conformance]


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gives_a_server_error_or_an_undocumented_answer(case) -> None:
    token = ADMIN if "/admin/" in case.path else TOKEN
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)


def test_the_schema_lists_every_refusal() -> None:
    paths = SERVER.fastapi.openapi()["paths"]
    join = paths["/v1/join"]["post"]["responses"]
    assert {"200", "401", "403", "408", "409", "413", "422", "503"} <= set(join)
    assert "HTTPValidationError" not in str(join["422"])  # our 422 body: {"detail": ...}
