"""Schemathesis against the coordinator's OpenAPI schema: no input makes it answer 5xx."""

from __future__ import annotations

import pytest

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


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gives_a_server_error(case) -> None:
    token = ADMIN if "/admin/" in case.path else TOKEN
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
