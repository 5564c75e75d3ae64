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

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labfbo.core import wire
from labfbo.core.exceptions import FederationError, ProtocolError, RoundError
from labfbo.core.messages import Message, parse

if TYPE_CHECKING:
    from labfbo.site.ledger import SiteLedger
    from labfbo.transport.base import SiteLink


@dataclass
class SiteClock:
    """A federated site's place on the round clock, and the guidance it holds."""

    next_round: int = 0          # the round the site asks for when it has something new
    guided: int | None = None    # the round whose guidance it holds
    seen: int = 0                # its number of results when it asked for ``guided``
    uses: int = 0                # proposals made from ``guided`` so far (keys their random streams)
    cuts: dict[int, int] = field(default_factory=dict)  # round -> journal position when asked (in memory)
    held: Message | None = None  # the last guidance received (in memory; asked again after a restart)

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

    def guidance(self, link: "SiteLink", ledger: "SiteLedger", site: str, results: int, position: int,
                 timeout: float | None) -> tuple[Message | None, str, dict[str, Any]]:
        """The guidance to propose from, its source, and the ``ask`` record's fields.

        ``results``: the site's results now; ``position``: its journal position. The guidance
        held when no result arrived since it was asked for, else the next round's (waiting
        for it). With ``timeout``, a round that does not come in time falls back to the last
        guidance received, or to the local model (``None``), with a warning.
        """
        held = self.ahead(results)
        if held and self.held is not None and self.held.round == self.guided:
            return self.held, "model", self.record(self.guided, self.seen)
        t = self.guided if held else self.next_round
        assert t is not None
        if not held:
            self.asking(t, position)
        try:
            frame = link.guidance(t, timeout)
            msg = parse(frame)
        except (TimeoutError, FederationError, RoundError) as exc:
            if timeout is None:
                raise
            last = self.held
            warnings.warn(f"site {site!r}, round {t}: no guidance ({exc}); proposing from "
                          f"{'the last guidance' if last is not None else 'the local model'}", stacklevel=5)
            return last, "model-last-guidance" if last is not None else "model-local", self.record(None, results)
        got = t if msg.round < 0 else msg.round
        if got < t:
            raise ProtocolError(f"site {site!r} got round {got}'s guidance for round {t}")
        ledger.record_received(msg, len(frame) if wire.is_frame(frame) else None)
        self.held = msg
        return msg, "model", self.record(got, self.seen if held else results)

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
