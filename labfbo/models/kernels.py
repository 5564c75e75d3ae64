r"""The kernels of the local GP and their lengthscale priors (BoTorch/GPyTorch, float64).

* :class:`HammingKernel` — one RBF or Matérn-5/2 over every column, continuous and categorical:
  two different choices of a categorical are :data:`MISMATCH` apart (squared), whatever their codes;
* :func:`additive_kernel` — main effects plus interactions (a HammingKernel per column, summed,
  beside one over every column);
* the lengthscale priors: BoTorch's dimension-scaled log-normal (Hvarfner et al., 2024),
  :class:`CappedLogNormalPrior` (the same with a Gaussian tail on long lengthscales) and
  :class:`TwoSidedLengthscalePrior` (Optuna's ``GPSampler``).
"""

from __future__ import annotations

import math

import torch
from botorch.models.kernels.categorical import CategoricalKernel
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import Kernel
from gpytorch.priors import GammaPrior, LogNormalPrior, Prior

DTYPE = torch.float64

#: the squared distance of two different choices of a categorical column: the mean squared distance
#: of two uniform points of a unit-cube column, so that both kinds of column weigh alike a priori
MISMATCH = 1.0 / 6.0


class TwoSidedLengthscalePrior(Prior):
    r"""Optuna's ``GPSampler`` lengthscale prior: :math:`\log p(\ell_j) = -a\,(u_j^2/\ell_j^2 + \ell_j^2/u_j^2)`
    (up to a constant), mode :math:`\ell_j = u_j`, a penalty that grows as :math:`\ell^2` on long
    lengthscales where a log-normal's grows as :math:`\log^2 \ell`: on flat data (every yield 0)
    the marginal likelihood gains without bound as the lengthscales grow, and only such a prior
    stops them."""

    arg_constraints: dict = {}
    support = torch.distributions.constraints.positive

    def __init__(self, unit: torch.Tensor, a: float = 0.1) -> None:
        super().__init__(validate_args=False)
        self.register_buffer("unit", unit)
        self.a = a

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = (x / self.unit).pow(2)
        return -self.a * (z + 1.0 / z)


class CappedLogNormalPrior(Prior):
    r"""BoTorch's dimension-scaled log-normal with a Gaussian tail on long lengthscales:
    :math:`\log p(\ell_j) = \log \mathcal{LN}(\ell_j; \mu_d, \sqrt3) - a\,\ell_j^2/u_j^2`.

    Below and around the log-normal's mode the extra term is negligible (:math:`a = 0.1`, at
    :math:`\ell = u` it costs 0.1 nats); on flat data, where the marginal likelihood grows without
    bound with the lengthscales and a log-normal's :math:`\log^2 \ell` penalty cannot stop them,
    it does (at :math:`\ell = 10u`, 10 nats)."""

    arg_constraints: dict = {}
    support = torch.distributions.constraints.positive

    def __init__(self, d: int, unit: torch.Tensor, a: float = 0.1) -> None:
        super().__init__(validate_args=False)
        self.base = LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(d), scale=math.sqrt(3))
        self.register_buffer("unit", unit)
        self.a = a

    @property
    def mode(self) -> torch.Tensor:
        return self.base.mode

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return self.base.log_prob(x) - self.a * (x / self.unit).pow(2)


def _units(d: int, cat_dims: list[int]) -> torch.Tensor:
    """The mode of :class:`TwoSidedLengthscalePrior` per column: 1, or sqrt(MISMATCH) if categorical."""
    u = torch.ones(d, dtype=DTYPE)
    u[list(cat_dims)] = math.sqrt(MISMATCH)
    return u


