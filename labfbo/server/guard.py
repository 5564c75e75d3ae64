"""ASGI guard around the routes: token, body-size and body-time limits, and the audit log.

A pure ASGI wrapper (not ``BaseHTTPMiddleware``). Before reading a body it refuses a
request without a known bearer token (401; the routes then check which site it is; an
address refused so too often is refused 429, unaudited, :mod:`labfbo.server.throttle`) and
one whose ``Content-Length`` is over the limit (413); while reading, a body that grows
over the limit (413) or whose next part takes longer than ``body_timeout`` seconds
(408). It reads the body once and replays it to the routes.

The dashboard's paths (``own_auth``) check their own session cookie instead of a bearer
token; its login body (``secret_bodies``, the admin token) is audited without a trace:
no digest, no size.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

from labfbo.server.store import AuditLog
from labfbo.server.throttle import AddressThrottle

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Guard:
    OPEN = ("/v1/health", "/openapi.json")  # no token needed

    def __init__(self, app: Any, max_body_bytes: int, audit: AuditLog, known_token: Callable[[str], bool],
                 body_timeout: float = 30.0, route_limits: dict[str, int] | None = None,
                 own_auth: frozenset[str] = frozenset(), secret_bodies: frozenset[str] = frozenset(),
                 tokenless: AddressThrottle | None = None) -> None:
        self.app, self.max_body_bytes, self.audit = app, max_body_bytes, audit
        self.known_token, self.body_timeout = known_token, body_timeout
        self.route_limits = route_limits or {}  # path -> a tighter body limit
        self.own_auth = own_auth            # paths that check their own credentials (the dashboard's cookie)
        self.secret_bodies = secret_bodies  # paths whose body is never audited, not even its digest or size
        self.tokenless = tokenless          # refusals for a missing or unknown token, per client address

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        return auth[:7].lower() == "bearer " and self.known_token(auth[7:].strip())

    async def _refuse(self, send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        route = f"{scope['method']} {scope['path']}"
        headers = dict(scope.get("headers", []))
        path = scope["path"]
        if path not in self.OPEN and path not in self.own_auth and not self._authorized(headers):  # before any body
            address = str((scope.get("client") or ("?",))[0])
            if self.tokenless is not None and self.tokenless.blocked(address):
                await self._refuse(send, 429, "too many requests without a known token from this address")
                return  # its connections are refused before parsing from now on: one audit line per refusal was enough
            await self._refuse(send, 401, "missing or unknown bearer token")
            self.audit.write(None, route, None, b"", 401)
            if self.tokenless is not None:
                self.tokenless.refuse(address)
            return
        limit = min(self.max_body_bytes, self.route_limits.get(scope["path"], self.max_body_bytes))
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, 413, f"body over {limit} bytes")
            self.audit.write(None, route, None, b"", 413)
            return
        # a request that declares no body (a poll, a want) has none to wait for: no timer, no read
        bodiless = declared == b"0" or (declared is None and b"transfer-encoding" not in headers)
        chunks, size, more = [], 0, not bodiless
        while more:
            try:
                async with asyncio.timeout(self.body_timeout):  # not wait_for: no task per body part
                    msg = await receive()
            except TimeoutError:
                await self._refuse(send, 408, f"the body took over {self.body_timeout:g} s to arrive")
                self.audit.write(None, route, None, b"", 408)
                return
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(send, 413, f"body over {limit} bytes")
                self.audit.write(None, route, None, b"", 413)
                return
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        status = 500

        async def capture(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, replay, capture)
        finally:
            r = state["round"] if "round" in state else parse_qs(scope.get("query_string", b"").decode()).get(
                "round", [None])[0]  # the routes a site polls set it; others: the query's
            self.audit.write(state.get("site"), route, int(r) if r not in (None, "") and str(r).isdigit() else None,
                             b"" if path in self.secret_bodies else body, status)
