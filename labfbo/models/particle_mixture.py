r"""The particle-mixture predictive of PACD-BO (Eqs. 8-9), as a BoTorch model (float64).

Each particle :math:`\phi_k` (:mod:`labfbo.models.pacoh`) is one GP prior; on a site's data
each gives an exact GP posterior (the site's ``y`` standardized by its own mean and std).
:class:`ParticleMixtureGP` moment-matches their equally weighted mixture (latent function;
noise only if asked) in the units of ``y``: mean :math:`\tilde\mu = \frac1K\sum_k\mu_k`,
covariance :math:`\frac1K\sum_k\Sigma_k + \frac1K\sum_k(\mu_k-\tilde\mu)(\mu_k-\tilde\mu)^\top`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from labfbo.models.gp import DTYPE
from labfbo.models.pacoh import PacohConfig, _data, _features, _fit, _inputs, _mean, _noise, _rbf, _standardize, _unpack

__all__ = ["mixture_moments", "mixture_mean_var", "ParticleMixtureGP"]


class _ParticlePosteriors:
    """Per-particle exact GP posteriors on one site's standardized data (Cholesky once)."""

    def __init__(self, particles: Tensor, X: Any, y: Any, cfg: PacohConfig) -> None:
        X, y = _data(X, y)
        phi = particles.detach().to(DTYPE)
        self.d, self.n = X.shape[1], X.shape[0]
        _, self.mu_y, self.sd_y = _standardize(y)
        self.th = _unpack(phi, cfg, self.d)
        self.noise = _noise(self.th)
        if self.n:
            f = _fit(phi, X, y, cfg)
            self.Ft, self.L, self.alpha = f["F"], f["L"], f["alpha"]    # (K, n, f), (K, n, n), (K, n)

    def loo_log_density(self, y: Tensor) -> float:
        r"""Mean leave-one-out log predictive density of the mixture on the site's own ``y`` (its
        units): per particle the exact GP identities :math:`\mu_{-i} = y_i - [K^{-1}r]_i/[K^{-1}]_{ii}`,
        :math:`\sigma^2_{-i} = 1/[K^{-1}]_{ii}` (:math:`r` the residual from the particle's mean),
        then the equally weighted mixture of the particles' Gaussians at each :math:`y_i`."""
        if self.n < 2:
            return float("nan")
        Kinv = torch.cholesky_inverse(self.L)                               # (K, n, n)
        diag = torch.diagonal(Kinv, dim1=-2, dim2=-1)                       # (K, n)
        ys = (torch.as_tensor(y, dtype=DTYPE) - self.mu_y) / self.sd_y
        mean, var = ys - self.alpha / diag, 1.0 / diag
        logp = -0.5 * ((ys - mean) ** 2 / var + torch.log(2 * math.pi * var))  # (K, n), standardized
        mix = torch.logsumexp(logp, 0) - math.log(logp.shape[0])
        return float(mix.mean()) - math.log(self.sd_y)

    def joint(self, Xq: Tensor) -> tuple[Tensor, Tensor]:
        """``Xq (B, q, d)`` -> means ``(K, B, q)``, covariances ``(K, B, q, q)`` (standardized)."""
        B, q, d = Xq.shape
        K = self.noise.shape[0]
        U = _inputs(Xq.reshape(B * q, d))
        Fq = _features(self.th, U)                                          # (K, B*q, f)
        mean = _mean(self.th, U)
        Fb = Fq.reshape(K, B, q, -1)
        cov = _rbf(self.th, Fb, Fb)                                         # (K, B, q, q)
        if self.n:
            Kxq = _rbf(self.th, self.Ft, Fq)                                # (K, n, B*q)
            mean = mean + torch.einsum("knm,kn->km", Kxq, self.alpha)
            V = torch.linalg.solve_triangular(self.L, Kxq, upper=False).reshape(K, self.n, B, q)
            cov = cov - torch.einsum("knbi,knbj->kbij", V, V)
        mean = mean.reshape(K, B, q)
        return mean, cov