class HammingKernel(Kernel):
    r"""RBF or Matérn-5/2 on one scaled distance over every column, continuous and categorical:
    :math:`r^2 = \sum_{j \in \text{cont}} (x_j - x'_j)^2/\ell_j^2 + \sum_{j \in \text{cat}} m\,[x_j \ne x'_j]/\ell_j^2`.

    Two different choices are :math:`m` = :data:`MISMATCH` = 1/6 apart (squared), the mean
    squared distance of two random points of a unit-cube column, so one lengthscale prior
    (BoTorch's dimension-scaled log-normal over all ``d`` columns) serves both kinds: at its
    mode (0.36 for 3 columns) one differing choice leaves a correlation of about 0.5, as
    Optuna's ``GPSampler`` kernel (Hamming distance in a Matérn-5/2 at lengthscale 1) does.
    A column's number of choices does not enter: one lengthscale per categorical, the 23
    additives as the 3 bases. Not a subclass of ``RBFKernel``: random Fourier features do not
    apply to it.
    """

    has_lengthscale = True

    def __init__(self, d: int, cat_dims: list[int], rbf: bool = True, two_sided: bool | str = False,
                 **kwargs: object) -> None:
        prior: Prior = LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(d), scale=math.sqrt(3))
        init = prior.mode
        if two_sided == "capped":
            prior = CappedLogNormalPrior(d, _units(d, cat_dims))
        elif two_sided:
            prior, init = TwoSidedLengthscalePrior(_units(d, cat_dims)), math.sqrt(MISMATCH)
        super().__init__(ard_num_dims=d, lengthscale_prior=prior,
                         lengthscale_constraint=GreaterThan(2.5e-2, transform=None, initial_value=init),
                         **kwargs)
        mask = torch.zeros(d, dtype=torch.bool)
        mask[list(cat_dims)] = True
        self.register_buffer("cat_mask", mask)
        self.rbf = rbf

    def squared_distance(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False) -> torch.Tensor:
        """The scaled squared distance :math:`r^2`, ``(..., n, m)`` (``diag``: ``(..., n)``)."""
        ls = self.lengthscale  # (..., 1, d)
        cat, cont = self.cat_mask, ~self.cat_mask
        sq = self.covar_dist(x1[..., cont] / ls[..., cont], x2[..., cont] / ls[..., cont],
                             square_dist=True, diag=diag)
        if bool(cat.any()):
            inv = MISMATCH * ls[..., cat].pow(-2)  # (..., 1, c)
            if diag:
                sq = sq + ((x1[..., cat] != x2[..., cat]).to(x1) * inv).sum(-1)
            else:
                diff = (x1[..., :, None, :][..., cat] != x2[..., None, :, :][..., cat]).to(x1)
                sq = sq + (diff * inv.unsqueeze(-2)).sum(-1)
        return sq

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False,
                last_dim_is_batch: bool = False, **params: object) -> torch.Tensor:
        if last_dim_is_batch:
            raise NotImplementedError("HammingKernel has no last_dim_is_batch mode")
        sq = self.squared_distance(x1, x2, diag=diag)
        if self.rbf:
            return torch.exp(-0.5 * sq)
        r = math.sqrt(5.0) * sq.clamp_min(1e-30).sqrt()
        return (1.0 + r + r.pow(2) / 3.0) * torch.exp(-r)


def additive_kernel(d: int, cat_dims: list[int], rbf: bool, prior: bool | str = "capped") -> Kernel:
    r"""Main effects plus interactions: :math:`k = s_1 \sum_j k_j(x_j, x'_j) + s_2\, k_H(x, x')`, one
    :class:`HammingKernel` per column (its own lengthscale) and one over every column, each sum with
    its own output scale (:math:`\Gamma(2, 2)` prior, mode 1/2 of the standardized variance). A
    response driven by each factor on its own (a good additive, a good ligand) is learned from the
    first term with few experiments; one that needs a pairing of choices, from the second."""
    from gpytorch.kernels import AdditiveKernel, ScaleKernel

    mains = [HammingKernel(1, [0] if j in cat_dims else [], rbf, two_sided=prior, active_dims=[j]) for j in range(d)]
    return (ScaleKernel(AdditiveKernel(*mains), outputscale_prior=GammaPrior(2.0, 2.0))
            + ScaleKernel(HammingKernel(d, cat_dims, rbf, two_sided=prior), outputscale_prior=GammaPrior(2.0, 2.0)))


def kernel_for(d: int, cat_dims: list[int], rbf: bool, categorical: str = "hamming",
            two_sided: bool | str = False) -> Kernel:
    r"""The site's kernel: on a continuous space BoTorch's dimension-scaled ARD kernel; with
    categorical columns, ``categorical="hamming"`` (the default) the :class:`HammingKernel` over
    every column; ``"botorch"`` the former product of the ARD kernel on the continuous columns
    with BoTorch's ``CategoricalKernel`` :math:`\exp(-\frac1c\sum_j [x_j \ne x'_j]/\ell_j)` on
    the categorical ones (no lengthscale prior: its lengthscales run to 0 or to infinity on
    a few observations).
    """
    cont = [j for j in range(d) if j not in cat_dims]
    if categorical == "additive" and cat_dims:
        return additive_kernel(d, cat_dims, rbf, two_sided or "capped")
    if two_sided and (not cat_dims or categorical == "hamming"):
        return HammingKernel(d, cat_dims, rbf, two_sided=two_sided)
    if not cat_dims:
        return get_covar_module_with_dim_scaled_prior(ard_num_dims=d, use_rbf_kernel=rbf)
    if categorical == "hamming":
        return HammingKernel(d, cat_dims, rbf)
    cat = CategoricalKernel(ard_num_dims=len(cat_dims), active_dims=cat_dims, lengthscale_constraint=GreaterThan(1e-6))
    if not cont:
        return cat
    return get_covar_module_with_dim_scaled_prior(ard_num_dims=len(cont), use_rbf_kernel=rbf, active_dims=cont) * cat


def scaled(kernel: Kernel, signal_variance: str) -> Kernel:
    """``kernel`` as it is, or times a learned output scale with a Gamma(2, 1) prior (mode 1)."""
    if signal_variance == "fixed":
        return kernel
    from gpytorch.kernels import ScaleKernel

    return ScaleKernel(kernel, outputscale_prior=GammaPrior(2.0, 1.0))
