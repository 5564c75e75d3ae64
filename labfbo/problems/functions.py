r"""Vectorized numpy test functions (all *minimization*) and a box-constrained minimizer.

Every function maps an ``(n, d)`` array in its natural (user-unit) domain to ``(n,)``
values and is defined on all of :math:`\mathbb{R}^d` (heterogeneous benchmark sites may
evaluate them outside the box). :data:`FUNCTIONS` maps a name to a
:class:`TestFunction` ``(fn, bounds, f_min, x_min)``; ``bounds`` and the optimum may
depend on the dimension, so they are callables of ``d``. See ``docs/problems.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from scipy.optimize import differential_evolution, minimize, minimize_scalar
from scipy.stats import qmc

Array = np.ndarray
BatchFn = Callable[[Array], Array]


# The functions BoTorch has are BoTorch's (``_botorch``). Hand-written here: Branin and Hartmann,
# whose coefficients a heterogeneous site varies (BoTorch's are fixed; tests pin ours against
# BoTorch's at the standard coefficients), Michalewicz and Powell (any d, where BoTorch's need
# their own dimension rules), and what BoTorch lacks (Wing Weight, Weierstrass, Ellipsoid,
# Sphere, Zakharov).
def _botorch(cls: str, X: Array) -> Array:
    """``botorch.test_functions.<cls>`` in ``X.shape[1]`` dimensions on an ``(n, d)`` array, anywhere
    in R^d (a heterogeneous site shifts the box; BoTorch checks points against the bounds it is given)."""
    import torch

    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    with torch.no_grad():
        return _unbounded(cls, X.shape[1]).evaluate_true(torch.as_tensor(X)).numpy()


@functools.lru_cache(maxsize=64)
def _unbounded(name: str, d: int) -> Any:
    from botorch import test_functions

    return getattr(test_functions, name)(dim=d, bounds=[(-math.inf, math.inf)] * d)

# --------------------------------------------------------------------------- classics
BRANIN_STD: dict[str, float] = dict(
    a=1.0, b=5.1 / (4 * math.pi**2), c=5 / math.pi, r=6.0, s=10.0, t=1 / (8 * math.pi))


def branin(X: Array, a: float = 1.0, b: float = BRANIN_STD["b"], c: float = BRANIN_STD["c"],
           r: float = 6.0, s: float = 10.0, t: float = BRANIN_STD["t"]) -> Array:
    r"""Branin on :math:`[-5,10]\times[0,15]`:
    :math:`a(x_2 - b x_1^2 + c x_1 - r)^2 + s(1-t)\cos x_1 + s`; f* = 0.397887."""
    X = np.atleast_2d(X)
    x1, x2 = X[:, 0], X[:, 1]
    return a * (x2 - b * x1**2 + c * x1 - r) ** 2 + s * (1 - t) * np.cos(x1) + s


HARTMANN3_A = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
HARTMANN3_P = 1e-4 * np.array([[3689.0, 1170, 2673], [4699, 4387, 7470],
                               [1091, 8732, 5547], [381, 5743, 8828]])
HARTMANN6_A = np.array([[10.0, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14],
                        [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]])
HARTMANN6_P = 1e-4 * np.array([[1312.0, 1696, 5569, 124, 8283, 5886],
                               [2329, 4135, 8307, 3736, 1004, 9991],
                               [2348, 1451, 3522, 2883, 3047, 6650],
                               [4047, 8828, 8732, 5743, 1091, 381]])
HARTMANN_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
HARTMANN3_XMIN = np.array([0.114614, 0.555649, 0.852547])
HARTMANN6_XMIN = np.array([0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573])


def _hartmann(X: Array, A: Array, P: Array, alpha: Array) -> Array:
    r""":math:`-\sum_j \alpha_j \exp(-\sum_k A_{jk}(x_k - P_{jk})^2)` on :math:`[0,1]^d`."""
    X = np.atleast_2d(X)
    inner = ((X[:, None, :] - P[None]) ** 2 * A[None]).sum(-1)  # (n, 4)
    return -(np.exp(-inner) * alpha).sum(-1)


def hartmann3(X: Array, alpha: Array = HARTMANN_ALPHA) -> Array:
    """Hartmann-3 on [0,1]^3, f* = -3.86278 at (0.114614, 0.555649, 0.852547)."""
    return _hartmann(X, HARTMANN3_A, HARTMANN3_P, np.asarray(alpha))


def hartmann6(X: Array, alpha: Array = HARTMANN_ALPHA) -> Array:
    """Hartmann-6 on [0,1]^6, f* = -3.32237 at (0.20169, 0.150011, ..., 0.6573)."""
    return _hartmann(X, HARTMANN6_A, HARTMANN6_P, np.asarray(alpha))


# Wing weight (VLSE, Forrester et al. 2008): name -> (low, high); Lambda in degrees.
WING_BOUNDS: dict[str, tuple[float, float]] = {
    "Sw": (150.0, 200.0), "Wfw": (220.0, 300.0), "A": (6.0, 10.0), "Lambda": (-10.0, 10.0),
    "q": (16.0, 45.0), "lam": (0.5, 1.0), "tc": (0.08, 0.18), "Nz": (2.5, 6.0),
    "Wdg": (1700.0, 2500.0), "Wp": (0.025, 0.08)}
WING_ORDER = ["Sw", "Wfw", "A", "Lambda", "q", "lam", "tc", "Nz", "Wdg", "Wp"]


def wing_weight(X: Array) -> Array:
    r"""Wing weight, columns in :data:`WING_ORDER`:

    .. math:: 0.036 S_w^{0.758} W_{fw}^{0.0035} (A/\cos^2\Lambda)^{0.6} q^{0.006}
              \lambda^{0.04} (100\,t_c/\cos\Lambda)^{-0.3} (N_z W_{dg})^{0.49} + S_w W_p
    """
    X = np.atleast_2d(X)
    Sw, Wfw, A, Lam, q, lam, tc, Nz, Wdg, Wp = X.T
    cl = np.cos(np.deg2rad(Lam))
    return (0.036 * Sw**0.758 * Wfw**0.0035 * (A / cl**2) ** 0.6 * q**0.006 * lam**0.04
            * (100 * tc / cl) ** -0.3 * (Nz * Wdg) ** 0.49 + Sw * Wp)


# ----------------------------------------------------------------------- GUIDE suite
def ackley(X: Array) -> Array:
    r""":math:`-20 e^{-0.2\sqrt{\bar{x^2}}} - e^{\overline{\cos 2\pi x}} + 20 + e`; 0 at 0."""
    return _botorch("Ackley", X)


def levy(X: Array) -> Array:
    r"""Levy with :math:`w = 1 + (x-1)/4`; 0 at :math:`x = 1`."""
    return _botorch("Levy", X)


def griewank(X: Array) -> Array:
    r""":math:`\sum x_i^2/4000 - \prod \cos(x_i/\sqrt i) + 1`; 0 at 0."""
    return _botorch("Griewank", X)


def rastrigin(X: Array) -> Array:
    r""":math:`10d + \sum (x_i^2 - 10\cos 2\pi x_i)`; 0 at 0."""
    return _botorch("Rastrigin", X)


_WA, _WB, _WK = 0.5, 3.0, np.arange(21)  # a, b, k = 0..kmax=20


def weierstrass(X: Array) -> Array:
    r""":math:`\sum_i\sum_{k=0}^{20} a^k\cos(2\pi b^k(x_i+\tfrac12)) - d\sum_k a^k\cos(\pi b^k)`,
    a=0.5, b=3; 0 at 0 (the offset is the same expression at x=0, so f(0)=0 exactly)."""
    X = np.atleast_2d(X)
    ak, bk = _WA**_WK, _WB**_WK
    terms = (ak * np.cos(2 * np.pi * bk * (X[..., None] + 0.5))).sum(-1).sum(-1)
    offset = X.shape[1] * (ak * np.cos(2 * np.pi * bk * 0.5)).sum()
    return terms - offset


def ellipsoid(X: Array) -> Array:
    r"""Axis-parallel hyper-ellipsoid :math:`\sum_i i\,x_i^2`; 0 at 0."""
    X = np.atleast_2d(X)
    return (np.arange(1, X.shape[1] + 1) * X**2).sum(-1)


def sphere(X: Array) -> Array:
    r""":math:`\sum x_i^2`; 0 at 0."""
    return (np.atleast_2d(X) ** 2).sum(-1)


def zakharov(X: Array) -> Array:
    r""":math:`\sum x_i^2 + S^2 + S^4`, :math:`S = \sum 0.5\,i\,x_i`; 0 at 0."""
    X = np.atleast_2d(X)
    S = (0.5 * np.arange(1, X.shape[1] + 1) * X).sum(-1)
    return (X**2).sum(-1) + S**2 + S**4


def rosenbrock(X: Array) -> Array:
    r""":math:`\sum_{i<d} 100(x_{i+1}-x_i^2)^2 + (x_i-1)^2`; 0 at 1."""
    return _botorch("Rosenbrock", X)


def michalewicz(X: Array, m: int = 10) -> Array:
    r""":math:`-\sum_i \sin x_i \sin^{2m}(i x_i^2/\pi)`, m=10; f* = -9.66015 at d=10."""
    X = np.atleast_2d(X)
    i = np.arange(1, X.shape[1] + 1)
    return -(np.sin(X) * np.sin(i * X**2 / np.pi) ** (2 * m)).sum(-1)


def powell(X: Array) -> Array:
    r"""Powell on blocks of 4 (the last ``d mod 4`` coordinates are ignored):
    :math:`(x_1+10x_2)^2 + 5(x_3-x_4)^2 + (x_2-2x_3)^4 + 10(x_1-x_4)^4`; 0 at 0."""
    X = np.atleast_2d(X)
    k = X.shape[1] // 4
    B = X[:, : 4 * k].reshape(len(X), k, 4)
    a, b, c, e = B[..., 0], B[..., 1], B[..., 2], B[..., 3]
    return ((a + 10 * b) ** 2 + 5 * (c - e) ** 2 + (b - 2 * c) ** 4 + 10 * (a - e) ** 4).sum(-1)


def styblinski_tang(X: Array) -> Array:
    r""":math:`\tfrac12\sum (x_i^4 - 16x_i^2 + 5x_i)`; f* = -39.16617 d at x_i = -2.903534."""
    return _botorch("StyblinskiTang", X)


# ------------------------------------------------------------------ exact 1-D optima
def _min_1d(g: Callable[[Array], Array], lo: float, hi: float, n: int = 100_001) -> tuple[float, float]:
    """Global minimum of a scalar function on [lo, hi]: dense grid + bounded Brent."""
    grid = np.linspace(lo, hi, n)
    vals = g(grid)
    j = int(vals.argmin())
    dx = (hi - lo) / (n - 1)
    res = minimize_scalar(lambda t: float(g(np.array([t]))[0]),
                          bounds=(max(lo, grid[j] - dx), min(hi, grid[j] + dx)),
                          method="bounded", options={"xatol": 1e-12})
    if res.fun < vals[j]:
        return float(res.x), float(res.fun)
    return float(grid[j]), float(vals[j])


@functools.lru_cache(maxsize=None)
def _michalewicz_opt(d: int) -> tuple[tuple[float, ...], float]:
    """Michalewicz is separable: minimize each coordinate's term on [0, pi]."""
    xs, fs = [], []
    for i in range(1, d + 1):
        x, f = _min_1d(lambda t, i=i: -np.sin(t) * np.sin(i * t**2 / np.pi) ** 20, 0.0, math.pi)
        xs.append(x)
        fs.append(f)
    x = np.array(xs)
    return tuple(xs), float(michalewicz(x[None])[0])


