r"""Expert priors on the location of the optimum, and how acquisitions use them.

A prior is a dict from parameter name to a density in **user units**; parameters without
an entry are uniform. Densities are truncated to the parameter's bounds and the joint
prior is their product. Models work in the unit cube, so the density used there is

.. math:: \pi_u(u) = \prod_j \pi_j(v_j(u_j)) \left|\frac{dv_j}{du_j}\right|,

a proper density on :math:`[0,1]^d` (log-scale parameters include their Jacobian).

**Uniform floor (labfbo default).** User priors are sometimes wrong. We use
:math:`\tilde\pi = (1-\epsilon)\,\pi_u + \epsilon` with ``prior_floor`` :math:`\epsilon`
(default 0.1), which bounds how strongly any region can be suppressed.

**Falsification (labfbo default).** When at least ``prior_check`` (default 3) observations
lie in the region where the prior boosts the acquisition, :math:`R = \{x: \tilde\pi(x) \ge
2\epsilon\}`, and
the best of them is worse than the median of all the site's observations, the data
contradict the prior and its exponent is set to 0 (plain acquisition) for as long as that
holds.

**Confirmation (labfbo default).** From round ``prior_patience`` (default 5) on, the prior
is used only while some observation in :math:`R` beats the median: a prior whose region
is never evaluated (under ``consensus`` a site evaluates the consensus point, not its own
proposal) cannot pull proposals for ever. ``prior_floor=0, prior_check=0,
prior_patience=0`` gives the paper's exact setting.

**Weighting** (``prior_mode``):

* ``"decay"`` (PMCBO, Eq. 7): :math:`\alpha(x)\,\tilde\pi(x)^{\gamma_t}`,
  :math:`\gamma_t = 1/(1+e^{\omega t})`, ``omega`` default 0.01.
* ``"pibo"`` (πBO): :math:`\alpha(x)\,\tilde\pi(x)^{\beta/n}` with ``prior_beta`` (default
  10) and :math:`n` the number of observations.

We maximize :math:`\log \alpha^+(x) + \gamma \log\tilde\pi(x)`, which has the same argmax.
EI variants are already log-acquisitions (LogEI, qLogEI, qLogNEI). UCB can be negative,
so it is made positive by :math:`\alpha^+ = \operatorname{softplus}((\mathrm{UCB}(x) -
\mu^*)/s_y)` with :math:`\mu^*` the largest posterior mean at an observed point and
:math:`s_y` the standard deviation of the observations: a smooth, positive, monotone
transform of UCB that is ~linear above the incumbent and decays exponentially below it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Mapping, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError as PydanticValidationError, model_validator
from scipy.special import ndtr
from scipy.stats import truncnorm

from labfbo.core.exceptions import ConfigurationError
from labfbo.space.search import Categorical, Integer, Real, SearchSpace


class _Density(BaseModel):
    """Turns pydantic's validation errors into :class:`ConfigurationError`."""

    def __init__(self, **kw: Any) -> None:
        try:
            super().__init__(**kw)
        except PydanticValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or type(self).__name__}: "
                                 f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
            raise ConfigurationError(f"{type(self).__name__}: {problems}") from None


