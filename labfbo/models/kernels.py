r"""The kernels of the local GP and their lengthscale priors (BoTorch/GPyTorch, float64).

* :class:`HammingKernel` — one RBF or Matérn-5/2 over every column, continuous and categorical:
  two different choices of a categorical are :data:`MISMATCH` apart (squared), whatever their codes;
* the lengthscale priors: Optuna ``GPSampler``'s two-sided prior (:class:`OptunaLengthscalePrior`, the
  default), BoTorch's dimension-scaled log-normal (Hvarfner et al., 2024),
  :math:`\ell_j \sim \mathcal{LN}(\sqrt2 + \tfrac12\log d, \sqrt3)` (``lengthscale_prior="dim_scaled"``), or
  that log-normal with a Gaussian tail on the continuous columns (:class:`CappedLogNormalPrior`,
  ``"capped"``). Chosen leave-one-family-out (``docs/benchmarks/engine.md``).
"""

from __future__ import annotations

import math

import torch
from botorch.models.kernels.categorical import CategoricalKernel
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel
from gpytorch.priors import LogNormalPrior, Prior

DTYPE = torch.float64

#: the squared distance of two different choices of a categorical column: the mean squared distance
#: of two uniform points of a unit-cube column, so that both kinds of column weigh alike a priori
MISMATCH = 1.0 / 6.0


class CappedLogNormalPrior(Prior):
    r"""BoTorch's dimension-scaled log-normal with a Gaussian tail on the long lengthscales of the
    continuous columns: :math:`\log p(\ell_j) = \log \mathcal{LN}(\ell_j; \sqrt2 + \tfrac12\log d, \sqrt3)
    - a\,\ell_j^2\,[j \text{ continuous}]` (unit-cube columns, :math:`a = 0.1`).

    Around and below the log-normal's mode the extra term is negligible (0.1 nats at
    :math:`\ell = 1`, the cube's width). Where the data are flat along a column the marginal
    likelihood keeps growing with its lengthscale, and a log-normal, whose penalty grows as
    :math:`\log^2 \ell`, lets it run to hundreds: the model then believes the response is known
    everywhere and the search stalls; the Gaussian tail stops it (10 nats at :math:`\ell = 10`).
    A categorical column keeps the plain log-normal: its long-lengthscale limit is a model of each
    choice's main effect, which the reaction families favour (``docs/benchmarks/engine.md``)."""

    arg_constraints: dict = {}
    support = torch.distributions.constraints.positive

    def __init__(self, d: int, continuous: torch.Tensor, a: float = 0.1) -> None:
        super().__init__(validate_args=False)
        self.base = LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(d), scale=math.sqrt(3))
        self.register_buffer("weight", a * continuous.to(DTYPE))
        self.a = a

    @property
    def mode(self) -> torch.Tensor:
        return self.base.mode

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return self.base.log_prob(x) - self.weight * x.pow(2)


class OptunaLengthscalePrior(Prior):
    r"""Optuna ``GPSampler``'s lengthscale prior, :math:`\log p(\ell_j) = -0.1\,(u_j^2/\ell_j^2 + \ell_j^2/u_j^2)`
    (its :math:`-0.1(1/\lambda + \lambda)` on :math:`\lambda = u^2/\ell^2`), :math:`u_j = 1` on a continuous
    column and :math:`\sqrt{m}` (:data:`MISMATCH`) on a categorical one (the default).

    Its penalty grows as :math:`\ell^2` on long lengthscales, where a log-normal's grows as
    :math:`\log^2 \ell`: where the data are flat along a column (or a lab's yields are all near
    zero) the marginal likelihood keeps growing with the lengthscale, a log-normal lets it run to
    hundreds, the GP then believes it knows the response everywhere and the search stalls."""

    arg_constraints: dict = {}
    support = torch.distributions.constraints.positive

    def __init__(self, unit: torch.Tensor) -> None:
        super().__init__(validate_args=False)
        self.register_buffer("unit", unit)

    @property
    def mode(self) -> torch.Tensor:
        return self.unit

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        z = (x / self.unit).pow(2)
        return -0.1 * (z + 1.0 / z)


def lengthscale_prior(d: int, cat_dims: list[int], kind: str = "optuna") -> Prior:
    """The prior of ``d`` lengthscales: ``"optuna"`` (:class:`OptunaLengthscalePrior`), ``"capped"``
    (:class:`CappedLogNormalPrior`) or ``"dim_scaled"`` (BoTorch's log-normal)."""
    continuous = torch.ones(d, dtype=DTYPE)
    continuous[list(cat_dims)] = 0.0
    if kind == "optuna":
        return OptunaLengthscalePrior(torch.where(continuous > 0, 1.0, math.sqrt(MISMATCH)).to(DTYPE))
    if kind == "dim_scaled":
        return LogNormalPrior(loc=math.sqrt(2) + 0.5 * math.log(d), scale=math.sqrt(3))
    return CappedLogNormalPrior(d, continuous)


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

    def __init__(self, d: int, cat_dims: list[int], rbf: bool = True, prior_kind: str = "dim_scaled",
                 **kwargs: object) -> None:
        prior = lengthscale_prior(d, cat_dims, prior_kind)
        super().__init__(ard_num_dims=d, lengthscale_prior=prior,
                         lengthscale_constraint=GreaterThan(2.5e-2, transform=None, initial_value=prior.mode),
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


def kernel_for(d: int, cat_dims: list[int], rbf: bool, categorical: str = "hamming",
               prior_kind: str = "optuna") -> Kernel:
    r"""The site's kernel: on a continuous space an ARD RBF or Matérn-5/2 (GPyTorch's, so random
    Fourier features apply) with :func:`lengthscale_prior`; with categorical columns,
    ``categorical="hamming"`` (the default) the :class:`HammingKernel` over every column;
    ``"botorch"`` the former product of BoTorch's dimension-scaled ARD kernel on the continuous
    columns with BoTorch's ``CategoricalKernel`` :math:`\exp(-\frac1c\sum_j [x_j \ne x'_j]/\ell_j)` on
    the categorical ones (no lengthscale prior: its lengthscales run to 0 or to infinity on
    a few observations).
    """
    cont = [j for j in range(d) if j not in cat_dims]
    if not cat_dims:
        prior = lengthscale_prior(d, [], prior_kind)
        return (RBFKernel if rbf else MaternKernel)(
            ard_num_dims=d, lengthscale_prior=prior,
            lengthscale_constraint=GreaterThan(2.5e-2, transform=None, initial_value=prior.mode))
    if categorical == "hamming":
        return HammingKernel(d, cat_dims, rbf, prior_kind=prior_kind)
    cat = CategoricalKernel(ard_num_dims=len(cat_dims), active_dims=cat_dims, lengthscale_constraint=GreaterThan(1e-6))
    if not cont:
        return cat
    return get_covar_module_with_dim_scaled_prior(ard_num_dims=len(cont), use_rbf_kernel=rbf, active_dims=cont) * cat
