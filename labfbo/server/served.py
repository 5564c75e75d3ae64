"""What the dashboard reads of a coordinator server (a structural type: the server module is
not imported here, so the dashboard and the server do not import each other)."""

from __future__ import annotations

from typing import Protocol

from labfbo.coordinator import Coordinator
from labfbo.server.config import ServerConfig, TokenBook
from labfbo.server.engine import RoundEngine


class Served(Protocol):
    """A running coordinator server: its configuration, tokens, coordinator and round engine."""

    config: ServerConfig
    tokens: TokenBook
    coordinator: Coordinator
    engine: RoundEngine
