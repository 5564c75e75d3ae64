r"""A campaign's privacy budget: plan the releases, calibrate the noise, never go beyond it.

``DP(epsilon=2.0, delta=1e-5)`` asks for a guarantee over the whole campaign, not a noise
level. A site turns it into one in three steps:

1. **Plan.** Its protocol says how many releases of each kind a campaign of ``horizon`` BO
   rounds makes (:meth:`labfbo.protocols.SiteLogic.planned_releases`; e.g. `gradient`:
   ``warmup_steps + svgd_steps (T - 1)`` score releases, `distribution`: one belief every ``release_every`` rounds),
   and what each declares (:meth:`~labfbo.protocols.SiteLogic.declare_release`): its effective
   noise multiplier :math:`m_k = \sigma f_k` (``noise_std / sensitivity``), linear in the
   configured :math:`\sigma`.
2. **Calibrate** (:func:`calibrate`). The smallest :math:`\sigma` whose planned releases,
   composed by the same PLD accountant as the privacy report (dp-accounting's
   ``calibrate_dp_mechanism`` on a ``ComposedDpEvent`` of ``SelfComposedDpEvent``\ s of
   ``GaussianDpEvent(\sigma f_k)``), give :math:`\varepsilon \le` the budget at
   :math:`\delta`. It is a function of (budget, plan) only, so a resumed site finds the same
   :math:`\sigma`.
3. **Enforce** (:class:`Budget`). Before a message leaves, the site checks that the releases
   made so far (its journal's) plus this one stay within the budget; a release that would
   not — one more than planned, a redone step, a campaign that runs longer, an unprotected
   message — is withheld: the site answers ``Abstain`` and continues on its own model and
   whatever guidance the others' releases still bring it (receiving costs this site nothing).

Composition is monotone (a release added never lowers the accountant's epsilon), so any
prefix of the plan is within the budget; only beyond the plan does the check call the
accountant.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from labfbo.core.exceptions import ConfigurationError, FederationError
from labfbo.core.messages import Abstain, Message, PrivacyDeclaration, SpentBudget
from labfbo.core.records import Withheld
from labfbo.core.release import Release
from labfbo.privacy.dp import DP, PLD_DISCRETIZATION, Unit, composed_epsilon

BUDGET_SPENT = "privacy budget spent"
"""The reason of the ``Abstain`` a site sends instead of a release beyond its budget."""

SIGMA_MAX = 1e6
"""The largest noise multiplier calibration searches (a budget needing more is refused)."""


def planned_multipliers(factors: Mapping[str, float], counts: Mapping[str, int], sigma: float) -> Counter[float]:
    """The planned releases at noise multiplier ``sigma``: effective multiplier -> count."""
    mult: Counter[float] = Counter()
    for kind, n in counts.items():
        if n:
            mult[sigma * factors[kind]] += int(n)
    return mult


def planned_epsilon(factors: Mapping[str, float], counts: Mapping[str, int], sigma: float, delta: float) -> float:
    """Epsilon of the planned releases at noise multiplier ``sigma`` (``factors[kind] * sigma`` each)."""
    return composed_epsilon(planned_multipliers(factors, counts, sigma), delta)


def calibrate(factors: Mapping[str, float], counts: Mapping[str, int], epsilon: float, delta: float) -> float:
    r"""The smallest noise multiplier :math:`\sigma` (within 1e-4 relative) whose planned releases
    compose to at most ``epsilon`` at ``delta`` under the privacy report's PLD accountant.

    ``factors[kind]``: the effective multiplier of one release of that kind at :math:`\sigma = 1`;
    ``counts[kind]``: how many the campaign plans. No planned release: :math:`\sigma = 1`
    (nothing will be released; the value is never used).
    """
    if not any(counts.values()):
        return 1.0
    from dp_accounting import ComposedDpEvent, GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.mechanism_calibration import ExplicitBracketInterval, calibrate_dp_mechanism
    from dp_accounting.pld import PLDAccountant

    items = [(factors[k], int(n)) for k, n in sorted(counts.items()) if n]

    def event(sigma: float) -> ComposedDpEvent:
        return ComposedDpEvent([SelfComposedDpEvent(GaussianDpEvent(sigma * f), n) for f, n in items])

    # composed Gaussians are one Gaussian of multiplier 1/sqrt(sum n/m^2): its exact sigma brackets the PLD's
    # (whose pessimistic discretization needs a little more noise; far below it the PLD would not fit in memory)
    exact = _gaussian_multiplier(epsilon, delta) * math.sqrt(sum(n / f ** 2 for f, n in items))
    if exact > SIGMA_MAX:
        raise ConfigurationError(f"a budget of epsilon={epsilon:g} at delta={delta:g} cannot cover the "
                                 f"{sum(n for _, n in items)} planned releases even at noise multiplier {SIGMA_MAX:g}")
    if planned_epsilon(factors, counts, exact, delta) <= epsilon:
        return exact
    try:
        sigma = float(calibrate_dp_mechanism(lambda: PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION),
                                             event, epsilon, delta, ExplicitBracketInterval(exact, 2 * exact),
                                             tol=1e-5 * exact))
    except ValueError:  # no PLD solution in [exact, 2 exact]: the report accounts multipliers below
        # PLD_MIN_SIGMA by RDP, so calibrate on the report's own accountant
        sigma = calibrate_events(lambda s: planned_multipliers(factors, counts, s), epsilon, delta)
    # Brent's method returns a point within tol of the boundary: step up until the report agrees
    while planned_epsilon(factors, counts, sigma, delta) > epsilon:
        sigma *= 1.0001
    return sigma


def calibrate_events(events_at: Callable[[float], Mapping[Any, int]], epsilon: float, delta: float) -> float:
    r"""The smallest :math:`\sigma` (within 1e-4 relative) whose planned releases, ``events_at(sigma)``
    (accounting event -> count, :attr:`labfbo.core.release.Release.event`), compose to at most
    ``epsilon`` at ``delta``: bisection in :math:`\log\sigma` on the privacy report's accountant, for
    plans that are not all Gaussian (e.g. randomized responses, whose epsilon is :math:`1/\sigma`)."""
    def fits(sigma: float) -> bool:
        return composed_epsilon(events_at(sigma), delta) <= epsilon

    hi = 1.0
    while not fits(hi):
        hi *= 2.0
        if hi > SIGMA_MAX:
            raise ConfigurationError(f"a budget of epsilon={epsilon:g} at delta={delta:g} cannot cover the planned "
                                     f"releases even at noise multiplier {SIGMA_MAX:g}")
    lo = hi / 2.0
    while fits(lo) and lo > 1e-6:
        hi, lo = lo, lo / 2.0
    while hi / lo > 1.0 + 1e-4:
        mid = math.sqrt(hi * lo)
        hi, lo = (mid, lo) if fits(mid) else (hi, mid)
    return hi


def _gaussian_multiplier(epsilon: float, delta: float) -> float:
    """The noise multiplier of one unit-sensitivity Gaussian that is exactly (epsilon, delta)-DP
    (dp-accounting's continuous Gaussian privacy loss, inverted by Brent's method)."""
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
    from scipy.optimize import brentq

    def excess(log_m: float) -> float:
        return GaussianPrivacyLoss(math.exp(log_m), sensitivity=1.0).get_delta_for_epsilon(epsilon) - delta

    return math.exp(brentq(excess, math.log(1e-4), math.log(1e8), xtol=1e-10))


def _key(event: Any) -> Any:
    """``event`` for matching two accounts of the same releases (ten significant digits)."""
    if isinstance(event, tuple):
        return (int(event[0]), float(f"{float(event[1]):.10g}"))
    return float(f"{float(event):.10g}")


def spent_events(spent: SpentBudget) -> Counter:
    """The accounting events of a :class:`SpentBudget` (an exposed release as multiplier 0: infinite)."""
    out: Counter = Counter({float(m): int(n) for m, n in spent.gaussian})
    for k, eps, n in spent.responses:
        out[(int(k), float(eps))] += int(n)
    if spent.exposed:
        out[0.0] += 1
    return out


def missing_events(theirs: Counter, ours: Counter) -> Counter:
    """The releases of ``theirs`` (the coordinator's account) that ``ours`` (a journal's) lacks."""
    have = Counter()
    for e, n in ours.items():
        have[_key(e)] += n
    out: Counter = Counter()
    for e, n in theirs.items():
        k = _key(e)
        matched = min(n, have[k])
        have[k] -= matched
        if n - matched:
            out[e] += n - matched
    return out


class Budget:
    """Enforces ``dp.epsilon`` over a site's releases (``plan``: the planned releases' effective
    multipliers and counts at the calibrated sigma, within the budget by construction)."""

    def __init__(self, dp: DP, plan: Mapping[Any, int] | None = None) -> None:
        if dp.epsilon is None:
            raise ConfigurationError("a Budget needs DP(epsilon=...)")
        self.dp = dp
        self.plan: Counter = Counter(plan or {})  # accounting event (Release.event) -> planned releases
        self.prior: Counter = Counter()  # releases the coordinator accounted that the journal lacks (adopt)

    @property
    def epsilon(self) -> float:
        return float(self.dp.epsilon)  # type: ignore[arg-type]

    @property
    def planned(self) -> int:
        return sum(self.plan.values())

    @property
    def weakest(self) -> float | None:
        """The smallest effective noise multiplier of the plan's Gaussian releases (noise std over
        sensitivity); None without one."""
        gaussian = [m for m in self.plan if not isinstance(m, tuple)]
        return min(gaussian) if gaussian else None

    def spent(self, releases: list[Release]) -> float:
        """Cumulative epsilon of ``releases`` and the :attr:`prior` (infinite once one was not private)."""
        if any(not r.private for r in releases):
            return math.inf
        return composed_epsilon(Counter(r.event for r in releases) + self.prior, self.dp.delta)

    def allows(self, releases: list[Release], release: Release) -> bool:
        """Whether ``release`` may leave after ``releases`` (and the :attr:`prior`) without going beyond the budget."""
        if not release.private or any(not r.private for r in releases):
            return False
        used = Counter(r.event for r in releases) + self.prior
        used[release.event] += 1
        if all(n <= self.plan.get(m, 0) for m, n in used.items()):
            return True  # a prefix of the plan (composition is monotone)
        return composed_epsilon(used, self.dp.delta) <= self.epsilon

    def adopt(self, spent: SpentBudget, releases: list[Release]) -> Counter:
        r"""Plan from the larger of the journal's ``releases`` and the coordinator's account ``spent``:
        the releases it accounted that the journal lacks (a journal lost, truncated or rolled back)
        join the :attr:`prior`, composed with the journal's by the same accountant
        (:math:`\varepsilon(\text{journal} + \text{prior})`). Returns those missing releases."""
        mine = Counter(r.event for r in releases if r.private)
        if any(not r.private for r in releases):
            mine[0.0] += 1
        ours = {_key(e): e for e in [*self.plan, *mine]}  # the site's own figures for the same events
        missing = Counter()
        for e, n in missing_events(spent_events(spent), mine).items():
            missing[ours.get(_key(e), e)] += n
        self.prior = self.prior | missing
        return missing

    def gate(self, answer: Message, release: Release, releases: list[Release], withheld: Sequence[Withheld],
             site: str) -> tuple[Message, Release | None, Withheld | None]:
        """``(answer, release, None)`` if the release fits; else ``(Abstain, None, record)``: the
        site sends nothing computed from its data, journals the ``record`` (one per round and
        message kind, else None) and warns the first time."""
        if self.allows(releases, release):
            return answer, release, None
        abstain = Abstain(reason=BUDGET_SPENT, round=answer.round, study=answer.study)
        last = withheld[-1] if withheld else None
        if last is not None and (last.round, last.message) == (answer.round, answer.kind):
            return abstain, None, None
        spent = self.spent(releases)
        if last is None:
            warnings.warn(f"site {site!r}: privacy budget spent (epsilon {spent:.3g} of {self.epsilon:g} at delta "
                          f"{self.dp.delta:g}): from round {answer.round} on it sends nothing computed from its data "
                          "and continues on its own model", stacklevel=3)
        return abstain, None, Withheld(round=answer.round, message=answer.kind, step=getattr(answer, "step", None),
                                       spent=min(spent, 1e300), budget=self.epsilon)


def declaration(dp: DP | None, horizon: int | None = None) -> PrivacyDeclaration | None:
    """What a site with these DP settings declares when it joins (its ``horizon`` only when a budget
    is yet to be planned over it: the coordinator refuses a site that could not plan)."""
    if dp is None:
        return None
    planned = horizon if dp.epsilon is not None and not dp.calibrated and horizon is not None else None
    return PrivacyDeclaration(epsilon=dp.epsilon, delta=dp.delta, noise_multiplier=dp.noise_multiplier, clip=dp.clip,
                              horizon=planned, unit=dp.unit)


class PrivacyFloor(BaseModel):
    """The consortium's floor: every site joins with ``DP(epsilon=e, delta=d)``, ``e <= epsilon``
    and ``d <= delta`` (``Coordinator(..., privacy_floor=PrivacyFloor(epsilon=4))``; a server's
    config: ``privacy_floor: {epsilon: 4}``). A site without a budget is refused. ``unit``: what the
    guarantee must protect at least — ``"site"`` (the default) refuses a site that protects only
    one experiment; ``"experiment"`` admits either (a site-level guarantee covers one experiment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    epsilon: float = Field(gt=0, allow_inf_nan=False, description="the largest campaign budget a site may have")
    delta: float = Field(1e-5, gt=0, lt=1, description="the largest delta a site may have")
    unit: Unit = Field("site", description="the least a site's guarantee protects: its whole dataset ('site') or "
                       "one experiment ('experiment', which admits both)")

    def __init__(self, epsilon: float, delta: float = 1e-5, unit: Unit = "site", **kw: Any) -> None:
        super().__init__(epsilon=epsilon, delta=delta, unit=unit, **kw)

    def check(self, site: str, declared: PrivacyDeclaration | None) -> None:
        """Refuse (FederationError naming what falls short) a site whose declaration does not meet it."""
        want = f"the study requires DP(epsilon<={self.epsilon:g}, delta<={self.delta:g})"
        if declared is None:
            raise FederationError(f"site {site!r} joins without differential privacy; {want}")
        if declared.epsilon is None:
            raise FederationError(f"site {site!r} has a noise multiplier but no privacy budget (DP(epsilon=...)); "
                                  f"{want}")
        if declared.epsilon > self.epsilon or declared.delta > self.delta:
            raise FederationError(f"site {site!r} has a privacy budget of epsilon={declared.epsilon:g} at delta="
                                  f"{declared.delta:g}, weaker than the study's floor: {want}")
        if self.unit == "site" and declared.unit != "site":
            raise FederationError(f"site {site!r} protects one experiment at a time (DP(unit={declared.unit!r})), "
                                  "not its whole dataset: the study's floor requires DP(unit='site') (every site "
                                  f"hides its whole campaign); {want}")
