r"""The coordinator's account of each site's privacy budget, from the answers it received.

A private answer states the site's DP settings (``dp_noise_multiplier``, and
``dp_clip``/``dp_sensitivity`` where the protocol sends them). :func:`labfbo.protocols.releases.received_release` asks
the protocol's own site-side declaration (:meth:`labfbo.protocols.SiteLogic.declare_release`,
the code the site journals its release with) what the answer released under those settings.
:class:`PrivacyLedger` folds those releases per site — the accounting events
(:attr:`labfbo.core.release.Release.event`) and how many of each — and composes them with
the site's PLD accountant (:func:`labfbo.privacy.dp.composed_epsilon`) at the delta the site
declared when it joined.

**Enforcement.** A site that declared ``DP(epsilon=e)`` has the budget
:math:`b = \min(e_1, e_2, \dots, \text{floor})` over every declaration it joined with (a rejoin
cannot raise it) and the consortium's :class:`~labfbo.privacy.budget.PrivacyFloor`. An answer
whose release would take :math:`\varepsilon(\text{accounted} + \text{this}) > b` — or that
carries no DP noise, or cannot be accounted — is **discarded**: :meth:`PrivacyLedger.admit`
returns an ``Abstain`` with reason :data:`BUDGET_DISCARDED` in its place, counts it, and the
coordinator tells the site (:class:`labfbo.core.messages.BudgetExhausted`). The account is what a
durable coordinator persists (:meth:`PrivacyLedger.state`), so a site whose journal is lost or
rolled back rejoins with what it had spent (:class:`labfbo.core.messages.SpentBudget`).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any, Callable

from labfbo.core.messages import Abstain, Message, PrivacyDeclaration, SpentBudget
from labfbo.core.release import Release
from labfbo.privacy.budget import BUDGET_SPENT
from labfbo.privacy.dp import DP, composed_epsilon

BUDGET_DISCARDED = "privacy budget exceeded: the coordinator discarded the release"
"""The reason of the ``Abstain`` the coordinator forwards in place of an over-budget answer."""



class Undeclared(Exception):
    """The protocol's declaration of a received answer cannot run here (why: its message)."""


class SiteAccount:
    """One site's releases as the coordinator received and accepted them."""

    def __init__(self) -> None:
        self.releases = 0
        self.events: Counter = Counter()  # accounting event -> releases
        self.exposed = False           # a release without DP noise: no finite epsilon
        self.unknown: str | None = None  # why a release could not be accounted
        self.discarded = 0             # releases discarded: over the budget
        self.budget: float | None = None  # the smallest budget declared (or the floor)
        self.delta: float | None = None   # the smallest delta declared
        self.budget_spent = False      # it abstained because its own gate found the budget spent
        self._eps: tuple[int, float] | None = None  # (releases, epsilon) of the last accountant run

    def state(self) -> dict[str, Any]:
        return {"releases": self.releases, "events": [[list(e) if isinstance(e, tuple) else e, n]
                                                      for e, n in sorted(self.events.items(), key=repr)],
                "exposed": self.exposed, "unknown": self.unknown, "discarded": self.discarded,
                "budget": self.budget, "delta": self.delta, "budget_spent": self.budget_spent}

    @classmethod
    def of(cls, state: dict[str, Any]) -> "SiteAccount":
        acc = cls()
        acc.releases, acc.exposed, acc.unknown = int(state["releases"]), bool(state["exposed"]), state.get("unknown")
        acc.events = Counter({(tuple(e) if isinstance(e, list) else float(e)): int(n) for e, n in state["events"]})
        acc.discarded, acc.budget, acc.delta = int(state.get("discarded", 0)), state.get("budget"), state.get("delta")
        acc.budget_spent = bool(state.get("budget_spent", False))
        return acc


