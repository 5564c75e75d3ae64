"""ASGI guard around the routes: body-size limit (413) and the audit log entry of every request.

A pure ASGI wrapper (not ``BaseHTTPMiddleware``): it reads the body once, refuses it as
soon as it exceeds the limit, and replays it to the routes.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

from labfbo.server.store import AuditLog

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Guard:
    def __init__(self, app: Any, max_body_bytes: int, audit: AuditLog) -> None:
        self.app, self.max_body_bytes, self.audit = app, max_body_bytes, audit

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
        query = parse_qs(scope.get("query_string", b"").decode())
        rnd = query.get("round", [None])[0]
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(send, 413, f"body over {self.max_body_bytes} bytes")
            self.audit.write(None, route, None, b"", 413)
            return
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._refuse(send, 413, f"body over {self.max_body_bytes} bytes")
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
            r = state.get("round", rnd)
            self.audit.write(state.get("site"), route, int(r) if r not in (None, "") and str(r).isdigit() else None,
                             body, status)
