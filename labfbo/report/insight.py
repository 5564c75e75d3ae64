r"""What the site's model believes now: the predicted best setting, the improvement left,
which parameters matter, and how the prediction moves with each of them.

All from the site's own GP (its local model, fitted as its optimizer fits it, on its own
completed experiments, with at most 100 L-BFGS iterations of the hyperparameter fit: on a
200-experiment journal the fit's log marginal likelihood per point is within 0.006 of the
converged one, in half the time), in the lab's units:

* **predicted best**: the setting of highest posterior mean :math:`\mu(x)` (lowest when
  minimizing) among the observed settings and 2,048 space-filling candidates;
* **improvement left**: :math:`\max_x \mathrm{EI}(x)` over the same candidates, with the
  incumbent :math:`f^* = \max_i \mu(x_i)` over the observed settings (robust to noise) —
  the improvement the model expects from the single most promising next experiment;
* **importance**: the total-order Sobol index of the posterior mean per parameter,
  :math:`S_{T_j} = \mathbb{E}[\mathrm{Var}(\mu \mid x_{\sim j})] / \mathrm{Var}(\mu)`
  (``scipy.stats.sobol_indices``, Saltelli's design, each unit-cube column uniform and
  snapped to the parameter's values, the parameters' whole ranges even where constraints
  exclude a combination), shown as shares of their sum;
* **partial dependence**: :math:`\bar\mu(v) = \frac{1}{B}\sum_b \mu(x_b \text{ with } x_j = v)`
  over :math:`B` = 128 space-filling settings of the other parameters' ranges (at most 25
  values of a numeric parameter), with the posterior std averaged alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats
from scipy.stats import qmc

from labfbo.core.exceptions import LabFBOError
from labfbo.core.seeding import int_seed
from labfbo.models.gp import as_tensor, fit_local_gp, predict
from labfbo.report.campaign import Campaign
from labfbo.space.params import Categorical

N_CANDIDATES = 2048
N_SOBOL = 1024  # Saltelli base sample (a power of 2): N (d + 2) posterior means
N_BACKGROUND = 128
CHUNK = 256  # points per posterior call (its kernel spans the chunk and the training points jointly)
FIT_ITERATIONS = 100  # L-BFGS iterations of the hyperparameter fit: near convergence, half the time on long campaigns


@dataclass(frozen=True)
class Belief:
    """The model's predicted best setting and the improvement it expects is left."""

    params: dict[str, Any]
    mean: float  # lab's units
    std: float
    improvement_left: float  # max expected improvement of one more experiment (lab's units, >= 0)
    best_observed: float  # the best feasible observation (lab's units)


@dataclass(frozen=True)
class Dependence:
    """The partial dependence of the prediction on one parameter."""

    name: str
    values: list[Any]  # the parameter's values, in the lab's units (choices for a categorical)
    mean: np.ndarray  # lab's units
    std: np.ndarray
    categorical: bool


