"""Refusals counted per client address: the dashboard's logins, and requests without a known token.

A client address that is refused ``limit`` times within ``window`` seconds is throttled until the
window has passed. A host flooding the coordinator with tokenless requests is shut out at its
connections, before they are parsed or audited (:mod:`labfbo.server.connections`), while every
other address is served as before; a site behind the same address as such a host is shut out
with it. The dashboard's logins are only slowed: each login of a throttled address waits before
its token is checked and a wrong one gets 429, so the admin token cannot be guessed at speed, yet
is never refused because of anyone's wrong guesses (:mod:`labfbo.server.dashboard`).
"""

from __future__ import annotations

import threading
import time


class AddressThrottle:
    """At most ``limit`` refusals per client address in ``window`` seconds; beyond, that address
    is refused (429) until the window has passed (memory only, bounded to ``addresses``)."""

    def __init__(self, limit: int, window: float = 60.0, addresses: int = 10_000) -> None:
        self.limit, self.window, self.addresses = limit, window, addresses
        self.lock = threading.Lock()
        self.refused: dict[str, list[float]] = {}  # address -> times of its refusals in the window

    def blocked(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: it may)."""
        now = time.time()
        with self.lock:
            recent = [t for t in self.refused.get(address, ()) if t > now - self.window]
            if recent:
                self.refused[address] = recent
            else:  # an address without refusals in the window takes no memory
                self.refused.pop(address, None)
            return recent[0] + self.window - now if len(recent) >= self.limit else 0.0

    def refuse(self, address: str) -> None:
        now = time.time()
        with self.lock:
            if len(self.refused) >= self.addresses:  # forget the addresses whose window has passed
                self.refused = {a: ts for a, ts in self.refused.items() if ts and ts[-1] > now - self.window}
            self.refused.setdefault(address, []).append(now)