class Normal(_Density):
    """A normal density ``N(mean, std**2)`` in user units, truncated to the bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["normal"] = "normal"
    mean: float
    std: float = Field(gt=0)

    def __init__(self, mean: float | None = None, std: float | None = None, **kw: Any) -> None:
        if mean is not None:
            kw.update(mean=mean, std=std)
        super().__init__(**kw)

    def log_pdf(self, v: torch.Tensor, low: float, high: float) -> torch.Tensor:
        mass = float(ndtr((high - self.mean) / self.std) - ndtr((low - self.mean) / self.std))
        z = (v - self.mean) / self.std
        return -0.5 * z**2 - math.log(self.std * math.sqrt(2 * math.pi)) - math.log(max(mass, 1e-300))


class Uniform(_Density):
    """A uniform density on ``[low, high]`` (default: the parameter's bounds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["uniform"] = "uniform"
    low: float | None = None
    high: float | None = None

    def __init__(self, low: float | None = None, high: float | None = None, **kw: Any) -> None:
        if low is not None or high is not None:
            kw.update(low=low, high=high)
        super().__init__(**kw)

    @model_validator(mode="after")
    def _check(self) -> "Uniform":
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError("Uniform needs low < high")
        return self

    def log_pdf(self, v: torch.Tensor, low: float, high: float) -> torch.Tensor:
        lo = max(low, self.low if self.low is not None else low)
        hi = min(high, self.high if self.high is not None else high)
        if not lo < hi:
            raise ConfigurationError(f"Uniform({self.low}, {self.high}) does not overlap [{low}, {high}]")
        inside = (v >= lo - 1e-12) & (v <= hi + 1e-12)
        return torch.where(inside, torch.full_like(v, -math.log(hi - lo)), torch.full_like(v, -745.0))


Density = Annotated[Union[Normal, Uniform], Field(discriminator="type")]


class PriorOptions(BaseModel):
    """The prior keywords every model-based protocol accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    prior: dict[str, Density] | None = None
    prior_mode: Literal["decay", "pibo"] = "decay"
    omega: float = Field(0.01, gt=0, description="PMCBO decay rate of the prior exponent")
    prior_beta: float = Field(10.0, gt=0, description="piBO prior strength")
    prior_floor: float = Field(0.1, ge=0, lt=1, description="uniform mixture weight epsilon")
    prior_check: int = Field(
        3, ge=0, description="observations in the prior region before it can be falsified (0: never)"
    )
    prior_patience: int = Field(
        5, ge=0, description="rounds the prior may go unconfirmed before it is dropped (0: never)"
    )


class LocationPrior:
    """The joint prior of a search space in unit-cube coordinates."""

    def __init__(self, space: SearchSpace, densities: Mapping[str, Any], floor: float = 0.1) -> None:
        unknown = sorted(set(densities) - set(space.names))
        if unknown:
            raise ConfigurationError(f"prior names unknown parameter(s) {unknown}; the space has {space.names}")
        self.space = space
        self.floor = floor
        self.terms: list[tuple[int, Real | Integer, Any]] = []
        for j, p in enumerate(space.params):
            dens = densities.get(p.name)
            if dens is None:
                continue
            if isinstance(p, Categorical):
                raise ConfigurationError(f"prior on categorical parameter {p.name!r} is not supported")
            if not isinstance(dens, (Normal, Uniform)):
                raise ConfigurationError(f"prior for {p.name!r} must be labfbo.models.priors.Normal or Uniform")
            self.terms.append((j, p, dens))
        self._log_max = self._max_log_density()

    def log_density(self, X: torch.Tensor) -> torch.Tensor:
        r""":math:`\log \tilde\pi(u)` for unit-cube ``X (..., d)`` (floor included)."""
        log_pi = torch.zeros(X.shape[:-1], dtype=X.dtype)
        for j, p, dens in self.terms:
            u = X[..., j].clamp(0.0, 1.0)
            if isinstance(p, Real) and p.log:
                lo, hi = math.log(p.low), math.log(p.high)
                v = torch.exp(lo + u * (hi - lo))
                jac = torch.log(v) + math.log(hi - lo)  # dv/du = v (log hi - log lo)
            else:
                v = p.low + u * (p.high - p.low)
                jac = torch.full_like(u, math.log(p.high - p.low))
            log_pi = log_pi + dens.log_pdf(v, float(p.low), float(p.high)) + jac
        if self.floor <= 0:
            return log_pi
        return torch.logaddexp(math.log1p(-self.floor) + log_pi, torch.full_like(log_pi, math.log(self.floor)))

    def _max_log_density(self) -> float:
        grid = torch.rand(4096, self.space.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        for j, p, dens in self.terms:
            if isinstance(dens, Normal) and not (isinstance(p, Real) and p.log):
                grid[:64, j] = min(max(p.to_unit(dens.mean), 0.0), 1.0)
        return float(self.log_density(grid).max())

    def sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` unit-cube draws from the prior without its floor (uniform elsewhere)."""
        gen = np.random.default_rng(seed)
        U = gen.random((n, self.space.dim))
        for j, p, dens in self.terms:
            lo, hi = float(p.low), float(p.high)
            if isinstance(dens, Normal):
                a, b = (lo - dens.mean) / dens.std, (hi - dens.mean) / dens.std
                v = truncnorm.rvs(a, b, loc=dens.mean, scale=dens.std, size=n, random_state=gen)
            else:
                v = gen.uniform(max(lo, dens.low if dens.low is not None else lo),
                                min(hi, dens.high if dens.high is not None else hi), size=n)
            U[:, j] = [p.to_unit(float(x)) for x in v]
        return self.space.snap(U)

    def in_region(self, X: np.ndarray) -> np.ndarray:
        r"""Which unit-cube points lie where the prior boosts the acquisition.

        With a floor :math:`\epsilon`: :math:`\tilde\pi(x) \ge 2\epsilon` (the prior part
        at least doubles the uniform floor); without one: within :math:`e^{-4.5}` of the peak
        (three standard deviations of a normal prior).
        """
        if len(X) == 0:
            return np.zeros(0, dtype=bool)
        lp = self.log_density(torch.as_tensor(X, dtype=torch.float64)).numpy()
        threshold = math.log(2 * self.floor) if self.floor > 0 else self._log_max - 4.5
        return lp >= threshold


def prior_exponent(opts: PriorOptions, prior: LocationPrior, t: int, X: np.ndarray, y: np.ndarray) -> float:
    """The exponent of the prior at BO round ``t`` given the site's data (0 = ignore it)."""
    if opts.prior_mode == "decay":
        gamma = 1.0 / (1.0 + math.exp(opts.omega * t))
    else:
        gamma = opts.prior_beta / max(len(y), 1)
    if (opts.prior_check or opts.prior_patience) and len(y):
        inside = prior.in_region(X)
        median = np.median(y)
        if opts.prior_check and inside.sum() >= opts.prior_check and y[inside].max() < median:
            return 0.0        # falsified: enough points in the prior region, none of them good
        if opts.prior_patience and t >= opts.prior_patience and not (inside.any() and y[inside].max() > median):
            return 0.0        # unconfirmed: no point in the prior region beats the median yet
    return gamma


def site_prior(space: SearchSpace, opts: PriorOptions) -> LocationPrior | None:
    """The site's prior, or None when no prior is configured."""
    if not opts.prior:
        return None
    return LocationPrior(space, opts.prior, floor=opts.prior_floor)


class CellPrior:
    r"""A location prior spread uniformly over the cells of a public codebook that were named.

    A codebook :math:`c_1..c_B` cuts the unit cube into Voronoi cells (the points nearer
    :math:`c_b` than any other codepoint). Naming :math:`c_b` says exactly that the optimum
    is believed to lie in :math:`c_b`'s cell; the prior with weights :math:`w_b` is

    .. math:: \tilde\pi(u) = (1 - \epsilon)\sum_b w_b\,\frac{a_b(u)}{V_b} + \epsilon,
              \qquad a_b(u) = \operatorname{softmax}_b\Big(-\frac{\lVert u - c_b\rVert^2}{2\tau^2}\Big),

    with :math:`V_b` the cell's volume (the mass of :math:`a_b` under the uniform measure,
    by quasi-Monte Carlo) and the uniform floor :math:`\epsilon` (``floor``) of
    :class:`LocationPrior`. The soft assignment (:math:`\tau` a fraction of the codebook's
    spacing) keeps the density smooth for the acquisition's gradient. Unlike a bump at
    :math:`c_b`, it does not pull a site towards the codepoint: in six dimensions eight
    codepoints are far from any corner, and a named cell holds the corners nearest its point.
    Federated protocols build it from what the other sites named (``vote``'s tallies); it has
    :class:`LocationPrior`'s interface (``log_density``, ``sample``, ``in_region``, ``floor``).
    """

    def __init__(self, space: SearchSpace, codebook: np.ndarray, weights: np.ndarray, floor: float = 0.1,
                 softness: float = 0.125, seed: int = 0) -> None:
        w = np.asarray(weights, dtype=float)
        C = np.asarray(codebook, dtype=float)
        if C.ndim != 2 or len(w) != len(C) or len(C) < 2 or not np.all(w >= 0) or not w.sum() > 0:
            raise ConfigurationError("a cell prior needs a codebook of at least two points and non-negative "
                                     "weights, one per point, not all zero")
        # a codebook snapped to a discrete space can repeat a point: one cell, the votes for both
        C, inverse = np.unique(C, axis=0, return_inverse=True)
        w = np.bincount(np.ravel(inverse), weights=w, minlength=len(C))
        if len(C) < 2:
            raise ConfigurationError("a cell prior needs a codebook of at least two distinct points")
        self.space, self.floor = space, float(floor)
        self.codebook, self.weights = C, w / w.sum()
        spacing = float(np.min([np.sort(np.linalg.norm(C - c, axis=1))[1] for c in C]))
        self.tau = max(softness * spacing, 1e-3)
        from scipy.stats import qmc

        U = qmc.Sobol(C.shape[1], scramble=True, seed=seed).random(4096)
        self.volumes = np.maximum(self._assign(torch.as_tensor(U)).mean(0).numpy(), 1e-6)

    def _assign(self, X: torch.Tensor) -> torch.Tensor:
        C = torch.as_tensor(self.codebook, dtype=X.dtype)
        sq = ((X.unsqueeze(-2) - C) ** 2).sum(-1)
        return torch.softmax(-sq / (2 * self.tau ** 2), dim=-1)

    def log_density(self, X: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\tilde\pi(u)` for unit-cube ``X (..., d)`` (floor included)."""
        scale = torch.as_tensor(self.weights / self.volumes, dtype=X.dtype)
        pi = (self._assign(X) * scale).sum(-1)
        if self.floor <= 0:
            return torch.log(pi.clamp_min(1e-300))
        return torch.log((1 - self.floor) * pi + self.floor)

    def sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` unit-cube draws from the named cells (uniform draws kept by their cell, then snapped)."""
        gen = np.random.default_rng(seed)
        U = gen.random((max(64 * n, 4096), self.codebook.shape[1]))
        nearest = np.argmin(((U[:, None, :] - self.codebook[None]) ** 2).sum(-1), axis=1)
        p = self.weights[nearest] / self.volumes[nearest]
        if not p.sum() > 0:
            return self.space.snap(U[:n])
        pick = gen.choice(len(U), size=n, p=p / p.sum())
        return self.space.snap(U[pick])

    def in_region(self, X: np.ndarray) -> np.ndarray:
        """Where the prior boosts the acquisition: inside a named cell (nearest codepoint has weight)."""
        if len(X) == 0:
            return np.zeros(0, dtype=bool)
        nearest = np.argmin(((np.asarray(X)[:, None, :] - self.codebook[None]) ** 2).sum(-1), axis=1)
        return self.weights[nearest] > 0