class SiteModel:
    """The site's local GP of its (first) objective, predicting in the lab's units."""

    def __init__(self, campaign: Campaign) -> None:
        from labfbo.protocols.independent import IndependentOptions

        data = campaign.site_data()
        if data.n < 2:
            raise LabFBOError("the model needs at least two completed experiments")
        known = {k: v for k, v in campaign.header.options.items() if k in IndependentOptions.model_fields}
        try:
            options = IndependentOptions.model_validate(known)
        except ValueError:  # another protocol's setting of a shared name: the engine's defaults
            options = IndependentOptions()
        self.campaign, self.space, self.data = campaign, campaign.space, data
        self.sign = 1.0 if campaign.maximize else -1.0
        self.seed = int_seed(campaign.header.seed, 0, data.n, "report")
        self.model = fit_local_gp(data.X, data.y, data.yvar, space=self.space, options=options,
                                  seed=int_seed(campaign.header.seed, 0, data.n, "report-fit"),
                                  max_iterations=FIT_ITERATIONS)

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean (lab's units) and std at unit-cube points ``X (m, d)``."""
        mean, std = self._predict(X)
        return self.sign * mean, std

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std in the maximized orientation, in chunks (a posterior evaluates the kernel
        over its points and the training points jointly: quadratic in their number)."""
        parts = [predict(self.model, X[i:i + CHUNK]) for i in range(0, len(X), CHUNK)]
        return np.concatenate([m for m, _ in parts]), np.concatenate([s for _, s in parts])

    def belief(self) -> Belief:
        cand = np.vstack([self.data.X, self.space.sample(N_CANDIDATES, self.seed)])
        mu, sd = self._predict(cand)
        best = int(np.argmax(mu))
        incumbent = float(np.max(mu[: self.data.n]))
        from botorch.acquisition.analytic import LogExpectedImprovement

        with torch.no_grad():
            log_ei = LogExpectedImprovement(self.model, best_f=incumbent)(as_tensor(cand).unsqueeze(1))
        observed = self.campaign.best()
        return Belief(params=self.space.decode(cand[best:best + 1])[0], mean=float(self.sign * mu[best]),
                      std=float(sd[best]), improvement_left=float(torch.exp(log_ei).max()),
                      best_observed=float("nan") if observed is None else float(observed.value))  # type: ignore[arg-type]

    def _box(self, n: int, seed: int) -> np.ndarray:
        """``n`` space-filling points of the parameters' whole ranges, each column snapped to its
        parameter's values but not onto the constraints: importance and partial dependence are
        averages over the box (constraints included, they would mix the parameters' effects)."""
        k = int(np.ceil(np.log2(max(n, 2))))
        U = qmc.Sobol(self.space.dim, scramble=True, seed=np.random.default_rng(seed)).random_base2(k)[:n]
        return self.space.snap(U, restrict=False)

    def importance(self) -> dict[str, float]:
        """Each parameter's share of the posterior mean's variation (total-order Sobol indices,
        normalized to sum to 1; all zero when the mean is flat)."""
        d = self.space.dim
        if d == 1:  # the one parameter carries all of it
            return {self.space.names[0]: 1.0}
        probe = self._predict(self._box(256, self.seed))[0]
        if np.ptp(probe) <= 1e-12 * (1.0 + np.abs(probe).max()):  # a flat model: nothing to apportion
            return dict.fromkeys(self.space.names, 0.0)

        def f(x: np.ndarray) -> np.ndarray:  # scipy passes (d, n)
            return self._predict(self.space.snap(np.asarray(x).T, restrict=False))[0][None, :]

        res = stats.sobol_indices(func=f, n=N_SOBOL, dists=[stats.uniform(0.0, 1.0)] * d,
                                  rng=np.random.default_rng(self.seed))
        total = np.nan_to_num(np.clip(np.asarray(res.total_order, dtype=np.float64).reshape(-1), 0.0, None))
        share = total / total.sum() if total.sum() > 0 else np.zeros(d)
        return dict(zip(self.space.names, (float(s) for s in share)))

    def dependence(self, name: str, points: int = 25) -> Dependence:
        """How the prediction moves with parameter ``name``, the others averaged over their ranges
        (at most ``points`` values of a numeric parameter; every choice of a categorical one)."""
        j = self.space.names.index(name)
        p = self.space.params[j]
        grid = np.asarray(p.grid() if p.is_discrete else np.linspace(0.0, 1.0, points))
        if len(grid) > points and not isinstance(p, Categorical):  # e.g. Integer("rpm", 0, 100000)
            grid = grid[np.unique(np.round(np.linspace(0, len(grid) - 1, points)).astype(int))]
        X = np.repeat(self._box(N_BACKGROUND, self.seed + 1)[None], len(grid), axis=0)  # (grid, B, d)
        X[:, :, j] = grid[:, None]
        mu, sd = self.predict(X.reshape(-1, self.space.dim))
        mean, std = mu.reshape(len(grid), -1).mean(axis=1), sd.reshape(len(grid), -1).mean(axis=1)
        values = [p.from_unit(float(u)) for u in grid]
        return Dependence(name=name, values=values, mean=mean, std=std, categorical=isinstance(p, Categorical))
