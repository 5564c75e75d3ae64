"""Transports move messages between sites and the coordinator; they know no protocol."""

from __future__ import annotations

import os
from typing import Any

from labfbo.coordinator import Coordinator
from labfbo.core.exceptions import ConfigurationError
from labfbo.transport.local import LocalTransport

_WHAT = ("give a labfbo.Coordinator, an http(s):// URL with token=, a flower://HOST:PORT bridge address with "
         "token=, or labfbo.transport.mpi.MPICoordinator()")


def require_coordinator(
    protocol: str,
    federated: bool,
    coordinator: Any,
    how: str = "coordinator=labfbo.Coordinator(...)",
    alone: str = "protocol='independent'",
) -> None:
    """Refuse a federated protocol without a coordinator (``how``: how to give one)."""
    if coordinator is None and federated:
        raise ConfigurationError(f"protocol {protocol!r} is federated and needs a coordinator ({how}); "
                                 f"use {alone} to run alone")


def connect(coordinator: Any, site: str, federated: bool, protocol: str, token: str | None = None,
            verify: bool | str | os.PathLike[str] = True) -> Any:
    """The site's link to ``coordinator`` (None: a non-federated site without one); ``verify``: an HTTPS
    coordinator's certificate check (a CA bundle's path, e.g. the consortium's own CA; False: none)."""
    if isinstance(coordinator, str) and coordinator.startswith(("http://", "https://")):
        from labfbo.transport.http import HTTPCoordinator

        coordinator = HTTPCoordinator(coordinator, token or "", verify=verify)
    elif verify is not True and coordinator is not None:
        raise ConfigurationError("verify= applies to an https:// coordinator given by its url; pass it to "
                                 "HTTPCoordinator(url, token, verify=...) when you build the link yourself")
    elif isinstance(coordinator, str) and coordinator.startswith("flower://"):
        from labfbo.transport.flower import FlowerCoordinator

        coordinator = FlowerCoordinator(coordinator, token or "")
    require_coordinator(protocol, federated, coordinator)
    if coordinator is None:
        return None
    if isinstance(coordinator, Coordinator):  # in-process
        return LocalTransport.of(coordinator).link(site)
    if not hasattr(coordinator, "connect"):
        raise ConfigurationError(f"coordinator {coordinator!r}: {_WHAT}")
    return coordinator.connect(site)
