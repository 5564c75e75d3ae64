r"""Differential privacy of the `distribution` uplink (GUIDE-FBO leaves it as future work).

A site's belief :math:`(\pi, \mu, \sigma_{1..d}, v)` — the weight, centre and standard
deviations of its top mixture component and its value score — is mapped to the unit cube
:math:`[0, 1]^{2d+2}`, one coordinate per scalar, after clipping each to a fixed range:

* :math:`\pi \in [0, 1]`, :math:`\mu \in [0, 1]^d` (model coordinates) as they are;
* :math:`\sigma_j \in [\sigma_{\min}, \sigma_{\max}] = [0.01, 0.5]`, scaled to [0, 1];
* :math:`v \in [-C, C]` (``DP.clip`` bounds the standardized value score), scaled to [0, 1].

Neighbouring datasets differ in the site's whole dataset (task level, as for
`gradient`), which may move every coordinate across its range, so the :math:`\ell_2`
sensitivity is the cube's diameter :math:`\Delta = \sqrt{2d + 2}`. The Gaussian
mechanism adds :math:`\mathcal N(0, (\sigma_{\rm DP}\Delta)^2)` to every coordinate; the
result is clipped back to the cube and mapped back (post-processing). One release per BO
round: a unit-sensitivity Gaussian with multiplier :math:`\sigma_{\rm DP}`, composed over
rounds by the same PLD accountant as `gradient` (the release ``DistributionSite`` declares).

**Centre only** (``DistributionOptions(dp_belief="centre")``, :func:`privatize_centre`). The
site releases only :math:`\mu \in [0, 1]^{d_o}` (and, on categorical columns, the choice
probabilities, one simplex of :math:`\ell_2` diameter :math:`\sqrt 2` each), so

.. math:: \Delta_{\rm centre} = \sqrt{d_o + 2 d_c} \quad (= \sqrt d \text{ on a continuous space}),

against :math:`\sqrt{2d_o + 2d_c + 2}` for the full belief; at the same noise multiplier
(the same epsilon) the noise std per coordinate :math:`\sigma_{\rm DP}\Delta` is smaller.
Weight, standard deviations and value travel as the public constants :data:`CENTRE_WEIGHT`,
:data:`CENTRE_SD` and :data:`CENTRE_VALUE` (no function of the data, so no release).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from labfbo.privacy.dp import DP
from labfbo.privacy.noise import gaussian

SD_MIN, SD_MAX = 0.01, 0.5
CENTRE_WEIGHT, CENTRE_SD, CENTRE_VALUE = 1.0, 0.1, 0.0
"""``dp_belief="centre"``: the public weight, standard deviation (model units) and value score sent
with the noised centre; the coordinator's aggregate is then the unweighted mixture of the centres."""


def sensitivity(dim: int) -> float:
    """:math:`\\Delta = \\sqrt{2d + 2}`: the diameter of the normalized belief's cube."""
    return math.sqrt(2 * dim + 2)


def centre_sensitivity(n_ordered: int, cats: Sequence[tuple[int, int, int]] = ()) -> float:
    """:math:`\\Delta = \\sqrt{d_o + 2 d_c}`: the centre's cube and the choice simplices together."""
    return math.sqrt(n_ordered + 2 * len(cats))


def to_unit(weight: float, mean: np.ndarray, variance: np.ndarray, value: float, clip: float) -> np.ndarray:
    """The belief as a point of :math:`[0, 1]^{2d+2}` (each scalar clipped to its range first)."""
    sd = np.clip(np.sqrt(np.asarray(variance, dtype=float)), SD_MIN, SD_MAX)
    return np.clip(np.concatenate([[weight], np.asarray(mean, dtype=float), (sd - SD_MIN) / (SD_MAX - SD_MIN),
                                   [(value + clip) / (2 * clip)]]), 0.0, 1.0)


def from_unit(z: np.ndarray, clip: float) -> tuple[float, np.ndarray, np.ndarray, float]:
    """Inverse of :func:`to_unit` on the clipped cube: ``(weight, mean, variance, value)``."""
    z = np.clip(np.asarray(z, dtype=float), 0.0, 1.0)
    d = (len(z) - 2) // 2
    sd = SD_MIN + z[1 + d:1 + 2 * d] * (SD_MAX - SD_MIN)
    weight = max(float(z[0]), 1e-6)  # a message's weight must be > 0
    return weight, z[1:1 + d], sd ** 2, float(z[-1] * 2 * clip - clip)


def privatize_belief(weight: float, mean: np.ndarray, variance: np.ndarray, value: float, dp: DP,
                     rng: np.random.Generator, probs: np.ndarray | None = None,
                     cats: Sequence[tuple[int, int, int]] = ()
                     ) -> tuple[float, np.ndarray, np.ndarray, float, np.ndarray | None]:
    r"""The Gaussian mechanism on the normalized belief; returns the released ``(weight, mean,
    variance, value, probs)``.

    ``probs`` (the categorical columns' choice probabilities, layout ``cats``) join the
    released vector as they are; each is a point of a simplex, whose :math:`\ell_2` diameter
    is :math:`\sqrt 2`, so with :math:`d_o` ordered and :math:`d_c` categorical columns the
    sensitivity is :math:`\sqrt{2d_o + 2 + 2d_c} = \sqrt{2d + 2}` as on a continuous space.
    After the noise each vector is clipped to :math:`[10^{-6}, 1]` and renormalized
    (post-processing).
    """
    d = len(mean) + len(cats)
    z = to_unit(weight, mean, variance, value, dp.clip)
    p = np.zeros(0) if probs is None else np.asarray(probs, dtype=float)
    if dp.sigma:
        scale = dp.sigma * sensitivity(d)
        z = gaussian(z, scale, rng)
        if len(p):
            p = gaussian(p, scale, rng)
    w, mu, var, v = from_unit(z, dp.clip)
    if probs is None:
        return w, mu, var, v, None
    p = np.clip(p, 1e-6, 1.0)
    for _, k, off in cats:
        p[off:off + k] /= p[off:off + k].sum()
    return w, mu, var, v, p


def privatize_centre(mean: np.ndarray, dp: DP, rng: np.random.Generator, probs: np.ndarray | None = None,
                     cats: Sequence[tuple[int, int, int]] = ()) -> tuple[np.ndarray, np.ndarray | None]:
    r"""The Gaussian mechanism on the centre alone; returns the released ``(mean, probs)``.

    :math:`\mu` clipped to :math:`[0, 1]^{d_o}` and the choice probabilities get
    :math:`\mathcal N(0, (\sigma_{\rm DP}\Delta)^2)` per coordinate with
    :math:`\Delta = \sqrt{d_o + 2d_c}` (:func:`centre_sensitivity`); then :math:`\mu` is
    clipped back to the cube and each probability vector to :math:`[10^{-6}, 1]` and
    renormalized (post-processing).
    """
    mu = np.clip(np.asarray(mean, dtype=float), 0.0, 1.0)
    p = np.zeros(0) if probs is None else np.asarray(probs, dtype=float)
    if dp.sigma:
        scale = dp.sigma * centre_sensitivity(len(mu), cats)
        mu = np.clip(gaussian(mu, scale, rng), 0.0, 1.0)
        if len(p):
            p = gaussian(p, scale, rng)
    if probs is None:
        return mu, None
    p = np.clip(p, 1e-6, 1.0)
    for _, k, off in cats:
        p[off:off + k] /= p[off:off + k].sum()
    return mu, p
