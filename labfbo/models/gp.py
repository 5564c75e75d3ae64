r"""The local GP surrogate of one site (BoTorch, float64).

``SingleTaskGP`` with ``Normalize`` (unit-cube bounds) and ``Standardize``; with
categorical columns the kernel is one :class:`HammingKernel` over every column (two different
choices a fixed distance apart, whatever their codes), so a choice's code is never an ordinal
number to the model, and every lengthscale has the same prior (:func:`labfbo.models.kernels.kernel_for`).
Hyper-parameters are MAP estimates from ``fit_gpytorch_mll``.
The kernel (:class:`SurrogateOptions`) is BoTorch's ARD kernel with the dimension-scaled
log-normal lengthscale prior of Hvarfner et al. (2024),
:math:`\ell_j \sim \mathcal{LN}(\sqrt2 + \tfrac12\log d, \sqrt3)`, RBF or Matérn-5/2,
optionally after a Kumaraswamy input warping of the continuous columns. When
per-observation standard errors are known for every observation they enter as fixed
noise :math:`\sigma_j^2 = \mathrm{sem}_j^2`; otherwise the noise level is learned
(by default Optuna's :math:`\Gamma(1.1, 30)` prior, floor :math:`10^{-6}` on the standardized
scale; BoTorch's :math:`\mathcal{LN}(-4, 1)`, floor :math:`10^{-4}`, with
``noise_prior="lognormal"``). ``output_transform="winsorize"`` clips the objective's bad tail
first (:func:`winsorized`); the default standardizes the values as they are. The defaults
(Matérn-5/2, the Gamma noise prior, plain standardization, and LogEI in
:mod:`labfbo.models.acquisition`) were chosen on ``labfbo bench engine`` (``docs/benchmarks/engine.md``).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.input import ChainedInputTransform, InputTransform, Normalize, Warp
from botorch.models.transforms.outcome import Standardize
from gpytorch.constraints import GreaterThan
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import Mean
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import GammaPrior, LogNormalPrior
from pydantic import BaseModel, ConfigDict, Field

from labfbo.core.seeding import seeded_torch
from labfbo.models.kernels import MISMATCH, HammingKernel, kernel_for  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from labfbo.models.encoding import FeatureMap
    from labfbo.space.search import SearchSpace

DTYPE = torch.float64


def as_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=DTYPE)


class SurrogateOptions(BaseModel):
    """How a site's local GP is built (every protocol with a local GP understands these)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kernel: Literal["rbf", "matern52"] = Field(
        "matern52", description="Matérn-5/2 (the default) or RBF, ARD with the dimension-scaled lengthscale prior")
    input_warping: bool = False
    noise_prior: Literal["lognormal", "gamma", "auto"] = Field(
        "gamma", description="prior on the standardized noise variance when it is learned: Gamma(1.1, 30), "
        "floor 1e-6 (the default, Optuna's; lets a noiseless response be interpolated), BoTorch's "
        "LogNormal(-4, 1), floor 1e-4 (suits noisy data), or 'auto': fit both, keep the one with the higher "
        "leave-one-out predictive density")
    categorical_kernel: Literal["hamming", "botorch"] = Field(
        "hamming", description="with categorical columns: 'hamming' (the default), one RBF/Matérn kernel over "
        "every column, two different choices 1/6 apart (squared), with BoTorch's dimension-scaled lengthscale "
        "prior on every column; 'botorch', the former product with BoTorch's CategoricalKernel (no prior)")
    lengthscale_prior: Literal["optuna", "capped", "dim_scaled"] = Field(
        "optuna", description="'optuna' (the default): Optuna GPSampler's -0.1 (u^2/l^2 + l^2/u^2) on every "
        "lengthscale (u = 1 on a continuous column, one mismatch on a categorical one), which keeps them from "
        "running to hundreds on flat data and stalling the search; 'capped': BoTorch's dimension-scaled "
        "LogNormal(sqrt2 + log(d)/2, sqrt3) with a Gaussian tail on the continuous columns; 'dim_scaled': that "
        "log-normal alone (the former default). Chosen leave-one-family-out (docs/benchmarks/engine.md)")
    descriptors: Literal["ignore", "use", "auto"] = Field(
        "ignore", description="choices described by descriptors (SMILES): 'ignore' them, one label per choice "
        "(the default: RDKit descriptors were a loss alone on all three shipped reaction families, "
        "docs/benchmarks/engine.md), 'use' them, or 'auto': fit both and keep the one with the higher "
        "leave-one-out predictive density on the site's own data (labels until it has DESCRIPTOR_MIN_POINTS "
        "observations)")
    output_transform: Literal["standardize", "winsorize"] = Field(
        "standardize", description="'standardize' (the default): the values as they are (BoTorch's "
        "Standardize alone; the papers' setting). 'winsorize': before standardizing, raise the objective's "
        "values below Tukey's lower fence Q1 - 1.5 IQR (the bad tail, in the maximization orientation) to "
        "the fence, so failed runs and outliers do not set the GP's scale; the values above it are "
        "unchanged")


