r"""Ranking-weighted GP ensemble (RGPE; Feurer, Letham, Hutter & Bakshy 2018).

A site combines base models — its own GP :math:`f_t` and the other sites' posteriors
:math:`f_j` (as sample functions, :mod:`labfbo.models.rff`) — into

.. math:: \bar\mu(x) = \sum_i w_i\,\mu_i(x), \qquad
          \bar k(x, x') = \sum_i w_i^2\,k_i(x, x'),

with the weight of a model the probability that it ranks the site's **own** observations
best. For a sample function :math:`f` the ranking loss counts the misordered pairs,

.. math:: L(f) = \sum_{i \ne k} \mathbb 1\big[(f(x_i) < f(x_k)) \oplus (y_i < y_k)\big];

a peer's loss is computed on its sample functions, the site's own on leave-one-out draws
(:math:`f_t^{-i}` trained without observation :math:`i` judges the pairs :math:`(i, k)`),
so its own model is not credited for fitting what it was trained on. Over :math:`S` joint
draws, :math:`w_i = \Pr[i = \arg\min_j L_j]` (ties split at random). **Weight dilution
prevention**: a peer whose median loss exceeds the 95th percentile of the site's own
loss is dropped — a partner whose response orders this lab's experiments worse than
its own model does gets no say, which is what protects a lab from harmful partners.
Peers enter in the site's units: their standardized values times the site's
:math:`\hat\sigma_y`, plus :math:`\bar y`.
"""

from __future__ import annotations

import numpy as np
import torch
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator


def ranking_losses(F: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Misordered ordered pairs of each draw: ``F (S, n)`` values at the observations -> ``(S,)``."""
    obs = y[:, None] < y[None, :]
    return ((F[:, :, None] < F[:, None, :]) ^ obs[None]).sum(axis=(1, 2))


def loo_losses(model: Model, n_samples: int, gen: np.random.Generator) -> np.ndarray:
    r"""``(S,)`` ranking losses of the site's own GP from leave-one-out draws: for each
    observation :math:`i`, a joint draw of :math:`f^{-i}` at all observations (posterior of
    the GP conditioned on the others, at the fitted hyper-parameters, standardized scale);
    draw :math:`s`'s loss sums the ordered pairs :math:`(i, k)` judged by :math:`f^{-i}_s` (as many
    pairs as a peer's loss counts)."""
    with torch.no_grad():
        Xt = model.train_inputs[0]
        y = model.train_targets.numpy()
        n = len(y)
        K = model.covar_module(Xt).to_dense().numpy()
        noise = np.broadcast_to(model.likelihood.noise.reshape(-1).numpy(), (n,))
        c = float(model.mean_module.constant)
    obs = y[:, None] < y[None, :]
    losses = np.zeros(n_samples)
    for i in range(n):
        o = np.delete(np.arange(n), i)
        Koo = K[np.ix_(o, o)] + np.diag(noise[o])
        L = np.linalg.cholesky(Koo + 1e-9 * np.eye(n - 1))
        A = np.linalg.solve(L, K[o, :])                 # (n-1, n)
        mean = c + A.T @ np.linalg.solve(L, y[o] - c)
        cov = K - A.T @ A
        F = mean + gen.standard_normal((n_samples, n)) @ _sqrt_psd(cov).T
        wrong = (F[:, i, None] < F) ^ obs[i][None, :]   # the ordered pairs (i, k); (i, i) is never wrong
        losses += wrong.sum(1)
    return losses


def _sqrt_psd(C: np.ndarray) -> np.ndarray:
    vals, vecs = np.linalg.eigh(0.5 * (C + C.T))
    return vecs * np.sqrt(np.clip(vals, 0.0, None))


def rgpe_weights(peer_losses: list[np.ndarray], own_losses: np.ndarray, gen: np.random.Generator,
                 dilution: bool = True) -> np.ndarray:
    """Weights ``(J + 1,)`` (peers first, the site's own model last) from ``(S,)`` losses each."""
    L = np.stack([*peer_losses, own_losses])                     # (J + 1, S)
    keep = np.ones(len(L), dtype=bool)
    if dilution:
        cut = np.percentile(own_losses, 95)
        keep[:-1] = np.array([np.median(p) <= cut for p in peer_losses], dtype=bool)
    masked = np.where(keep[:, None], L, np.inf)
    best = masked == masked.min(0, keepdims=True)               # ties: shared at random below
    pick = np.array([gen.choice(np.flatnonzero(col)) for col in best.T])
    return np.bincount(pick, minlength=len(L)) / L.shape[1]


def relatedness(peer_losses: list[np.ndarray], own_losses: np.ndarray, dilution: bool = True) -> np.ndarray:
    r""":math:`\beta_j = \Pr[L_j < L_t] + \tfrac12\Pr[L_j = L_t]` per peer ``(J,)``: how likely the peer's
    model orders the site's observations at least as well as the site's own (leave-one-out) model,
    over paired draws; 0 for a peer diluted away (median loss above the own loss's 95th percentile)."""
    cut = np.percentile(own_losses, 95)
    out = np.zeros(len(peer_losses))
    for j, L in enumerate(peer_losses):
        if dilution and np.median(L) > cut:
            continue
        out[j] = float(np.mean((L < own_losses) + 0.5 * (L == own_losses)))
    return out


class SampledModel:
    """A peer's posterior as ``S`` sample functions ``f_s(x) = c + phi(x)^T w_s`` (its standardized scale)."""

    def __init__(self, feature_fn, weights: np.ndarray, offset: float) -> None:  # type: ignore[no-untyped-def]
        self.feature_fn = feature_fn
        self.weights = torch.as_tensor(weights, dtype=torch.float64)  # (S, M)
        self.offset = float(offset)

    def draws(self, X: torch.Tensor) -> torch.Tensor:
        """``(S, ...)`` sample values at ``X (..., d)``."""
        Phi = self.feature_fn(X)                                      # (..., M)
        return self.offset + torch.einsum("...m,sm->s...", Phi, self.weights)


class EnsembleModel(Model):
    r"""The site's GP combined with its peers' sample functions (site units via ``(y_mean, y_std)``).

    ``rule="bcm"`` (the default of ``ensemble``): a robust Bayesian committee machine
    (Deisenroth & Ng 2015) with the peers' relatedness :math:`\beta_j` as their exponents and
    the site's own GP at :math:`\beta = 1`,

    .. math:: \sigma^{-2} = \sum_i \beta_i\sigma_i^{-2} + (1 - \textstyle\sum_i\beta_i)\,\sigma_{**}^{-2},
              \qquad \mu = m_0 + \sigma^2 \sum_i \beta_i\sigma_i^{-2}(\mu_i - m_0),

    :math:`\sigma_{**}^2` the prior variance, :math:`m_0` the own GP's prior mean: where a related
    peer has experimented and the site has not, its belief counts as evidence in proportion to
    its precision; where it knows nothing (:math:`\sigma_j = \sigma_{**}`) it adds nothing. The
    joint covariance keeps the own GP's posterior correlations: :math:`\sigma(x)\sigma(x')
    \rho_t(x, x')`. ``rule="rgpe"``: RGPE's :math:`\sum_i w_i\mu_i`, :math:`\sum_i w_i^2 k_i`
    with ``own_weight`` and ``peer_weights`` the ranking weights.
    """

    def __init__(self, own: Model, own_weight: float, peers: list[SampledModel], peer_weights: list[float],
                 y_mean: float, y_std: float, rule: str = "bcm", prior_mean: float = 0.0) -> None:
        super().__init__()
        self.own = own
        self.own_weight = float(own_weight)
        self.peers = [(p, float(w)) for p, w in zip(peers, peer_weights) if w > 0]
        self.y_mean, self.y_std = float(y_mean), float(y_std)
        self.rule = rule
        self.prior_mean = float(prior_mean)

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return self.own.batch_shape

    def _peer_moments(self, X: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        out = []
        for peer, w in self.peers:
            F = self.y_mean + self.y_std * peer.draws(X)              # (S, ..., q)
            out.append((F, F.mean(0), w))
        return out

    def posterior(self, X: torch.Tensor, output_indices: list[int] | None = None,
                  observation_noise: bool | torch.Tensor = False, posterior_transform=None,  # type: ignore[no-untyped-def]
                  **kwargs) -> GPyTorchPosterior:
        if output_indices not in (None, [0]):
            raise ValueError("the ensemble has one output")
        mvn = self.own.posterior(X).distribution
        K = mvn.lazy_covariance_matrix.to_dense()
        if self.rule == "rgpe":
            w = self.own_weight
            mean, cov = w * mvn.mean, w ** 2 * K
            for F, m, wp in self._peer_moments(X):
                D = F - m
                mean = mean + wp * m
                cov = cov + wp ** 2 * torch.einsum("s...i,s...j->...ij", D, D) / max(F.shape[0] - 1, 1)
        else:
            prior_var = self.y_std ** 2
            var_t = mvn.variance.clamp_min(1e-12 * prior_var)
            prec = 1.0 / var_t
            pull = (mvn.mean - self.prior_mean) / var_t
            beta_sum = 1.0
            for F, m, b in self._peer_moments(X):
                v = F.var(0).clamp(1e-12 * prior_var, prior_var)
                prec = prec + b / v
                pull = pull + b * (m - self.prior_mean) / v
                beta_sum += b
            prec = prec + (1.0 - beta_sum) / prior_var
            var = 1.0 / prec
            mean = self.prior_mean + var * pull
            sd_t = var_t.sqrt()
            corr = K / (sd_t.unsqueeze(-1) * sd_t.unsqueeze(-2))
            sd = var.sqrt()
            cov = sd.unsqueeze(-1) * corr * sd.unsqueeze(-2)
        if observation_noise is not False:
            noisy = self.own.posterior(X, observation_noise=observation_noise).distribution
            cov = cov + torch.diag_embed((noisy.variance - mvn.variance).clamp_min(0.0))
        cov = 0.5 * (cov + cov.transpose(-1, -2))
        post = GPyTorchPosterior(MultivariateNormal(mean, DenseLinearOperator(cov)))
        return posterior_transform(post) if posterior_transform is not None else post


__all__ = ["EnsembleModel", "SampledModel", "loo_losses", "ranking_losses", "relatedness", "rgpe_weights"]
