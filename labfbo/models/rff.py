r"""A site's GP posterior as random-Fourier-feature sample functions (what ``ensemble`` shares).

Every kernel labfbo's local GP uses is shift-invariant on a common encoding of the space,
:math:`z(x)` = :class:`~labfbo.models.encoding.FeatureMap` with one-hot categoricals:

* continuous, integer and descriptor columns enter the dimension-scaled ARD kernel
  (RBF or Matérn-5/2) with lengthscales :math:`\ell_c`;
* BoTorch's ``CategoricalKernel`` :math:`\exp(-\frac1c\sum_j [x_j \ne x'_j]/\ell_j)` over
  :math:`c` categorical columns equals an RBF on the one-hot vectors scaled by
  :math:`1/\sqrt{c\,\ell_j}` (two one-hots differ by :math:`\sqrt2` when the choices differ).

So with :math:`u = z \odot s` (``scales`` :math:`s`), :math:`k(x, x') = \mathbb E_\omega
[\cos(\omega^\top(u - u'))]` for the kernel's spectral measure: :math:`\omega \sim
\mathcal N(0, I)` on the RBF and categorical columns, and :math:`\omega_c = g^{-1/2}\sqrt5\,z_c`,
:math:`g \sim \chi^2_5`, on the Matérn-5/2 columns (a product kernel's spectral measure is
the product of its factors'). With :math:`M` draws :math:`(\omega_m, b_m)`, :math:`b_m
\sim U(0, 2\pi)` — the **basis**, drawn from a seed the whole study shares —

.. math:: \phi(x) = \sqrt{2/M}\,\cos(W u(x) + b), \qquad f(x) \approx c + \phi(x)^\top w,

a Bayesian linear model (Rahimi & Recht 2007). Given the site's standardized targets
:math:`y` with noise variances :math:`\sigma^2_i`, :math:`w \mid y \sim \mathcal N(A^{-1}
\Phi^\top\Sigma^{-1}(y - c),\ A^{-1})`, :math:`A = \Phi^\top\Sigma^{-1}\Phi + I`: a site
shares :math:`S` draws of :math:`w` (federated Thompson sampling, Dai et al. 2020 shares one)
together with :math:`(s, c)` — never its observations, its standardization or its inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from botorch.models.kernels.categorical import CategoricalKernel
from botorch.models.model import Model
from gpytorch.kernels import MaternKernel, ProductKernel, RBFKernel

from labfbo.exceptions import ProtocolError
from labfbo.models.encoding import FeatureMap
from labfbo.space import Categorical, SearchSpace

Kernel = Literal["rbf", "matern52"]


@dataclass(frozen=True)
class Basis:
    """``M`` random features over the encoded space: ``z (M, D)`` standard normal, ``g (M,)``
    chi-square(5) draws (Matérn rows), ``b (M,)`` phases."""

    z: np.ndarray
    g: np.ndarray
    b: np.ndarray

    @classmethod
    def draw(cls, n_in: int, n_features: int, seed: int) -> "Basis":
        gen = np.random.default_rng(seed)
        return cls(gen.standard_normal((n_features, n_in)), gen.chisquare(5.0, n_features),
                   gen.uniform(0.0, 2.0 * math.pi, n_features))

    @property
    def n_features(self) -> int:
        return int(self.z.shape[0])

    def frequencies(self, kernel: Kernel, matern_cols: np.ndarray) -> np.ndarray:
        """``W (M, D)``: the spectral draws of ``kernel`` (Matérn-5/2 on the boolean ``matern_cols``)."""
        if kernel == "rbf" or not matern_cols.any():
            return self.z
        W = self.z.copy()
        W[:, matern_cols] *= np.sqrt(5.0 / self.g)[:, None]
        return W


def shared_encoding(space: SearchSpace) -> FeatureMap:
    """The encoding every site's features read: one-hot categoricals (descriptors where given)."""
    return FeatureMap(space, one_hot=True)


def _kernel_parts(model: Model) -> tuple[RBFKernel | MaternKernel | None, CategoricalKernel | None]:
    k = model.covar_module
    parts = list(k.kernels) if isinstance(k, ProductKernel) else [k]
    cont = [p for p in parts if isinstance(p, (RBFKernel, MaternKernel))]
    cat = [p for p in parts if isinstance(p, CategoricalKernel)]
    if len(cont) > 1 or len(cat) > 1 or len(cont) + len(cat) != len(parts):
        raise ProtocolError(f"no random-feature form for the kernel {type(k).__name__}")
    return (cont[0] if cont else None), (cat[0] if cat else None)


