r"""Uniform points of a polytope by hit-and-run, many chains at once (numpy, seeded).

The polytope is :math:`\{u \in [0,1]^d : A_{\ge} u \ge b_{\ge},\ A_= u = b_=\}`. Writing
:math:`u = u_0 + N z` with :math:`N` an orthonormal basis of the null space of :math:`A_=` and
:math:`u_0` a point of its Chebyshev ball, every constraint left is :math:`G z \le h`. One
hit-and-run step moves each chain :math:`z` along a uniform random direction :math:`v` by
:math:`t \sim U[t_-, t_+]`, the chord of the polytope through :math:`z` along :math:`v`:

.. math::
    t_+ = \min_{i:\,(Gv)_i > 0} \frac{(h - Gz)_i}{(Gv)_i}, \qquad
    t_- = \max_{i:\,(Gv)_i < 0} \frac{(h - Gz)_i}{(Gv)_i}.

The chain's stationary law is uniform on the polytope (Smith, 1984). BoTorch's
``HitAndRunPolytopeSampler`` runs one chain, a Python loop of one step per point and thinning
step (about 1 s for a 1,024-point pool in 6 dimensions); here ``chains`` chains start at the
Chebyshev centre and step together as array operations, each burnt in and then thinned.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import null_space
from scipy.optimize import linprog

#: how many chains step together (each contributes every ``thinning``-th point after its burn-in)
CHAINS = 64


def chebyshev_start(A_ge: np.ndarray, b_ge: np.ndarray, A_eq: np.ndarray, b_eq: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    r"""``(u0, N, G, h)``: the centre :math:`u_0` of the largest ball inside the polytope (within the
    equalities' affine set), the null-space basis :math:`N` and the constraints :math:`G z \le h` in
    its coordinates; ``None`` when the polytope has no interior there (a radius below 1e-9)."""
    d = A_ge.shape[1] if A_ge.size else A_eq.shape[1]
    N = null_space(A_eq) if len(A_eq) else np.eye(d)
    if N.shape[1] == 0:
        return None
    base = np.linalg.lstsq(A_eq, b_eq, rcond=None)[0] if len(A_eq) else np.zeros(d)
    G_u = np.vstack([-A_ge.reshape(-1, d), -np.eye(d), np.eye(d)])  # G_u u <= h_u
    h_u = np.concatenate([-b_ge, np.zeros(d), np.ones(d)])
    G, h = G_u @ N, h_u - G_u @ base
    keep = np.linalg.norm(G, axis=1) > 1e-12  # rows the null space cannot move (a pinned column's bound)
    if np.any(h[~keep] < -1e-9):
        return None
    G, h = G[keep], h[keep]
    k = N.shape[1]
    # maximize r subject to G z + r |G_i| <= h: the Chebyshev centre
    res = linprog(np.r_[np.zeros(k), -1.0], A_ub=np.c_[G, np.linalg.norm(G, axis=1)], b_ub=h,
                  bounds=[(None, None)] * k + [(0.0, 1.0)], method="highs")
    if res.status != 0 or res.x[-1] < 1e-9:
        return None
    z0 = res.x[:k]
    return base + N @ z0, N, G, h - G @ z0


def hit_and_run(A_ge: np.ndarray, b_ge: np.ndarray, A_eq: np.ndarray, b_eq: np.ndarray, n: int, seed: int,
                burnin: int = 200, thinning: int | None = None, chains: int = CHAINS) -> np.ndarray | None:
    """``(n, d)`` points of the polytope, or ``None`` if it has no interior to walk (see
    :func:`chebyshev_start`). ``thinning`` defaults to ``2 d + 2`` steps between kept points."""
    start = chebyshev_start(A_ge, b_ge, A_eq, b_eq)
    if start is None:
        return None
    u0, N, G, h = start
    d, k = N.shape
    thinning = thinning if thinning is not None else 2 * d + 2
    rng = np.random.default_rng(seed)
    m = max(1, min(int(n), chains))
    Z = np.zeros((m, k))
    slack = np.broadcast_to(h, (m, len(h))).copy()  # h - G z, kept up to date
    out: list[np.ndarray] = []
    rounds = -(-int(n) // m)
    for step in range(burnin + rounds * thinning):
        V = rng.standard_normal((m, k))
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        GV = V @ G.T
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = slack / GV
        hi = np.where(GV > 1e-14, ratio, np.inf).min(1)
        lo = np.where(GV < -1e-14, ratio, -np.inf).max(1)
        hi, lo = np.maximum(hi, 0.0), np.minimum(lo, 0.0)  # rounding can leave a chain a hair outside
        t = lo + (hi - lo) * rng.random(m)
        Z += t[:, None] * V
        slack -= t[:, None] * GV
        if step >= burnin and (step - burnin + 1) % thinning == 0:
            out.append(Z.copy())
    return u0 + np.concatenate(out)[:n] @ N.T
