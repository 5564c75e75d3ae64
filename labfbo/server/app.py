"""The coordinator server: FastAPI routes over the round engine (``labfbo coordinator serve``).

Routes (all under ``/v1``; bearer tokens in ``Authorization``):

* ``POST /v1/join`` — a site joins (its token must belong to the site it names).
* ``GET /v1/sites/{site}/work?round=t&wait=s`` — long-poll (≤ 30 s): a request to
  answer, the site's guidance of round ``t`` (asking for it starts the round), an error,
  or ``wait``. A client that sends ``Accept: application/x-labfbo-frame`` gets a request
  or guidance as a :mod:`labfbo.core.wire` frame (the body; type, seq and round in
  ``X-Labfbo-*`` headers); others get the JSON envelope.
* ``POST /v1/sites/{site}/rounds/{t}/want`` — the site needs round ``t`` (202); with
  ``?wait=s`` also a long poll, answered as ``GET .../work`` (200).
* ``POST /v1/sites/{site}/answers/{seq}`` — the site's answer to exchange ``seq`` (a frame
  with that content type, or JSON); idempotent on an identical body, 409 on a different
  one or a closed exchange. With ``?round=t&wait=s`` the reply is the site's next work, as
  ``GET .../work`` (a round of one exchange: two requests per site).
* ``GET /v1/health``; ``GET /v1/admin/status`` and ``POST /v1/admin/sites/{site}/token``
  (rotate a site's token without a restart) with the admin token.
* ``GET /dashboard``: the operator's live page (admin token, session cookie;
  :mod:`labfbo.server.dashboard`).

401: missing or unknown token. 403: the token's site is not the route's site. 413: body
over ``max_body_bytes``. 422: malformed message, NaN/inf, or arrays over
``max_array_items``. Every request is written to the audit log (never tokens or
payloads).
"""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exception_handlers import http_exception_handler
from starlette.exceptions import HTTPException as StarletteHTTPException

from labfbo.core import wire
from labfbo.core.exceptions import FederationError, LabFBOError, ValidationError
from labfbo.core.messages import JoinRequest, parse
from labfbo.core.names import check_site_name
from labfbo.server import admin, sites
from labfbo.server.config import ServerConfig, TokenBook
from labfbo.server.engine import Conflict, RoundEngine
from labfbo.server.payload import check_payload, read_document, read_message  # noqa: F401 - re-exported
from labfbo.server.schema import Envelope, Work, answers, json_response
from labfbo.server.store import AuditLog, Store, persist_round, resume, tokens_in_force
from labfbo.server.throttle import AddressThrottle
from labfbo.space.search import MAX_PARAMS


def settle_heap() -> None:
    """Leave the objects of a started server (its imports: PyTorch, BoTorch, pydantic's schemas —
    millions) out of Python's garbage collector: a full collection would walk them all again and
    again, a pause that requests pay for (:func:`gc.freeze`; they are never freed anyway)."""
    import gc

    gc.collect()
    gc.freeze()


async def _refusal(request: Request, exc: StarletteHTTPException) -> Response:
    """FastAPI's refusals, with "error parsing the body" (400) as 422: a malformed request is 422 here."""
    if exc.status_code == 400:
        exc = StarletteHTTPException(422, exc.detail)
    return await http_exception_handler(request, exc)


