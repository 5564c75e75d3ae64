"""Every protocol on categorical, discrete and stepped parameters; the reaction benchmark's pieces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from campaign import run_campaign

import labfbo
from labfbo.models.figp import GuidanceField
from labfbo.models.optimum_belief import choice_layout, fit_belief
from labfbo.privacy.belief_dp import privatize_belief, sensitivity
from labfbo.protocols.distribution.protocol import Components, GuidancePacket, OptimumBelief, merge_components

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0, step=0.05), labfbo.Categorical("c", ["a", "b", "c", "d"]),
                            labfbo.Discrete("conc", [0.057, 0.1, 0.153]), labfbo.Categorical("s", ["u", "v"])])
ORDERED = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0, step=0.05), labfbo.Discrete("conc", [0.057, 0.1, 0.153]),
                              labfbo.Integer("n", 1, 4)])
SITES = ["lab-a", "lab-b", "lab-c"]
FAST = {"num_restarts": 2, "raw_samples": 32}
PROTOCOL_FAST = {
    "gradient": {"n_particles": 4, "hidden": (8, 8), "warmup_steps": 5, "svgd_steps": 3},
    "distribution": {"M": 64, "candidates": 128},
    "centralized": {"n_particles": 4, "hidden": (8, 8), "warmup_steps": 5, "svgd_steps": 3},
}


def _f(i: int, p: dict) -> float:
    return (-(p["x"] - 0.3 - 0.1 * i) ** 2 + {"a": 0.0, "b": 1.0, "c": 0.2, "d": 0.5}[p["c"]]
            + (0.3 if p["s"] == "v" else 0.0) - 3 * (p["conc"] - 0.1) ** 2)


@pytest.mark.integration  # a multi-site campaign
@pytest.mark.parametrize("protocol", sorted(PROTOCOL_FAST))
def test_every_protocol_runs_on_categorical_discrete_and_stepped_parameters(protocol: str) -> None:
    opts = {**FAST, **PROTOCOL_FAST[protocol]}
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=0, horizon=4, **opts)
    sites = [labfbo.Optimizer(SPACE, objective="maximize", protocol=protocol, coordinator=coord, site=s, seed=0,
                              n_init=4, **opts) for s in SITES]
    props = run_campaign(sites, _f, 4, 3)
    for rnd in props:
        for p in rnd:
            assert p["c"] in "abcd" and p["s"] in "uv" and p["conc"] in (0.057, 0.1, 0.153)
            assert abs(p["x"] / 0.05 - round(p["x"] / 0.05)) < 1e-9


@pytest.mark.integration  # a multi-site campaign
def test_consensus_runs_on_discrete_and_stepped_parameters_and_refuses_categoricals() -> None:
    coord = labfbo.Coordinator("consensus", sites=SITES, seed=0, horizon=4, **FAST)
    sites = [labfbo.Optimizer(ORDERED, objective="maximize", protocol="consensus", coordinator=coord, site=s, seed=0,
                              n_init=4, **FAST) for s in SITES]
    props = run_campaign(sites, lambda i, p: -(p["x"] - 0.3) ** 2 - (p["conc"] - 0.1) ** 2 - 0.1 * p["n"], 4, 3)
    assert all(p["conc"] in (0.057, 0.1, 0.153) and p["n"] in (1, 2, 3, 4) for rnd in props for p in rnd)
    with pytest.raises(labfbo.ProtocolError, match="use 'distribution'"):
        labfbo.Coordinator("consensus", sites=SITES, seed=0, horizon=4, space=SPACE)


def test_a_categorical_belief_is_a_probability_vector_per_parameter() -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Categorical("c", ["a", "b", "c"])])
    gen = np.random.default_rng(0)
    x = np.r_[gen.normal(0.2, 0.02, 300), gen.normal(0.8, 0.02, 200)].clip(0, 1)
    c = np.r_[np.zeros(300), np.ones(200)] * 0.5  # the left mode chooses "a", the right one "b"
    belief = fit_belief(np.c_[x, c], seed=0, space=space)
    assert belief.means.shape[1] == 1 and belief.probs.shape == (len(belief.weights), 3)
    np.testing.assert_allclose(belief.probs.sum(1), 1.0)
    left = int(np.argmin(np.abs(belief.means[:, 0] - 0.2)))
    right = int(np.argmin(np.abs(belief.means[:, 0] - 0.8)))
    assert belief.probs[left].argmax() == 0 and belief.probs[right].argmax() == 1 and belief.probs[left, 0] > 0.9
    only_cat = labfbo.SearchSpace([labfbo.Categorical("c", ["a", "b", "c"])])
    b2 = fit_belief(np.c_[c], seed=0, space=only_cat)
    assert b2.means.shape == (1, 0)
    np.testing.assert_allclose(b2.probs[0], [(300 + 0.5) / 501.5, (200 + 0.5) / 501.5, 0.5 / 501.5])


def test_the_guidance_field_is_one_at_a_components_most_likely_choices() -> None:
    ordered, cats = choice_layout(SPACE)
    assert ordered == [0, 2] and cats == [(1, 4, 0), (3, 2, 4)]
    probs = np.array([[0.1, 0.6, 0.2, 0.1, 0.3, 0.7]])
    field = GuidanceField(np.ones(1), np.array([[0.5, 0.5]]), np.full((1, 2), 0.01), probs=probs,
                          ordered=tuple(ordered), cats=tuple(cats))
    X = torch.tensor([[0.5, 1 / 3, 0.5, 1.0], [0.5, 0.0, 0.5, 1.0], [0.5, 1 / 3, 0.5, 0.0]], dtype=torch.float64)
    np.testing.assert_allclose(field(X).numpy(), [1.0, 0.1 / 0.6, 0.3 / 0.7])


def test_merging_averages_choice_probabilities_and_counts_total_variation() -> None:
    cats = ((0, 2, 0),)
    comps = Components(np.array([0.5, 0.5, 1.0]), np.zeros((3, 0)), np.ones((3, 0)), np.zeros(3),
                       np.array([[0.9, 0.1], [0.88, 0.12], [0.1, 0.9]]), cats)
    merged = merge_components(comps, threshold=0.05)
    assert len(merged) == 2  # TV 0.02 merges, TV 0.8 does not
    np.testing.assert_allclose(merged.probs[0], [0.89, 0.11])
    assert merged.weights.tolist() == [1.0, 1.0]


def test_messages_state_their_size_and_refuse_bad_probabilities() -> None:
    from labfbo.core.messages import Array

    up = OptimumBelief(weight=0.5, mean=Array.of(np.array([0.2, 0.4])), variance=Array.of(np.array([0.01, 0.01])),
                       value=0.3, probs=Array.of(np.array([0.25, 0.25, 0.25, 0.25, 0.5, 0.5])))
    assert up.n_scalars == 2 + 2 * 2 + 6  # 2 d_o + 2 + the choice counts
    with pytest.raises(ValueError):
        GuidancePacket(weights=Array.of(np.ones(1)), means=Array.of(np.zeros((1, 1))),
                       variances=Array.of(np.ones((1, 1))), probs=Array.of(np.array([[1.5, -0.5]])))


def test_dp_noises_the_choice_probabilities_with_the_same_sensitivity() -> None:
    dp = labfbo.DP(clip=3.0, noise_multiplier=1.0)
    p = np.array([0.7, 0.2, 0.1, 0.5, 0.5])
    out = [privatize_belief(0.5, np.array([0.3]), np.array([0.01]), 0.1, dp, np.random.default_rng(s), p,
                            [(1, 3, 0), (2, 2, 3)]) for s in range(50)]
    probs = np.array([o[4] for o in out])
    np.testing.assert_allclose(probs[:, :3].sum(1), 1.0)
    np.testing.assert_allclose(probs[:, 3:].sum(1), 1.0)
    assert probs.std(0).min() > 0.05 and (probs > 0).all()
    assert privatize_belief(0.5, np.array([0.3]), np.array([0.01]), 0.1, dp, np.random.default_rng(0))[4] is None
    assert math.isclose(sensitivity(3), math.sqrt(8))  # d = 1 ordered + 2 categorical columns


def _brute_loo(K: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Per-point leave-one-out log density of residuals ``r`` under N(0, K), by refitting."""
    out = []
    for i in range(len(r)):
        o = np.delete(np.arange(len(r)), i)
        w = np.linalg.solve(K[np.ix_(o, o)], K[o, i])
        mu, var = w @ r[o], K[i, i] - w @ K[o, i]
        out.append(-0.5 * ((r[i] - mu) ** 2 / var + np.log(2 * np.pi * var)))
    return np.array(out)


