"""A site's campaign plan under ``DP(epsilon=...)``: its protocol's planned releases, the noise
multiplier calibrated to the budget, and the :class:`~labfbo.privacy.budget.Budget` that enforces it."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Any

from pydantic import BaseModel

from labfbo.core.dp import DP
from labfbo.core.exceptions import ConfigurationError
from labfbo.privacy.budget import Budget, calibrate, calibrate_events
from labfbo.privacy.dp import composed_epsilon
from labfbo.protocols.base import Protocol, SiteContext
from labfbo.space.search import SearchSpace


def plan(protocol: Protocol, space: SearchSpace, context: SiteContext,
         horizon: int | None) -> tuple[BaseModel, Budget | None]:
    """The site's protocol options with the noise multiplier calibrated to its budget, and the
    :class:`Budget` that enforces it (None without ``DP(epsilon=...)``).

    ``protocol`` is the configured protocol; its site logic's
    :meth:`~labfbo.protocols.SiteLogic.planned_releases` and ``declare_release`` give the plan.
    """
    logic_cls, options, dp = type(protocol).site_logic, protocol.options, protocol.privacy
    if not isinstance(dp, DP) or (dp.epsilon is None and dp.calibrated):
        return options, None
    if horizon is None or horizon < 1:
        if not dp.calibrated:
            raise ConfigurationError(f"DP(epsilon={dp.epsilon:g}) plans the campaign's releases from its horizon: "
                                     "give Optimizer(..., horizon=T) or run the coordinator with horizon=T")
        return options, Budget(dp)

    def with_sigma(sigma: float) -> BaseModel:
        return options.model_copy(update={"privacy": dp.model_copy(update={"noise_multiplier": sigma})})

    def events_of(logic: object, kinds: list[str]) -> dict[str, Any]:
        out = {}
        for kind in kinds:
            rel = logic.declare_release(kind, 0, None, True, None)  # type: ignore[attr-defined]
            if rel is None or not rel.private:
                raise ConfigurationError(f"the protocol plans a release {kind!r} it does not protect with DP")
            out[kind] = rel.event
        return out

    def planned_at(sigma: float) -> Counter:
        at = events_of(logic_cls(space, with_sigma(sigma), context), kinds)
        out: Counter = Counter()
        for k in kinds:
            out[at[k]] += int(counts[k])
        return out

    counts = logic_cls(space, with_sigma(dp.sigma if dp.calibrated else 1.0), context).planned_releases(horizon)
    kinds = [k for k, n in counts.items() if n]
    if not dp.calibrated:
        unit = events_of(logic_cls(space, with_sigma(1.0), context), kinds)
        if all(isinstance(e, float) for e in unit.values()):  # Gaussians: the analytic bracket
            sigma = calibrate(unit, counts, float(dp.epsilon), dp.delta)  # type: ignore[arg-type]
        else:
            sigma = calibrate_events(planned_at, float(dp.epsilon), dp.delta)  # type: ignore[arg-type]
        options = with_sigma(sigma)
    resolved = options.privacy  # type: ignore[attr-defined]
    if resolved.epsilon is None:
        return options, None
    planned = planned_at(resolved.sigma)
    if not planned:  # nothing to plan (e.g. no SVGD step at all): every release is checked as it comes
        return options, Budget(resolved)
    over = composed_epsilon(planned, resolved.delta)
    if over > resolved.epsilon:  # the expert form: a fixed sigma that the budget does not cover
        warnings.warn(f"DP(noise_multiplier={resolved.sigma:g}, epsilon={resolved.epsilon:g}): the campaign's "
                      f"{sum(planned.values())} planned releases would spend epsilon={over:.3g}; the site will stop "
                      "releasing when the budget is spent (leave noise_multiplier out to calibrate it)", stacklevel=4)
        return options, Budget(resolved)
    gaussian = [m for m in planned if not isinstance(m, tuple)]
    if not gaussian:  # randomized responses: say so when a choice is barely more often true than a guess
        from labfbo.privacy.randomized_response import keep_probability, noise_parameter

        # a response is the truth with probability q = 1 - p, else a uniform draw: q < 1/4 is mostly noise
        k, eps = max((e for e in planned), key=lambda e: noise_parameter(e[1], e[0]))
        if noise_parameter(eps, k) > 0.75:
            warnings.warn(f"DP(epsilon={resolved.epsilon:g}) over {sum(planned.values())} planned choices among {k}: "
                          f"each is reported truthfully only {100 * keep_probability(eps, k):.0f} % of the time "
                          f"(a guess: {100 / k:.0f} %) — fewer than one in four carries the truth rather than a "
                          "uniform draw — so expect little gain from the federation at this budget "
                          "(fewer releases or a larger budget help; docs/privacy.md)", stacklevel=4)
        return options, Budget(resolved, planned)
    weakest = min(gaussian)  # the least noisy release of the plan, as a multiple of its sensitivity
    n = context.n_sites
    # the sum of n releases: signal up to n*Delta/2 against noise sqrt(n)*m*Delta (local noise), or
    # sqrt(n/h)*m*Delta with distributed shares among h honest members: mostly noise once m exceeds this
    h = max(n - protocol.dp_colluders, 1)
    distributed = protocol.distributed_noise
    bound = math.sqrt(n * h) / 2 if distributed else math.sqrt(n) / 2
    # (per experiment the release's range is about n_i sensitivities, not one: the test does not apply)
    if n > 1 and weakest > bound and resolved.unit == "site":
        warnings.warn(f"DP(epsilon={resolved.epsilon:g}) over {sum(planned.values())} planned releases: each carries "
                      f"Gaussian noise {weakest:.3g}x its sensitivity, so even the sum of all {n} sites' releases "
                      "is mostly noise: expect little or no gain from the federation at this budget (fewer releases, "
                      "a larger budget or more sites help; docs/privacy.md)", stacklevel=4)
    return options, Budget(resolved, planned)
