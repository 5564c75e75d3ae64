r"""The Federated Interventional GP (GUIDE-FBO §3.3): guidance acts only through uncertainty.

A site receives :math:`P_t` diagonal Gaussian components :math:`(\omega_p, \mu_p,
\operatorname{diag}\Sigma_p)` and forms the guidance field

.. math:: G(x) = \sum_{p=1}^{P_t} \omega_p \exp\!\big(-\tfrac12 (x-\mu_p)^\top
          \Sigma_p^{-1} (x-\mu_p)\big),

the scaling :math:`S(x) = 1 + \lambda_t G(x)`, :math:`\lambda_t = \lambda_{\max}/\sqrt{t}`,
and the FI-GP

.. math:: \tilde\mu(x) = \mu(x), \qquad \tilde k(x, x') = S(x)\, k(x, x')\, S(x'),

where :math:`\mu, k` are the *posterior* mean and covariance of the local GP. Hence
:math:`\tilde\sigma(x) = S(x)\sigma(x)`: the intervention widens the posterior where the
federation believes optima lie, in proportion to the local uncertainty. Because
:math:`\tilde f = \mu + S\,(f - \mu)` in distribution, Thompson sampling on
:class:`FIGP` is exactly "scale the sampled path's deviation from the mean".

:class:`FIGP` is a BoTorch ``Model``; analytic UCB, the q-acquisitions (qUCB,
qLogNEI, ...) and ``MaxPosteriorSampling`` work on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from scipy.stats import qmc

from labfbo.models.gp import as_tensor
from labfbo.space.params import choice_index

VARIANCE_FLOOR = 1e-10


@dataclass(frozen=True)
class GuidanceField:
    r"""Weighted bumps :math:`G(x)` (unnormalized, so :math:`0 \le G \le \sum\omega`).

    On a space with categorical columns (``cats``: ``(column, choices, offset)``; ``means``
    and ``variances`` then cover the other columns, ``ordered``) a bump is the Gaussian
    factor times, per categorical column :math:`j`, :math:`p_{pj}(x_j)/\max_c p_{pj}(c)`:
    1 at the component's most likely choices, as the Gaussian factor is 1 at its centre.
    """

    weights: np.ndarray    # (P,)
    means: np.ndarray      # (P, d_o), unit cube
    variances: np.ndarray  # (P, d_o)
    probs: np.ndarray | None = None                  # (P, sum of choice counts)
    ordered: tuple[int, ...] | None = None          # None: every column
    cats: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def empty(cls, d: int) -> "GuidanceField":
        return cls(np.zeros(0), np.zeros((0, d)), np.ones((0, d)))

    def __len__(self) -> int:
        return int(len(self.weights))

    @property
    def dim(self) -> int:
        return self.means.shape[1] + len(self.cats)

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """:math:`G` at ``X (..., d)``; returns ``(...)``."""
        if not len(self):
            return torch.zeros(X.shape[:-1], dtype=X.dtype)
        w = torch.as_tensor(self.weights, dtype=X.dtype)
        mu = torch.as_tensor(self.means, dtype=X.dtype)
        var = torch.as_tensor(np.maximum(self.variances, VARIANCE_FLOOR), dtype=X.dtype)
        Xo = X if self.ordered is None else X[..., list(self.ordered)]
        bump = torch.exp(-0.5 * ((Xo.unsqueeze(-2) - mu) ** 2 / var).sum(-1))  # (..., P)
        for j, k, off in self.cats:
            p = torch.as_tensor(self.probs[:, off:off + k], dtype=X.dtype)      # type: ignore[index]
            rel = p / p.max(-1, keepdim=True).values                            # (P, k)
            idx = choice_index(X[..., j].detach(), k)
            bump = bump * rel.T[idx]                                             # (..., P)
        return (w * bump).sum(-1)

    def domain_average(self, n: int = 512) -> float:
        r""":math:`\bar G`: the mean of :math:`G` over ``n`` unscrambled Sobol points of the cube."""
        d = self.dim
        with np.errstate(all="ignore"):
            pts = qmc.Sobol(d, scramble=False).random(n)
        return float(self(as_tensor(pts)).mean()) if len(self) else 0.0


def guidance_strength(lambda_max: float, t: int) -> float:
    r""":math:`\lambda_t = \lambda_{\max}/\sqrt{t}` for BO round ``t >= 1``."""
    return float(lambda_max) / float(np.sqrt(max(int(t), 1)))


class FIGP(Model):
    r"""Mean-preserving uncertainty intervention on a fitted single-output model.

    ``uniform`` (the "uniform uncertainty scaling" ablation) replaces :math:`G(x)` by its
    domain average :math:`\bar G` everywhere.
    """

    def __init__(self, base: Model, field: GuidanceField, strength: float, uniform: bool = False) -> None:
        super().__init__()
        if base.num_outputs != 1:
            raise ValueError("FIGP wraps single-output models")
        self.base = base
        self.field = field
        self.strength = float(strength)
        self._uniform_value = field.domain_average() if uniform else None

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return self.base.batch_shape

    def scaling(self, X: torch.Tensor) -> torch.Tensor:
        r""":math:`S(x) = 1 + \lambda_t G(x)` at ``X (..., d)``."""
        if self._uniform_value is not None:
            return torch.full(X.shape[:-1], 1.0 + self.strength * self._uniform_value, dtype=X.dtype)
        return 1.0 + self.strength * self.field(X)

    def posterior(self, X: torch.Tensor, output_indices: list[int] | None = None,
                  observation_noise: bool | torch.Tensor = False, posterior_transform=None,  # type: ignore[no-untyped-def]
                  **kwargs) -> GPyTorchPosterior:
        if output_indices not in (None, [0]):
            raise ValueError("FIGP has one output")
        latent = self.base.posterior(X)
        mvn = latent.distribution
        mean = mvn.mean
        cov = mvn.lazy_covariance_matrix.to_dense()
        S = self.scaling(X).to(cov)
        cov = S.unsqueeze(-1) * cov * S.unsqueeze(-2)
        if observation_noise is not False:
            noisy = self.base.posterior(X, observation_noise=observation_noise).distribution
            noise = (noisy.variance - mvn.variance).clamp_min(0.0)
            cov = cov + torch.diag_embed(noise)
        cov = 0.5 * (cov + cov.transpose(-1, -2))
        # a linear operator, not a tensor: gpytorch factors it lazily, with jitter if needed
        post = GPyTorchPosterior(MultivariateNormal(mean, DenseLinearOperator(cov)))
        if posterior_transform is not None:
            return posterior_transform(post)
        return post


__all__ = ["FIGP", "GuidanceField", "guidance_strength"]
