"""uvicorn's HTTP/1.1 protocol with a deadline for each request's headers.

uvicorn closes a connection that stays idle after a response (``timeout_keep_alive``),
but any byte received cancels that timer, and a fresh connection has none: a client
that opens connections and trickles its headers holds them for ever, and enough of them
exhaust ``max_connections``. Here every request's headers must be complete within the
keep-alive time of the connection opening or of the previous response; otherwise the
connection is closed. (Bodies have their own limit, ``body_timeout``, in the guard.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(self.timeout_keep_alive, self._headers_late)

    def _headers_late(self) -> None:
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)