@functools.lru_cache(maxsize=None)
def _styblinski_x() -> float:
    return _min_1d(lambda t: 0.5 * (t**4 - 16 * t**2 + 5 * t), -5.0, 5.0)[0]


@dataclass(frozen=True)
class TestFunction:
    """A registered test function: ``fn``, ``bounds(d) -> (d, 2)``, ``f_min(d)``, ``x_min(d)``."""

    fn: BatchFn
    bounds: Callable[[int], Array]
    f_min: Callable[[int], float]
    x_min: Callable[[int], Array]
    dim: int | None = None  # fixed dimension, or None if any d works


def _box(lo: float, hi: float) -> Callable[[int], Array]:
    return lambda d: np.tile([lo, hi], (d, 1)).astype(float)


def _const(v: float) -> Callable[[int], float]:
    return lambda d: float(v)


def _point(v: float) -> Callable[[int], Array]:
    return lambda d: np.full(d, float(v))


FUNCTIONS: dict[str, TestFunction] = {
    "branin": TestFunction(branin, lambda d: np.array([[-5.0, 10.0], [0.0, 15.0]]),
                           _const(0.39788735772973816), lambda d: np.array([math.pi, 2.275]), 2),
    "hartmann3": TestFunction(hartmann3, _box(0, 1), _const(-3.8627797873327) , lambda d: HARTMANN3_XMIN, 3),
    "hartmann6": TestFunction(hartmann6, _box(0, 1), _const(-3.3223680114155), lambda d: HARTMANN6_XMIN, 6),
    "ackley": TestFunction(ackley, _box(-32.768, 32.768), _const(0.0), _point(0.0)),
    "levy": TestFunction(levy, _box(-10, 10), _const(0.0), _point(1.0)),
    "griewank": TestFunction(griewank, _box(-600, 600), _const(0.0), _point(0.0)),
    "rastrigin": TestFunction(rastrigin, _box(-5.12, 5.12), _const(0.0), _point(0.0)),
    "weierstrass": TestFunction(weierstrass, _box(-0.5, 0.5), _const(0.0), _point(0.0)),
    "ellipsoid": TestFunction(ellipsoid, _box(-5.12, 5.12), _const(0.0), _point(0.0)),
    "sphere": TestFunction(sphere, _box(-5, 5), _const(0.0), _point(0.0)),
    "zakharov": TestFunction(zakharov, _box(-5, 5), _const(0.0), _point(0.0)),
    "rosenbrock": TestFunction(rosenbrock, _box(-2.048, 2.048), _const(0.0), _point(1.0)),
    "michalewicz": TestFunction(michalewicz, _box(0, math.pi), lambda d: _michalewicz_opt(d)[1],
                                lambda d: np.array(_michalewicz_opt(d)[0])),
    "powell": TestFunction(powell, _box(-5, 5), _const(0.0), _point(0.0)),
    "styblinski_tang": TestFunction(
        styblinski_tang, _box(-5, 5),
        lambda d: float(styblinski_tang(np.full((1, d), _styblinski_x()))[0]),
        lambda d: np.full(d, _styblinski_x())),
}
"""name -> :class:`TestFunction`. Wing weight is not listed (its optimum depends on the
operating conditions; see :mod:`labfbo.problems.families`)."""


