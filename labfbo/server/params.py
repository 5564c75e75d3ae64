"""The parameters of the routes a site calls every round, read by the routes themselves.

FastAPI validates the parameters a route declares in its signature on every request, and
its per-request type introspection costs the coordinator more than the rest of a poll. The
three routes every site calls every round (``GET .../work``, ``POST .../want``, ``POST
.../answers/{seq}``) read theirs with a :class:`Param` instead — the same bounds, the same
422 for a value out of them — and declare them to the OpenAPI schema as written here
(:func:`declared`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import HTTPException, Request

_INT = re.compile(r"-?[0-9]{1,20}")
_NUMBER = re.compile(r"-?[0-9]{1,20}(\.[0-9]{0,20})?([eE][-+]?[0-9]{1,3})?")


@dataclass(frozen=True)
class Param:
    """One path or query parameter: its name, type and inclusive bounds."""

    name: str
    where: Literal["path", "query"]
    kind: type = str  # int, float or str
    lo: float | None = None
    hi: float | None = None
    description: str = ""

    def spec(self) -> dict[str, Any]:
        """Its OpenAPI parameter object."""
        schema: dict[str, Any] = {"type": {int: "integer", float: "number"}.get(self.kind, "string")}
        if self.lo is not None:
            schema["minimum"] = self.lo
        if self.hi is not None:
            schema["maximum"] = self.hi
        out = {"name": self.name, "in": self.where, "required": self.where == "path", "schema": schema}
        return {**out, "description": self.description} if self.description else out

    def read(self, request: Request) -> Any:
        """Its value in ``request`` (None: a query parameter not given); 422 if malformed or out of bounds."""
        raw = (request.path_params if self.where == "path" else request.query_params).get(self.name)
        if raw is None or self.kind is str:
            return raw
        pattern, what = (_INT, "an integer") if self.kind is int else (_NUMBER, "a number")
        if not pattern.fullmatch(raw):
            raise HTTPException(422, f"{self.name}: {raw[:40]!r} is not {what}")
        value = self.kind(raw)
        if not math.isfinite(value) or (self.lo is not None and value < self.lo) or (
                self.hi is not None and value > self.hi):
            raise HTTPException(422, f"{self.name} must be within [{self.lo}, {self.hi}], not {raw[:40]}")
        return value


def declared(*params: Param) -> dict[str, Any]:
    """The ``openapi_extra`` of a route that reads ``params`` itself."""
    return {"parameters": [p.spec() for p in params]}


SITE = Param("site", "path", description="the site's name (its token's)")
ROUND_PATH = Param("round", "path", int, 0, 10**9)
SEQ = Param("seq", "path", int, 0, 2**53)
ROUND = Param("round", "query", int, 0, 10**9, "the round whose guidance the site waits for (asking for it "
              "starts the round)")
WAIT = Param("wait", "query", float, 0.0, 30.0, "seconds to long-poll for work (the server caps it at poll_wait_max)")


def server_of(request: Request) -> Any:
    """The :class:`~labfbo.server.app.CoordinatorServer` whose app serves ``request``."""
    return request.app.state.server
