"""The transport interface: it moves messages and knows nothing of protocols.

A site sees the coordinator through a :class:`SiteLink`; it registers a handler (a
callable from request JSON to response JSON that answers from the site's local data) and
asks for its guidance of round ``t``. Messages cross as JSON text so every transport —
in-process included — passes exactly the bytes a network would.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

from labfbo.messages import JoinReply, JoinRequest

Handler = Callable[[str], str]
"""Site-side request handler: request JSON -> response JSON."""


class SiteLink(ABC):
    """A site's connection to its coordinator."""

    site: str

    @abstractmethod
    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        """Join the study and register the handler that answers coordinator requests."""

    @abstractmethod
    def guidance(self, round: int, timeout: float | None = None) -> str:
        """The JSON of this site's reply for BO round ``round`` (waits for the round)."""

    def close(self) -> None:
        """Leave (the site may rejoin later)."""
