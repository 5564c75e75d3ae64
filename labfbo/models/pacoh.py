r"""PACOH meta-learned GP priors for PACD-BO (float64): particles, per-site scores, SVGD, mixture.

**Prior family** (PACOH-GP, Rothfuss et al. 2021; PACD-BO Eq. 5). A particle
:math:`\phi \in \mathbb{R}^P` is one GP prior on the unit cube. Inputs
:math:`u = \sqrt{12}(x - \frac12)` (unit variance under a uniform design; a fixed map, the
same at every site, where PACOH standardizes pooled inputs); kernel
:math:`s^2 \exp(-\frac12\|(\varphi(u) - \varphi(u'))/\ell\|^2)` with :math:`\varphi` a tanh
MLP ``hidden`` -> ``feature_dim``, one lengthscale per feature and a learned :math:`s^2`;
mean a tanh MLP ``hidden`` -> 1 (``learn_mean``) or a learned constant; Gaussian noise
:math:`\sigma^2 = 10^{-4} + e^{(\cdot)}` (BoTorch's minimum inferred noise; keeps the
Cholesky factors well conditioned).

**Flat vector.** :func:`param_layout` lists the blocks in order (per layer ``W (in, out)``
row-major then ``b``; kernel MLP, mean MLP or ``mean_const``, ``log_lengthscale``,
``log_outputscale``, ``log_noise``), stored standardized: value = ``offset + scale * phi``.
Scales are PACOH's hyper-prior stds (NN weights 0.5, biases 3.0; 1 for the log GP
parameters, as PACOH's N(0,1) on its softplus-raw ones), so
:math:`\mathcal{N}(0, \mathrm{prior\_std}^2 I)` on :math:`\phi` is (exactly, for the NN
weights) PACOH's hyper-prior tempered by ``prior_factor = 1/prior_std^2``. Deviations for BO: the mean MLP's output
layer has scale 0.1 (prior means start within ~±0.5 standardized units, not ±4);
``log_noise`` is centred at :math:`\ln 10^{-2}` (PACOH: softplus(-1) ≈ 0.31, noisy
regression data; pacoh-jax starts at noise std 0.01); :math:`\ln s^2` is learned, centred
at 0 (PACOH fixes :math:`s^2 = 1`, PACD-BO Eq. 5 fixes 1/2).

**Evidence.** :math:`\ln Z_\beta(S, P_\phi) = \ln \mathbb{E}_{f \sim P_\phi}
\prod_j p(y_j \mid f(x_j))^{\beta/n}` (:math:`-\beta` times the empirical NLL loss). With
``beta_meta="n"`` (:math:`\beta = n`, PACOH's choice for GPs) it is exactly the GP marginal
log-likelihood :math:`\ln \mathcal{N}(y \mid m, K + \sigma^2 I)`. For a number
:math:`\beta`, :math:`t = \beta/n`, the tempered likelihood is Gaussian again:
:math:`\ln Z_\beta = \ln \mathcal{N}(y \mid m, K + \frac{\sigma^2}{t} I)
+ n[\frac{1-t}{2}\ln(2\pi\sigma^2) - \frac12\ln t]` (and the per-particle posterior is
the matching Gibbs posterior, noise :math:`\sigma^2/t`). ``y`` is standardized by the
site's **own** mean and unbiased std (1 if :math:`n < 2` or constant), so :math:`A_i`
depends on site :math:`i`'s data only and the meta-score is exactly a sum over sites.

**Meta-score** (PACD-BO Eq. 7): :math:`-\phi/\mathrm{prior\_std}^2 +
\frac{\lambda}{N\beta+\lambda}\sum_i A_i`. With ``beta_meta="n"`` the prefactor's :math:`\beta`
is the harmonic mean :math:`\tilde m` of the sites' :math:`n_i` (as in PACOH's code), so
:func:`meta_score` needs ``n_points``. ``lam="n_sites"`` (:math:`\lambda = N`) gives
:math:`1/(\tilde m + 1)`: the likelihood term stays :math:`O(N)` as data accrue. PACOH's
code weights :math:`\ln Z_i` by :math:`\tilde m/(n_i(\tilde m + N))` and the hyper-prior
by ``prior_factor=0.01``; for equal :math:`n_i` our defaults are that objective with
:math:`\tilde m + 1` for :math:`\tilde m + N`.

**SVGD** (:mod:`labfbo.models.svgd`) directions, applied by Adam (``meta_optimizer="adam"``,
PACOH's choice; :func:`svgd_step`, the moments passed in and out explicitly) or by the
paper's plain step :math:`\phi \leftarrow \phi + \eta\psi` (``"sgd"``).

**Defaults.** ``n_particles=10``, ``hidden=(32, 32)``, ``feature_dim=2``,
``learn_mean=True``, ``bandwidth=None`` (median heuristic): the PACOH-SVGD reference.
``meta_optimizer="adam"``, ``step_size=0.01``: tuned here (``labfbo bench meta-fit``;
docs/protocols/gradient.md). On Hartmann-6 (5 sites x 30 points) Adam at 0.01 reached in
500 steps a test nRMSE (0.77) the plain step at 0.1 needed ~4000 for, and in BO it halved
the final regret; ``feature_dim=6`` was worse there (0.086 against 0.052).
For the plain step, ``step_size=0.1``: on related sinusoids (N=5, d in {1,2,6}, n in {5,20,100})
0.03 raises ln Z steadily and 0.1 faster; on Wing Weight (5 sites, 10 points each) 0.03
for 220 steps left the mixture's test nRMSE at 0.50 (local GP: 0.13), 0.1 for 1000 steps
reached 0.18; 0.3-1 is erratic (never NaN).
``svgd_steps=20`` per BO round. ``max_step=20``: each particle's step is clipped to that
norm (and a non-finite direction counts as zero). Plain steps have median norm ~0.27 and 99th
percentile ~7-9 (2-D sphere, 5 sites, K=5); without the cap one campaign of that study
took a step of 20, then 8e9, and every site's kernel became NaN at round 68. The cap
binds on ~0.3 % of plain particle-steps there; Adam's (about lr per coordinate) stay far below it.

**Mixture** (Eqs. 8-9): :mod:`labfbo.models.particle_mixture`.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal, Sequence, Union

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from labfbo.models.gp import DTYPE
from labfbo.models.svgd import median_bandwidth, svgd_direction

__all__ = ["PacohConfig", "n_params", "param_layout", "init_particles", "site_log_evidence",
           "site_score", "mean_jacobian", "mean_block_names", "mean_block_index", "prior_mean_cov",
           "log_hyperprior", "hyperprior_score", "meta_weight", "meta_score",
           "svgd_direction", "median_bandwidth", "svgd_update", "svgd_step", "AdamState"]

WEIGHT_SCALE = 0.5          # PACOH weight_prior_std
BIAS_SCALE = 3.0            # PACOH bias_prior_std
MEAN_OUT_SCALE = 0.1        # mean-MLP output layer (labfbo; see module docstring)
LOG_NOISE_LOC = math.log(1e-2)
NOISE_FLOOR = 1e-4          # BoTorch's MIN_INFERRED_NOISE_LEVEL
_LOG_2PI = math.log(2.0 * math.pi)
PosInt = Annotated[int, Field(ge=1)]
PosFloat = Annotated[float, Field(gt=0)]


class PacohConfig(BaseModel):
    """PACOH-SVGD settings (defaults and their sources: see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    n_particles: int = Field(10, ge=1, description="K; PACOH num_particles=10")
    hidden: tuple[PosInt, ...] = Field((32, 32), description="tanh layers of both MLPs; PACOH (32, 32)")
    feature_dim: int = Field(2, ge=1, description="kernel feature map output; PACOH VectorizedGP default 2")
    learn_mean: bool = Field(True, description="MLP mean (PACOH mean_module='NN'); False: learned constant")
    prior_std: float = Field(10.0, gt=0, description="hyper-prior std of the standardized vector; "
                             "= 1/sqrt(PACOH prior_factor=0.01)")
    beta_meta: Union[Literal["n"], PosFloat] = Field("n", description="PACOH's task temperature beta: 'n': "
                                                     "beta_i = n_i, exact GP marginal log-likelihood (PACOH for "
                                                     "GPs); a number: tempered (named apart from UCB's beta)")
    lam: Union[Literal["n_sites"], PosFloat] = Field("n_sites", description="meta-level lambda; 'n_sites': N")
    meta_optimizer: Literal["adam", "sgd"] = Field("adam", description="how an SVGD direction moves the "
                                                   "particles: Adam (PACOH) or the plain step")
    step_size: float = Field(0.01, gt=0, description="learning rate (adam) or step eta (sgd); tuned here")
    bandwidth: float | None = Field(None, gt=0, description="RBF bandwidth h; None: median heuristic")
    svgd_steps: int = Field(20, ge=0, description="SVGD steps per BO round")
    max_step: float | None = Field(20.0, gt=0, description="cap on each particle's step norm (None: no cap)")


# ----------------------------------------------------------------------------- layout
def param_layout(cfg: PacohConfig, d: int) -> list[tuple[str, tuple[int, ...], float, float]]:
    """Blocks of the flat particle vector, in order: ``(name, shape, scale, offset)``."""
    blocks: list[tuple[str, tuple[int, ...], float, float]] = []

    def mlp(prefix: str, d_out: int, out_scale: float | None) -> None:
        dims = [d, *cfg.hidden, d_out]
        for layer in range(len(dims) - 1):
            last = layer == len(dims) - 2
            ws = out_scale if last and out_scale is not None else WEIGHT_SCALE
            bs = out_scale if last and out_scale is not None else BIAS_SCALE
            blocks.append((f"{prefix}.W{layer}", (dims[layer], dims[layer + 1]), ws, 0.0))
            blocks.append((f"{prefix}.b{layer}", (dims[layer + 1],), bs, 0.0))

    mlp("kernel", cfg.feature_dim, None)
    if cfg.learn_mean:
        mlp("mean", 1, MEAN_OUT_SCALE)
    else:
        blocks.append(("mean_const", (1,), 1.0, 0.0))
    blocks.append(("log_lengthscale", (cfg.feature_dim,), 1.0, 0.0))
    blocks.append(("log_outputscale", (1,), 1.0, 0.0))
    blocks.append(("log_noise", (1,), 1.0, LOG_NOISE_LOC))
    return blocks


def n_params(cfg: PacohConfig, d: int) -> int:
    """Length ``P`` of a particle for ``d`` input dimensions."""
    return sum(math.prod(shape) for _, shape, _, _ in param_layout(cfg, d))


@functools.lru_cache(maxsize=64)
def _affine(cfg: PacohConfig, d: int) -> tuple[Tensor, Tensor]:
    scale, offset = [], []
    for _, shape, s, o in param_layout(cfg, d):
        scale += [s] * math.prod(shape)
        offset += [o] * math.prod(shape)
    return torch.tensor(scale, dtype=DTYPE), torch.tensor(offset, dtype=DTYPE)


def _unpack(phi: Tensor, cfg: PacohConfig, d: int) -> dict[str, Tensor]:
    """Actual parameters, each ``(K, *shape)``, from standardized particles ``(K, P)``."""
    scale, offset = _affine(cfg, d)
    if phi.ndim != 2 or phi.shape[1] != scale.numel():
        raise ValueError(f"particles must be (K, {scale.numel()}) for d={d}, got {tuple(phi.shape)}")
    layout = param_layout(cfg, d)
    parts = torch.split(offset + scale * phi, [math.prod(shape) for _, shape, _, _ in layout], dim=1)
    return {name: v.reshape(v.shape[0], *shape) for (name, shape, _, _), v in zip(layout, parts)}


def init_particles(cfg: PacohConfig, d: int, seed: int) -> Tensor:
    """``(K, P)`` draws from the untempered PACOH hyper-prior (standard normal in the
    standardized vector), as PACOH initializes its particles; deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(int(seed) % (2**63 - 1))
    return torch.randn(cfg.n_particles, n_params(cfg, d), generator=gen, dtype=DTYPE)


# ----------------------------------------------------------------------------- the GP prior
def _inputs(X: Tensor) -> Tensor:
    return (X - 0.5) * math.sqrt(12.0)


def _mlp(th: dict[str, Tensor], prefix: str, U: Tensor, acts: list[Tensor] | None = None) -> Tensor:
    """``U (N, d)`` shared by all particles -> ``(K, N, d_out)``; ``acts`` collects layer inputs."""
    h, layer = U, 0
    while f"{prefix}.W{layer}" in th:
        if layer:
            h = torch.tanh(h)
        if acts is not None:
            acts.append(h)
        h = torch.matmul(h, th[f"{prefix}.W{layer}"]) + th[f"{prefix}.b{layer}"].unsqueeze(-2)
        layer += 1
    return h


def _mlp_grad(th: dict[str, Tensor], prefix: str, acts: list[Tensor], g: Tensor,
              out: dict[str, Tensor]) -> None:
    """Backpropagate ``g = d/d output (K, N, d_out)`` through the MLP into ``out[name]``."""
    for layer in reversed(range(len(acts))):
        a = acts[layer]
        out[f"{prefix}.W{layer}"] = a.transpose(-1, -2) @ g
        out[f"{prefix}.b{layer}"] = g.sum(-2)
        if layer:
            g = (g @ th[f"{prefix}.W{layer}"].transpose(-1, -2)) * (1.0 - a * a)


def _features(th: dict[str, Tensor], U: Tensor, acts: list[Tensor] | None = None) -> Tensor:
    return _mlp(th, "kernel", U, acts) / torch.exp(th["log_lengthscale"]).unsqueeze(-2)


def _mean(th: dict[str, Tensor], U: Tensor, acts: list[Tensor] | None = None) -> Tensor:
    if "mean.W0" in th:
        return _mlp(th, "mean", U, acts)[..., 0]
    return th["mean_const"].expand(-1, U.shape[0])


def _rbf(th: dict[str, Tensor], Fa: Tensor, Fb: Tensor) -> Tensor:
    """``Fa (K, ..., a, f)``, ``Fb (K, ..., b, f)`` -> ``(K, ..., a, b)``."""
    d2 = _sqdist(Fa, Fb)
    s2 = torch.exp(th["log_outputscale"][:, 0]).reshape(-1, *([1] * (d2.ndim - 1)))
    return s2 * torch.exp(-0.5 * d2)


def _sqdist(Fa: Tensor, Fb: Tensor) -> Tensor:
    """Exact squared distances, one feature at a time (``feature_dim`` is small)."""
    return sum((Fa[..., c].unsqueeze(-1) - Fb[..., c].unsqueeze(-2)) ** 2 for c in range(Fa.shape[-1]))


def _noise(th: dict[str, Tensor]) -> Tensor:
    return NOISE_FLOOR + torch.exp(th["log_noise"][:, 0])


def _cholesky(A: Tensor) -> Tensor:
    # Not gpytorch's psd_safe_cholesky: its jitter is absolute (1e-6 in float64), ours is relative
    # to the mean diagonal, which a PACOH particle's kernel scale (anywhere in e^{+-10}) needs.
    L, info = torch.linalg.cholesky_ex(A)
    jitter = 1e-10 * A.diagonal(dim1=-2, dim2=-1).mean()
    for _ in range(8):
        if not bool((info > 0).any()):
            return L
        A = A + jitter * torch.eye(A.shape[-1], dtype=A.dtype)
        L, info = torch.linalg.cholesky_ex(A)
        jitter = jitter * 10
    raise torch.linalg.LinAlgError("kernel matrix is not positive definite even with jitter")


def _standardize(y: Tensor) -> tuple[Tensor, float, float]:
    """``y`` by its own mean and unbiased std (std 1 when ``n < 2`` or ``y`` is constant)."""
    yd = y.detach()             # the constants of the standardization carry no gradient
    mu = float(yd.mean()) if y.numel() else 0.0
    sd = float(yd.std()) if y.numel() >= 2 else 0.0
    if not sd > 1e-12 * max(1.0, float(yd.abs().max()) if y.numel() else 1.0):
        sd = 1.0
    return (y - mu) / sd, mu, sd


def _data(X: Any, y: Any) -> tuple[Tensor, Tensor]:
    X = torch.as_tensor(X, dtype=DTYPE)
    y = torch.as_tensor(y, dtype=DTYPE).reshape(-1)
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X must be (n, d) and y (n,), got {tuple(X.shape)} and {tuple(y.shape)}")
    return X, y


def _fit(phi: Tensor, X: Any, y: Any, cfg: PacohConfig, acts: bool = False) -> dict[str, Any]:
    """Forward pass on one site's standardized data: features, mean, Cholesky factor, alpha."""
    X, y = _data(X, y)
    n = y.shape[0]
    th = _unpack(phi, cfg, X.shape[1])
    U = _inputs(X)
    f = {"th": th, "n": n, "t": 1.0 if cfg.beta_meta == "n" else float(cfg.beta_meta) / n,
         "acts_k": [] if acts else None, "acts_m": [] if acts else None, "noise": _noise(th)}
    f["F"], f["m"] = _features(th, U, f["acts_k"]), _mean(th, U, f["acts_m"])
    f["Kf"] = _rbf(th, f["F"], f["F"])
    f["L"] = _cholesky(f["Kf"] + torch.diag_embed((f["noise"] / f["t"]).unsqueeze(-1).expand(-1, n)))
    f["r"] = _standardize(y)[0] - f["m"]
    f["alpha"] = torch.cholesky_solve(f["r"].unsqueeze(-1), f["L"])[..., 0]          # (K, n)
    return f


def site_log_evidence(particles: Tensor, X: Any, y: Any, cfg: PacohConfig) -> Tensor:
    r""":math:`\ln Z_\beta(S, P_{\phi_k})` ``(K,)`` of one site's data (differentiable in
    ``particles``); ``X (n, d)`` unit cube, ``y (n,)`` raw, maximization orientation."""
    phi = particles.to(DTYPE)
    if _data(X, y)[1].shape[0] == 0:
        return phi.sum(-1) * 0.0
    f = _fit(phi, X, y, cfg)
    n, t = f["n"], f["t"]
    lnz = (-0.5 * (f["r"] * f["alpha"]).sum(-1) - 0.5 * n * _LOG_2PI
           - torch.log(f["L"].diagonal(dim1=-2, dim2=-1)).sum(-1))
    if t != 1.0:
        lnz = lnz + n * (0.5 * (1.0 - t) * (_LOG_2PI + torch.log(f["noise"])) - 0.5 * math.log(t))
    return lnz


def site_score(particles: Tensor, X: Any, y: Any, cfg: PacohConfig) -> Tensor:
    r""":math:`A_k = \nabla_{\phi_k} \ln Z_\beta(S, P_{\phi_k})`, ``(K, P)``, on one site's data
    (PACD-BO Eq. 6); the only thing a site sends.

    The exact gradient of :func:`site_log_evidence`, written out (no autograd, for speed):
    :math:`\partial \ln Z/\partial K_y = W = \frac12(\alpha\alpha^\top - K_y^{-1})`,
    :math:`\partial \ln Z/\partial m = \alpha`, then back through the kernel and the MLPs.
    """
    phi = particles.detach().to(DTYPE)
    X, y = _data(X, y)
    if y.shape[0] == 0:
        return torch.zeros_like(phi)
    f = _fit(phi, X, y, cfg, acts=True)
    th, n, t, F, alpha, noise = f["th"], f["n"], f["t"], f["F"], f["alpha"], f["noise"]
    Kinv = torch.cholesky_inverse(f["L"])
    # W = d lnZ / d Ky = (alpha alpha^T - Ky^-1) / 2;  C = d lnZ / d D_ij = -W * Kf / 2
    C = (Kinv - alpha.unsqueeze(-1) * alpha.unsqueeze(-2)) * (0.25 * f["Kf"])
    g_F = 4.0 * (C.sum(-1, keepdim=True) * F - C @ F)
    tr_W = 0.5 * ((alpha * alpha).sum(-1) - Kinv.diagonal(dim1=-2, dim2=-1).sum(-1))
    g: dict[str, Tensor] = {
        "log_lengthscale": -(g_F * F).sum(-2),
        "log_outputscale": (-2.0 * C.sum((-2, -1)))[:, None],
        "log_noise": ((tr_W / t + 0.5 * n * (1.0 - t) / noise) * (noise - NOISE_FLOOR))[:, None],
    }
    _mlp_grad(th, "kernel", f["acts_k"], g_F / torch.exp(th["log_lengthscale"]).unsqueeze(-2), g)
    if cfg.learn_mean:
        _mlp_grad(th, "mean", f["acts_m"], alpha.unsqueeze(-1), g)
    else:
        g["mean_const"] = alpha.sum(-1, keepdim=True)
    layout = param_layout(cfg, X.shape[1])
    return torch.cat([g[name].reshape(phi.shape[0], -1) for name, *_ in layout], 1) * _affine(cfg, X.shape[1])[0]


def mean_jacobian(particles: Tensor, X: Any, cfg: PacohConfig) -> Tensor:
    r"""Per-point Jacobians of the mean MLP, :math:`\partial m_{\phi_k}(x_j)/\partial \phi_k`
    over the ``mean.*`` blocks of the standardized vector: ``(K, n, P_mean)`` (differentiable in ``X``).

    The mean part of a site's score is linear in them: ``A_k[mean] = sum_j alpha_kj J_kj``
    (see :func:`site_score`); :mod:`labfbo.privacy.audit` inverts that.
    """
    phi = particles.detach().to(DTYPE)
    X = torch.as_tensor(X, dtype=DTYPE)
    th, names = _unpack(phi, cfg, X.shape[1]), mean_block_names(cfg, X.shape[1])
    if not names:
        raise ValueError("the mean is a learned constant (learn_mean=False): no mean MLP to differentiate")
    acts: list[Tensor] = []
    _mlp(th, "mean", _inputs(X).expand(phi.shape[0], *X.shape), acts)
    g = torch.ones(phi.shape[0], X.shape[0], 1, dtype=DTYPE)
    out: dict[str, Tensor] = {}
    for layer in reversed(range(len(acts))):
        out[f"mean.W{layer}"] = (acts[layer].unsqueeze(-1) * g.unsqueeze(-2)).flatten(-2)
        out[f"mean.b{layer}"] = g
        if layer:
            g = (g @ th[f"mean.W{layer}"].transpose(-1, -2)) * (1.0 - acts[layer] * acts[layer])
    scale = _affine(cfg, X.shape[1])[0][mean_block_index(cfg, X.shape[1])]
    return torch.cat([out[name] for name in names], -1) * scale


def prior_mean_cov(particles: Tensor, X: Any, cfg: PacohConfig) -> tuple[Tensor, Tensor]:
    """Each particle's prior mean ``(K, n)`` and covariance of noisy observations ``(K, n, n)`` at ``X``."""
    X = torch.as_tensor(X, dtype=DTYPE)
    f = _fit(particles.detach().to(DTYPE), X, torch.zeros(X.shape[0], dtype=DTYPE), cfg)
    return f["m"], f["L"] @ f["L"].transpose(-1, -2)


def mean_block_names(cfg: PacohConfig, d: int) -> list[str]:
    """Names of the mean-MLP blocks of the flat particle vector, in layout order."""
    return [name for name, *_ in param_layout(cfg, d) if name.startswith("mean.")]


def mean_block_index(cfg: PacohConfig, d: int) -> Tensor:
    """Positions of the mean-MLP blocks in the flat particle vector."""
    idx, start = [], 0
    for name, shape, _, _ in param_layout(cfg, d):
        size = math.prod(shape)
        if name.startswith("mean."):
            idx.append(torch.arange(start, start + size))
        start += size
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)