# ------------------------------------------------------------------------ minimizer
def minimize_in_box(fn: BatchFn, bounds: Array, *, seed: int = 0, n_raw: int = 4096,
                    n_starts: int = 64, extra_starts: Sequence[Array] | None = None,
                    n_polish: int = 4, global_search: bool = False) -> tuple[Array, float]:
    """Global minimum of a vectorized ``fn`` on a box (numerically; an upper bound).

    Scrambled Sobol design of ``n_raw`` points; the ``n_starts`` best plus
    ``extra_starts`` (clipped to the box) are refined jointly by L-BFGS-B (batched
    central finite-difference gradients in unit coordinates); with ``global_search`` the
    result of a seeded differential evolution joins them. The ``n_polish`` best are
    then polished one by one. Returns ``(x, f(x))``, ``x`` inside the box.
    """
    bounds = np.asarray(bounds, dtype=float)
    lo, width = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    d = len(lo)

    def f_unit(U: Array) -> Array:
        return fn(lo + U * width)

    eye = 1e-7 * np.eye(d)

    def value_grad(flat: Array) -> tuple[float, Array]:
        U = flat.reshape(-1, d)
        P = np.concatenate([U[:, None, :], U[:, None, :] + eye, U[:, None, :] - eye], 1)
        v = f_unit(P.reshape(-1, d)).reshape(len(U), 2 * d + 1)
        g = (v[:, 1:d + 1] - v[:, d + 1:]) / 2e-7
        return float(v[:, 0].sum()), g.ravel()

    U0 = qmc.Sobol(d, scramble=True, seed=seed).random(n_raw)
    v0 = f_unit(U0)
    starts = U0[np.argsort(v0)[:n_starts]]
    if extra_starts is not None and len(extra_starts):
        E = np.clip((np.atleast_2d(np.asarray(extra_starts, float)) - lo) / width, 0, 1)
        starts = np.vstack([E, starts])
    box = [(0.0, 1.0)] * (len(starts) * d)
    res = minimize(value_grad, starts.ravel(), jac=True, method="L-BFGS-B", bounds=box,
                   options=dict(maxiter=500, ftol=1e-15, gtol=1e-10))
    cand = np.vstack([np.clip(res.x.reshape(-1, d), 0, 1), starts])
    if global_search:
        de = differential_evolution(lambda U: f_unit(U.T), [(0.0, 1.0)] * d, vectorized=True,
                                    updating="deferred", seed=seed, maxiter=600, popsize=30,
                                    tol=1e-6, polish=False, init="sobol")
        cand = np.vstack([np.clip(de.x, 0, 1)[None], cand])
    cv = f_unit(cand)
    best_u, best_v = cand[int(cv.argmin())], float(cv.min())
    for u in cand[np.argsort(cv)[:n_polish]]:
        r = minimize(value_grad, u, jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * d,
                     options=dict(maxiter=1000, ftol=1e-15, gtol=1e-12))
        uu = np.clip(r.x, 0, 1)
        vv = float(f_unit(uu[None])[0])
        if vv < best_v:
            best_u, best_v = uu, vv
    x = np.clip(lo + best_u * width, bounds[:, 0], bounds[:, 1])
    return x, float(fn(x[None])[0])
