r"""Ready-made heterogeneous federated benchmarks: :func:`get_problem`, :func:`list_problems`.

Every problem is a minimization over a box of ``Real`` parameters. Site ``i``'s random
task parameters come from ``numpy.random.default_rng(SeedSequence([seed,
stable_hash(name), i, ...]))``, so a problem is a deterministic function of
``(name, n_sites, heterogeneity, seed)`` and site ``i`` does not depend on ``n_sites``.
``heterogeneity`` scales the *same* draws (0, or GUIDE level 1, gives identical sites).

``problem.metadata`` holds ``batch`` (vectorized ``(n, d) -> (n,)`` site functions in
user units, columns in the space's parameter order), ``optimizers`` (each site's
minimizer, user units), ``exact`` (whether ``optima[i]`` is known in closed form rather
than computed numerically), ``site_params`` and the arguments. Definitions and how
optima are computed: ``docs/problems.md``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from labfbo.core.exceptions import ConfigurationError
from labfbo.problems.functions import (
    BRANIN_STD,
    FUNCTIONS,
    HARTMANN3_XMIN,
    HARTMANN6_XMIN,
    HARTMANN_ALPHA,
    WING_BOUNDS,
    WING_ORDER,
    BatchFn,
    _min_1d,
    branin,
    hartmann3,
    hartmann6,
    minimize_in_box,
    wing_weight,
)
from labfbo.problems.guide_functions import GUIDE_NAMES, guide_site
from labfbo.problems.problem import FederatedProblem
from labfbo.space.search import Real, SearchSpace

Array = np.ndarray


def stable_hash(name: str) -> int:
    """A process-independent 64-bit hash of ``name`` (first 8 bytes of SHA-256)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def site_rng(name: str, seed: int, site: int, *extra: int) -> np.random.Generator:
    """The generator of site ``site``'s task parameters."""
    return np.random.default_rng(np.random.SeedSequence([seed, stable_hash(name), site, *extra]))


@dataclass(frozen=True)
class DictObjective:
    """Adapts a vectorized site function to ``params dict -> float`` (picklable)."""

    batch: BatchFn
    names: tuple[str, ...]

    def __call__(self, params: dict[str, Any]) -> float:
        x = np.array([[float(params[n]) for n in self.names]])
        return float(self.batch(x)[0])


# ----------------------------------------------------------------- site functions
@dataclass(frozen=True)
class Sinusoid:
    r""":math:`f(x) = -e^{-x}\sin(2\pi w x)` on [0, 1]."""

    w: float

    def __call__(self, X: Array) -> Array:
        x = np.atleast_2d(X)[:, 0]
        return -np.exp(-x) * np.sin(2 * np.pi * self.w * x)


@dataclass(frozen=True)
class BraninTask:
    """Branin with task parameters ``a, b, c, r, s, t``."""

    a: float
    b: float
    c: float
    r: float
    s: float
    t: float

    def __call__(self, X: Array) -> Array:
        return branin(X, self.a, self.b, self.c, self.r, self.s, self.t)


@dataclass(frozen=True)
class HartmannTask:
    """Hartmann-3/6 with a perturbed weight vector ``alpha``."""

    dim: int
    alpha: tuple[float, ...]

    def __call__(self, X: Array) -> Array:
        f = hartmann3 if self.dim == 3 else hartmann6
        return f(X, np.asarray(self.alpha))


WING_DESIGN = ["Sw", "A", "Lambda", "lam", "tc", "Wp"]
WING_CONDITIONS = ["Wfw", "q", "Nz", "Wdg"]


@dataclass(frozen=True)
class WingTask:
    """Wing weight over the 6 design variables at fixed operating conditions."""

    Wfw: float
    q: float
    Nz: float
    Wdg: float

    def __call__(self, X: Array) -> Array:
        X = np.atleast_2d(X)
        cols = dict(zip(WING_DESIGN, X.T))
        cols.update({k: np.full(len(X), getattr(self, k)) for k in WING_CONDITIONS})
        return wing_weight(np.stack([cols[k] for k in WING_ORDER], axis=1))


# ----------------------------------------------------------------------- builders
Site = tuple[BatchFn, float, Array, bool, dict[str, Any]]  # fn, f*, x*, exact, params