#: the papers' surrogate (PACD-BO, GUIDE-FBO, PMCBO): outputs standardized as they are; the benchmark
#: suites' paper rows ask for it by name, whatever labfbo's defaults are
PAPERS_SURROGATE: dict[str, str] = {"output_transform": "standardize", "lengthscale_prior": "dim_scaled"}


def winsorized(y: np.ndarray, k: float = 1.5) -> np.ndarray:
    r"""``y`` with its low tail raised to Tukey's lower fence :math:`Q_1 - k\,(Q_3 - Q_1)`.

    One-sided on purpose: ``y`` is in the maximization orientation, so only the bad tail
    (failed reactions, broken runs) is clipped; the region the optimizer cares about keeps
    its values. With fewer than 4 values, or none below the fence, ``y`` is returned as is.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.size < 4:
        return y
    q1, q3 = np.quantile(y, [0.25, 0.75])
    return np.maximum(y, q1 - k * (q3 - q1))


#: how many robust spreads from the median a value may lie before :func:`tamed` pulls it in
TAME_SPREADS = 1e4


def tamed(y: np.ndarray, k: float = TAME_SPREADS) -> np.ndarray:
    r"""``y`` with the values farther than ``k`` robust spreads from the median pulled in on a log scale.

    With :math:`m` the median and :math:`s` the median absolute deviation :math:`|y_j - m|` (if
    that is 0, the median of the non-zero deviations; robust to one outlier among 3 values; beyond
    1e100, whose square overflows, :math:`\max(|m|, 1)`), a value with :math:`z = |y_j - m| / s > k`
    becomes
    :math:`m \pm s\,(k + \log(z/k))`: order kept, still the best (or worst) by far, but a
    finite extreme (a unit slip, ``1e308``) can no longer shrink every other value to the same
    number after standardizing, which leaves the GP without a scale. Values within ``k``
    spreads, i.e. every value of an ordinary campaign, are returned as they are.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.size < 3 or not np.isfinite(y).all():
        return y
    m = float(np.median(y))
    with np.errstate(over="ignore", invalid="ignore"):
        dev = np.abs(y - m)
    s = float(np.median(dev))
    if not s > 0:
        nz = dev[dev > 0]
        s = float(np.median(nz)) if nz.size else 0.0
    if s > 1e100:  # one value apart from a crowd of equal ones: no spread to go by but the values' own size
        s = max(abs(m), 1.0)
    if not (s > 0 and np.isfinite(s)):
        return y
    z = np.minimum(dev / s, 1e300)
    far = z > k
    if not far.any():
        return y
    out = y.copy()
    out[far] = m + np.sign(y[far] - m) * s * (k + np.log(z[far] / k))
    return out


