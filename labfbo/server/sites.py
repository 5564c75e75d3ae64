"""The routes a site calls: join, poll for work, ask for a round, answer an exchange, leave.

Each route reads the server it belongs to off its request (:func:`~labfbo.server.params.server_of`)
and authenticates the site's bearer token itself (:meth:`CoordinatorServer.authenticate`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from labfbo.server.engine import Conflict
from labfbo.server.params import ROUND, ROUND_PATH, SEQ, SITE, WAIT, declared, server_of
from labfbo.server.payload import read_document, read_message
from labfbo.server.schema import FAILURE, FRAME, MESSAGE, Accepted, Envelope, Work, answers, body_doc, json_response

router = APIRouter()


@router.post("/v1/join", response_model=Envelope, openapi_extra=body_doc(MESSAGE), responses=answers(401, 403, 409))
async def join(request: Request) -> Envelope:
    server = server_of(request)
    site = server.authenticate(request)
    # parsing and checking a space is CPU work: off the event loop, so that a big join
    # never holds up the other sites' requests
    return await run_in_threadpool(server.join, await request.body(), site)


@router.get("/v1/sites/{site}/work", response_model=Work, responses={**answers(401, 403, 409), **FRAME},
            openapi_extra=declared(SITE, ROUND, WAIT))
async def work(request: Request) -> Any:
    server = server_of(request)
    me, site, round, wait = server.authenticate(request), SITE.read(request), ROUND.read(request), WAIT.read(request)
    server.own(me, site)
    server.member(site)
    request.state.round = round
    return await server.next_work(request, site, round, wait or 0.0)


@router.post("/v1/sites/{site}/rounds/{round}/want", status_code=202, response_model=None,
             responses={**answers(401, 403, 409), 202: {"model": Accepted, "description": "without wait"},
                        200: {"model": Work, "description": "with wait: the site's work, as GET .../work",
                              "content": FRAME[200]["content"]}},
             openapi_extra=declared(SITE, ROUND_PATH, WAIT))
async def want(request: Request) -> Any:
    server = server_of(request)
    me, site, round, wait = (server.authenticate(request), SITE.read(request), ROUND_PATH.read(request),
                             WAIT.read(request))
    server.own(me, site)
    server.member(site)
    request.state.round = round
    try:  # a few dict updates under the engine's lock: on the event loop, no worker-thread hop
        server.engine.want(round, site)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    if wait is None:
        return json_response(Accepted(accepted=True), 202)
    return await server.next_work(request, site, round, wait)


@router.post("/v1/sites/{site}/leave", response_model=Accepted, responses=answers(401, 403))
def leave(site: str, request: Request) -> Accepted:
    server = server_of(request)
    server.own(server.authenticate(request), site)
    server.engine.leave(site)
    server.store.add_leave(site)
    return Accepted(accepted=True)


@router.post("/v1/sites/{site}/answers/{seq}", response_model=None,
             openapi_extra={**body_doc(MESSAGE, FAILURE), **declared(SITE, SEQ, ROUND, WAIT)},
             responses={**answers(401, 403, 409),
                        200: {"model": Accepted | Work, "description": "without wait: accepted; with wait: the "
                              "site's next work, as GET .../work", "content": FRAME[200]["content"]}})
async def answer(request: Request) -> Any:
    server = server_of(request)
    me = server.authenticate(request)
    site, seq, round, wait = SITE.read(request), SEQ.read(request), ROUND.read(request), WAIT.read(request)
    server.own(me, site)
    body = await request.body()
    report = read_document(body)
    if isinstance(report, dict) and "error" in report and "kind" not in report:  # the site failed
        try:
            server.engine.fail(site, seq, f"{report.get('error')}: {report.get('message', '')}")
        except Conflict as exc:
            raise HTTPException(409, str(exc)) from None
        new = True
    else:
        msg = read_message(report, server.config.max_array_items)
        try:  # accounting a private release (PLD) is CPU work: off the event loop
            new = (server.engine.submit(site, seq, body, msg) if server.coordinator.admits_lightly(site)
                   else await run_in_threadpool(server.engine.submit, site, seq, body, msg))
        except Conflict as exc:
            raise HTTPException(409, str(exc)) from None
    if wait is None:
        return json_response(Accepted(accepted=True, repeat=not new))
    request.state.round = round
    return await server.next_work(request, site, round, wait)
