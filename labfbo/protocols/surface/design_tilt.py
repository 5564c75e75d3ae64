r"""The Gram of a consortium's experiments from the sums of their features alone.

Under ``DP(unit="experiment")`` ``surface`` does not release its members' Gram :math:`\sum_i \phi(x_i)\phi(x_i)^\top`
(one experiment moves every pair count it holds); it releases, noised, the features' *sums*
:math:`s = \sum_i \tilde\phi(x_i)` (:math:`\tilde\phi`: the features without the constant; the Gram's
constant row), and the others estimate the Gram as that of the maximum-entropy design that matches them.

Over the points :math:`u_1..u_M` of a uniform design of the space (:func:`design_points`), with target
mean :math:`\tilde m = s/N` and its noise std :math:`\tau` per entry, the design's weights solve

.. math:: \min_w\ \mathrm{KL}(w\,\Vert\,\mathcal U) + \frac{\lVert \textstyle\sum_u w_u\tilde\phi(u) - \tilde
          m\rVert^2}{2\gamma},
          \qquad \gamma = \max(\tau^2, \gamma_0),

whose solution is the exponential tilt :math:`w_u \propto \exp(\theta^\top\tilde\phi(u))`, :math:`\theta`
the minimizer of the convex dual

.. math:: f(\theta) = \log\sum_u e^{\theta^\top\tilde\phi(u)} - \theta^\top\tilde m +
          \tfrac{\gamma}{2}\lVert\theta\rVert^2,
          \qquad \nabla f = E_w[\tilde\phi] - \tilde m + \gamma\theta

(scipy's ``trust-exact``, with the Hessian :math:`\mathrm{Cov}_w(\tilde\phi) + \gamma I`). The estimate is :math:`\hat G
= N\sum_u w_u\,\phi(u)\phi(u)^\top`. A mismatch of one
standard error costs half a nat, so a noisy sum moves the design little; with one-hot blocks alone the
tilt is the design whose reagents are drawn independently with the released counts as marginals
(the counts of each choice are exact, the counts of pairs of choices their product over :math:`N`).
Without a target (:math:`N = 0`) or at :math:`\theta = 0` it is the uniform design's Gram.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax

GAMMA_FLOOR = 1e-4
"""gamma_0: the least tolerance on the mean's mismatch (a choice no experiment used keeps a small weight)."""

__all__ = ["GAMMA_FLOOR", "LastTilt", "tilt_weights", "tilted_gram"]


def tilt_weights(Phi: np.ndarray, target: np.ndarray, noise_sd: float = 0.0) -> np.ndarray:
    r"""The weights :math:`w` (``(M,)``, summing to 1) of the design points' features ``Phi (M, q)``
    (the constant left out) whose mean matches ``target (q,)`` up to its noise std per entry."""
    Phi = np.asarray(Phi, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    gamma = max(float(noise_sd) ** 2, GAMMA_FLOOR)

    def dual(theta: np.ndarray) -> tuple[float, np.ndarray]:
        a = Phi @ theta
        w = softmax(a)
        value = float(logsumexp(a) - theta @ target + 0.5 * gamma * theta @ theta)
        return value, Phi.T @ w - target + gamma * theta

    def hessian(theta: np.ndarray) -> np.ndarray:  # Cov_w(phi) + gamma I
        w = softmax(Phi @ theta)
        mean = Phi.T @ w
        return (Phi.T * w) @ Phi - np.outer(mean, mean) + gamma * np.eye(Phi.shape[1])

    theta = minimize(dual, np.zeros(Phi.shape[1]), jac=True, hess=hessian, method="trust-exact",
                     options={"gtol": 1e-10, "maxiter": 200}).x
    return softmax(Phi @ theta)


def tilted_gram(Phi: np.ndarray, count: float, sums: np.ndarray, noise_sd: float = 0.0) -> np.ndarray:
    r""":math:`\hat G = N\sum_u w_u\phi(u)\phi(u)^\top` for the design points' features ``Phi (M, p)`` (the
    constant first), ``count`` :math:`N` experiments and the noised sums ``sums (p - 1,)`` of their other
    features, each with noise std ``noise_sd`` (:func:`tilt_weights` at the mean ``sums / N``)."""
    Phi = np.asarray(Phi, dtype=np.float64)
    if count <= 0:
        return np.zeros((Phi.shape[1], Phi.shape[1]))
    w = tilt_weights(Phi[:, 1:], np.asarray(sums, dtype=np.float64) / count, noise_sd / count)
    return count * (Phi.T * w) @ Phi


class LastTilt:
    """:func:`tilted_gram`, computed again only when asked with other sums, count or noise (a site reuses
    one sum for several rounds)."""

    def __init__(self) -> None:
        self._last: tuple[bytes, np.ndarray] | None = None

    def __call__(self, Phi: np.ndarray, count: float, sums: np.ndarray, noise_sd: float = 0.0) -> np.ndarray:
        key = np.asarray(sums, dtype=np.float64).tobytes() + np.array([count, noise_sd, len(Phi)]).tobytes()
        if self._last is None or self._last[0] != key:
            self._last = (key, tilted_gram(Phi, count, sums, noise_sd))
        return self._last[1]
