"""The dashboard's privacy view: each site's cumulative epsilon, budget and what remains of it,
as the coordinator accounts them.

The coordinator accounts every answer it accepts (:mod:`labfbo.privacy.accounts`: the
protocol's own site-side declaration of what the answer released under the DP fields it
carries, composed per site by the PLD accountant at the delta the site declared — else at the
study's ``privacy.delta``, else :class:`labfbo.privacy.DP`'s default) and keeps the account in
its state store, so the figure survives a restart. A site that declared ``DP(epsilon=...)``
has a budget the coordinator enforces: a release beyond it is discarded (the page counts
them). An answer without DP noise makes epsilon infinite, as in the site's own report; "not
known" when the protocol's declaration cannot be evaluated here or dp-accounting is missing.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from labfbo.server.served import Served


@dataclass(frozen=True)
class BudgetText:
    """What the page shows of one site's privacy."""

    epsilon: float | None  # a finite cumulative epsilon (None: infinite, not known, or being accounted)
    epsilon_text: str
    budget: float | None   # the budget the coordinator enforces (None: none declared)
    budget_text: str
    remaining: float | None
    remaining_text: str
    discarded: int


class PrivacyView:
    """Each site's epsilon from the coordinator's account. The PLD accountant can take a while (many
    small-multiplier compositions), so it runs in one background thread, only while someone looks
    at the dashboard; until it catches up, the page shows the last result as a lower bound."""

    def __init__(self, server: Served) -> None:
        self.coord = server.coordinator
        self.ledger = self.coord.ledger
        self.lock = threading.Lock()
        self.done: dict[str, tuple[int, float | None, str | None]] = {}  # site -> (releases, epsilon, why unknown)
        self.worker: threading.Thread | None = None

    def epsilon(self, site: str) -> tuple[float | None, str]:
        """``(finite epsilon or None, the text the page shows)``."""
        view = self.budget(site)
        return view.epsilon, view.epsilon_text

    def budget(self, site: str) -> BudgetText:
        """The site's cumulative epsilon, budget, remaining budget and discarded releases."""
        with self.ledger.lock:
            acc = self.ledger.account(site)
            n, unknown, exposed, budget = acc.releases, acc.unknown, acc.exposed, acc.budget
            discarded, spent_flag, delta = acc.discarded, acc.budget_spent, self.ledger.delta_of_acc(acc)
        with self.lock:
            done = self.done.get(site)
            if not (unknown or exposed) and n and (done is None or done[0] != n) and self.worker is None:
                self.worker = threading.Thread(target=self._work, name="labfbo-dashboard-epsilon", daemon=True)
                self.worker.start()
        eps: float | None = None
        if unknown:
            text = f"not known: {unknown}"
        elif exposed:
            text, eps = "∞: it sent data-derived answers without DP noise", math.inf
        elif not n:
            text, eps = "0 (no release received yet)", 0.0
        elif done is None:
            text = f"being accounted ({n} release{'s' if n > 1 else ''})"
        elif done[2] is not None:
            text = done[2]
        elif done[1] is None or math.isinf(done[1]):
            text, eps = "∞: DP with noise_multiplier 0", math.inf
        else:
            bound = "" if done[0] == n else "≥ "
            count = (
                f"{n} release{'s' if n > 1 else ''}" if done[0] == n else f"{done[0]} of {n} releases accounted so far"
            )
            text, eps = f"{bound}{done[1]:.3g} at δ = {delta:g} ({count})", done[1]
        exact = done is None or done[0] == n  # else eps is a lower bound until the accountant catches up
        if budget is None:
            btext, rem, rtext = "—", None, "—"
        else:
            btext = f"ε ≤ {budget:g} at δ = {delta:g}"
            rem = None if eps is None else max(budget - eps, 0.0)
            if rem is None:
                rtext = "not known yet"
            elif rem <= 0:
                rtext = "none: spent"
            elif spent_flag:
                rtext = f"{rem:.3g}, but the site's own plan is spent: it releases nothing more"
            else:
                rtext = f"{'' if exact else '≤ '}{rem:.3g}"
        finite = eps if eps is not None and math.isfinite(eps) else None
        return BudgetText(epsilon=finite, epsilon_text=text, budget=budget, budget_text=btext,
                          remaining=rem, remaining_text=rtext, discarded=discarded)

    def _work(self) -> None:
        """Run the accountant for every site behind, until none is (one thread)."""
        while True:
            with self.ledger.lock:
                todo = [(site, acc.releases) for site, acc in self.ledger.accounts.items()
                        if acc.releases and not (acc.exposed or acc.unknown)]
            with self.lock:
                todo = [(s, n) for s, n in todo if self.done.get(s, (None,))[0] != n]
                if not todo:
                    self.worker = None
                    return
            for site, n in todo:
                try:
                    eps, why = self.ledger.epsilon(site), None
                except Exception as exc:  # noqa: BLE001 - e.g. dp-accounting missing (labfbo[privacy])
                    eps, why = None, f"not known: {exc}"
                with self.lock:
                    self.done[site] = (n, eps, why)

    def note(self) -> str:
        return ("ε: the coordinator's account of every answer it accepted, from the DP fields they carry (PLD "
                "accountant, at the δ each site declared), kept in its state store across restarts. A site's "
                "budget is the smallest DP(epsilon=...) it declared (or the consortium's floor): the coordinator "
                "discards a release beyond it and tells the site. A site's own privacy report also counts answers "
                "that arrived too late, so it can be higher.")
