"""The operator's routes, behind the admin token: the study's status, and a site's token rotated
without a restart (the dashboard's page is :mod:`labfbo.server.dashboard`)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, HTTPException, Request

from labfbo.core.exceptions import LabFBOError
from labfbo.server.config import new_token
from labfbo.server.params import server_of
from labfbo.server.schema import Rotated, Status, TokenRotation, answers


async def admin_auth(request: Request) -> None:
    """401 unless the request carries the admin token (a dependency: checked before the body is read)."""
    server_of(request).authenticate_admin(request)


router = APIRouter(dependencies=[Depends(admin_auth)])


@router.get("/v1/admin/status", response_model=Status, responses=answers(401))
def status(request: Request) -> Status:
    server = server_of(request)
    waiting = server.engine.waiting()
    with server.engine.cv:  # the round thread changes these
        coord = server.coordinator
        return Status(study=server.config.study, protocol=server.config.protocol, members=sorted(coord.members),
                      rounds_done=sorted(server.engine.published & set(coord.rounds)),
                      round_errors=dict(server.engine.errors), waiting_for=waiting,
                      local_constraints=dict(coord.local_constraints), privacy=dict(coord.privacy),
                      cpu_seconds=time.process_time())


@router.post("/v1/admin/sites/{site}/token", response_model=Rotated, responses=answers(401, 404))
def rotate(site: str, body: TokenRotation, request: Request) -> Rotated:
    server = server_of(request)
    token, digest = (None, body.token_sha256) if body.token_sha256 else new_token()
    try:
        server.tokens.rotate(site, digest)  # type: ignore[arg-type]
    except LabFBOError as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    server.store.set_token(site, digest, server.config.token_digests()[site])  # type: ignore[arg-type]
    return Rotated(site=site, token=token)
