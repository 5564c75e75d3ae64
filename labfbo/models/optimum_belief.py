r"""Where is my optimum? A site's belief over its optimum location (GUIDE-FBO §3.1, App. I).

1. :func:`candidate_set`: one shared candidate set per site-round — scrambled Sobol
   points, the observed inputs, and Gaussian perturbations (sd 0.05) of the best
   observed inputs (the paper's code uses 1000 uniform points; the extra points let a
   sample path's argmax land near the incumbent in 10-D).
2. :func:`optimum_samples`: :math:`M` posterior sample paths
   :math:`\hat f^{(m)} \sim p(f \mid \mathcal D)` — BoTorch's pathwise (Matheron) sampler
   with 500 random Fourier features on continuous spaces, joint posterior draws on the
   candidate set otherwise — and :math:`\hat x^{(m)} = \arg\max_{x \in \mathcal C}\hat f^{(m)}(x)`.
3. :func:`fit_belief`: a Dirichlet-process Gaussian mixture with diagonal covariances
   (scikit-learn's ``BayesianGaussianMixture``; truncation ``max_components``, weight
   concentration 100, mean precision 1e-3, ``reg_covar`` 1e-6 raised to 1e-5 and 1e-4
   if a fit fails, 3 initializations — the reference code's settings). Fallback when the
   samples are degenerate (fewer than two distinct points) or no fit converges: one
   diagonal Gaussian with the sample mean and variance + 1e-4.

Variances are floored at :data:`MIN_VARIANCE` (sd 0.01 of the unit cube): a component
that collapsed onto a single candidate would otherwise be a needle that guides nothing.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np
import torch
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.sampling.pathwise import draw_kernel_feature_paths, draw_matheron_paths
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from scipy.stats import qmc
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

from labfbo.models.gp import as_tensor, seeded_torch
from labfbo.space.params import choice_index
from labfbo.space.search import SearchSpace

MIN_VARIANCE = 1e-4
FALLBACK_JITTER = 1e-4


@dataclass(frozen=True)
class Belief:
    """A mixture over the optimum location: diagonal Gaussians on the ordered columns
    (continuous, integer, discrete; unit cube) times, per component, one probability vector
    per categorical column (``probs``, the vectors concatenated in column order)."""

    weights: np.ndarray    # (K,), sums to 1
    means: np.ndarray      # (K, d_o) over the ordered columns
    variances: np.ndarray  # (K, d_o)
    fallback: bool = False  # True: the single-Gaussian fallback was used
    probs: np.ndarray | None = None  # (K, sum of the categorical columns' choice counts)

    def top(self) -> int:
        """Index of the component with the largest weight."""
        return int(np.argmax(self.weights))


def choice_layout(space: SearchSpace) -> tuple[list[int], list[tuple[int, int, int]]]:
    """``(ordered columns, [(categorical column, number of choices, offset in probs)])``."""
    cats, off = [], 0
    for j, grid in sorted(space.cat_dims().items()):
        cats.append((j, len(grid), off))
        off += len(grid)
    ordered = [j for j in range(space.dim) if j not in space.cat_dims()]
    return ordered, cats


def choice_probabilities(samples: np.ndarray, resp: np.ndarray, cats: list[tuple[int, int, int]],
                         pseudo: float = 0.5) -> np.ndarray:
    r"""Per component, the (responsibility-weighted) frequency of each choice among the optimum
    samples, with a pseudo-count :math:`\alpha = 0.5` per choice (Jeffreys):
    :math:`p_{kj}(c) = (\sum_m r_{mk}[x^{(m)}_j = c] + \alpha)/(\sum_m r_{mk} + \alpha K_j)`."""
    out = np.zeros((resp.shape[1], sum(k for _, k, _ in cats)))
    for j, k, off in cats:
        idx = choice_index(samples[:, j], k)
        counts = resp.T @ np.eye(k)[idx]                                   # (K, k)
        out[:, off:off + k] = (counts + pseudo) / (counts.sum(1, keepdims=True) + pseudo * k)
    return out


def candidate_set(space: SearchSpace, X: np.ndarray, y: np.ndarray, n: int, seed: int,
                  n_best: int = 5, local_sd: float = 0.05) -> np.ndarray:
    """``n`` Sobol points + observed ``X`` + ``n // 4`` perturbations of the best inputs."""
    gen = np.random.default_rng(seed)
    m = int(np.ceil(np.log2(max(n, 2))))
    sobol = qmc.Sobol(space.dim, scramble=True, seed=gen).random_base2(m)[:n]
    parts = [sobol, X]
    if len(X):
        best = X[np.argsort(-y)[:n_best]]
        k = max(n // 4, 1)
        local = best[gen.integers(0, len(best), size=k)] + local_sd * gen.standard_normal((k, space.dim))
        parts.append(np.clip(local, 0.0, 1.0))
    pts = space.snap(np.vstack(parts))
    if len(space.discrete_dims()) + len(space.cat_dims()) == space.dim:  # a small discrete space: all of it
        grid = space.feasible_grid(max(n, 1024), seed)
        if grid is not None:
            return grid
    return pts


def optimum_samples(model: Model, candidates: np.ndarray, M: int, seed: int,
                    num_features: int = 500) -> np.ndarray:
    r"""``(M, d)`` argmaxes over ``candidates`` of ``M`` posterior sample paths
    (``num_features`` random Fourier features for the prior part of each path, Table 7)."""
    C = as_tensor(candidates)
    with seeded_torch(seed), torch.no_grad():
        if type(model) is SingleTaskGP and isinstance(model.covar_module, (RBFKernel, MaternKernel, ScaleKernel)):
            paths = draw_matheron_paths(model, sample_shape=torch.Size([M]), prior_sampler=partial(
                draw_kernel_feature_paths, num_features=num_features))
            values = paths(C)  # (M, n)
        else:  # categorical columns (a product with CategoricalKernel has no RFF): joint draws
            values = model.posterior(C).rsample(torch.Size([M])).squeeze(-1)
    return candidates[values.argmax(-1).numpy()]


def single_gaussian(samples: np.ndarray, fallback: bool = False) -> Belief:
    """One diagonal Gaussian fitted to all samples (also the ablation "single Gaussian")."""
    var = np.maximum(samples.var(axis=0) + FALLBACK_JITTER, MIN_VARIANCE)
    return Belief(np.ones(1), samples.mean(axis=0, keepdims=True), var[None, :], fallback=fallback)


def fit_belief(samples: np.ndarray, seed: int, max_components: int = 10,
               mode: Literal["dpgmm", "single_gaussian"] = "dpgmm", space: SearchSpace | None = None) -> Belief:
    """Fit the optimum-location belief to ``samples (M, d)``.

    With a ``space`` that has categorical columns, the mixture is fitted to the ordered
    columns and each component gets the choice frequencies of the samples it is responsible
    for (:func:`choice_probabilities`); with no ordered column it is one component.
    """
    if space is not None and space.cat_dims():
        ordered, cats = choice_layout(space)
        if not ordered:
            return Belief(np.ones(1), np.zeros((1, 0)), np.ones((1, 0)),
                          probs=choice_probabilities(samples, np.ones((len(samples), 1)), cats))
        base = fit_belief(samples[:, ordered], seed, max_components, mode)
        if len(base.weights) == 1:
            resp = np.ones((len(samples), 1))
        else:
            z2 = ((samples[:, None, ordered] - base.means[None]) ** 2 / base.variances[None]).sum(-1)
            logp = np.log(base.weights)[None] - 0.5 * z2 - 0.5 * np.log(base.variances).sum(-1)[None]
            resp = np.exp(logp - logp.max(1, keepdims=True))
            resp /= resp.sum(1, keepdims=True)
        return Belief(base.weights, base.means, base.variances, base.fallback,
                      probs=choice_probabilities(samples, resp, cats))
    if mode == "single_gaussian":
        return single_gaussian(samples)
    if len(np.unique(samples, axis=0)) < 2:
        return single_gaussian(samples, fallback=True)
    k = int(min(max_components, len(samples)))
    for reg in (1e-6, 1e-5, 1e-4):
        gmm = BayesianGaussianMixture(
            n_components=k, covariance_type="diag", weight_concentration_prior_type="dirichlet_process",
            weight_concentration_prior=100.0, mean_precision_prior=1e-3, reg_covar=reg, max_iter=200,
            n_init=3, random_state=int(seed % (2**32 - 1)))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                gmm.fit(samples)
        except (ValueError, np.linalg.LinAlgError):
            continue
        if not gmm.converged_:
            continue
        w = np.asarray(gmm.weights_, dtype=np.float64)
        keep = w > 0.01 / k
        keep[np.argmax(w)] = True
        w = w[keep] / w[keep].sum()
        return Belief(w, np.asarray(gmm.means_, np.float64)[keep],
                      np.maximum(np.asarray(gmm.covariances_, np.float64)[keep], MIN_VARIANCE))
    return single_gaussian(samples, fallback=True)