class CoordinatorServer:
    """The coordinator, its round engine, durable state, tokens and audit log."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        digests = config.token_digests()
        self.coordinator = config.coordinator()
        self.store = Store(config.state)
        self.audit = AuditLog(config.audit_log, config.audit_retention_days,
                              max_bytes=int(config.audit_max_mb * 2**20))
        # an address refused for a missing or unknown token this often in a minute is shut out for the rest of it
        self.tokenless = AddressThrottle(limit=config.tokenless_per_minute, window=60.0)
        self.tokens = TokenBook(tokens_in_force(self.store, digests), config.admin_token_sha256)
        try:
            gone = resume(self.coordinator, self.store)  # a restarted coordinator: same members, rounds, budgets
        except BaseException:
            self.store.close()
            raise
        self.engine = RoundEngine(self.coordinator, on_round=self._persist_round)
        self.engine.gone.update(gone)  # a site that had left is not waited for
        self.app = self._build_app()

    def _persist_round(self, t: int) -> None:
        persist_round(self.coordinator, self.store, t, self.config.retention_rounds)

    # -- auth -------------------------------------------------------------------------------------
    def _token(self, request: Request) -> str:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        return auth[7:].strip()

    def authenticate(self, request: Request) -> str:
        """The site of the request's bearer token (401 if none). The routes a site polls call it
        themselves rather than declare it a dependency: FastAPI's dependency solving costs each
        request more than the check."""
        site = self.tokens.site_of(self._token(request))
        if site is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        request.state.site = site
        return site

    def authenticate_admin(self, request: Request) -> None:
        """401 unless the request's bearer token is the admin token."""
        if not self.tokens.is_admin(self._token(request)):
            raise HTTPException(401, "admin token required", headers={"WWW-Authenticate": "Bearer"})
        request.state.site = "admin"

    @staticmethod
    def own(site: str, route_site: str) -> None:
        """403 unless the token's site is the route's."""
        if site != route_site:
            raise HTTPException(403, f"this token belongs to {site!r}, not {route_site!r}")

    def member(self, site: str) -> None:
        """409 unless ``site`` has joined."""
        if site not in self.coordinator.members:
            raise HTTPException(409, f"site {site!r} has not joined")

    async def next_work(self, request: Request, site: str, round: int | None, wait: float) -> Any:
        """``site``'s work (:meth:`RoundEngine.apoll`): a frame for a client that accepts one, else :class:`Work`."""
        try:
            got = await self.engine.apoll(site, round, min(wait, self.config.poll_wait_max))
        except Conflict as exc:
            raise HTTPException(409, str(exc)) from None
        frame = got.get("message")
        if not isinstance(frame, bytes):
            return json_response(Work(**got))
        if wire.MEDIA_TYPE in request.headers.get("accept", ""):
            head = {"X-Labfbo-Work": got["type"], "X-Labfbo-Round": str(got["round"]), "Vary": "Accept"}
            if got.get("seq") is not None:
                head["X-Labfbo-Seq"] = str(got["seq"])
            return Response(content=frame, media_type=wire.MEDIA_TYPE, headers=head)
        return json_response(Work(**{**got, "message": parse(frame).model_dump_json()}))  # a JSON-only client

    # -- the app ------------------------------------------------------------------------------------
    def _build_app(self) -> Any:
        """The FastAPI app: health, the sites' routes (:mod:`~labfbo.server.sites`), the operator's
        (:mod:`~labfbo.server.admin`) and the dashboard, behind the :class:`~labfbo.server.guard.Guard`."""
        from labfbo.server import dashboard
        from labfbo.server.guard import Guard
        from labfbo.version import __version__

        # no /docs or /redoc: their pages load scripts from a CDN; the schema is at /openapi.json
        app = FastAPI(title="labfbo coordinator", version=__version__, docs_url=None, redoc_url=None,
                      description="Federated Bayesian optimization: the consortium's coordinator.")
        app.state.server = self  # what the routes read off their request (labfbo.server.params.server_of)
        app.add_exception_handler(StarletteHTTPException, _refusal)  # type: ignore[arg-type]
        study = self.config.study

        @app.get("/v1/health", responses=answers())
        def health() -> dict[str, str]:
            return {"status": "ok", "study": study}

        app.include_router(sites.router)
        app.include_router(admin.router)
        self.dashboard = dashboard.Dashboard(self)  # GET /dashboard: the operator's page (a session cookie)
        self.dashboard.mount(app)
        self.fastapi = app  # the routes and their OpenAPI schema (``self.app`` adds the guard)
        cfg = self.config
        return Guard(app, max_body_bytes=cfg.max_body_bytes, audit=self.audit, body_timeout=cfg.body_timeout,
                     route_limits={"/v1/join": cfg.max_join_bytes,
                                   **dict.fromkeys(dashboard.PATHS, dashboard.MAX_BODY)},
                     known_token=lambda t: self.tokens.site_of(t) is not None or self.tokens.is_admin(t),
                     own_auth=dashboard.PATHS, secret_bodies=dashboard.SECRET_BODIES, tokenless=self.tokenless)

    def join(self, body: bytes, site: str) -> Envelope:
        """A join (in a worker thread): its size is checked on the raw JSON, before any message
        or space is built from it."""
        data = read_document(body)
        space = data.get("space") if isinstance(data, dict) else None
        params = space.get("params") if isinstance(space, dict) else None
        limit = min(MAX_PARAMS, self.config.max_params)
        if isinstance(params, list) and len(params) > limit:
            raise HTTPException(422, f"the joining space has {len(params)} parameters (at most {limit}: max_params)")
        msg = read_message(data, self.config.max_array_items)
        if not isinstance(msg, JoinRequest):
            raise HTTPException(422, f"expected a join request, got {msg.kind!r}")
        try:  # the configuration's names follow the rule; a join names the site it is, by the same rule
            check_site_name(msg.site, "the joining site")
        except ValidationError as exc:
            raise HTTPException(422, str(exc)) from None
        self.own(site, msg.site)
        try:
            reply = self.engine.join(msg)
        except LabFBOError as exc:
            raise HTTPException(409, str(exc)) from None
        except ValueError as exc:  # e.g. a search space that does not validate
            raise HTTPException(422, str(exc)) from None
        self.store.add_join(msg.site, msg.model_dump_json())
        return Envelope(message=reply.model_dump_json())

    def uvicorn_limits(self) -> dict[str, Any]:
        """The operator's connection limits, as uvicorn settings."""
        from labfbo.server.connections import limited

        cfg = self.config
        return {"limit_concurrency": cfg.max_connections, "timeout_keep_alive": cfg.keep_alive,
                "http": limited(cfg.header_timeout, cfg.max_connections_per_address, self.tokenless)}

    def close(self) -> None:
        self.engine.stop()
        self.store.close()
        self.audit.close()


class ServerThread:
    """Run a :class:`CoordinatorServer` with uvicorn in a thread (tests, ``simulate``)."""

    def __init__(self, server: CoordinatorServer, host: str = "127.0.0.1", port: int = 0, **uvicorn_kw: Any) -> None:
        import uvicorn

        self.server = server
        self.uv = uvicorn.Server(uvicorn.Config(server.app, host=host, port=port, log_level="warning",
                                                lifespan="off", **{**server.uvicorn_limits(), **uvicorn_kw}))
        self.thread = threading.Thread(target=self.uv.run, name="labfbo-coordinator", daemon=True)

    def __enter__(self) -> "ServerThread":
        import time

        self.thread.start()
        for _ in range(1000):
            if self.uv.started:
                break
            time.sleep(0.01)
        else:
            raise FederationError("the coordinator server did not start")
        return self

    @property
    def url(self) -> str:
        host, port = self.uv.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc: Any) -> None:
        self.server.engine.stop()
        self.uv.should_exit = True
        self.thread.join(timeout=10)
        self.server.store.close()
        self.server.audit.close()
