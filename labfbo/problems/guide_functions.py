r"""GUIDE-style heterogeneous sites: shifted and rotated copies of a base function.

Site :math:`n` evaluates

.. math:: f_n(x) = f\big(c + R_n (x - c - z_n)\big),

with :math:`c` the centre of the box :math:`[l, u]^d`,
:math:`z_n \sim \mathcal{N}(0, \sigma_z^2 I)`,
:math:`\sigma_z = \delta_{\mathrm{shift}} \lVert u - l\rVert_2/\sqrt d` and
:math:`R_n = \exp(\delta_{\mathrm{rot}} H_n / \lVert H_n\rVert_2)`,
:math:`H_n = A_n - A_n^\top`, :math:`(A_n)_{jk} \sim \mathcal{N}(0,1)` iid. The
eigenvalues of the skew matrix :math:`H_n/\lVert H_n\rVert_2` are :math:`\pm i\theta_k`
with :math:`\max\theta_k = 1`, so :math:`R_n` is a proper rotation whose *largest*
rotation angle is exactly :math:`\delta_{\mathrm{rot}}` radians.

Levels: 1 -> (0, 0) (identical sites), 2 -> (0.05, 0.1), 3 -> (0.3, 1.0).

The base minimizer :math:`x^*` maps to :math:`x_n^* = c + z_n + R_n^\top (x^* - c)`. If it
lies in the box, :math:`f_n^* = f^*`; otherwise :math:`f_n^*` is found numerically by
:func:`~labfbo.problems.functions.minimize_in_box` (seeded with the clipped
:math:`x_n^*`), an upper bound on the true box minimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import expm

from labfbo.problems.functions import FUNCTIONS, BatchFn, minimize_in_box

GUIDE_NAMES: tuple[str, ...] = (
    "ackley", "levy", "griewank", "rastrigin", "weierstrass", "ellipsoid", "sphere",
    "zakharov", "rosenbrock", "michalewicz", "powell", "styblinski_tang")
GUIDE_LEVELS: dict[int, tuple[float, float]] = {1: (0.0, 0.0), 2: (0.05, 0.1), 3: (0.3, 1.0)}
# Functions whose (near-)optimal local minima sit on a lattice ``offset + period * Z^d``
# in base coordinates. For Weierstrass (b = 3 odd) every lattice point is a global
# minimum (f = 0), so a lattice point mapped into the box gives the exact optimum.
_LATTICE: dict[str, tuple[float, float]] = {
    "weierstrass": (1.0, 0.0), "rastrigin": (1.0, 0.0), "ackley": (1.0, 0.0), "levy": (4.0, 1.0)}
_EXACT_ON_LATTICE = {"weierstrass"}
_CONVEX = {"sphere", "ellipsoid", "zakharov", "powell"}  # local search suffices


@dataclass(frozen=True)
class TransformedFunction:
    """Vectorized ``X (n, d) -> fn(c + (X - c - shift) @ R.T)`` (picklable)."""

    fn: BatchFn
    center: np.ndarray
    shift: np.ndarray
    rotation: np.ndarray

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        return self.fn(self.center + (X - self.center - self.shift) @ self.rotation.T)


def random_rotation(rng: np.random.Generator, d: int, angle: float) -> np.ndarray:
    r""":math:`\exp(\theta H/\lVert H\rVert_2)`, :math:`H = A - A^\top`, A iid N(0,1)."""
    if angle == 0.0 or d == 1:
        return np.eye(d)
    A = rng.standard_normal((d, d))
    H = A - A.T
    return expm(angle * H / np.linalg.norm(H, 2))


def guide_site(name: str, d: int, level: int, rng: np.random.Generator,
               seed: int = 0) -> tuple[TransformedFunction, float, np.ndarray, bool]:
    """One site of GUIDE function ``name`` at ``level``.

    Returns ``(f_n, f*_n, x*_n, exact)``; ``exact`` is False when the optimum was
    computed numerically because the mapped base minimizer left the box.
    """
    if level not in GUIDE_LEVELS:
        raise ValueError(f"GUIDE heterogeneity level must be 1, 2 or 3, got {level!r}")
    tf = FUNCTIONS[name]
    bounds = tf.bounds(d)
    lo, hi = bounds[:, 0], bounds[:, 1]
    c = (lo + hi) / 2
    d_shift, d_rot = GUIDE_LEVELS[level]
    sigma = d_shift * np.linalg.norm(hi - lo) / np.sqrt(d)
    # draw both always so a site's rotation does not depend on whether it is shifted
    z = sigma * rng.standard_normal(d)
    R = random_rotation(rng, d, d_rot) if d_rot > 0 else np.eye(d)
    f_n = TransformedFunction(tf.fn, c, z, R)
    x_star = c + z + R.T @ (tf.x_min(d) - c)
    if np.all(x_star >= lo) and np.all(x_star <= hi):
        return f_n, tf.f_min(d), x_star, True
    starts = [x_star]
    if name in _LATTICE:
        lat = lattice_points(f_n, bounds, *_LATTICE[name])
        if len(lat):
            vals = f_n(lat)
            j = int(vals.argmin())
            if name in _EXACT_ON_LATTICE:
                return f_n, tf.f_min(d), lat[j], True
            starts += list(lat[np.argsort(vals)[:64]])
    x, v = minimize_in_box(f_n, bounds, seed=seed, extra_starts=starts,
                           global_search=name not in _CONVEX)
    return f_n, v, x, False


def lattice_points(f_n: TransformedFunction, bounds: np.ndarray, period: float,
                   offset: float, n: int = 100_000) -> np.ndarray:
    """Pre-images in the box of base points ``offset + period * m`` (m integer).

    Candidates are the lattice points nearest to the images of ``n`` uniform points of
    the box (fixed seed); returns those whose pre-image lies inside the box.
    """
    lo, hi = bounds[:, 0], bounds[:, 1]
    c, z, R = f_n.center, f_n.shift, f_n.rotation
    U = lo + np.random.default_rng(12345).random((n, len(lo))) * (hi - lo)
    Y = c + (U - c - z) @ R.T
    M = np.unique(np.round((Y - offset) / period), axis=0)
    X = c + z + (offset + period * M - c) @ R  # x = c + z + R^T (y - c), row form
    return X[np.all((X >= lo) & (X <= hi), axis=1)]
