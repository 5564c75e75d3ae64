"""The coordinator server: FastAPI routes over the round engine (``labfbo coordinator serve``).

Routes (all under ``/v1``; bearer tokens in ``Authorization``):

* ``POST /v1/join`` — a site joins (its token must belong to the site it names).
* ``GET /v1/sites/{site}/work?round=t&wait=s`` — long-poll (≤ 30 s): a request to
  answer, the site's guidance of round ``t`` (asking for it starts the round), an error,
  or ``wait``. A client that sends ``Accept: application/x-labfbo-frame`` gets a request
  or guidance as a :mod:`labfbo.wire` frame (the body; type, seq and round in
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

import json
import math
import threading
import time
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler
from starlette.exceptions import HTTPException as StarletteHTTPException
from pydantic import BaseModel, Field

from labfbo import wire
from labfbo.exceptions import FederationError, LabFBOError, ProtocolError, ValidationError
from labfbo.messages import Array, JoinRequest, Message, PrivacyDeclaration, parse
from labfbo.names import check_site_name
from labfbo.server.config import ServerConfig, TokenBook, new_token
from labfbo.server.engine import Conflict, RoundEngine
from labfbo.server.params import ROUND, ROUND_PATH, SEQ, SITE, WAIT, declared
from labfbo.server.store import AuditLog, Store, persist_round, resume, tokens_in_force
from labfbo.server.throttle import AddressThrottle
from labfbo.space import MAX_PARAMS


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


def _answers(*codes: int) -> dict[int | str, dict[str, Any]]:
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


def check_payload(msg: Message, max_items: int) -> None:
    """Refuse NaN/inf anywhere and arrays over ``max_items`` (422)."""
    def walk(v: Any, where: str) -> None:
        if isinstance(v, Array):
            if v.n_scalars > max_items:
                raise ProtocolError(f"{where}: {v.n_scalars} items, the limit is {max_items}")
            a = v.numpy()
            if a.dtype.kind == "f" and not bool(__import__("numpy").isfinite(a).all()):
                raise ProtocolError(f"{where}: NaN or infinite values")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ProtocolError(f"{where}: NaN or infinite value")
        elif isinstance(v, BaseModel):
            for k in type(v).model_fields:
                walk(getattr(v, k), f"{where}.{k}")
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}.{k}")
    walk(msg, msg.kind)


def _reject_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in labfbo messages")


def read_json(body: bytes) -> Any:
    """The JSON of a request body (422 for invalid JSON, NaN/inf, anything but UTF-8, too deep)."""
    try:  # json.loads would also accept UTF-16/32 bytes; the protocol is UTF-8 (RFC 8259)
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        return json.loads(text, parse_constant=_reject_constants)
    except ValueError as exc:  # covers UnicodeDecodeError
        raise HTTPException(422, str(exc)) from None
    except RecursionError:
        raise HTTPException(422, "message nested too deeply") from None


def read_document(body: bytes) -> Any:
    """The JSON document of a request body: a wire frame's (422 if damaged or not an object) or
    the JSON's (:func:`read_json`)."""
    if not wire.is_frame(body):
        return read_json(body)
    try:
        data = wire.unpack(body)
    except ProtocolError as exc:
        raise HTTPException(422, str(exc)) from None
    if not isinstance(data, dict):
        raise HTTPException(422, "not a labfbo message (a frame's header must be a JSON object)")
    return data


def read_message(body: bytes | Any, max_items: int) -> Message:
    """A checked message from a request body — a wire frame, JSON, or already-loaded JSON; 422
    if it is not one."""
    data = read_document(body) if isinstance(body, (bytes, str)) else body
    try:
        msg = parse(data)
        check_payload(msg, max_items)
    except (ValueError, ProtocolError, OverflowError) as exc:  # ValueError covers UnicodeDecodeError
        raise HTTPException(422, str(exc)) from None
    except RecursionError:
        raise HTTPException(422, "message nested too deeply") from None
    return msg


def settle_heap() -> None:
    """Leave the objects of a started server (its imports: PyTorch, BoTorch, pydantic's schemas —
    millions) out of Python's garbage collector: a full collection would walk them all again and
    again, a pause that requests pay for (:func:`gc.freeze`; they are never freed anyway)."""
    import gc

    gc.collect()
    gc.freeze()


