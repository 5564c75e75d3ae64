r"""k-ary randomized response: one choice among :math:`k` public options, :math:`\varepsilon`-DP.

A site holding a choice :math:`i \in \{0, \dots, k-1\}` (e.g. the codebook cell it believes
its optimum lies in) reports

.. math:: P(\text{report } i) = \frac{e^{\varepsilon}}{e^{\varepsilon} + k - 1}, \qquad
          P(\text{report } j \ne i) = \frac{1}{e^{\varepsilon} + k - 1},

so any two inputs give output distributions within a factor :math:`e^{\varepsilon}`: pure
:math:`\varepsilon`-DP for *any* two inputs, whatever they are computed from — hence under
labfbo's task-level relation too (a site's whole dataset replaced). Equivalently it keeps the
input with probability :math:`1 - p` and otherwise reports a uniform draw over all :math:`k`
options, :math:`p = k / (e^{\varepsilon} + k - 1)`: dp-accounting's
``RandomizedResponseDpEvent(p, k)``, which its PLD accountant composes under the
replace-one relation (:func:`labfbo.privacy.dp.composed_epsilon`).

For one release at small budgets this is far more accurate than a Gaussian mechanism on a
one-hot vector: at :math:`\varepsilon = 2,\ \delta = 10^{-5}` the Gaussian needs noise
twice its sensitivity, while randomized response over 8 options is truthful 51 % of the time.
"""

from __future__ import annotations

import math

import numpy as np


def keep_probability(epsilon: float, k: int) -> float:
    r""":math:`e^{\varepsilon} / (e^{\varepsilon} + k - 1)`: how often the true choice is reported."""
    if k < 2:
        raise ValueError(f"randomized response needs at least 2 options, got {k}")
    if math.isinf(epsilon):
        return 1.0
    return 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))


def noise_parameter(epsilon: float, k: int) -> float:
    r""":math:`p = k / (e^{\varepsilon} + k - 1)`, the probability of a uniform report (dp-accounting's form)."""
    return k * (1.0 - keep_probability(epsilon, k)) / (k - 1)


def epsilon_of(noise: float, k: int) -> float:
    r"""The :math:`\varepsilon` of randomized response with noise parameter ``noise`` over ``k`` options."""
    if noise <= 0:
        return math.inf
    return math.log1p(k * (1.0 - noise) / noise)


def respond(choice: int, k: int, epsilon: float, rng: np.random.Generator) -> int:
    """The reported choice: ``choice`` with :func:`keep_probability`, else one of the other ``k - 1`` uniformly."""
    if not 0 <= choice < k:
        raise ValueError(f"choice {choice} is not one of {k} options")
    if rng.random() < keep_probability(epsilon, k):
        return int(choice)
    other = int(rng.integers(0, k - 1))
    return other + (other >= choice)