def _real_space(bounds: Array, names: Sequence[str] | None = None) -> SearchSpace:
    names = names or [f"x{j + 1}" for j in range(len(bounds))]
    return SearchSpace([Real(n, float(lo), float(hi)) for n, (lo, hi) in zip(names, bounds)])


def _sinusoid(name: str, i: int, h: float, seed: int) -> Site:
    """w_i = 3 exp(0.25 h eps_i), eps_i ~ N(0, 1); optimum by grid (1e5) + Brent."""
    w = 3.0 * math.exp(0.25 * h * site_rng(name, seed, i).standard_normal())
    fn = Sinusoid(w)
    x, v = _min_1d(lambda t: fn(t[:, None]), 0.0, 1.0)
    return fn, v, np.array([x]), False, {"w": w}


_BRANIN_FAMILY = dict(a=(0.5, 1.5), b=(0.1, 0.15), c=(1.0, 2.0), r=(5.0, 7.0),
                      s=(8.0, 12.0), t=(0.03, 0.05))
_BRANIN_BOUNDS = np.array([[-5.0, 10.0], [0.0, 15.0]])


def _branin_opt(fn: BatchFn) -> tuple[Array, float]:
    g = np.linspace(0, 1, 201)
    G = _BRANIN_BOUNDS[:, 0] + np.stack(np.meshgrid(g, g), -1).reshape(-1, 2) * 15.0
    best = G[np.argsort(fn(G))[:16]]
    return minimize_in_box(fn, _BRANIN_BOUNDS, n_raw=256, n_starts=16, extra_starts=best)


def _branin(name: str, i: int, h: float, seed: int) -> Site:
    """branin: p = p_std (1 + 0.1 h u), u ~ U[-1, 1] for b, c, r, s, t (a = 1).
    branin_family: p = mid + h (U - mid), U ~ U[range] for all six (see _BRANIN_FAMILY)."""
    u = site_rng(name, seed, i).uniform(-1.0, 1.0, size=6)
    if name == "branin":
        p = {k: BRANIN_STD[k] * (1 + 0.1 * h * uk) for k, uk in zip("abcrst", u)}
        p["a"] = 1.0
    else:
        p = {k: (lo + hi) / 2 + h * uk * (hi - lo) / 2
             for (k, (lo, hi)), uk in zip(_BRANIN_FAMILY.items(), u)}
    fn = BraninTask(**p)
    x, v = _branin_opt(fn)
    return fn, v, x, False, p


def _hartmann(name: str, i: int, h: float, seed: int) -> Site:
    """alpha_i = alpha (1 + 0.1 h eps), eps ~ N(0, I_4); optimum numerically."""
    d = 3 if name == "hartmann3" else 6
    alpha = HARTMANN_ALPHA * (1 + 0.1 * h * site_rng(name, seed, i).standard_normal(4))
    fn = HartmannTask(d, tuple(float(a) for a in alpha))
    x0 = HARTMANN3_XMIN if d == 3 else HARTMANN6_XMIN
    x, v = minimize_in_box(fn, np.tile([0.0, 1.0], (d, 1)), extra_starts=[x0])
    return fn, v, x, False, {"alpha": list(fn.alpha)}


def _wing(name: str, i: int, h: float, seed: int) -> Site:
    """Conditions = mid + h (U - mid), U ~ uniform on each range; optimum numerically."""
    if not 0.0 <= h <= 1.0:
        raise ConfigurationError(f"wing_weight heterogeneity must be in [0, 1], got {h}")
    rng = site_rng(name, seed, i)
    cond = {}
    for k in WING_CONDITIONS:
        lo, hi = WING_BOUNDS[k]
        cond[k] = float((lo + hi) / 2 + h * (rng.uniform(lo, hi) - (lo + hi) / 2))
    fn = WingTask(**cond)
    bounds = np.array([WING_BOUNDS[k] for k in WING_DESIGN])
    # analytic minimizer (every factor is monotone except cos(Lambda)^-0.9): a start
    x0 = np.array([150.0, 6.0, 0.0, 0.5, 0.18, 0.025])
    x, v = minimize_in_box(fn, bounds, n_raw=1024, n_starts=16, extra_starts=[x0])
    return fn, v, x, False, cond


def _wing_space() -> SearchSpace:
    return _real_space(np.array([WING_BOUNDS[k] for k in WING_DESIGN]), WING_DESIGN)