def _json(model: BaseModel, status: int = 200) -> Response:
    """``model`` as a JSON response (no second validation: it is built by the server)."""
    return Response(content=model.model_dump_json(), status_code=status, media_type="application/json")


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

    async def site_auth(self, request: Request) -> str:  # async: a ``def`` dependency costs a thread hop
        return self.authenticate(request)

    async def admin_auth(self, request: Request) -> None:
        if not self.tokens.is_admin(self._token(request)):
            raise HTTPException(401, "admin token required", headers={"WWW-Authenticate": "Bearer"})
        request.state.site = "admin"

    @staticmethod
    def _own(site: str, route_site: str) -> None:
        if site != route_site:
            raise HTTPException(403, f"this token belongs to {site!r}, not {route_site!r}")

    def _member(self, site: str) -> None:
        if site not in self.coordinator.members:
            raise HTTPException(409, f"site {site!r} has not joined")

    async def _next_work(self, request: Request, site: str, round: int | None, wait: float) -> Any:
        """``site``'s work (:meth:`RoundEngine.apoll`): a frame for a client that accepts one, else :class:`Work`."""
        try:
            got = await self.engine.apoll(site, round, min(wait, self.config.poll_wait_max))
        except Conflict as exc:
            raise HTTPException(409, str(exc)) from None
        frame = got.get("message")
        if not isinstance(frame, bytes):
            return _json(Work(**got))
        if wire.MEDIA_TYPE in request.headers.get("accept", ""):
            head = {"X-Labfbo-Work": got["type"], "X-Labfbo-Round": str(got["round"]), "Vary": "Accept"}
            if got.get("seq") is not None:
                head["X-Labfbo-Seq"] = str(got["seq"])
            return Response(content=frame, media_type=wire.MEDIA_TYPE, headers=head)
        return _json(Work(**{**got, "message": parse(frame).model_dump_json()}))  # a JSON-only client

    # -- the app ------------------------------------------------------------------------------------
    def _build_app(self) -> Any:
        from labfbo.version import __version__
        from labfbo.server.guard import Guard

        # no /docs or /redoc: their pages load scripts from a CDN; the schema is at /openapi.json
        app = FastAPI(title="labfbo coordinator", version=__version__, docs_url=None, redoc_url=None,
                      description="Federated Bayesian optimization: the consortium's coordinator.")
        cfg = self.config

        @app.exception_handler(StarletteHTTPException)
        async def refusal(request: Request, exc: StarletteHTTPException) -> Any:
            if exc.status_code == 400:  # FastAPI's "error parsing the body": a malformed request is 422 here
                exc = StarletteHTTPException(422, exc.detail)
            return await http_exception_handler(request, exc)

        @app.get("/v1/health", responses=_answers())
        def health() -> dict[str, str]:
            return {"status": "ok", "study": cfg.study}

        def body_doc(*json: dict[str, Any]) -> dict[str, Any]:
            return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "anyOf": list(json),
                "description": "a labfbo message (see labfbo.messages): kind, version, round, ..."}},
                wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary", "minLength": 1,
                                             "description": "the same message as a labfbo.wire frame"}}}}}

        message = {"required": ["kind"], "properties": {"kind": {"type": "string", "minLength": 1}}}
        failure = {"required": ["error"], "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                   "description": "the site could not answer (its error's kind and text, for the operator)"}

        @app.post("/v1/join", response_model=Envelope, openapi_extra=body_doc(message),
                  responses=_answers(401, 403, 409))
        async def join(request: Request, site: str = Depends(self.site_auth)) -> Envelope:
            # parsing and checking a space is CPU work: off the event loop, so that a big join
            # never holds up the other sites' requests
            return await run_in_threadpool(self._join, await request.body(), site)

        frame_doc = {200: {"description": "with Accept: " + wire.MEDIA_TYPE + ", a request or guidance as a frame",
                           "content": {wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}}

        @app.get("/v1/sites/{site}/work", response_model=Work, responses={**_answers(401, 403, 409), **frame_doc},
                 openapi_extra=declared(SITE, ROUND, WAIT))
        async def work(request: Request) -> Any:
            me, site, round, wait = self.authenticate(request), SITE.read(request), ROUND.read(request), WAIT.read(request)
            self._own(me, site)
            self._member(site)
            request.state.round = round
            return await self._next_work(request, site, round, wait or 0.0)

        @app.post("/v1/sites/{site}/rounds/{round}/want", status_code=202, response_model=None,
                  responses={**_answers(401, 403, 409), 202: {"model": Accepted, "description": "without wait"},
                             200: {"model": Work, "description": "with wait: the site's work, as GET .../work",
                                   "content": frame_doc[200]["content"]}},
                  openapi_extra=declared(SITE, ROUND_PATH, WAIT))
        async def want(request: Request) -> Any:
            me, site, round, wait = (self.authenticate(request), SITE.read(request), ROUND_PATH.read(request),
                                     WAIT.read(request))
            self._own(me, site)
            self._member(site)
            request.state.round = round
            try:  # a few dict updates under the engine's lock: on the event loop, no worker-thread hop
                self.engine.want(round, site)
            except Conflict as exc:
                raise HTTPException(409, str(exc)) from None
            if wait is None:
                return _json(Accepted(accepted=True), 202)
            return await self._next_work(request, site, round, wait)

        @app.post("/v1/sites/{site}/leave", response_model=Accepted, responses=_answers(401, 403))
        def leave(site: str, me: str = Depends(self.site_auth)) -> Accepted:
            self._own(me, site)
            self.engine.leave(site)
            self.store.add_leave(site)
            return Accepted(accepted=True)

        @app.post("/v1/sites/{site}/answers/{seq}", response_model=None,
                  openapi_extra={**body_doc(message, failure), **declared(SITE, SEQ, ROUND, WAIT)},
                  responses={**_answers(401, 403, 409),
                             200: {"model": Accepted | Work, "description": "without wait: accepted; with wait: the "
                                   "site's next work, as GET .../work", "content": frame_doc[200]["content"]}})
        async def answer(request: Request) -> Any:
            me = self.authenticate(request)
            site, seq, round, wait = SITE.read(request), SEQ.read(request), ROUND.read(request), WAIT.read(request)
            self._own(me, site)
            body = await request.body()
            report = read_document(body)
            if isinstance(report, dict) and "error" in report and "kind" not in report:  # the site failed
                try:
                    self.engine.fail(site, seq, f"{report.get('error')}: {report.get('message', '')}")
                except Conflict as exc:
                    raise HTTPException(409, str(exc)) from None
                new = True
            else:
                msg = read_message(report, cfg.max_array_items)
                try:  # accounting a private release (PLD) is CPU work: off the event loop
                    new = (self.engine.submit(site, seq, body, msg) if self.coordinator.admits_lightly(site)
                           else await run_in_threadpool(self.engine.submit, site, seq, body, msg))
                except Conflict as exc:
                    raise HTTPException(409, str(exc)) from None
            if wait is None:
                return _json(Accepted(accepted=True, repeat=not new))
            request.state.round = round
            return await self._next_work(request, site, round, wait)

        @app.get("/v1/admin/status", response_model=Status, dependencies=[Depends(self.admin_auth)],
                 responses=_answers(401))
        def status() -> Status:
            waiting = self.engine.waiting()
            with self.engine.cv:  # the round thread changes these
                return Status(study=cfg.study, protocol=cfg.protocol, members=sorted(self.coordinator.members),
                              rounds_done=sorted(self.engine.published & set(self.coordinator.rounds)),
                              round_errors=dict(self.engine.errors), waiting_for=waiting,
                              local_constraints=dict(self.coordinator.local_constraints),
                              privacy=dict(self.coordinator.privacy), cpu_seconds=time.process_time())

        @app.post("/v1/admin/sites/{site}/token", response_model=Rotated, dependencies=[Depends(self.admin_auth)],
                  responses=_answers(401, 404))
        def rotate(site: str, body: TokenRotation) -> Rotated:
            token, digest = (None, body.token_sha256) if body.token_sha256 else new_token()
            try:
                self.tokens.rotate(site, digest)  # type: ignore[arg-type]
            except LabFBOError as exc:
                raise HTTPException(404, str(exc)) from None
            except ValueError as exc:
                raise HTTPException(422, str(exc)) from None
            self.store.set_token(site, digest, cfg.token_digests()[site])  # type: ignore[arg-type]
            return Rotated(site=site, token=token)

        from labfbo.server import dashboard

        self.dashboard = dashboard.Dashboard(self)  # GET /dashboard: the operator's page (a session cookie)
        self.dashboard.mount(app)
        self.fastapi = app  # the routes and their OpenAPI schema (``self.app`` adds the guard)
        return Guard(app, max_body_bytes=cfg.max_body_bytes, audit=self.audit, body_timeout=cfg.body_timeout,
                     route_limits={"/v1/join": cfg.max_join_bytes,
                                   **dict.fromkeys(dashboard.PATHS, dashboard.MAX_BODY)},
                     known_token=lambda t: self.tokens.site_of(t) is not None or self.tokens.is_admin(t),
                     own_auth=dashboard.PATHS, secret_bodies=dashboard.SECRET_BODIES, tokenless=self.tokenless)

    def _join(self, body: bytes, site: str) -> Envelope:
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
        self._own(site, msg.site)
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
