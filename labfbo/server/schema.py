"""What the coordinator's HTTP API answers, and the OpenAPI documentation its routes share."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Response
from pydantic import BaseModel, Field

from labfbo.core import wire
from labfbo.core.messages import PrivacyDeclaration


class Work(BaseModel):
    type: Literal["request", "guidance", "error", "wait"]
    seq: int | None = None
    round: int | None = None
    message: str | None = None  # the message's exact JSON text


class Problem(BaseModel):
    """Every refusal: a sentence, or (a request that does not match the schema) FastAPI's list."""

    detail: str | list[dict[str, Any]]


_WHY = {401: "missing or unknown bearer token", 403: "the token belongs to another site",
        404: "no such site", 408: "the body took longer than body_timeout to arrive",
        409: "refused by the study or the round clock (the detail says why)",
        413: "body over max_body_bytes (a join: max_join_bytes)", 422: "malformed request or message"}


def answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route: its refusals, plus 408/413/422 (any body) and 503."""
    out: dict[int | str, dict[str, Any]] = {c: {"model": Problem, "description": _WHY[c]}
                                            for c in sorted({*codes, 408, 413, 422})}
    out[503] = {"description": "over max_connections (plain text)", "content": {"text/plain": {}}}
    out[429] = {"model": Problem, "description": "too many requests without a known token from this address"}
    return out


class Envelope(BaseModel):
    message: str


class Accepted(BaseModel):
    accepted: bool
    repeat: bool = False


class TokenRotation(BaseModel):
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="the new token's SHA-256 (hex); "
                                     "without it the server generates a token")


class Rotated(BaseModel):
    site: str
    token: str | None = None  # only when the server generated it


class Status(BaseModel):
    study: str
    protocol: str
    members: list[str]
    rounds_done: list[int]
    round_errors: dict[int, str]
    waiting_for: dict[str, list[str]] = {}  # open exchange "round/seq" -> sites that have not answered
    local_constraints: dict[str, list[str]] = {}  # each site's own nonlinear constraints, by name only
    privacy: dict[str, PrivacyDeclaration | None] = {}  # each site's DP budget and delta as it declared them
    cpu_seconds: float = Field(0.0, description="the server process's CPU time so far (user + system, seconds)")




def body_doc(*json: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI request body of a route that takes a message: JSON of one of ``json``, or a frame."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "anyOf": list(json),
        "description": "a labfbo message (see labfbo.core.messages): kind, version, round, ..."}},
        wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary", "minLength": 1,
                                     "description": "the same message as a labfbo.core.wire frame"}}}}}


MESSAGE = {"required": ["kind"], "properties": {"kind": {"type": "string", "minLength": 1}}}
FAILURE = {"required": ["error"], "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
           "description": "the site could not answer (its error's kind and text, for the operator)"}
FRAME = {200: {"description": "with Accept: " + wire.MEDIA_TYPE + ", a request or guidance as a frame",
               "content": {wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}}


def json_response(model: BaseModel, status: int = 200) -> Response:
    """``model`` as a JSON response (no second validation: it is built by the server)."""
    return Response(content=model.model_dump_json(), status_code=status, media_type="application/json")
