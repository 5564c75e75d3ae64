"""PACOH particles, per-site scores, SVGD and the particle-mixture BoTorch model.

The references below re-implement the documented prior family per particle (plain
matrices, ``torch.distributions``), sharing only :func:`param_layout` with the module.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from botorch.acquisition import (
    LogExpectedImprovement,
    UpperConfidenceBound,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from scipy import integrate, stats

from labfbo.models import pacoh
from labfbo.models.gp import DTYPE, seeded_torch
from labfbo.models.pacoh import (
    PacohConfig,
    hyperprior_score,
    init_particles,
    log_hyperprior,
    meta_score,
    meta_weight,
    n_params,
    param_layout,
    site_log_evidence,
    site_score,
    svgd_direction,
    svgd_step,
    svgd_update,
)
from labfbo.models.particle_mixture import ParticleMixtureGP, mixture_mean_var, mixture_moments

torch.set_num_threads(1)
SMALL = PacohConfig(n_particles=4, hidden=(8, 8))


def _data(n: int, d: int, seed: int, phase: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DTYPE)
    y = 3.0 * torch.sin(2 * math.pi * X[:, 0] + phase) + X[:, 1:].sum(-1) + 5.0
    return X, y + 0.05 * torch.randn(n, generator=g, dtype=DTYPE)


def _moderate(cfg: PacohConfig, d: int, seed: int) -> torch.Tensor:
    """Particles with smallish weights and noise variance ~0.1: well-conditioned kernels."""
    p = 0.5 * init_particles(cfg, d, seed)
    p[:, -1] = math.log(0.1 / 1e-2)          # log_noise is the last block (standardized)
    return p


# ------------------------------------------------------------------ per-particle reference
def _ref_params(phi: torch.Tensor, cfg: PacohConfig, d: int) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for name, shape, scale, offset in param_layout(cfg, d):
        j = i + math.prod(shape)
        out[name] = offset + scale * phi[i:j].reshape(shape)
        i = j
    assert i == phi.numel()
    return out


def _ref_prior(par: dict, cfg: PacohConfig, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (n, f) and prior mean (n,) of one particle."""
    def mlp(prefix: str, h: torch.Tensor) -> torch.Tensor:
        n_layers = len(cfg.hidden) + 1
        for layer in range(n_layers):
            h = h @ par[f"{prefix}.W{layer}"] + par[f"{prefix}.b{layer}"]
            if layer < n_layers - 1:
                h = torch.tanh(h)
        return h
    U = (X - 0.5) * math.sqrt(12.0)
    feats = mlp("kernel", U) / torch.exp(par["log_lengthscale"])
    mean = mlp("mean", U)[:, 0] if cfg.learn_mean else par["mean_const"].expand(X.shape[0])
    return feats, mean


def _ref_kernel(par: dict, Fa: torch.Tensor, Fb: torch.Tensor) -> torch.Tensor:
    return torch.exp(par["log_outputscale"]) * torch.exp(-0.5 * ((Fa[:, None] - Fb[None]) ** 2).sum(-1))


def _ref_noise(par: dict) -> torch.Tensor:
    return pacoh.NOISE_FLOOR + torch.exp(par["log_noise"][0])


def _ref_log_evidence(phi: torch.Tensor, X: torch.Tensor, y: torch.Tensor, cfg: PacohConfig) -> torch.Tensor:
    par = _ref_params(phi, cfg, X.shape[1])
    n = X.shape[0]
    ys = (y - y.mean()) / y.std()
    F, m = _ref_prior(par, cfg, X)
    noise = _ref_noise(par)
    t = 1.0 if cfg.beta_meta == "n" else cfg.beta_meta / n
    cov = _ref_kernel(par, F, F) + noise / t * torch.eye(n, dtype=DTYPE)
    lnz = torch.distributions.MultivariateNormal(m, covariance_matrix=cov).log_prob(ys)
    if t != 1.0:
        lnz = lnz + n * (0.5 * (1 - t) * torch.log(2 * math.pi * noise) - 0.5 * math.log(t))
    return lnz


