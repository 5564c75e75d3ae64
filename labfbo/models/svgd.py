r"""Stein variational gradient descent (SVGD) directions for a set of particles (float64).

For particles :math:`\phi_1..\phi_K` and the scores :math:`s_k = \nabla \ln p(\phi_k)` of the
target, the SVGD direction of Liu & Wang (2016), used by PACOH and PACD-BO (Sec. III-B), is

.. math:: \psi(\phi_k) = \frac1K \sum_{k'} \big[k(\phi_{k'}, \phi_k)\, s_{k'}
          + \nabla_{\phi_{k'}} k(\phi_{k'}, \phi_k)\big],
          \qquad k(a, b) = \exp\!\big(-\|a - b\|^2 / (2h^2)\big).

The first term drives the particles up the target density, the second repels them from
each other. With the **median heuristic** (``bandwidth=None``, the PACOH reference
default) :math:`h^2 = \mathrm{med}_{i<j}\|\phi_i - \phi_j\|^2 / (2\ln(K+1))`, so a pair
at the median distance has kernel value :math:`1/(K+1)`. The median is taken over the
:math:`K(K-1)/2` distinct pairs (linear interpolation between the two middle values for
an even count); with a single particle, or coinciding particles, :math:`h = 1` (the
repulsion vanishes then anyway).

Everything is a pure function of ``(particles, score)``: no optimizer state, so a
coordinator that sums the sites' scores gets exactly the centralized update.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from labfbo.models.gp import DTYPE


def median_bandwidth(particles: Tensor) -> float:
    """The median-heuristic bandwidth :math:`h` of the RBF kernel on ``particles (K, P)``."""
    phi = particles.detach().to(DTYPE)
    K = phi.shape[0]
    if K < 2:
        return 1.0
    iu = torch.triu_indices(K, K, offset=1)
    d2 = ((phi[:, None, :] - phi[None, :, :]) ** 2).sum(-1)[iu[0], iu[1]]
    med = float(torch.quantile(d2, 0.5))
    if not math.isfinite(med) or med <= 0.0:
        return 1.0
    return math.sqrt(med / (2.0 * math.log(K + 1.0)))


def svgd_direction(particles: Tensor, score: Tensor, bandwidth: float | None = None) -> Tensor:
    r"""The SVGD direction :math:`\psi` ``(K, P)`` for ``particles (K, P)`` and their
    target scores ``score (K, P)``; ``bandwidth`` :math:`h` or ``None`` (median heuristic).

    With ``K = 1`` the direction is the score itself (gradient ascent on the target).
    """
    phi = particles.detach().to(DTYPE)
    s = score.detach().to(DTYPE)
    if phi.ndim != 2 or s.shape != phi.shape:
        raise ValueError(f"particles {tuple(phi.shape)} and score {tuple(s.shape)} must both be (K, P)")
    K = phi.shape[0]
    h = median_bandwidth(phi) if bandwidth is None else float(bandwidth)
    if not h > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    d2 = ((phi[:, None, :] - phi[None, :, :]) ** 2).sum(-1)        # (K, K), exact zeros on the diagonal
    kmat = torch.exp(-d2 / (2.0 * h * h))                           # symmetric
    drive = kmat @ s                                                # sum_k' k(k', k) s_k'
    # sum_k' grad_{phi_k'} k(phi_k', phi_k) = sum_k' k(k', k) (phi_k - phi_k') / h^2
    repulse = (kmat.sum(1, keepdim=True) * phi - kmat @ phi) / (h * h)
    return (drive + repulse) / K