@functools.lru_cache(maxsize=1024)
def _guide_cached(name: str, d: int, level: int, seed: int, i: int) -> Site:
    """GUIDE site ``i`` (cached: numerical optima at level 3 take seconds)."""
    fn, v, x, exact = guide_site(name, d, level, site_rng(name, seed, i, d))
    x.setflags(write=False)
    return fn, v, x, exact, {"shift": fn.shift.tolist(), "rotation": fn.rotation.tolist()}


# --------------------------------------------------------------------- registry
_Builder = Callable[[str, int, float, int], Site]
_SIMPLE: dict[str, tuple[_Builder, float, Callable[[], SearchSpace]]] = {
    "sinusoid": (_sinusoid, 1.0, lambda: _real_space(np.array([[0.0, 1.0]]))),
    "branin": (_branin, 1.0, lambda: _real_space(_BRANIN_BOUNDS)),
    "branin_family": (_branin, 1.0, lambda: _real_space(_BRANIN_BOUNDS)),
    "hartmann3": (_hartmann, 1.0, lambda: _real_space(np.tile([0.0, 1.0], (3, 1)))),
    "hartmann6": (_hartmann, 1.0, lambda: _real_space(np.tile([0.0, 1.0], (6, 1)))),
    "wing_weight": (_wing, 1.0, _wing_space),
}


def list_problems() -> list[str]:
    """Names accepted by :func:`get_problem`."""
    return [*_SIMPLE, *GUIDE_NAMES]


def get_problem(name: str, n_sites: int = 5, heterogeneity: float | None = None,
                seed: int = 0, *, dim: int | None = None,
                noise_std: float = 0.0) -> FederatedProblem:
    """Build the federated benchmark ``name`` with ``n_sites`` heterogeneous sites.

    Args:
        name: one of :func:`list_problems`.
        n_sites: number of sites (>= 1).
        heterogeneity: spread of the site tasks; default 1.0, or level 2 for the GUIDE
            functions (levels 1, 2, 3). 0 (GUIDE: 1) makes all sites identical.
        seed: seed of the site draws (the problem is deterministic given its arguments).
        dim: dimension of a GUIDE function (default 10); not allowed for the others.
        noise_std: observation noise passed to :class:`FederatedProblem`.
    """
    if n_sites < 1:
        raise ConfigurationError(f"n_sites must be >= 1, got {n_sites}")
    if name in _SIMPLE:
        if dim is not None:
            raise ConfigurationError(f"problem {name!r} has a fixed dimension; dim= is for GUIDE functions")
        builder, default_h, make_space = _SIMPLE[name]
        h = default_h if heterogeneity is None else float(heterogeneity)
        if h < 0:
            raise ConfigurationError(f"heterogeneity must be >= 0, got {h}")
        sites = [builder(name, i, h, seed) for i in range(n_sites)]
        space: SearchSpace = make_space()
        hval: float | int = h
    elif name in GUIDE_NAMES:
        d = 10 if dim is None else int(dim)
        if d < (4 if name == "powell" else 2):
            raise ConfigurationError(f"{name} needs dim >= {4 if name == 'powell' else 2}, got {d}")
        level = 2 if heterogeneity is None else heterogeneity
        if level not in (1, 2, 3):
            raise ConfigurationError(f"GUIDE heterogeneity must be a level 1, 2 or 3, got {level!r}")
        hval = int(level)
        sites = [_guide_cached(name, d, hval, seed, i) for i in range(n_sites)]
        space = _real_space(FUNCTIONS[name].bounds(d))
    else:
        raise ConfigurationError(f"unknown problem {name!r}; available: {list_problems()}")

    names = tuple(space.names)
    batch = [s[0] for s in sites]
    return FederatedProblem(
        space=space,
        objectives=[DictObjective(fn, names) for fn in batch],
        optima=[float(s[1]) for s in sites],
        objective="minimize",
        noise_std=noise_std,
        name=name,
        metadata={"batch": batch, "optimizers": [np.array(s[2], float) for s in sites],
                  "exact": [bool(s[3]) for s in sites], "site_params": [dict(s[4]) for s in sites],
                  "heterogeneity": hval, "seed": seed, "n_sites": n_sites},
    )