def _ref_posterior(phi, X, y, Xs, cfg):
    """Posterior mean (m,) and covariance (m, m) of one particle, units of y."""
    par = _ref_params(phi, cfg, X.shape[1])
    mu_y, sd_y = y.mean(), y.std()
    F, m = _ref_prior(par, cfg, X)
    Fs, ms = _ref_prior(par, cfg, Xs)
    Ky = _ref_kernel(par, F, F) + _ref_noise(par) * torch.eye(X.shape[0], dtype=DTYPE)
    Ksx = _ref_kernel(par, Fs, F)
    mean = ms + Ksx @ torch.linalg.solve(Ky, (y - mu_y) / sd_y - m)
    cov = _ref_kernel(par, Fs, Fs) - Ksx @ torch.linalg.solve(Ky, Ksx.T)
    return mean * sd_y + mu_y, cov * sd_y ** 2


# ------------------------------------------------------------------------------- tests
def test_config_is_frozen_and_strict():
    cfg = PacohConfig()
    assert (cfg.n_particles, cfg.hidden, cfg.feature_dim, cfg.beta_meta, cfg.lam) == (10, (32, 32), 2, "n", "n_sites")
    for bad in ({"beta_meta": "m"}, {"beta_meta": -1.0}, {"lam": 0.0}, {"hidden": (0,)}, {"nope": 1}):
        with pytest.raises(ValueError):
            PacohConfig(**bad)
    with pytest.raises(ValueError):
        cfg.step_size = 1.0


def test_shapes():
    d, cfg = 3, SMALL
    P = n_params(cfg, d)
    assert P == sum(math.prod(s) for _, s, _, _ in param_layout(cfg, d))
    assert n_params(PacohConfig(), 2) == 2407 and n_params(PacohConfig(learn_mean=False), 6) == 1351
    p = init_particles(cfg, d, 0)
    assert p.shape == (4, P) and p.dtype == DTYPE
    X, y = _data(7, d, 1)
    A = site_score(p, X, y, cfg)
    assert A.shape == (4, P) and A.dtype == DTYPE and torch.isfinite(A).all()
    assert site_log_evidence(p, X, y, cfg).shape == (4,)
    assert hyperprior_score(p, cfg).shape == (4, P)
    assert meta_score(p, A, 1, cfg, n_points=7).shape == (4, P)
    assert svgd_direction(p, A).shape == (4, P) and svgd_update(p, A, cfg).shape == (4, P)
    mu, var = mixture_moments(p, X, y, torch.rand(5, d, dtype=DTYPE), cfg)
    assert mu.shape == var.shape == (4, 5) and (var >= 0).all()
    assert torch.equal(site_score(p, X[:0], y[:0], cfg), torch.zeros_like(p))


def test_init_particles_deterministic():
    state = torch.get_rng_state()
    a, b = init_particles(SMALL, 2, 7), init_particles(SMALL, 2, 7)
    assert torch.equal(torch.get_rng_state(), state)   # global RNG untouched
    assert torch.equal(a, b) and not torch.equal(a, init_particles(SMALL, 2, 8))