class PrivacyLedger:
    """Every site's account (thread-safe); ``on_change(site, state)`` is called, the lock held,
    each time an account changes — a durable coordinator writes it before the answer is used."""

    def __init__(self, reader: Any, floor: Any = None, default_delta: float | None = None) -> None:
        self.reader, self.floor = reader, floor
        self.default_delta = default_delta if default_delta is not None else DP().delta
        self.lock = threading.RLock()
        self.accounts: dict[str, SiteAccount] = {}
        self.on_change: Callable[[str, dict[str, Any]], None] | None = None

    def account(self, site: str) -> SiteAccount:
        with self.lock:
            acc = self.accounts.get(site)
            if acc is None:  # not setdefault: that would build an account on every call
                acc = self.accounts[site] = SiteAccount()
            return acc

    def unbudgeted(self, site: str) -> bool:
        """``site`` declared no budget: admitting its releases computes no ε (cheap)."""
        with self.lock:
            acc = self.accounts.get(site)
            return acc is None or acc.budget is None

    def _changed(self, site: str, acc: SiteAccount) -> None:
        if self.on_change is not None:
            self.on_change(site, acc.state())

    def declare(self, site: str, declared: PrivacyDeclaration | None) -> None:
        """``site`` (re)joined with ``declared``: its budget is the smallest it ever declared (and the floor)."""
        if declared is None:
            return
        with self.lock:
            acc = self.account(site)
            before = (acc.budget, acc.delta)
            if declared.epsilon is not None:
                budget = declared.epsilon if self.floor is None else min(declared.epsilon, self.floor.epsilon)
                acc.budget = budget if acc.budget is None else min(acc.budget, budget)
            acc.delta = declared.delta if acc.delta is None else min(acc.delta, declared.delta)
            if (acc.budget, acc.delta) != before:
                self._changed(site, acc)

    def delta_of(self, site: str) -> float:
        acc = self.accounts.get(site)
        return acc.delta if acc is not None and acc.delta is not None else self.default_delta

    def admit(self, site: str, msg: Message) -> tuple[Message, str | None]:
        """Account ``msg``, an answer of ``site``: ``(msg, None)`` to forward it, or ``(Abstain,
        why)`` when it would exceed the site's budget (discarded and counted, never forwarded)."""
        if isinstance(msg, Abstain):
            if msg.reason == BUDGET_SPENT:
                with self.lock:
                    acc = self.account(site)
                    if not acc.budget_spent:
                        acc.budget_spent = True
                        self._changed(site, acc)
            return msg, None
        try:
            rel, unknown = self.reader.release(msg), None
        except Undeclared as exc:
            rel, unknown = None, str(exc)
        with self.lock:
            acc = self.account(site)
            if rel is None and unknown is None:
                return msg, None  # nothing computed from data (key material)
            why = self._over(acc, rel, unknown)
            if why is not None:
                acc.discarded += 1
                self._changed(site, acc)
                return Abstain(reason=BUDGET_DISCARDED, round=msg.round, study=msg.study), why
            if unknown is not None:
                acc.unknown = unknown
            else:
                acc.releases += 1
                if rel.private:  # type: ignore[union-attr]
                    acc.events[rel.event] += 1  # type: ignore[union-attr]
                else:
                    acc.exposed = True
            self._changed(site, acc)
            return msg, None

    def _over(self, acc: SiteAccount, rel: Release | None, unknown: str | None) -> str | None:
        """Why this release may not be admitted (None: it may)."""
        if acc.budget is None:
            return None
        budget = f"its budget ε ≤ {acc.budget:g} at δ = {self.delta_of_acc(acc):g}"
        if unknown is not None:
            return f"the coordinator cannot account it ({unknown}), and {budget} must hold"
        if acc.exposed or not rel.private:  # type: ignore[union-attr]
            return f"it carries no DP noise (no finite ε): {budget}"
        used = acc.events + Counter({rel.event: 1})  # type: ignore[union-attr]
        try:
            eps = composed_epsilon(used, self.delta_of_acc(acc))
        except Exception as exc:  # noqa: BLE001 - e.g. dp-accounting missing: fail closed
            return f"the coordinator cannot account it ({exc}), and {budget} must hold"
        if eps > acc.budget:
            return f"with it, {acc.releases + 1} releases would spend ε = {eps:.3g}, beyond {budget}"
        return None

    def delta_of_acc(self, acc: SiteAccount) -> float:
        return acc.delta if acc.delta is not None else self.default_delta

    def epsilon(self, site: str) -> float | None:
        """``site``'s cumulative epsilon (0: nothing; ``inf``: a release without noise; None: not known)."""
        with self.lock:
            acc = self.account(site)
            if acc.unknown:
                return None
            if acc.exposed:
                return math.inf
            if acc._eps is not None and acc._eps[0] == acc.releases:
                return acc._eps[1]
            n, events, delta = acc.releases, Counter(acc.events), self.delta_of_acc(acc)
        eps = composed_epsilon(events, delta) if events else 0.0
        with self.lock:
            if acc.releases == n:
                acc._eps = (n, eps)
        return eps

    def spent(self, site: str) -> SpentBudget:
        """``site``'s account as the coordinator tells it to the site."""
        try:
            eps = self.epsilon(site)
        except Exception:  # noqa: BLE001 - dp-accounting missing: the events still say it all
            eps = None
        with self.lock:
            acc = self.account(site)
            gaussian = sorted((float(e), n) for e, n in acc.events.items() if not isinstance(e, tuple))
            responses = sorted((int(e[0]), float(e[1]), n) for e, n in acc.events.items() if isinstance(e, tuple))
            return SpentBudget(releases=acc.releases, gaussian=gaussian, responses=responses, exposed=acc.exposed,
                               epsilon=eps if eps is not None and math.isfinite(eps) else None,
                               delta=self.delta_of_acc(acc), budget=acc.budget, discarded=acc.discarded)

    def state(self) -> dict[str, Any]:
        """Every account, JSON-able (for snapshots and state stores)."""
        with self.lock:
            return {s: a.state() for s, a in self.accounts.items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (a restarted coordinator)."""
        with self.lock:
            for site, acc in state.items():
                self.accounts[site] = SiteAccount.of(acc)
