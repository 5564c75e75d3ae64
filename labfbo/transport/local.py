"""The in-process transport: N sites and the coordinator in one Python process.

When a site asks for its guidance of the next round and the round has not run yet, the
coordinator runs it then, calling every site's registered handler in turn (a site that
asks for a round already run gets the current guidance, see :mod:`labfbo.coordinator`).
Sites may run in threads of the process: a lock lets one of them run a round while the
others asking for it wait, then get its guidance (the round uses the data every site has
when it runs; a script that wants the data of every site's last result waits for them
before asking). Every message still crosses as a wire frame (what a network
would carry), so byte counts and the privacy boundary are the same as on the MPI and HTTP
transports.

A handler that raises, or that answers after the coordinator's ``deadline`` once the
quorum is met, is left out of that exchange.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Mapping

from labfbo.core.exceptions import FederationError, RoundError
from labfbo.core.messages import JoinReply, JoinRequest, Message, parse
from labfbo.transport.base import Handler, SiteLink

if TYPE_CHECKING:
    from labfbo.coordinator import Coordinator


_TRANSPORTS: "weakref.WeakKeyDictionary[Coordinator, LocalTransport]" = weakref.WeakKeyDictionary()
_MADE = threading.Lock()


class LocalTransport:
    """Connects in-process sites to one :class:`~labfbo.coordinator.Coordinator`."""

    def __init__(self, coordinator: "Coordinator") -> None:
        self.coordinator = coordinator
        self.handlers: dict[str, Handler] = {}
        self.lock = threading.RLock()  # one thread runs a round (or a join) at a time

    @classmethod
    def of(cls, coordinator: "Coordinator") -> "LocalTransport":
        """The in-process transport of ``coordinator`` (one per coordinator, made on first use)."""
        with _MADE:
            transport = _TRANSPORTS.get(coordinator)
            if transport is None:
                transport = _TRANSPORTS[coordinator] = cls(coordinator)
            return transport

    def link(self, site: str) -> "LocalLink":
        return LocalLink(self, site)

    def gather(self, requests: Mapping[str, Message], quorum: int,
               deadline: float | None) -> dict[str, Message | BaseException]:
        out: dict[str, Message | BaseException] = {}
        start = time.monotonic()
        frames: dict[int, bytes] = {}  # one encoding of a request broadcast to every site
        for site, request in requests.items():
            handler = self.handlers.get(site)
            if handler is None:
                out[site] = FederationError(f"site {site!r} is not connected")
                continue
            try:
                frame = frames.get(id(request)) or frames.setdefault(id(request), request.to_wire())
                answer = parse(handler(frame))
            except Exception as exc:  # a failing site is left out of the exchange
                out[site] = exc
                continue
            late = deadline is not None and time.monotonic() - start > deadline
            n_ok = sum(isinstance(m, Message) for m in out.values())
            out[site] = TimeoutError(f"{site} answered after the deadline") if late and n_ok >= quorum else answer
        return out


class LocalLink(SiteLink):
    def __init__(self, transport: LocalTransport, site: str) -> None:
        self.transport = transport
        self.site = site

    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        request = parse(request.to_wire())  # type: ignore[assignment]
        with self.transport.lock:
            reply = self.transport.coordinator.join(request)
            self.transport.handlers[self.site] = handler
        return parse(reply.to_wire())  # type: ignore[return-value]

    def guidance(self, round: int, timeout: float | None = None) -> bytes:
        """Round ``round``'s guidance: run now if it is the next round (every site answers from
        the data it has now); a round already run gives the current guidance."""
        coord = self.transport.coordinator
        with self.transport.lock:
            coord.check_round(self.site, round)
            if round <= coord.last_round:
                return coord.current_guidance(self.site).to_wire()
            missing = coord.n_sites - len(coord.members)
            if missing:  # the local transport does not wait for a site to join
                raise RoundError(f"waiting for {missing} more site(s) to join before round {round}")
            return coord.run_round(round, self.transport.gather)[self.site].to_wire()

    def close(self) -> None:
        self.transport.handlers.pop(self.site, None)
