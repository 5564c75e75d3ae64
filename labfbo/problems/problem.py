r"""`FederatedProblem`: one search space, one objective per site, known optima.

Regret is always measured on the noiseless objective. The *normalized* regret of site
:math:`i` divides the simple regret by the site's objective range

.. math:: R_i = \max_{x \in \mathcal{D}} f_i(x) - \min_{x \in \mathcal{D}} f_i(x),

estimated once per problem from a fixed scrambled Sobol design of 4096 points (seed
``20240601``, independent of the run seed) together with the known optimum. It depends
only on the problem, so normalized regrets compare across protocols and seeds. Users may
pass ``ranges=`` to fix it themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np
from scipy.stats import qmc

from labfbo.core.exceptions import ConfigurationError
from labfbo.space.search import SearchSpace

Objective = Callable[[dict[str, Any]], float]

_RANGE_SEED = 20240601
_RANGE_POINTS = 4096


@dataclass
class FederatedProblem:
    """A federated benchmark: ``objectives[i](params) -> float`` is site ``i``'s process.

    Args:
        space: the shared search space (user units).
        objectives: one callable per site taking a params dict and returning the
            noiseless value.
        optima: each site's best achievable value ``f*_i`` (min or max by ``objective``).
        objective: ``"minimize"`` or ``"maximize"``.
        noise_std: standard deviation of Gaussian observation noise added in simulation.
        name: a label for reports.
        ranges: optional per-site normalizers for the normalized regret.
        site_names: optional names; default ``site-0 ... site-{N-1}``.
    """

    space: SearchSpace
    objectives: Sequence[Objective]
    optima: Sequence[float]
    objective: Literal["minimize", "maximize"] = "minimize"
    noise_std: float = 0.0
    name: str = "custom"
    ranges: Sequence[float] | None = None
    site_names: Sequence[str] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.space, SearchSpace):
            raise ConfigurationError("FederatedProblem.space must be a labfbo.SearchSpace")
        if len(self.objectives) == 0:
            raise ConfigurationError("FederatedProblem needs at least one site objective")
        if len(self.optima) != len(self.objectives):
            raise ConfigurationError(
                f"{len(self.objectives)} objectives but {len(self.optima)} optima")
        if self.objective not in ("minimize", "maximize"):
            raise ConfigurationError(f"objective must be 'minimize' or 'maximize', got {self.objective!r}")
        if not all(math.isfinite(float(v)) for v in self.optima):
            raise ConfigurationError("every optimum must be a finite number")
        if self.noise_std < 0:
            raise ConfigurationError("noise_std must be >= 0")
        if self.site_names is None:
            self.site_names = [f"site-{i}" for i in range(self.n_sites)]
        if len(self.site_names) != self.n_sites or len(set(self.site_names)) != self.n_sites:
            raise ConfigurationError("site_names must be unique, one per objective")
        if self.ranges is not None and len(self.ranges) != self.n_sites:
            raise ConfigurationError("ranges must have one entry per site")

    @property
    def n_sites(self) -> int:
        return len(self.objectives)

    @property
    def loss_sign(self) -> float:
        """+1 for minimization, -1 for maximization: ``loss_sign * value`` is a loss (lower is better)."""
        return 1.0 if self.objective == "minimize" else -1.0

    def evaluate(self, site: int, params: dict[str, Any]) -> float:
        """Noiseless value of site ``site`` at ``params``."""
        return float(self.objectives[site](params))

    def regret(self, site: int, value: float | np.ndarray) -> np.ndarray:
        """Simple regret (>= 0 up to round-off) of noiseless values at a site."""
        return self.loss_sign * (np.asarray(value, dtype=np.float64) - float(self.optima[site]))

    def objective_ranges(self) -> np.ndarray:
        """Per-site normalizers of the normalized regret (see module docstring)."""
        if self.ranges is None:
            u = qmc.Sobol(self.space.dim, scramble=True, seed=_RANGE_SEED).random(_RANGE_POINTS)
            pts = self.space.decode(u)
            out = []
            for i in range(self.n_sites):
                vals = np.array([self.evaluate(i, p) for p in pts] + [float(self.optima[i])])
                out.append(max(float(vals.max() - vals.min()), 1e-12))
            self.ranges = out
        return np.asarray(self.ranges, dtype=np.float64)