def mixture_moments(particles: Tensor, X_train: Any, y_train: Any, X_test: Any,
                    cfg: PacohConfig) -> tuple[Tensor, Tensor]:
    r"""Per-particle posterior means :math:`\mu_{\phi_k}` ``(K, m)`` and latent variances
    :math:`\sigma^2_{\phi_k}` ``(K, m)`` at ``X_test (m, d)``, in the units of ``y_train``."""
    post = _ParticlePosteriors(particles, X_train, y_train, cfg)
    Xq = torch.as_tensor(X_test, dtype=DTYPE).reshape(-1, 1, post.d)
    mean, cov = post.joint(Xq)
    return mean[..., 0] * post.sd_y + post.mu_y, cov[..., 0, 0].clamp_min(0.0) * post.sd_y ** 2


def mixture_mean_var(means: Tensor, variances: Tensor) -> tuple[Tensor, Tensor]:
    """PACD-BO Eqs. 8-9 from per-particle ``means``/``variances`` ``(K, m)`` -> ``(m,)``, ``(m,)``."""
    mu = means.mean(0)
    return mu, variances.mean(0) + ((means - mu) ** 2).mean(0)


class ParticleMixtureGP(Model):
    r"""BoTorch model of the equally weighted mixture of the particles' GP posteriors on
    one site's data, moment-matched to a Gaussian: mean Eq. 8, covariance
    :math:`\frac1K\sum_k \Sigma_k + \frac1K\sum_k (\mu_k-\tilde\mu)(\mu_k-\tilde\mu)^\top`
    (Eq. 9 on the diagonal). ``posterior(X)`` takes ``X (..., q, d)``; differentiable in ``X``.

    ``features`` (e.g. a :class:`~labfbo.models.encoding.FeatureMap`) maps the unit-cube
    inputs to what the particles were meta-learned on (one-hot or descriptor columns for
    categorical parameters); ``X_train`` and ``posterior`` take unit-cube points."""

    def __init__(self, particles: Tensor, X_train: Any, y_train: Any, cfg: PacohConfig,
                 features: Callable[[Tensor], Tensor] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.features = features
        X, y = _data(X_train, y_train)
        self._post = _ParticlePosteriors(particles, X if features is None else features(X), y, cfg)
        self.loo_log_density = lambda: self._post.loo_log_density(y)  # see _ParticlePosteriors
        self.register_buffer("train_X", X.clone())
        self.register_buffer("train_y", y.clone())

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    def posterior(self, X: Tensor, output_indices: list[int] | None = None,
                  observation_noise: bool | Tensor = False, posterior_transform: Any = None,
                  **kwargs: Any) -> GPyTorchPosterior:
        if output_indices not in (None, [0]):
            raise ValueError("ParticleMixtureGP has a single output")
        X = X.to(DTYPE)
        if self.features is not None:
            X = self.features(X)
        lead, q, d = X.shape[:-2], X.shape[-2], X.shape[-1]
        means, covs = self._post.joint(X.reshape(-1, q, d))             # (K, B, q), (K, B, q, q)
        mu = means.mean(0)
        dev = means - mu
        cov = covs.mean(0) + torch.einsum("kbi,kbj->bij", dev, dev) / means.shape[0]
        sd = self._post.sd_y
        mu = (mu * sd + self._post.mu_y).reshape(*lead, q)
        cov = (cov * sd ** 2).reshape(*lead, q, q)
        if isinstance(observation_noise, Tensor):   # variances in the units of y, (..., q, 1)
            cov = cov + torch.diag_embed(observation_noise.to(DTYPE)[..., 0].expand(*lead, q))
        elif observation_noise:
            cov = cov + (self._post.noise.mean() * sd ** 2) * torch.eye(q, dtype=DTYPE)
        # a lazy (DenseLinearOperator) covariance: factorized only when sampled, with jitter
        mvn = MultivariateNormal(mu, DenseLinearOperator(cov))
        post = GPyTorchPosterior(mvn)
        return posterior_transform(post) if posterior_transform is not None else post