def test_the_harm_guards_leave_one_out_densities_match_refitting() -> None:
    from labfbo.models.gp import fit_local_gp, loo_log_density
    from labfbo.models.pacoh import PacohConfig, _fit, init_particles
    from labfbo.models.particle_mixture import ParticleMixtureGP

    gen = np.random.default_rng(0)
    X = gen.random((12, 2))
    y = 10 * np.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * gen.standard_normal(12)
    model = fit_local_gp(X, y)
    Xt = model.input_transform(torch.as_tensor(X))
    with torch.no_grad():
        K = (model.covar_module(Xt).to_dense() + model.likelihood.noise * torch.eye(12)).numpy()
        r = (model.train_targets - model.mean_module.constant).numpy()
    s = float(model.outcome_transform.stdvs)
    assert loo_log_density(model) == pytest.approx(_brute_loo(K, r).mean() - np.log(s), rel=1e-6)

    cfg = PacohConfig(n_particles=3, hidden=(8, 8))
    particles = init_particles(cfg, 2, seed=1)
    mix = ParticleMixtureGP(particles, X, y, cfg)
    f = _fit(particles, X, y, cfg)
    Ky = (f["L"] @ f["L"].transpose(-1, -2)).numpy()
    per = np.stack([_brute_loo(Ky[k], f["r"][k].detach().numpy()) for k in range(3)])  # (K, n), standardized
    expect = (np.log(np.exp(per).mean(0))).mean() - np.log(float(np.std(y, ddof=1)))
    assert mix.loo_log_density() == pytest.approx(expect, rel=1e-6)


def test_the_harm_guard_falls_back_to_the_local_gp_when_the_federation_misleads() -> None:
    from labfbo.protocols.base import SiteContext, SiteData
    from labfbo.protocols.gradient.protocol import GradientOptions, GradientSite

    space = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0)])
    site = GradientSite(space, GradientOptions(n_particles=2, hidden=(4, 4)), SiteContext("a"))
    X = np.linspace(0, 1, 8)[:, None]
    data = SiteData(space, X, np.sin(6 * X[:, 0]), None, np.zeros((0, 1)))

    class _Fake:
        def __init__(self, lpd: float) -> None:
            self.lpd = lpd

        def loo_log_density(self) -> float:
            return self.lpd

    assert site.trusts(_Fake(50.0), data) and not site.trusts(_Fake(-50.0), data)
    site.options = GradientOptions(n_particles=2, hidden=(4, 4), harm_guard=False)
    assert site.trusts(_Fake(-50.0), data)
    short = SiteData(space, X[:4], np.sin(6 * X[:4, 0]), None, np.zeros((0, 1)))
    site.options = GradientOptions(n_particles=2, hidden=(4, 4))
    assert site.trusts(_Fake(-50.0), short)  # too few points to judge
