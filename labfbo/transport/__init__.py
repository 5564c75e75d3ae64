"""Transports move messages between sites and the coordinator; they know no protocol."""

from __future__ import annotations

from typing import Any

from labfbo.exceptions import ConfigurationError

_WHAT = "give a labfbo.Coordinator, an http(s):// URL with token=, or labfbo.transport.mpi.MPICoordinator()"


def connect(coordinator: Any, site: str, federated: bool, protocol: str, token: str | None = None) -> Any:
    """The site's link to ``coordinator`` (None: a non-federated site without one)."""
    if isinstance(coordinator, str) and coordinator.startswith(("http://", "https://")):
        from labfbo.transport.http import HTTPCoordinator

        coordinator = HTTPCoordinator(coordinator, token or "")
    if coordinator is None:
        if not federated:
            return None
        raise ConfigurationError(f"protocol {protocol!r} is federated and needs a coordinator "
                                 "(coordinator=labfbo.Coordinator(...)); use protocol='independent' to run alone")
    if not hasattr(coordinator, "connect"):
        raise ConfigurationError(f"coordinator {coordinator!r}: {_WHAT}")
    return coordinator.connect(site)
