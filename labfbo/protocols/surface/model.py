r"""A shared response surface: features, federated ridge regression, and the GP mean that uses it.

**Features.** On the model's inputs (:class:`~labfbo.models.encoding.FeatureMap`: unit-cube
codes, descriptors where a categorical has them) the response-surface features are

.. math:: \phi(x) = \big(1,\ \text{one-hot}(c_1), \dots,\ \text{descriptors}(c_\cdot),\
          u_1, \dots, u_{d_o},\ u_1^2, \dots, u_{d_o}^2,\ u_j u_k\ (j < k),\
          \sqrt{2/F}\cos(\omega_l^\top u + b_l)\ (l \le F)\big),

main effects of every categorical choice and a full quadratic in the :math:`d_o` ordered
(real, integer, discrete) columns — the response-surface model of process chemistry
(design of experiments) — plus :math:`F` random Fourier features of the ordered columns
(:math:`\omega_l \sim \mathcal N(0, I/\ell^2)`, :math:`b_l \sim U(0, 2\pi)`, drawn from the
space's fingerprint, so every party with the same space has the same basis; scaled by
:math:`\sqrt{2/F}` so that, under the ridge's unit prior on the weights, they add up to an RBF
kernel of unit variance on the standardized values — unscaled, their prior variance was
:math:`F/2` and the surface overfit the others' points in 6-D), with
:math:`p = 1 + \sum k_c + \sum m_c + 2 d_o + d_o(d_o-1)/2 + F` coefficients. Every feature
lies in [-1, 1], so :math:`\lVert\phi\rVert^2 \le P` with :math:`P` = the number of
non-one-hot, non-Fourier features + the number of one-hot blocks + 2 (the Fourier block).

**Sufficient statistics.** A site with values :math:`y` standardizes them,
:math:`z = (y - \bar y)/s_y` (so sites whose yields differ in scale share the surface's
*shape*), and its ridge statistics are the per-observation averages
:math:`\bar G = \Phi^\top\Phi/n` and :math:`\bar h = \Phi^\top z/n`. The coefficients
learned from other sites' statistics are

.. math:: w = \Big(\sum_j n_j \bar G_j + \lambda I\Big)^{-1} \sum_j n_j \bar h_j

(the sum's matrix made positive semi-definite first, which only matters after DP noise).

**Under DP** (:func:`private_statistics`) the values are clipped to :math:`[-C, C]` and both
averages get the Gaussian mechanism, its sensitivity by the unit protected: the site's whole
dataset (:func:`dp_sensitivity`), or one experiment (``DP(unit="experiment")``: the values are
then centred ranks in :math:`[-C, C]`, :func:`rank_scores`, and :func:`experiment_sensitivity`
is :math:`O(1/n)`).

**The mean.** A site's GP has the prior mean :math:`m(x) = a + c\,\phi(x)^\top w` on its
standardized scale, with :math:`a` and the *agreement* :math:`c \sim \mathcal N(c_0, s_c^2)`
fitted by the marginal likelihood with the kernel.

How far a site trusts the surface is :math:`c`: data that contradict it pull :math:`c`
towards 0 (with 12 observations and a surface of the opposite sign, MAP :math:`c` = 0.37,
against 0.99 for the true one). A leave-one-out guard (use the surface only while it
predicts the site's held-out observations as well as the plain GP) was measured and
dropped: with 3–8 observations it rejected helpful surfaces (the reaction labs,
``docs/benchmarks/reactions.md``).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
import torch
from botorch.models.model import Model
from gpytorch.means import Mean
from gpytorch.priors import NormalPrior
from torch import Tensor

from labfbo.core.records import TransferEstimate
from labfbo.core.seeding import rng
from labfbo.models.encoding import FeatureMap
from labfbo.models.transfer import held_out_gain
from labfbo.privacy.dp import DP, Unit
from labfbo.privacy.noise import gaussian
from labfbo.space.params import choice_index
from labfbo.space.search import Categorical, SearchSpace

DTYPE = torch.float64


class SurfaceFeatures:
    r"""Model inputs ``(..., n_out)`` -> response-surface features ``(..., p)`` (torch, float64)."""

    def __init__(self, space: SearchSpace, fourier: int = 0, lengthscale: float = 0.2) -> None:
        self.fmap = FeatureMap(space)
        self.onehot: list[tuple[int, int]] = []   # (model column, number of choices)
        self.linear: list[int] = []               # descriptor columns: main effects only
        self.ordered: list[int] = []              # real / integer / discrete columns: full quadratic
        for j, p in enumerate(space.params):
            lo, hi = self.fmap.slices[j]
            if isinstance(p, Categorical) and p.descriptors is None:
                self.onehot.append((lo, len(p.choices)))
            elif isinstance(p, Categorical):
                self.linear.extend(range(lo, hi))
            else:
                self.ordered.append(lo)
        d_o = len(self.ordered)
        self.pairs = [(a, b) for i, a in enumerate(self.ordered) for b in self.ordered[i + 1:]]
        m = fourier if d_o else 0
        # a function of the study's space alone (not of a lab's stock): every lab draws the same basis
        self.fingerprint = space.shared().fingerprint()
        gen = rng(int(self.fingerprint[:15], 16), 0, 0, "surface-fourier-basis")
        self.omega = torch.as_tensor(gen.normal(0.0, 1.0 / lengthscale, (d_o, m)), dtype=DTYPE)
        self.phase = torch.as_tensor(gen.uniform(0.0, 2 * math.pi, m), dtype=DTYPE)
        #: the Fourier features' amplitude sqrt(2/F) (Rahimi & Recht): with unit-variance weights their sum
        #: is an RBF kernel of unit variance, whatever F (capped at 1, so every feature stays in [-1, 1])
        self.fourier_scale = min(1.0, math.sqrt(2.0 / m)) if m else 0.0
        self.p = 1 + sum(k for _, k in self.onehot) + len(self.linear) + 2 * d_o + len(self.pairs) + m
        #: a bound on ||phi(x)||^2: every feature is in [-1, 1], a one-hot block adds 1, the Fourier block
        #: at most F (2/F) = 2
        self.norm_bound = float(1 + len(self.onehot) + len(self.linear) + 2 * d_o + len(self.pairs)
                                + m * self.fourier_scale ** 2)

    def __call__(self, Z: Tensor) -> Tensor:
        parts = [torch.ones_like(Z[..., :1])]
        for col, k in self.onehot:
            parts.append(torch.nn.functional.one_hot(choice_index(Z[..., col].detach(), k), k).to(Z))
        if self.linear:
            parts.append(Z[..., self.linear])
        if self.ordered:
            U = Z[..., self.ordered]
            parts += [U, U ** 2]
        if self.pairs:
            parts.append(torch.stack([Z[..., a] * Z[..., b] for a, b in self.pairs], dim=-1))
        if self.omega.shape[1]:
            parts.append(self.fourier_scale * torch.cos(Z[..., self.ordered] @ self.omega.to(Z) + self.phase.to(Z)))
        return torch.cat(parts, dim=-1)

    def of_unit(self, X: np.ndarray) -> np.ndarray:
        """Features of unit-cube points ``(n, d)`` (as the sites' statistics use them)."""
        Z = self.fmap(torch.as_tensor(np.asarray(X, dtype=np.float64), dtype=DTYPE))
        return self(Z).numpy()

    @functools.cached_property
    def shares(self) -> np.ndarray:
        """Per feature, the share of a uniform design's experiments it carries: 1/k for each choice of a
        one-hot block of k, 1 for every other feature (the constant first, as :meth:`__call__` orders them)."""
        blocks = [np.full(k, 1.0 / k) for _, k in self.onehot]
        return np.concatenate([[1.0], *blocks, np.ones(self.p - 1 - sum(k for _, k in self.onehot))])

    @functools.cached_property
    def design(self) -> np.ndarray:
        """:func:`design_points` of these features (computed once)."""
        return design_points(self)


def upper(G: np.ndarray) -> np.ndarray:
    """The upper triangle (with the diagonal) of a symmetric matrix, row by row."""
    return G[np.triu_indices(G.shape[0])]


def symmetric(packed: np.ndarray, p: int) -> np.ndarray:
    """Inverse of :func:`upper`."""
    G = np.zeros((p, p))
    G[np.triu_indices(p)] = packed
    return G + np.triu(G, 1).T


def packed_size(p: int) -> int:
    return p * (p + 1) // 2


def standardized(y: np.ndarray) -> np.ndarray:
    """``(y - mean) / sd`` with the sample standard deviation (ddof 1), as BoTorch's ``Standardize``."""
    sd = float(np.std(y, ddof=1)) if len(y) > 1 else 0.0
    return (y - np.mean(y)) / (sd if sd > 0 else 1.0)


def rank_scores(y: np.ndarray, clip: float) -> np.ndarray:
    r"""The values' centred ranks scaled to :math:`[-C, C]`: :math:`z_i = C\,(2 r_i - n - 1)/(n - 1)`,
    :math:`r_i \in [1, n]` the mid-rank of :math:`y_i` (ties share their mean rank); all 0 for ``n < 2``.

    The standardization of ``unit="experiment"``: replacing one value moves every other
    :math:`r_i` by at most 1, so every other :math:`z_i` by at most :math:`2C/(n-1)`, whatever the
    values (a mean and a standard deviation, by contrast, move without bound with one value, and
    with them every standardized value: see :func:`experiment_sensitivity`)."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if n < 2:
        return np.zeros(n)
    ordered = np.sort(y)
    below = np.searchsorted(ordered, y, side="left")   # values strictly below y_i
    ties = np.searchsorted(ordered, y, side="right") - below
    ranks = below + (ties + 1) / 2.0
    return clip * (2.0 * ranks - n - 1.0) / (n - 1.0)


def _per_outcome(y: np.ndarray, transform: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``transform`` of the values ``y (n,)``, or of each column of ``y (n, m)`` on its own."""
    Y = np.asarray(y, dtype=np.float64)
    return np.stack([transform(col) for col in Y.T], axis=1) if Y.ndim == 2 else transform(Y)


def site_statistics(Phi: np.ndarray, y: np.ndarray, clip: float | None = None,
                    unit: Unit = "site") -> tuple[np.ndarray, np.ndarray]:
    r"""``(upper(G/n), h/n)`` of a site's features ``Phi (n, p)`` and values ``y (n,)``; with
    ``clip`` the standardized values are clipped to :math:`[-C, C]` first. Several outcomes,
    ``y (n, m)``: each column standardized on its own, ``h/n`` of shape ``(m, p)``.
    ``unit="experiment"`` (needs ``clip``): the values are :func:`rank_scores` instead."""
    transform: Callable[[np.ndarray], np.ndarray] = standardized
    if unit == "experiment":
        if clip is None:
            raise ValueError("unit='experiment' standardizes by ranks scaled to [-C, C]: give clip")
        transform = functools.partial(rank_scores, clip=clip)
    Z = _per_outcome(y, transform)
    if clip is not None:
        Z = np.clip(Z, -clip, clip)
    n = Z.shape[0]
    return upper(Phi.T @ Phi) / n, (Phi.T @ Z).T / n


def dp_sensitivity(norm_bound: float, clip: float, outcomes: int = 1, unit: Unit = "site",
                   count: int | None = None) -> float:
    r""":math:`\ell_2` sensitivity of ``(upper(\bar G), \bar h_1, \dots, \bar h_m)`` when the site's
    whole dataset may change (task level): :math:`\lVert\bar G\rVert_F \le P` and each
    :math:`\lVert\bar h_j\rVert \le C\sqrt P`, so :math:`\Delta = 2\sqrt{P^2 + m C^2 P}`
    (:math:`m` = ``outcomes``, one moment per modelled outcome). ``unit="experiment"`` with the
    site's ``count`` :math:`n`: :func:`experiment_sensitivity` (without a count, the task level's,
    which bounds it)."""
    if unit == "experiment" and count is not None:
        return experiment_sensitivity(norm_bound, clip, count, outcomes)
    return 2.0 * math.sqrt(norm_bound ** 2 + outcomes * clip ** 2 * norm_bound)


def experiment_sensitivity(norm_bound: float, clip: float, count: int, outcomes: int = 1) -> float:
    r""":math:`\ell_2` sensitivity of ``(upper(\bar G), \bar h_1..\bar h_m)`` when one experiment —
    its features' row :math:`\phi_k` and its results — is replaced (``unit="experiment"``), the
    values being :func:`rank_scores` and the count :math:`n` public (it is sent in the clear):

    .. math:: \Delta_e = \frac1n\sqrt{2P^2 + 16\,m\,C^2 P}.

    *Gram.* :math:`n\,\Delta\bar G = \phi'\phi'^\top - \phi\phi^\top`, and
    :math:`\lVert aa^\top - bb^\top\rVert_F^2 = \lVert a\rVert^4 + \lVert b\rVert^4 - 2(a^\top b)^2
    \le 2P^2` (:math:`\lVert\phi\rVert^2 \le P`); the upper triangle has at most that norm.

    *Moment.* :math:`n\,\Delta\bar h = \phi' z'_k - \phi z_k + \sum_{i\ne k}\phi_i\,\Delta z_i`.
    The first two terms have norm :math:`\le 2C\sqrt P`. Each other rank moves by at most 1, so
    :math:`|\Delta z_i| \le 2C/(n-1)` over the :math:`n-1` others: the sum has norm
    :math:`\le \sqrt P\,(n-1)\,2C/(n-1) = 2C\sqrt P`. So :math:`\lVert\Delta\bar h_j\rVert \le 4C\sqrt P/n`
    for each of the :math:`m` outcomes.

    Against the task level's :math:`2\sqrt{P^2 + mC^2P}` this is about :math:`0.7/n` of it (``P``
    much larger than :math:`C^2`). With values standardized by their own mean and standard
    deviation no such bound exists: one result far out shrinks every other standardized value
    towards 0, an :math:`O(1)` change of every :math:`z_i` (tested)."""
    if isinstance(count, bool) or int(count) != count or count < 2:
        raise ValueError(f"the experiment-level sensitivity needs the site's count n >= 2, got {count!r}")
    return math.sqrt(2.0 * norm_bound ** 2 + 16.0 * outcomes * clip ** 2 * norm_bound) / count


def privatize_statistics(gram: np.ndarray, moment: np.ndarray, dp: DP, norm_bound: float,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The Gaussian mechanism on the averaged statistics at the task level's sensitivity (std
    ``noise_multiplier * sensitivity``): a valid guarantee for either unit; :func:`private_statistics`
    is the one that lowers the noise under ``unit="experiment"``."""
    scale = dp.sigma * dp_sensitivity(norm_bound, dp.clip, 1 if moment.ndim == 1 else moment.shape[0])
    return _noised(gram, moment, scale, rng)


def _noised(gram: np.ndarray, moment: np.ndarray, scale: float,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if scale == 0:
        return gram, moment
    return gaussian(gram, scale, rng), gaussian(moment, scale, rng)


def private_statistics(Phi: np.ndarray, y: np.ndarray, dp: DP, norm_bound: float,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    r"""A site's statistics under ``dp``, in its unit: ``(upper(G/n) + noise, h/n + noise, Delta)``,
    the Gaussian mechanism of std ``dp.sigma * Delta`` on both, ``Delta`` the l2 sensitivity to state.

    ``unit="site"``: values standardized by the site's mean and std, clipped to :math:`[-C, C]`,
    :math:`\Delta` = :func:`dp_sensitivity` (exactly :func:`site_statistics` then :func:`privatize_statistics`).
    ``unit="experiment"``: values by :func:`rank_scores` in :math:`[-C, C]`,
    :math:`\Delta` = :func:`experiment_sensitivity` at the site's count (public)."""
    Y = np.asarray(y, dtype=np.float64)
    m = 1 if Y.ndim == 1 else Y.shape[1]
    gram, moment = site_statistics(Phi, Y, dp.clip, dp.unit)
    delta = dp_sensitivity(norm_bound, dp.clip, m, dp.unit, len(Y))
    gram, moment = _noised(gram, moment, dp.sigma * delta, rng)
    return gram, moment, delta


def ranked_moments(Phi: np.ndarray, y: np.ndarray, clip: float) -> np.ndarray:
    r"""The moment *sums* :math:`h = \Phi^\top z` of the values' centred ranks :math:`z` in :math:`[-C, C]`
    (:func:`rank_scores`, each outcome on its own): ``(p,)``, or ``(m, p)`` for ``y (n, m)``. Their
    constant feature's entry is :math:`\sum_i z_i = 0` whatever the values (mid-ranks keep their sum)."""
    return (Phi.T @ _per_outcome(y, functools.partial(rank_scores, clip=clip))).T


def ranked_sum_sensitivity(norm_bound: float, clip: float, outcomes: int = 1) -> float:
    r""":math:`\ell_2` sensitivity of the experiment-level release :math:`(h, C s)` — the moment sums of
    :func:`ranked_moments` and :math:`C` times the features' sums :math:`s = \sum_i\tilde\phi(x_i)` — when one
    experiment, its setting and its results, is replaced (``unit="experiment"``; the count is public):

    .. math:: \Delta_\Sigma = 2C\sqrt{(P - 1)(4m + 1)},

    independent of the count, so each member of a secure sum can add its *share* of the noise.
    Let :math:`\tilde\phi` be the features without the constant (:math:`\lVert\tilde\phi\rVert^2
    \le P - 1`); the constant's entry of :math:`h` never moves (:math:`\sum_i z_i = 0`). Replacing experiment
    :math:`k`: :math:`\Delta h = \tilde\phi'_k z'_k - \tilde\phi_k z_k + \sum_{i\ne k}\tilde\phi_i\,\Delta z_i`.
    The first two terms have norm at most :math:`2C\sqrt{P-1}`; every other mid-rank moves by at most 1
    (one value leaves, one arrives), so :math:`|\Delta z_i| \le 2C/(n-1)` over the :math:`n - 1` others
    and the sum has norm at most :math:`2C\sqrt{P-1}`: per outcome :math:`4C\sqrt{P-1}`, the :math:`m`
    outcomes stacked :math:`\sqrt m` times that. :math:`C\Delta s = C(\tilde\phi'_k - \tilde\phi_k)` has
    norm at most :math:`2C\sqrt{P-1}`; the two in quadrature (tested on random datasets with ties)."""
    return 2.0 * clip * math.sqrt(max(norm_bound - 1.0, 0.0) * (4.0 * outcomes + 1.0))


def feature_sums(Phi: np.ndarray) -> np.ndarray:
    r""":math:`s = \sum_i\tilde\phi(x_i)`, the sums of the features but the constant (the Gram's constant
    row; for a one-hot block the count of each choice): what ``surface``'s experiment-level release tells
    of the design (:mod:`labfbo.protocols.surface.design_tilt`)."""
    return np.asarray(Phi, dtype=np.float64)[:, 1:].sum(axis=0)


def design_points(features: "SurfaceFeatures", points: int = 4096) -> np.ndarray:
    r"""The features ``(points, p)`` of a uniform design over the space's unit cube (a scrambled Sobol
    sequence, seeded by the space: the same at every site). A function of the space alone: under
    ``surface``'s experiment-level release the others' Gram is this design's, tilted to the released
    sums of their features (:func:`labfbo.protocols.surface.design_tilt.tilted_gram`)."""
    from scipy.stats import qmc

    seed = int(features.fingerprint[:15], 16)
    return features.of_unit(qmc.Sobol(features.fmap.d, scramble=True, seed=seed).random(points))


def ridge_weights(G: np.ndarray, h: np.ndarray, ridge: float) -> np.ndarray:
    r""":math:`w = (G_+ + \lambda I)^{-1} h`, :math:`G_+` the PSD part of the symmetric ``G``;
    ``h (m, p)`` (one moment per outcome) gives ``w (m, p)``."""
    return _spectral(G, h, lambda g: 1.0 / (g + ridge))


def _spectral(G: np.ndarray, h: np.ndarray, gain: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """:math:`V\\,\\mathrm{diag}(\\mathrm{gain}(g))\\,V^\top h`, :math:`G = V\\,\\mathrm{diag}(g)\\,V^\top` the
    symmetric ``G`` with its eigenvalues clipped at 0; ``h (m, p)`` gives ``(m, p)``."""
    vals, vecs = np.linalg.eigh(0.5 * (G + G.T))
    H = np.atleast_2d(h).T
    W = vecs @ ((vecs.T @ H) * gain(np.clip(vals, 0.0, None))[:, None])
    return W.T.reshape(np.shape(h))


def noisy_ridge_weights(G: np.ndarray, h: np.ndarray, ridge: float, noise_sd: float, value_var: float) -> np.ndarray:
    r"""The posterior mean of the coefficients when the moments carry DP noise of std ``noise_sd`` per
    entry (a Wiener filter): with :math:`z = \phi^\top w + \varepsilon`, :math:`\varepsilon \sim
    \mathcal N(0, s^2)` (``value_var`` :math:`= s^2`), the moment sum is :math:`\tilde h = Gw +
    \Phi^\top\varepsilon + e`, so :math:`\tilde h \mid w \sim \mathcal N(Gw,\ s^2 G + \sigma_n^2 I)`;
    under the ridge's prior :math:`w \sim \mathcal N(0, (s^2/\lambda) I)`, in the eigenbasis
    :math:`G = V\,\mathrm{diag}(g)\,V^\top`,

    .. math:: (V^\top w)_j = \frac{g_j\,(V^\top\tilde h)_j / (s^2 g_j + \sigma_n^2)}
                                   {g_j^2 / (s^2 g_j + \sigma_n^2) + \lambda / s^2}.

    Without noise this is :func:`ridge_weights`; a direction the design covers little (small
    :math:`g_j`: a choice among many) shrinks to 0 as the noise grows, instead of taking the
    noise as signal. ``h (m, p)`` gives ``w (m, p)``."""
    if noise_sd <= 0:
        return ridge_weights(G, h, ridge)

    def gain(g: np.ndarray) -> np.ndarray:
        den = value_var * g + noise_sd ** 2
        return (g / den) / (g ** 2 / den + ridge / value_var)

    return _spectral(G, h, gain)


def guarded_noisy_weights(G: np.ndarray, h: np.ndarray, ridge: float, noise_sd: float, value_var: float,
                          shares: np.ndarray, count: int, guard: float) -> np.ndarray | None:
    r""":func:`noisy_ridge_weights` on the features whose moment the noise does not swamp: feature
    :math:`j` is kept while ``noise_sd`` :math:`\le` ``guard`` :math:`\cdot\, N s_j`, :math:`s_j` its
    share of the experiments (``shares``: :math:`1/k` for a choice among :math:`k`), so :math:`N s_j`
    is about how many of the others' :math:`N` experiments enter its moment; the others' coefficients
    are 0. A reagent with three choices is read long before one of 23 additives. None if no feature
    but the constant is kept."""
    keep = noise_sd <= guard * max(count, 1) * np.asarray(shares)
    keep[0] = True
    if not keep[1:].any():
        return None
    H = np.atleast_2d(h)
    W = np.zeros_like(H)
    W[:, keep] = noisy_ridge_weights(G[np.ix_(keep, keep)], H[:, keep], ridge, noise_sd, value_var)
    return W.reshape(np.shape(h))


class SurfaceMean(Mean):
    r""":math:`m(x) = a + c\,\phi(x)^\top w`: a constant and an agreement scale :math:`c`, both
    hyper-parameters of the GP (:math:`c` with a normal prior); :math:`w` is fixed."""

    def __init__(self, features: SurfaceFeatures, weights: np.ndarray, scale_mean: float = 1.0,
                 scale_sd: float = 0.3) -> None:
        super().__init__()
        self.features = features
        self.register_buffer("weights", torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=DTYPE))
        self.register_parameter("constant", torch.nn.Parameter(torch.zeros(1, dtype=DTYPE)))
        self.register_parameter("scale", torch.nn.Parameter(torch.full((1,), float(scale_mean), dtype=DTYPE)))
        self.register_prior("scale_prior", NormalPrior(torch.tensor(float(scale_mean), dtype=DTYPE),
                                                       torch.tensor(float(scale_sd), dtype=DTYPE)), "scale")

    def surface(self, x: Tensor) -> Tensor:
        return self.features(x) @ self.weights

    def forward(self, x: Tensor) -> Tensor:
        return self.constant + self.scale * self.surface(x)


def surface_transfer(model: Model) -> TransferEstimate | None:
    """What a GP whose prior mean is a :class:`SurfaceMean` is worth to the lab
    (:func:`~labfbo.models.transfer.held_out_gain`), with the surface at the lab's inputs for the agreement."""
    partners = model.mean_module.surface(model.train_inputs[0]).detach()
    return held_out_gain(model, float(model.mean_module.scale.detach()), partners)