@pytest.mark.parametrize("learn_mean,beta", [(True, "n"), (False, "n"), (True, 4.0), (False, 30.0)])
def test_site_score_matches_per_particle_autograd(learn_mean, beta):
    cfg = SMALL.model_copy(update={"learn_mean": learn_mean, "beta_meta": beta})
    d = 2
    X, y = _data(12, d, 3)
    p = _moderate(cfg, d, 4)
    ref = []
    for k in range(p.shape[0]):          # the straightforward loop over particles
        phi = p[k].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(_ref_log_evidence(phi, X, y, cfg), phi)
        ref.append(g)
    ref = torch.stack(ref)
    lnz_ref = torch.stack([_ref_log_evidence(p[k], X, y, cfg) for k in range(p.shape[0])])
    torch.testing.assert_close(site_log_evidence(p, X, y, cfg), lnz_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(site_score(p, X, y, cfg), ref, rtol=0, atol=1e-10)


def test_site_score_default_config_relative():
    """Default config, raw initial particles (steep, ill-conditioned): agree to ~1e-9 relative."""
    cfg, d = PacohConfig(), 2
    X, y = _data(30, d, 5)
    p = init_particles(cfg, d, 0)[:3]
    A = site_score(p, X, y, cfg)
    q = p.clone().requires_grad_(True)
    (B,) = torch.autograd.grad(site_log_evidence(q, X, y, cfg).sum(), q)
    torch.testing.assert_close(A, B, rtol=0, atol=1e-9 * float(B.abs().max()))


@pytest.mark.parametrize("beta", [0.3, 2.5])
def test_tempered_evidence_matches_quadrature(beta):
    """ln Z_beta = ln int prod_j N(y_j | f, s^2)^(beta/n) N(f | m, k) df, for n = 1 (y_std = 0)."""
    cfg = PacohConfig(n_particles=1, hidden=(4,), learn_mean=False, beta_meta=beta)
    p = 0.7 * init_particles(cfg, 1, 2)
    par = _ref_params(p[0], cfg, 1)
    m, k, s2 = float(par["mean_const"][0]), float(torch.exp(par["log_outputscale"][0])), float(_ref_noise(par))
    def f(v):
        return stats.norm.pdf(0.0, v, math.sqrt(s2)) ** beta * stats.norm.pdf(v, m, math.sqrt(k))
    val, _ = integrate.quad(f, m - 12 * math.sqrt(k), m + 12 * math.sqrt(k), epsabs=0, epsrel=1e-12, limit=200)
    lnz = site_log_evidence(p, torch.tensor([[0.3]], dtype=DTYPE), torch.tensor([1.7], dtype=DTYPE), cfg)
    assert abs(float(lnz[0]) - math.log(val)) < 1e-8


def test_meta_score_is_additive_over_sites():
    cfg, d = SMALL, 2
    p = _moderate(cfg, d, 6)
    sites = [_data(n, d, 10 + i, phase=i) for i, n in enumerate((6, 11, 9))]
    counts = [len(y) for _, y in sites]
    w = meta_weight(3, cfg, counts)
    hm = 3 / sum(1 / n for n in counts)
    assert w == pytest.approx(3 / (3 * hm + 3))                          # lam = N, beta = harmonic mean
    G = sum(site_score(p, X, y, cfg) for X, y in sites)
    q = p.clone().requires_grad_(True)
    total = log_hyperprior(q, cfg) + w * sum(site_log_evidence(q, X, y, cfg) for X, y in sites)
    (ref,) = torch.autograd.grad(total.sum(), q)
    torch.testing.assert_close(meta_score(p, G, 3, cfg, n_points=counts), ref, rtol=0, atol=1e-10)
    fixed = cfg.model_copy(update={"beta_meta": 2.0, "lam": 0.5})
    assert meta_weight(3, fixed) == pytest.approx(0.5 / (3 * 2.0 + 0.5))
    with pytest.raises(ValueError, match="n_points"):
        meta_score(p, G, 3, cfg)


def test_svgd_single_particle_is_the_score():
    p = torch.randn(1, 5, dtype=DTYPE)
    s = torch.randn(1, 5, dtype=DTYPE)
    assert torch.equal(svgd_direction(p, s), s)
    assert torch.equal(svgd_direction(p, s, bandwidth=0.3), s)
    cfg = PacohConfig(n_particles=1, step_size=0.1)
    torch.testing.assert_close(svgd_update(p, s, cfg), p + 0.1 * s, rtol=0, atol=0)


def test_svgd_step_is_capped_and_a_non_finite_step_is_dropped():
    p = torch.zeros(1, 4, dtype=DTYPE)
    cfg = PacohConfig(n_particles=1, step_size=0.1, max_step=2.0)
    big = torch.tensor([[1e12, 0.0, 0.0, 0.0]], dtype=DTYPE)
    torch.testing.assert_close(svgd_update(p, big, cfg), torch.tensor([[2.0, 0.0, 0.0, 0.0]], dtype=DTYPE))
    small = torch.tensor([[1.0, 2.0, 0.0, 0.0]], dtype=DTYPE)
    assert torch.equal(svgd_update(p, small, cfg), 0.1 * small)            # below the cap: the plain step
    bad = torch.tensor([[float("nan"), 1.0, 0.0, 0.0]], dtype=DTYPE)
    assert torch.equal(svgd_update(p, bad, cfg), p)
    uncapped = PacohConfig(n_particles=1, step_size=0.1, max_step=None)
    assert torch.equal(svgd_update(p, big, uncapped), 0.1 * big)


def test_the_adam_meta_step_is_torch_adam_on_the_svgd_direction_with_its_state_carried():
    cfg = PacohConfig(n_particles=3, step_size=0.05)
    g = torch.Generator().manual_seed(4)
    p = torch.randn(3, 6, generator=g, dtype=DTYPE)
    scores = [torch.randn(3, 6, generator=g, dtype=DTYPE) for _ in range(3)]
    # the first step of bias-corrected Adam is lr * psi / (|psi| + eps): lr * sign(psi), up to eps
    first, state = svgd_step(p, scores[0], cfg)
    psi = svgd_direction(p, scores[0])
    torch.testing.assert_close(first - p, 0.05 * psi / (psi.abs() + 1e-8), rtol=1e-9, atol=1e-15)
    # three pure steps with the state passed along = one persistent optimizer
    param = torch.nn.Parameter(p.clone())
    opt = torch.optim.Adam([param], lr=0.05, maximize=True)
    q, state = p, None
    for s in scores:
        param.grad = svgd_direction(param.detach(), s)
        opt.step()
        q, state = svgd_step(q, s, cfg, state)
    torch.testing.assert_close(q, param.detach(), rtol=1e-12, atol=1e-14)
    assert int(state["step"]) == 3
    # the plain update is still there, and ignores (returns) the state
    plain = PacohConfig(n_particles=3, step_size=0.05, meta_optimizer="sgd")
    assert torch.equal(svgd_step(p, scores[0], plain, state)[0], svgd_update(p, scores[0], plain))
    # a non-finite direction moves nothing on the first step
    bad = scores[0].clone()
    bad[1, 2] = float("nan")
    moved, _ = svgd_step(p, bad, PacohConfig(n_particles=3, bandwidth=1e6))
    assert torch.isfinite(moved).all()


def test_svgd_moves_particles_to_a_gaussian_target():
    mu = torch.tensor([2.0, -1.0], dtype=DTYPE)
    cov = torch.tensor([[1.0, 0.5], [0.5, 0.8]], dtype=DTYPE)
    prec = torch.linalg.inv(cov)
    g = torch.Generator().manual_seed(0)
    p = 0.5 * torch.randn(40, 2, generator=g, dtype=DTYPE) - 3.0
    for _ in range(1000):
        p = p + 0.1 * svgd_direction(p, -(p - mu) @ prec)
    assert torch.allclose(p.mean(0), mu, atol=0.05)
    emp = torch.cov(p.T)
    assert torch.allclose(emp, cov, atol=0.35)           # spread by the repulsion, not collapsed
    assert emp.diagonal().min() > 0.4


def test_meta_training_on_related_tasks_increases_evidence():
    cfg, d = PacohConfig(n_particles=6, hidden=(16, 16)), 1
    sites = []
    for i in range(5):
        g = torch.Generator().manual_seed(100 + i)
        X = torch.rand(10, d, generator=g, dtype=DTYPE)
        sites.append((X, torch.sin(2 * math.pi * X[:, 0] + 2 * math.pi * i / 5)))
    def summed(q):
        return sum(site_log_evidence(q, X, y, cfg) for X, y in sites).mean().item()
    p = init_particles(cfg, d, 0)
    before = summed(p)
    trace = [before]
    state = None
    for _ in range(2):                                   # two BO rounds of cfg.svgd_steps each
        for _ in range(cfg.svgd_steps):
            G = sum(site_score(p, X, y, cfg) for X, y in sites)
            p, state = svgd_step(p, meta_score(p, G, len(sites), cfg, n_points=[10] * 5), cfg, state)
        trace.append(summed(p))
    assert torch.isfinite(p).all()
    assert trace[1] > before + 10 and trace[2] > trace[1]


def _fitted_mixture(d: int = 2, n: int = 12):
    cfg = SMALL
    X, y = _data(n, d, 21)
    p = init_particles(cfg, d, 3)
    for _ in range(10):
        p = svgd_update(p, meta_score(p, site_score(p, X, y, cfg), 1, cfg, n_points=n), cfg)
    return cfg, p, X, y


def test_mixture_posterior_is_eqs_8_9():
    cfg, p, X, y = _fitted_mixture()
    Xs = torch.tensor([[0.15, 0.8], [0.5, 0.5], [0.93, 0.07]], dtype=DTYPE)
    means, variances = mixture_moments(p, X, y, Xs, cfg)
    for k in range(p.shape[0]):                        # per-particle moments vs. the reference GP
        m_ref, c_ref = _ref_posterior(p[k], X, y, Xs, cfg)
        torch.testing.assert_close(means[k], m_ref, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(variances[k], c_ref.diagonal(), rtol=1e-8, atol=1e-9)
    model = ParticleMixtureGP(p, X, y, cfg)
    post = model.posterior(Xs.unsqueeze(1))            # (3, 1, d): three single points
    mu, var = mixture_mean_var(means, variances)
    torch.testing.assert_close(post.mean.reshape(-1), means.mean(0), rtol=0, atol=1e-10)
    torch.testing.assert_close(post.variance.reshape(-1),
                               variances.mean(0) + ((means - means.mean(0)) ** 2).mean(0), rtol=0, atol=1e-10)
    torch.testing.assert_close(post.variance.reshape(-1), var, rtol=0, atol=1e-10)
    joint = model.posterior(Xs)                        # q = 3 jointly: moment-matched covariance
    refs = [_ref_posterior(p[k], X, y, Xs, cfg) for k in range(p.shape[0])]
    M = torch.stack([r[0] for r in refs])
    cov = torch.stack([r[1] for r in refs]).mean(0) + (M - M.mean(0)).T @ (M - M.mean(0)) / len(refs)
    torch.testing.assert_close(joint.mvn.covariance_matrix, cov, rtol=1e-8, atol=1e-8)
    assert model.posterior(torch.rand(4, 5, 3, 2, dtype=DTYPE)).mean.shape == (4, 5, 3, 1)
    noisy = model.posterior(Xs.unsqueeze(1), observation_noise=True).variance.reshape(-1)
    assert (noisy > post.variance.reshape(-1)).all()


def test_mixture_gradient_wrt_inputs():
    cfg, p, X, y = _fitted_mixture()
    model = ParticleMixtureGP(p, X, y, cfg)
    x = torch.tensor([[[0.3, 0.6]]], dtype=DTYPE, requires_grad=True)
    def f(z):
        return (lambda post: post.mean.sum() + post.variance.sum())(model.posterior(z))
    (g,) = torch.autograd.grad(f(x), x)
    eps = 1e-6
    fd = torch.stack([(f(x.detach() + eps * e) - f(x.detach() - eps * e)) / (2 * eps)
                      for e in torch.eye(2, dtype=DTYPE).reshape(2, 1, 1, 2)])
    torch.testing.assert_close(g.reshape(-1), fd.reshape(-1).detach(), rtol=1e-5, atol=1e-6)


def test_mixture_model_inside_optimize_acqf():
    cfg, p, X, y = _fitted_mixture()
    model = ParticleMixtureGP(p, X, y, cfg)
    bounds = torch.stack([torch.zeros(2, dtype=DTYPE), torch.ones(2, dtype=DTYPE)])
    def sampler():
        return SobolQMCNormalSampler(torch.Size([64]), seed=0)
    pending = torch.tensor([[0.2, 0.2], [0.7, 0.4]], dtype=DTYPE)
    cases = [(UpperConfidenceBound(model, beta=4.0), 1),
             (LogExpectedImprovement(model, best_f=y.max()), 1),
             (qUpperConfidenceBound(model, beta=4.0, sampler=sampler(), X_pending=pending), 2),
             (qLogNoisyExpectedImprovement(model, X_baseline=X, sampler=sampler(), X_pending=pending,
                                           prune_baseline=True), 2)]
    for acqf, q in cases:
        with seeded_torch(0):
            cand, val = optimize_acqf(acqf, bounds=bounds, q=q, num_restarts=2, raw_samples=32,
                                      options={"seed": 0, "maxiter": 50})
        assert cand.shape == (q, 2) and torch.isfinite(cand).all() and torch.isfinite(val).all()
        assert (cand >= 0).all() and (cand <= 1).all()


def test_meta_fit_benchmark_reports_every_setting_and_refuses_a_bad_one():
    from labfbo.core.exceptions import ConfigurationError
    from labfbo_bench.meta_fit import format_rows, run

    base, rows = run("branin", 2, 12, 30, [{"n_particles": 2, "hidden": (8,)},
                                           {"n_particles": 2, "hidden": (8,), "meta_optimizer": "sgd"}])
    assert set(base) == {"local GP", "pooled GP"} and all(0 < v < 2 for v in base.values())
    assert [(r.setting.endswith("meta_optimizer=sgd"), r.steps) for r in rows] == [(False, 30), (True, 30)]
    assert all(np.isfinite([r.nrmse, r.noise, r.log_evidence]).all() and r.nrmse > 0 for r in rows)
    assert "pooled GP (baseline)" in format_rows(base, rows)
    with pytest.raises(ConfigurationError, match="step_size"):
        run("branin", 2, 5, 1, [{"step_size": -1.0}])