def log_hyperprior(particles: Tensor, cfg: PacohConfig) -> Tensor:
    r""":math:`\ln \mathcal{N}(\phi_k; 0, \mathrm{prior\_std}^2 I)`, ``(K,)``."""
    phi = particles.to(DTYPE)
    v = cfg.prior_std ** 2
    return -0.5 * (phi ** 2).sum(-1) / v - 0.5 * phi.shape[-1] * (_LOG_2PI + math.log(v))


def hyperprior_score(particles: Tensor, cfg: PacohConfig) -> Tensor:
    r""":math:`\nabla \ln \mathcal{P}(\phi_k) = -\phi_k / \mathrm{prior\_std}^2`, ``(K, P)``."""
    return -particles.detach().to(DTYPE) / cfg.prior_std ** 2


def meta_weight(n_sites: int, cfg: PacohConfig, n_points: int | Sequence[int] | None = None) -> float:
    r""":math:`\lambda / (N\beta + \lambda)`. With ``beta_meta="n"``, :math:`\beta` is the harmonic
    mean of ``n_points`` (the sites' observation counts; empty sites are skipped)."""
    if n_sites < 1:
        raise ValueError("n_sites must be >= 1")
    lam = float(n_sites) if cfg.lam == "n_sites" else float(cfg.lam)
    if cfg.beta_meta == "n":
        if n_points is None:
            raise ValueError("beta_meta='n' needs n_points: the sites' observation counts")
        pos = [c for c in torch.as_tensor(n_points, dtype=DTYPE).reshape(-1).tolist() if c > 0]
        beta = len(pos) / sum(1.0 / c for c in pos) if pos else 0.0
    else:
        beta = float(cfg.beta_meta)
    return lam / (n_sites * beta + lam)


