"""uvicorn's HTTP/1.1 protocol with a deadline for each request's headers and a connection
limit per client address.

uvicorn closes a connection that stays idle after a response (``timeout_keep_alive``),
but any byte received cancels that timer, and a fresh connection has none: a client
that opens connections and trickles its headers holds them for ever, and enough of them
exhaust ``max_connections``. Here

* a fresh connection's first request must have its headers complete within
  ``header_timeout``, and each later request's within the keep-alive time of the previous
  response; otherwise the connection is closed (bodies have their own limit,
  ``body_timeout``, in the guard);
* one client address holds at most ``max_connections_per_address`` connections at once: a
  connection beyond it is answered ``503`` and closed at once, so one host trickling
  headers over many connections cannot take the slots of the others;
* an address shut out for its tokenless requests (:mod:`labfbo.server.throttle`) is
  answered ``429`` and closed at once, before anything it sends is parsed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from labfbo.server.throttle import AddressThrottle

THROTTLED = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
             b"content-length: 53\r\n\r\ntoo many requests without a known token from this address")
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: 45\r\n\r\ntoo many connections from this client address")


class _Deadlines:
    """The deadlines and limits above, over uvicorn's h11 or httptools protocol (same attributes and hooks)."""

    header_timeout: ClassVar[float | None] = None  # None: the keep-alive time, for the first request too
    max_per_address: ClassVar[int] = 0             # 0: no limit per address
    open_by_address: ClassVar[Counter[str]] = Counter()
    tokenless: ClassVar[AddressThrottle | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._address: str | None = None  # set while the connection counts against its address

    def _arm(self, seconds: float) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(seconds, self._headers_late)

    def _headers_late(self) -> None:
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "?"
        if self.tokenless is not None and self.tokenless.blocked(address):
            transport.write(THROTTLED)
            transport.close()
            return
        if self.max_per_address and self.open_by_address[address] >= self.max_per_address:
            transport.write(BUSY)
            transport.close()
            return
        self.open_by_address[address] += 1
        self._address = address
        self._arm(self.header_timeout if self.header_timeout is not None else self.timeout_keep_alive)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm(self.timeout_keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        if self._address is not None:
            self.open_by_address[self._address] -= 1
            if self.open_by_address[self._address] <= 0:
                del self.open_by_address[self._address]
            self._address = None
        super().connection_lost(exc)  # type: ignore[misc]


class HeaderDeadlineProtocol(_Deadlines, H11Protocol):  # type: ignore[misc]
    """The protocol above on h11 (pure Python); :func:`limited` makes one with a server's own limits and counts."""


def _fast() -> type | None:
    """The protocol above on httptools (a C parser: about a third less CPU per request), if installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None
    return type("HttpToolsHeaderDeadlineProtocol", (_Deadlines, HttpToolsProtocol), {})


def limited(header_timeout: float, max_per_address: int,
            tokenless: AddressThrottle | None = None) -> type[_Deadlines]:
    """The protocol class of one server: its header deadline, its limits per address and its own counts
    (on httptools when it is installed, else h11)."""
    return type("LimitedHeaderDeadlineProtocol", (_fast() or HeaderDeadlineProtocol,),
                {"header_timeout": header_timeout, "max_per_address": max_per_address,
                 "open_by_address": Counter(), "tokenless": tokenless})
