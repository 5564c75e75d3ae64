"""The transport interface: it moves messages and knows nothing of protocols.

A site sees the coordinator through a :class:`SiteLink`; it registers a handler (a
callable from a request's bytes to its answer's bytes that answers from the site's local
data) and asks for its guidance of round ``t``. Messages cross as :mod:`labfbo.core.wire`
frames (a JSON header, the arrays as raw bytes) so every transport — in-process included —
passes exactly the bytes a network would.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

from labfbo.core.messages import JoinReply, JoinRequest

Handler = Callable[[bytes], bytes]
"""Site-side request handler: the request's frame -> the answer's frame (or the JSON of an error)."""


class SiteLink(ABC):
    """A site's connection to its coordinator."""

    site: str

    @abstractmethod
    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        """Join the study and register the handler that answers coordinator requests."""

    @abstractmethod
    def guidance(self, round: int, timeout: float | None = None) -> bytes:
        """The frame of this site's reply for BO round ``round`` (waits for the round)."""

    def close(self) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Leave (the site may rejoin later)."""