def meta_score(particles: Tensor, summed_site_scores: Tensor, n_sites: int, cfg: PacohConfig,
               n_points: int | Sequence[int] | None = None) -> Tensor:
    r"""PACD-BO Eq. 7: :math:`\nabla\ln\mathcal{P}(\phi_k) + \frac{\lambda}{N\beta+\lambda} G_k`
    with ``summed_site_scores`` :math:`G = \sum_i A_i` ``(K, P)`` over ``n_sites`` sites."""
    w = meta_weight(n_sites, cfg, n_points)
    return hyperprior_score(particles, cfg) + w * summed_site_scores.detach().to(DTYPE)


AdamState = dict[str, Tensor]    # torch.optim.Adam's per-parameter state: step, exp_avg, exp_avg_sq


def svgd_step(particles: Tensor, score: Tensor, cfg: PacohConfig,
              state: AdamState | None = None) -> tuple[Tensor, AdamState | None]:
    r"""One meta-update from the target ``score``: the SVGD direction :math:`\psi`, then
    :func:`svgd_update` (``meta_optimizer="sgd"``) or an Adam step on :math:`\psi` (``"adam"``,
    :class:`torch.optim.Adam`, lr ``step_size``, default betas). Pure: Adam's moments are
    ``state`` in and out (None: fresh); a direction with a non-finite entry counts as zero
    for its particle, and each particle's step is capped at ``max_step`` as in :func:`svgd_update`.
    """
    if cfg.meta_optimizer == "sgd":
        return svgd_update(particles, score, cfg), state
    phi = particles.detach().to(DTYPE)
    param = torch.nn.Parameter(phi.clone())
    opt = torch.optim.Adam([param], lr=cfg.step_size, maximize=True, foreach=False)
    if state is not None:
        opt.state[param] = {k: v.clone() for k, v in state.items()}
    param.grad = _finite_rows(svgd_direction(phi, score, cfg.bandwidth))
    opt.step()
    moments = {k: v.detach() for k, v in opt.state[param].items()}  # this call's own tensors
    return phi + _capped(param.detach() - phi, cfg.max_step), moments


def svgd_update(particles: Tensor, score: Tensor, cfg: PacohConfig) -> Tensor:
    r""":math:`\phi_k + \eta\,\psi_k(\phi)` (pure: no optimizer state), each particle's step
    clipped to norm ``max_step``; a particle whose step is not finite stays where it is."""
    phi = particles.detach().to(DTYPE)
    return phi + _capped(_finite_rows(cfg.step_size * svgd_direction(particles, score, cfg.bandwidth)), cfg.max_step)


def _finite_rows(x: Tensor) -> Tensor:
    """``x (K, P)`` with every row that has a non-finite entry set to zero."""
    return torch.where(torch.isfinite(x).all(-1, keepdim=True), x, torch.zeros_like(x))


def _capped(step: Tensor, max_step: float | None) -> Tensor:
    """Each particle's step ``(K, P)`` scaled down to norm ``max_step`` if longer (None: as is)."""
    if max_step is None:
        return step
    norm = torch.linalg.norm(step, dim=-1, keepdim=True)
    return step * torch.clamp(max_step / norm.clamp_min(1e-300), max=1.0)
