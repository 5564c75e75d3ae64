"""``simulated``: a virtual instrument that evaluates a built-in benchmark site.

Useful for dry runs of a lab loop: ``load_adapter("simulated", problem="branin", site=0,
noise_std=0.1, seed=0)``. Noise draws are keyed by (seed, site, trial id), so a re-run
of the same trial gives the same measurement.
"""

from __future__ import annotations

from labfbo.adapter import InstrumentAdapter
from labfbo.benchmarks import get_problem
from labfbo.seeding import rng
from labfbo.trial import Trial


class SimulatedAdapter(InstrumentAdapter):
    name = "simulated"

    def __init__(self, problem: str = "branin", site: int = 0, n_sites: int = 1, noise_std: float = 0.0,
                 seed: int = 0, heterogeneity: float | None = None) -> None:
        self.problem = get_problem(problem, n_sites=max(n_sites, site + 1), heterogeneity=heterogeneity, seed=seed)
        self.space = self.problem.space
        self.site = site
        self.noise_std = noise_std
        self.seed = seed

    def run(self, trial: Trial) -> float:
        value = self.problem.evaluate(self.site, trial.params)
        if self.noise_std:
            value += self.noise_std * rng(self.seed, self.site, trial.id, "simulated-adapter").standard_normal()
        return float(value)