def _input_transform(d: int, cat_dims: list[int], warp: bool, features: "FeatureMap | None" = None,
                     warp_dims: list[int] | None = None) -> InputTransform:
    """``features`` (descriptors of categorical choices), then ``Normalize`` to the unit cube,
    then (``warp``) a Kumaraswamy CDF per continuous column (``warp_dims``, default: every
    non-categorical column) with BoTorch's tutorial priors on its two concentrations."""
    bounds = torch.stack([torch.zeros(d, dtype=DTYPE), torch.ones(d, dtype=DTYPE)])
    steps: dict[str, InputTransform] = {}
    if features is not None:
        from labfbo.models.encoding import FeatureTransform

        steps["features"] = FeatureTransform(features)
    steps["normalize"] = Normalize(d=d, bounds=bounds)
    cont = warp_dims if warp_dims is not None else [j for j in range(d) if j not in cat_dims]
    if warp and cont:
        steps["warp"] = Warp(d=d, indices=cont, bounds=bounds,
                             concentration1_prior=LogNormalPrior(0.0, 0.75 ** 0.5),
                             concentration0_prior=LogNormalPrior(0.0, 0.75 ** 0.5))
    return steps["normalize"] if len(steps) == 1 else ChainedInputTransform(**steps)


#: observations before ``descriptors="auto"`` compares descriptors with labels (fewer: labels)
DESCRIPTOR_MIN_POINTS = 5

def noise_likelihood(noise_prior: str) -> GaussianLikelihood | None:
    """The likelihood of a learned noise under ``noise_prior``: ``None`` (BoTorch's default,
    ``LogNormal(-4, 1)``, floor 1e-4) for ``"lognormal"``, Optuna's ``Gamma(1.1, 30)`` with a
    1e-6 floor for ``"gamma"``."""
    if noise_prior != "gamma":
        return None
    return GaussianLikelihood(noise_prior=GammaPrior(1.1, 30.0),
                              noise_constraint=GreaterThan(1e-6, transform=None, initial_value=1e-3))


