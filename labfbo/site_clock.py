"""Where a federated site stands on the coordinator's round clock.

A site asks the coordinator for a new round only when it has something new to say: a
result (or failure, or historical data) that arrived since it asked for the guidance it
holds. Asking again before any result is in — a lab running several experiments in
parallel — is served from the guidance it holds, pending-aware, and moves no counter::

    ask()  -> round t      (nothing held yet: asks for round t)
    ask()  -> round t      (no result since: same guidance, the pending point is avoided)
    tell() ; ask() -> t+1  (a new result: asks for the next round)

The coordinator may answer with a later round than asked (the site fell behind, or
joined late); the site then continues from that round. Everything here is replayed from
the journal's ``ask`` records, so a restarted site stands where it stood.

A round's answers use the site's data *cut* at the moment it asked for that round
(journal position, :attr:`SiteClock.cuts`): results told while the round runs — from
another thread of the lab's script — wait for the next round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SiteClock:
    next_round: int = 0          # the round the site asks for when it has something new
    guided: int | None = None    # the round whose guidance it holds
    seen: int = 0                # its number of results when it asked for ``guided``
    uses: int = 0                # proposals made from ``guided`` so far (keys their random streams)
    cuts: dict[int, int] = field(default_factory=dict)  # round -> journal position when asked (in memory)

    def ahead(self, results: int) -> bool:
        """True when nothing new arrived since the site asked for the guidance it holds."""
        return self.guided is not None and results == self.seen

    def asking(self, t: int, position: int) -> None:
        """The site asks for round ``t`` with the data up to journal ``position``."""
        self.cuts = {r: p for r, p in self.cuts.items() if r >= t - 1}  # older rounds are over
        self.cuts[t] = position

    def rebase(self, clock: int) -> bool:
        """Follow a coordinator whose last completed round is ``clock``; True if the site was
        ahead of it (the coordinator lost its rounds: re-created without its state)."""
        if self.next_round <= clock + 1:
            return False
        self.next_round, self.guided, self.uses = clock + 1, None, 0
        self.cuts.clear()
        return True

    def record(self, guided: int | None, seen: int) -> dict[str, Any]:
        """The fields of an ``ask`` record that used round ``guided``'s guidance."""
        return {"guidance_round": guided, "seen": seen}

    def replay(self, rec: dict[str, Any]) -> None:
        """Apply an ``ask`` record (old journals: ``model_round`` counted every model ask)."""
        if "guidance_round" in rec:
            g = rec["guidance_round"]
            if g is None:
                return  # proposed without guidance (ask(timeout=) fell back): nothing moved
            if isinstance(g, bool) or not isinstance(g, int) or g < 0:
                raise ValueError(f"guidance_round must be a round number, got {g!r}")
            self.uses = self.uses + 1 if g == self.guided else 1
            self.guided, self.seen = g, int(rec["seen"])
            self.next_round = g + 1
        elif rec.get("model_round"):
            self.guided, self.uses = self.next_round, 1
            self.next_round += 1
            self.seen = -1  # never "ahead": old journals asked a new round every time
