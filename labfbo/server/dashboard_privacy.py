"""The dashboard's privacy view: each site's cumulative epsilon as far as the coordinator can account it.

A private answer states the site's DP settings (``dp_noise_multiplier``, and
``dp_clip``/``dp_sensitivity`` where the protocol sends them). For every answer it accepted,
the coordinator asks the protocol's own site-side declaration
(:meth:`labfbo.protocols.SiteLogic.declare_release`, the code the site journals its release
with) what the answer released under those settings, and composes the releases with the
site's accountant (:func:`labfbo.privacy.report.cumulative_epsilon`). The sites do not send
their delta: epsilon is given at the study's ``privacy.delta`` if the consortium configures
one, else at :class:`labfbo.privacy.DP`'s default, and the page says which. An answer
without DP noise makes it infinite, as in the site's own report. It is a lower bound of the
site's own figure after a coordinator restart (earlier answers are not counted) and whenever
a site's answer was refused (late); "not known" when the protocol's declaration cannot be
evaluated here or dp-accounting is missing.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from labfbo.messages import Abstain, Message
from labfbo.privacy.budget import BUDGET_SPENT
from labfbo.server.served import Served



@dataclass
class _Account:
    """One site's releases as the coordinator received them (kinds, rounds and DP fields only)."""

    pending: list[tuple[Any, ...]] = field(default_factory=list)  # answers not declared yet (then dropped)
    releases: int = 0
    multipliers: Counter = field(default_factory=Counter)  # accounting event (Release.event) -> releases
    exposed: bool = False         # a release without DP noise: no finite epsilon
    unknown: str | None = None    # why its epsilon is not known
    done: tuple[int, float] | None = None  # (releases accounted, epsilon) of the last accountant run
    budget_spent: bool = False    # it abstained because its privacy budget was spent