def kernel_scales(model: Model, space: SearchSpace) -> tuple[np.ndarray, np.ndarray, Kernel]:
    """``(scales (D,), matern_cols (D,), kernel)`` of a fitted local GP on the shared encoding."""
    cont, cat = _kernel_parts(model)
    if isinstance(cont, MaternKernel) and abs(float(cont.nu) - 2.5) > 1e-9:
        raise ProtocolError(f"no random-feature form for a Matérn-{cont.nu} kernel")
    model_map, shared = FeatureMap(space), shared_encoding(space)
    cat_cols = model_map.cat_out
    l_cont = cont.lengthscale.detach().reshape(-1).numpy() if cont is not None else np.zeros(0)
    l_cat = cat.lengthscale.detach().reshape(-1).numpy() if cat is not None else np.zeros(0)
    cont_cols = [c for c in range(model_map.n_out) if c not in cat_cols]
    scales = np.zeros(shared.n_out)
    matern = np.zeros(shared.n_out, dtype=bool)
    for j, p in enumerate(space.params):
        (a, b), (sa, sb) = model_map.slices[j], shared.slices[j]
        if isinstance(p, Categorical) and p.descriptors is None:
            scales[sa:sb] = 1.0 / math.sqrt(len(cat_cols) * float(l_cat[cat_cols.index(a)]))
        else:
            scales[sa:sb] = 1.0 / l_cont[[cont_cols.index(c) for c in range(a, b)]]
            matern[sa:sb] = isinstance(cont, MaternKernel)
    return scales, matern, ("matern52" if isinstance(cont, MaternKernel) else "rbf")


def features(basis: Basis, shared: FeatureMap, X: torch.Tensor, scales: np.ndarray, kernel: Kernel,
             matern_cols: np.ndarray) -> torch.Tensor:
    r""":math:`\phi(x) = \sqrt{2/M}\cos(W (z(x) \odot s) + b)` at unit-cube ``X (..., d)`` -> ``(..., M)``."""
    W = torch.as_tensor(basis.frequencies(kernel, matern_cols) * scales[None, :], dtype=X.dtype)
    b = torch.as_tensor(basis.b, dtype=X.dtype)
    return math.sqrt(2.0 / basis.n_features) * torch.cos(shared(X) @ W.T + b)


def posterior_weights(Phi: np.ndarray, y: np.ndarray, noise: np.ndarray, offset: float, n_samples: int,
                      gen: np.random.Generator) -> np.ndarray:
    r"""``(S, M)`` draws of :math:`w \mid y`, :math:`w \sim \mathcal N(0, I)` a priori,
    :math:`y = c + \Phi w + \varepsilon`, :math:`\varepsilon_i \sim \mathcal N(0, \sigma^2_i)`."""
    P = Phi / noise[:, None]
    A = Phi.T @ P + np.eye(Phi.shape[1])
    L = np.linalg.cholesky(A)
    mean = np.linalg.solve(L.T, np.linalg.solve(L, P.T @ (y - offset)))
    eps = gen.standard_normal((n_samples, Phi.shape[1]))
    return mean[None, :] + np.linalg.solve(L.T, eps.T).T   # cov = L^-T L^-1 = A^-1


def site_sample_weights(model: Model, space: SearchSpace, X: np.ndarray, basis: Basis, n_samples: int,
                        gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, Kernel, float]:
    """``(weights (S, M), scales, matern_cols, kernel, offset)`` of a local GP fitted on unit-cube
    inputs ``X`` (its standardized scale: ``Standardize`` transformed the targets at training)."""
    scales, matern, kernel = kernel_scales(model, space)
    Phi = features(basis, shared_encoding(space), torch.as_tensor(X, dtype=torch.float64), scales, kernel,
                   matern).numpy()
    y = model.train_targets.detach().numpy()
    noise = np.broadcast_to(model.likelihood.noise.detach().reshape(-1).numpy(), y.shape).astype(float)
    offset = float(model.mean_module.constant.detach())
    return posterior_weights(Phi, y, noise, offset, n_samples, gen), scales, matern, kernel, offset


__all__ = ["Basis", "Kernel", "features", "kernel_scales", "posterior_weights", "shared_encoding",
           "site_sample_weights"]