def fit_local_gp(X: np.ndarray, y: np.ndarray, yvar: np.ndarray | None = None,
                 cat_dims: list[int] | None = None, seed: int = 0,
                 options: SurrogateOptions | None = None, space: "SearchSpace | None" = None,
                 mean_module: Mean | None = None, max_iterations: int | None = None,
                 objective: bool = True) -> Model:
    """Fit the site's GP on unit-cube inputs ``X (n, d)`` and targets ``y (n,)``.

    ``y`` is in the maximization orientation (labfbo flips minimization objectives).
    With ``space``, its categorical columns are categorical (``cat_dims`` is ignored), and
    those whose choices carry descriptors enter as the scaled descriptors
    (:mod:`labfbo.models.encoding`). ``mean_module`` replaces BoTorch's constant mean (it
    sees the model's inputs: the encoded features, on the standardized scale of ``y``).
    ``max_iterations`` caps the L-BFGS iterations of the hyperparameter fit (None: to convergence).
    ``objective=False`` (an outcome constraint's column) never winsorizes: a constraint's threshold
    may sit in either tail.
    """
    opts = options or SurrogateOptions()
    if objective and opts.output_transform == "winsorize":
        y = winsorized(y)
    train_X = as_tensor(X)
    train_Y = as_tensor(y).reshape(-1, 1)
    train_Yvar = None if yvar is None else as_tensor(yvar).reshape(-1, 1).clamp_min(1e-10)
    d = train_X.shape[-1]
    cat_dims = sorted(cat_dims or [])
    plain = (d, cat_dims, None, None)  # categorical columns as labels
    coded = plain
    if space is not None:
        plain = coded = (d, sorted(space.cat_dims()), None, None)
        if space.descriptor_dims():
            from labfbo.models.encoding import FeatureMap

            features = FeatureMap(space)
            warp_dims = [features.slices[j][0] for j, p in enumerate(space.params) if not p.is_discrete]
            coded = (features.n_out, features.cat_out, features, warp_dims)

    def fit(noise_prior: str, mean: Mean | None = mean_module,
            enc: tuple[int, list[int], "FeatureMap | None", list[int] | None] = coded) -> Model:
        d, cat_dims, features, warp_dims = enc
        likelihood = noise_likelihood(noise_prior) if train_Yvar is None else None
        model = SingleTaskGP(train_X, train_Y, train_Yvar, likelihood=likelihood,
                             covar_module=kernel_for(d, cat_dims, opts.kernel == "rbf", opts.categorical_kernel,
                                                     opts.lengthscale_prior),
                             mean_module=mean,
                             input_transform=_input_transform(d, cat_dims, opts.input_warping, features, warp_dims),
                             outcome_transform=Standardize(m=1))
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        with seeded_torch(seed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optimizer chatter; failures raise below
            fit_gpytorch_mll(mll, optimizer_kwargs=None if max_iterations is None else
                             {"options": {"maxiter": max_iterations}})
        model.eval()
        return model

    n = train_X.shape[0]
    noises = (["lognormal", "gamma"] if opts.noise_prior == "auto" and train_Yvar is None and n >= 3
              else ["lognormal" if opts.noise_prior == "auto" else opts.noise_prior])
    if coded is plain or mean_module is not None or opts.descriptors == "use":
        encodings = [coded]  # a mean module sees the model's inputs: the encoded features
    elif opts.descriptors == "ignore" or n < DESCRIPTOR_MIN_POINTS:
        encodings = [plain]
    else:
        encodings = [plain, coded]
    choices = [(noise, enc) for enc in encodings for noise in noises]
    candidates = [fit(noise, copy.deepcopy(mean_module) if k < len(choices) - 1 else mean_module, enc)
                  for k, (noise, enc) in enumerate(choices)]
    if len(candidates) == 1:
        return candidates[0]
    # Model selection by leave-one-out predictive density (Rasmussen & Williams, Sec. 5.4.2): every
    # candidate sees the same standardized targets, so their LOO densities compare directly (ties: the first).
    return candidates[int(np.argmax([loo_log_density(m) for m in candidates]))]


def predict(model: Model, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of the latent function at ``X (m, d)``."""
    with torch.no_grad():
        post = model.posterior(as_tensor(X))
        mean = post.mean.reshape(-1).numpy().copy()
        std = post.variance.clamp_min(0.0).sqrt().reshape(-1).numpy().copy()
    return mean, std


def loo_log_density(model: Model) -> float:
    r"""Mean leave-one-out log predictive density of a fitted ``SingleTaskGP`` on its own
    training targets, in the units of ``y``, at the fitted hyper-parameters: with
    :math:`K_y = K + \Sigma_\text{noise}` and :math:`r = y - m`,
    :math:`\mu_{-i} = y_i - [K_y^{-1}r]_i/[K_y^{-1}]_{ii}`, :math:`\sigma^2_{-i} = 1/[K_y^{-1}]_{ii}`
    (on the standardized scale, then less :math:`\log s` of the ``Standardize`` transform)."""
    n = model.train_targets.shape[-1]
    if n < 2:
        return float("nan")
    with torch.no_grad():
        Xt = model.train_inputs[0]                       # transformed: the model is in eval mode
        noise = model.likelihood.noise.reshape(-1).expand(n)
        Ky = model.covar_module(Xt).to_dense() + torch.diag_embed(noise)
        r = model.train_targets - model.mean_module(Xt)
        Kinv = torch.cholesky_inverse(torch.linalg.cholesky(Ky))
        diag = torch.diagonal(Kinv)
        var = 1.0 / diag
        z2 = (Kinv @ r) ** 2 * var                        # (r_i - mu_-i)^2 / var
        lpd = float((-0.5 * (z2 + torch.log(2 * math.pi * var))).mean())
    scale = getattr(getattr(model, "outcome_transform", None), "stdvs", None)
    return lpd - (float(torch.log(scale).sum()) if scale is not None else 0.0)
