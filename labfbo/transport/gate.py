"""When a concurrent transport starts the coordinator's next round (MPI, HTTP, Flower)."""

from __future__ import annotations

import time

from labfbo.coordinator import Coordinator


class RoundGate:
    """When the coordinator's next round starts, for transports whose sites run concurrently
    (MPI, HTTP): who has asked for it, since when, and whether :meth:`Coordinator.ready`
    lets it start. The transport serializes the calls (its lock or its single loop)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coord = coordinator
        self.wants: dict[str, int] = {}          # site -> the round it last asked for
        self.first_asked: dict[int, float] = {}  # round -> when the first site asked for it
        self.counts: dict[int, int] = {}         # round -> how many sites ask for it

    def ask(self, site: str, t: int) -> bool:
        """``site`` waits for the next round ``t``; False if it had already asked for it."""
        old = self.wants.get(site)
        self.first_asked.setdefault(t, time.monotonic())
        if old == t:
            return False
        if old is not None:
            self.counts[old] -= 1
        self.counts[t] = self.counts.get(t, 0) + 1
        self.wants[site] = t
        return True

    def may_open(self, t: int, n_active: int) -> bool:
        """Whether round ``t`` might start now that one more site asked for it — its first asker
        (a deadline starts counting), the quorum, or every active site (O(1): the caller wakes the
        round thread only then, not once per site)."""
        n = self.counts.get(t, 0)
        return n == 1 or n >= n_active or (self.coord.deadline is not None and n >= self.coord.quorum)

    def asked(self, active: set[str]) -> set[str]:
        """The sites of ``active`` (joined, not left) that asked for the next round."""
        t = self.coord.last_round + 1
        return {s for s, r in self.wants.items() if r == t and s in active}

    def open(self, active: set[str]) -> tuple[int, list[str]] | None:
        """``(t, participants)`` if the next round may start now, else None."""
        t, wanting = self.coord.last_round + 1, self.asked(active)
        waited = time.monotonic() - self.first_asked.get(t, time.monotonic())
        return (t, sorted(wanting)) if self.coord.ready(wanting, active, waited) else None

    def retry_in(self) -> float | None:
        """Seconds until the deadline may start the next round (None: only an ask or a leave can)."""
        first = self.first_asked.get(self.coord.last_round + 1)
        if self.coord.deadline is None or first is None:
            return None
        return max(self.coord.deadline - (time.monotonic() - first), 0.0) or None

    def started(self, t: int) -> None:
        """Round ``t`` has run (or failed): forget who waited for it."""
        self.wants = {s: r for s, r in self.wants.items() if r > t}
        self.counts = {r: n for r, n in self.counts.items() if r > t}
        self.first_asked.pop(t, None)