class PrivacyView:
    """Each site's cumulative epsilon from the DP fields of the answers the coordinator accepted.

    The PLD accountant can take seconds (many small-multiplier compositions), so it runs in one
    background thread, only while someone looks at the dashboard; until it catches up, the page
    shows the last result as a lower bound.
    """

    def __init__(self, server: Served) -> None:
        from labfbo.privacy import DP

        self.coord = server.coordinator
        configured = self.coord.configured.privacy
        self.delta = configured.delta if isinstance(configured, DP) else DP().delta
        self.delta_source = "the study's privacy.delta" if isinstance(configured, DP) else \
            "labfbo's default delta (the sites do not send theirs)"
        self.restarted_after = self.coord.last_round  # >= 0: rounds before this process are not counted
        self.lock = threading.Lock()
        self.accounts: dict[str, _Account] = {}
        self.logic: dict[tuple[Any, Any], Any] = {}
        self.worker: threading.Thread | None = None

    def record(self, site: str, msg: Message) -> None:
        """An accepted answer (the engine's hook, its lock held): kind, round and DP fields only."""
        if isinstance(msg, Abstain):
            if msg.reason == BUDGET_SPENT:
                with self.lock:
                    self.accounts.setdefault(site, _Account()).budget_spent = True
            return
        step = getattr(msg, "step", None)
        rec = (msg.kind, max(int(msg.round), 0), step if isinstance(step, int) else None,
               getattr(msg, "dp_noise_multiplier", None), getattr(msg, "dp_clip", None),
               getattr(msg, "dp_sensitivity", None))
        with self.lock:
            self.accounts.setdefault(site, _Account()).pending.append(rec)

    def _logic(self, noise: float | None, clip: float | None) -> Any:
        """The protocol's site side under the DP settings an answer stated (None: cannot be built)."""
        key = (noise, clip)
        if key not in self.logic:
            from labfbo.privacy import DP
            from labfbo.protocols import SiteContext

            try:
                opts = self.coord.options
                if self.coord.protocol_cls.supports_privacy():
                    base = self.coord.configured.privacy
                    dp = None if noise is None else DP(clip=clip if clip is not None else (base.clip if base else 1.0),
                                                       noise_multiplier=noise, delta=self.delta)
                    opts = opts.model_copy(update={"privacy": dp})
                elif noise is not None:
                    raise ValueError("the protocol has no privacy option")
                self.logic[key] = self.coord.protocol_cls.site_logic(self.coord.space, opts,
                                                                     SiteContext(site="coordinator"))
            except Exception:  # noqa: BLE001 - then the epsilon is "not known"
                self.logic[key] = None
        return self.logic[key]

    def _declare(self, site: str) -> None:
        """Fold the site's answers not declared yet. The protocol's declarations run outside
        ``self.lock``: the engine's hook (which holds the round engine's lock) waits on it."""
        with self.lock:
            acc = self.accounts.setdefault(site, _Account())
            todo, acc.pending = acc.pending, []
        folded: list[tuple[str, Any]] = []  # ("unknown", why) | ("release", Release)
        for kind, rnd, step, noise, clip, sensitivity in todo:
            logic = self._logic(noise, clip)
            if logic is None:
                folded.append(("unknown", f"not known: the {self.coord.protocol!r} declaration of {kind!r} "
                                          "cannot run here"))
                continue
            try:
                rel = logic.declare_release(kind, rnd, step, noised=noise is not None, sensitivity=sensitivity)
            except Exception as exc:  # noqa: BLE001
                folded.append(("unknown", f"not known: {exc}"))
                continue
            if rel is not None:
                folded.append(("release", rel))
        with self.lock:
            for what, value in folded:
                if what == "unknown":
                    acc.unknown = value
                    continue
                acc.releases += 1
                if value.private:
                    acc.multipliers[value.event] += 1
                else:
                    acc.exposed = True

    def epsilon(self, site: str) -> tuple[float | None, str]:
        """``(finite epsilon or None, the text the page shows)``, with the budget the site declared
        when it joined (``DP(epsilon=...)``) and whether it has spent it."""
        eps, text = self._epsilon(site)
        declared = self.coord.privacy.get(site)
        if declared is not None and declared.epsilon is not None:
            with self.lock:
                spent = self.accounts.get(site, _Account()).budget_spent
            text += (f"; budget ε ≤ {declared.epsilon:g} at δ = {declared.delta:g}"
                     + (" — spent: it releases nothing more" if spent else ""))
        return eps, text

    def _epsilon(self, site: str) -> tuple[float | None, str]:
        self._declare(site)
        with self.lock:
            acc = self.accounts[site]
            n, done, unknown, exposed = acc.releases, acc.done, acc.unknown, acc.exposed
            if not (unknown or exposed) and n and (done is None or done[0] != n) and self.worker is None:
                self.worker = threading.Thread(target=self._work, name="labfbo-dashboard-epsilon", daemon=True)
                self.worker.start()
        if unknown:
            return None, unknown
        if exposed:
            return None, "∞: it sent data-derived answers without DP noise"
        if not n:
            return 0.0, "0 (no release received yet)"
        if done is None:
            return None, f"being accounted ({n} release{'s' if n > 1 else ''})"
        if math.isinf(done[1]):
            return None, "∞: DP with noise_multiplier 0"
        bound = "≥ " if self.restarted_after >= 0 or done[0] != n else ""
        count = f"{n} release{'s' if n > 1 else ''}" if done[0] == n else f"{done[0]} of {n} releases accounted so far"
        return done[1], f"{bound}{done[1]:.3g} at δ = {self.delta:g} ({count})"

    def _work(self) -> None:
        """Run the accountant for every site behind, until none is (one thread)."""
        from labfbo.privacy.dp import composed_epsilon

        while True:
            with self.lock:
                todo = [(site, acc.releases, Counter(acc.multipliers)) for site, acc in self.accounts.items()
                        if acc.releases and not (acc.exposed or acc.unknown)
                        and (acc.done is None or acc.done[0] != acc.releases)]
                if not todo:
                    self.worker = None
                    return
            for site, n, multipliers in todo:
                try:
                    eps, why = composed_epsilon(multipliers, self.delta), None
                except Exception as exc:  # noqa: BLE001 - e.g. dp-accounting missing (labfbo[privacy])
                    eps, why = math.nan, f"not known: {exc}"
                with self.lock:
                    acc = self.accounts[site]
                    acc.done, acc.unknown = (n, eps), why or acc.unknown

    def note(self) -> str:
        text = (f"ε: the coordinator's accounting of the answers it accepted, from the DP fields they carry "
                f"(PLD accountant, at δ = {self.delta:g}: {self.delta_source}). A site's own privacy report "
                "also counts answers that arrived too late, so it can be higher.")
        if self.restarted_after >= 0:
            text += (f" This coordinator restarted after round {self.restarted_after}: earlier answers are not "
                     "counted (≥).")
        return text
