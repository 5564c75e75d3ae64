"""Protocol `distribution` (GUIDE-FBO): FI-GP, beliefs, merging, reweighting, end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from campaign import run_campaign

import labfbo
from labfbo.core.exceptions import FederationError, ProtocolError
from labfbo.core.messages import Array, parse
from labfbo.models.figp import FIGP, GuidanceField, guidance_strength
from labfbo.models.gp import as_tensor, fit_local_gp
from labfbo.models.optimum_belief import MIN_VARIANCE, candidate_set, fit_belief, optimum_samples
from labfbo.protocols.distribution.protocol import (
    Components,
    DistributionAggregator,
    DistributionOptions,
    GuidancePacket,
    OptimumBelief,
    draw_packet,
    merge_components,
    reweight,
    temperature,
)

FAST = {"num_restarts": 2, "raw_samples": 32, "M": 64, "candidates": 128}


@pytest.fixture(scope="module")
def gp() -> tuple[object, np.ndarray, np.ndarray]:
    gen = np.random.default_rng(0)
    X = gen.random((12, 2))
    y = -((X - 0.3) ** 2).sum(1) + 0.01 * gen.standard_normal(12)
    return fit_local_gp(X, y), X, y


def _field() -> GuidanceField:
    return GuidanceField(np.array([0.7, 0.3]), np.array([[0.2, 0.3], [0.8, 0.6]]),
                         np.array([[0.01, 0.02], [0.05, 0.01]]))


# -- FI-GP --------------------------------------------------------------------------------
def test_figp_keeps_the_mean_and_scales_the_std_by_exactly_s(gp) -> None:
    model = gp[0]
    field = _field()
    lam = guidance_strength(1.0, 4)
    assert lam == pytest.approx(0.5)
    fi = FIGP(model, field, lam)
    X = as_tensor(np.random.default_rng(1).random((50, 2)))
    with torch.no_grad():
        base, post = model.posterior(X), fi.posterior(X)
        S = 1.0 + lam * field(X)
        torch.testing.assert_close(post.mean, base.mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(post.variance.sqrt().squeeze(-1), S * base.variance.sqrt().squeeze(-1),
                                   rtol=1e-10, atol=1e-12)
        # the joint covariance is S(x) k(x, x') S(x')
        cov_b = base.distribution.covariance_matrix
        cov_f = post.distribution.covariance_matrix
        torch.testing.assert_close(cov_f, S[:, None] * cov_b * S[None, :], rtol=1e-10, atol=1e-12)
    assert (S >= 1).all() and (S <= 1 + lam * field.weights.sum() + 1e-12).all()


def test_guidance_field_values() -> None:
    field = _field()
    X = as_tensor(np.array([[0.2, 0.3], [0.5, 0.5]]))
    g = field(X).numpy()
    far = np.exp(-0.5 * ((0.6) ** 2 / 0.05 + (0.3) ** 2 / 0.01))
    assert g[0] == pytest.approx(0.7 + 0.3 * far, rel=1e-12)
    assert GuidanceField.empty(2)(X).abs().max() == 0


def test_figp_uniform_ablation_and_batches(gp) -> None:
    model = gp[0]
    fi = FIGP(model, _field(), 1.0, uniform=True)
    X = as_tensor(np.random.default_rng(2).random((4, 3, 2)))  # (batch, q, d)
    with torch.no_grad():
        s = fi.scaling(X)
        assert torch.allclose(s, s.flatten()[0].expand_as(s))
        assert float(s.flatten()[0]) == pytest.approx(1.0 + _field().domain_average())
        post = fi.posterior(X)
        assert post.mean.shape == (4, 3, 1)
        noisy = fi.posterior(X, observation_noise=True)
        assert (noisy.variance > post.variance).all()


@pytest.mark.parametrize("acq", ["ucb", "ei", "nei", "ts"])
def test_every_acquisition_runs_on_the_figp(acq) -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
    coord = labfbo.Coordinator("distribution", sites=["s0", "s1"], seed=3)
    opts = [labfbo.Optimizer(space, protocol="distribution", coordinator=coord, site=s, seed=3, n_init=4,
                             acquisition=acq, **FAST) for s in ("s0", "s1")]
    for i, o in enumerate(opts):
        for t in o.ask(n=4):
            o.tell(t, (t.params["a"] - 0.3 - 0.1 * i) ** 2 + (t.params["b"] - 0.6) ** 2)
    trials = [o.ask() for o in opts]
    for t in trials:
        assert 0 <= t.params["a"] <= 1 and 0 <= t.params["b"] <= 1


# -- site side: optimum samples and the DPGMM ------------------------------------------------
def test_optimum_samples_concentrate_near_the_optimum(gp) -> None:
    model, X, y = gp
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
    cands = candidate_set(space, X, y, 256, seed=0)
    assert len(cands) == 256 + len(X) + 64
    s = optimum_samples(model, cands, 200, seed=1)
    assert s.shape == (200, 2)
    assert np.median(np.abs(s - 0.3).max(1)) < 0.2
    np.testing.assert_array_equal(s, optimum_samples(model, cands, 200, seed=1))


def test_fit_belief_finds_two_modes_and_falls_back_on_degenerate_samples() -> None:
    gen = np.random.default_rng(0)
    two = np.vstack([0.2 + 0.02 * gen.standard_normal((150, 2)), 0.8 + 0.02 * gen.standard_normal((150, 2))])
    b = fit_belief(two, seed=0)
    big = np.argsort(-b.weights)[:2]
    assert b.weights[big].sum() > 0.9
    assert sorted(np.round(b.means[big, 0], 1)) == [0.2, 0.8]
    assert not b.fallback
    same = np.tile([[0.5, 0.5]], (40, 1))
    fb = fit_belief(same, seed=0)
    assert fb.fallback and fb.weights.tolist() == [1.0]
    np.testing.assert_allclose(fb.variances, MIN_VARIANCE)
    single = fit_belief(two, seed=0, mode="single_gaussian")
    np.testing.assert_allclose(single.means[0], two.mean(0))


# -- coordinator side -------------------------------------------------------------------------
def _comps(means, weights=None, values=None, var=0.01) -> Components:
    means = np.asarray(means, float)
    n = len(means)
    return Components(np.ones(n) / n if weights is None else np.asarray(weights, float), means,
                      np.full_like(means, var), np.zeros(n) if values is None else np.asarray(values, float))


def test_merge_moment_matches_close_centres() -> None:
    c = _comps([[0.50, 0.50], [0.52, 0.50], [0.9, 0.1]], weights=[0.2, 0.6, 0.2], values=[1.0, 3.0, 0.0])
    m = merge_components(c, 0.05)
    assert len(m) == 2
    W = 0.8
    mu = (0.2 * np.array([0.5, 0.5]) + 0.6 * np.array([0.52, 0.5])) / W
    var = (0.2 * (0.01 + (np.array([0.5, 0.5]) - mu) ** 2) + 0.6 * (0.01 + (np.array([0.52, 0.5]) - mu) ** 2)) / W
    np.testing.assert_allclose(m.weights, [W, 0.2])
    np.testing.assert_allclose(m.means[0], mu)
    np.testing.assert_allclose(m.variances[0], var)
    assert m.values[0] == pytest.approx((0.2 * 1 + 0.6 * 3) / W)


def test_merge_is_complete_linkage_on_rms_distance() -> None:
    # a chain 0.04 apart (RMS): a-b and b-c could merge, a-c (0.08) cannot -> 2 clusters
    d = 0.04 * np.sqrt(2)
    c = _comps([[0.0, 0.0], [d, 0.0], [2 * d, 0.0]])
    assert len(merge_components(c, 0.05)) == 2
    assert len(merge_components(c, 0.081)) == 1
    assert len(merge_components(c, 0.0)) == 3


def test_reweight_is_stable_and_uses_the_adaptive_temperature() -> None:
    # equal huge scores: tau falls to its floor and v / tau = 1e8 would overflow a naive softmax
    c = _comps([[0.1, 0.1], [0.9, 0.9]], weights=[0.5, 0.5], values=[1e6, 1e6])
    np.testing.assert_allclose(reweight(c), [0.5, 0.5])
    # the temperature adapts to the spread: scores 2e6 apart are only e^10 apart in weight
    w = reweight(_comps([[0.1, 0.1], [0.9, 0.9]], weights=[0.5, 0.5], values=[1e6, -1e6]))
    assert w[0] / w[1] == pytest.approx(np.exp(10.0))
    assert temperature(np.array([0.0, 2.0])) == pytest.approx(0.2)
    assert temperature(np.array([1.0, 1.0])) == pytest.approx(0.01)
    c2 = _comps([[0.1, 0.1], [0.9, 0.9]], weights=[0.3, 0.1], values=[0.0, 0.2])
    np.testing.assert_allclose(reweight(c2, value_aware=False), [0.75, 0.25])
    expect = np.array([0.3, 0.1 * np.exp(0.2 / 0.02)])
    np.testing.assert_allclose(reweight(c2), expect / expect.sum())


def test_packets_are_drawn_without_replacement() -> None:
    gen = np.random.default_rng(0)
    omega = np.array([0.5, 0.2, 0.2, 0.1, 0.0])
    for _ in range(50):
        idx = draw_packet(omega, 3, gen)
        assert len(idx) == 3 == len(set(idx.tolist())) and 4 not in idx
    assert len(draw_packet(omega, 10, gen)) == 4


def _belief(mean, value=0.0, weight=0.5) -> OptimumBelief:
    mean = np.asarray(mean, float)
    return OptimumBelief(weight=weight, mean=Array.of(mean), variance=Array.of(np.full_like(mean, 0.01)), value=value)


def test_aggregator_sends_each_site_at_most_p_components() -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
    sites = [f"s{i}" for i in range(6)]
    agg = DistributionAggregator(DistributionOptions(P=2), sites, 0, None, space)
    gen = np.random.default_rng(0)
    resp = {s: _belief(gen.random(2), value=float(i)) for i, s in enumerate(sites)}
    out = agg.on_responses(0, resp)
    for s in sites:
        pkt = out.replies[s]
        assert isinstance(pkt, GuidancePacket) and pkt.n_scalars <= 2 * (2 * 2 + 1)
    # agent-specific draws differ between sites; without them every site gets the same packet
    packets = {out.replies[s].means.data for s in sites}
    assert len(packets) > 1
    shared = DistributionAggregator(DistributionOptions(P=2, agent_specific=False), sites, 0, None, space)
    assert len({shared.on_responses(0, resp).replies[s].means.data for s in sites}) == 1


def test_bad_uploads_are_refused_or_left_out() -> None:
    good = _belief([0.2, 0.3]).model_dump(mode="json")
    bad = dict(good, variance=Array.of([0.0, 0.1]).model_dump(mode="json"))
    with pytest.raises(ProtocolError, match="variances must be positive"):
        parse(bad)
    with pytest.raises(ProtocolError, match="finite"):
        parse(dict(good, value=float("nan")))
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
    agg = DistributionAggregator(DistributionOptions(), ["a", "b"], 0, None, space)
    with pytest.warns(UserWarning, match="left out"):
        out = agg.on_responses(0, {"a": _belief([0.1, 0.2, 0.3]), "b": _belief([0.5, 0.5])})
    np.testing.assert_allclose(out.replies["a"].means.numpy(), [[0.5, 0.5]])


# -- end to end ---------------------------------------------------------------------------------
def _federation(n_sites: int = 3, seed: int = 0, **opts: object):
    space = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1), labfbo.Real("z", -1, 1)])
    names = [f"s{i}" for i in range(n_sites)]
    coord = labfbo.Coordinator("distribution", sites=names, seed=seed, **opts)
    return coord, [labfbo.Optimizer(space, protocol="distribution", coordinator=coord, site=n, seed=seed,
                                    n_init=4, **FAST, **opts) for n in names]


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.1 * i) ** 2 + (p["y"] + 0.2) ** 2 + 0.5 * p["z"] ** 2


def _campaign(opts, rounds: int) -> list[list[dict]]:
    return run_campaign(opts, _f, 4, rounds)


@pytest.mark.integration  # a multi-site campaign
def test_messages_are_the_papers_size_in_the_sites_own_log() -> None:
    _, opts = _federation(n_sites=4, P=2)
    _campaign(opts, 2)
    d, P = 3, 2
    for o in opts:
        ups = [m for m in o.sent_messages() if isinstance(m, OptimumBelief)]
        downs = [m for m in o.received_messages() if isinstance(m, GuidancePacket)]
        assert len(ups) == 2 and len(downs) == 2
        assert all(m.n_scalars == 2 * d + 2 for m in ups)
        assert all(m.n_scalars <= P * (2 * d + 1) for m in downs)
        kinds = {m.kind for m in o.sent_messages()}
        assert kinds == {"join", "optimum_belief"}  # nothing else leaves the site


@pytest.mark.integration  # a multi-site campaign
def test_same_seed_same_proposals_and_ablations_run() -> None:
    a = _campaign(_federation(seed=5)[1], 2)
    b = _campaign(_federation(seed=5)[1], 2)
    assert a == b
    for ablation in ({"belief": "single_gaussian"}, {"value_reweighting": False}, {"merging": False},
                     {"agent_specific": False}, {"spatial": False}):
        props = _campaign(_federation(n_sites=2, seed=5, **ablation)[1], 1)
        assert len(props[0]) == 2


def test_ask_n_under_distribution_returns_distinct_points() -> None:
    _, opts = _federation(n_sites=2)
    run_campaign(opts, _f, 4, 0)
    batch = opts[0].ask(n=3)
    assert len(batch) == 3
    X = np.array([[t.params[k] for k in ("x", "y", "z")] for t in batch])
    assert np.min([np.abs(X[i] - X[j]).max() for i in range(3) for j in range(i)]) > 1e-6
    assert len(opts[1].ask(n=2)) == 2


def test_shared_options_must_match_and_few_points_abstain() -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1)])
    coord = labfbo.Coordinator("distribution", sites=["a", "b"], P=3)
    with pytest.raises(FederationError, match="P"):
        labfbo.Optimizer(space, protocol="distribution", coordinator=coord, site="a", P=4)
    with pytest.raises(labfbo.ConfigurationError, match="M"):
        labfbo.Optimizer(space, protocol="distribution", M=1)


@pytest.mark.integration  # a multi-site campaign
def test_simulate_distribution_bytes() -> None:
    from labfbo.problems.families import get_problem

    prob = get_problem("sphere", n_sites=3, dim=3, seed=0)
    res = labfbo.simulate(prob, protocol="distribution", n_init=4, budget=2, seed=0, **FAST)
    assert res.proposals.shape == (3, 2, 3)
    assert (res.bytes_up > 0).all() and (res.bytes_down > 0).all()
    assert res.bytes_up.max() < 1000


def test_distribution_on_a_mixed_space(mixed_space) -> None:
    coord = labfbo.Coordinator("distribution", sites=["a", "b"], seed=1)
    opts = [labfbo.Optimizer(mixed_space, protocol="distribution", coordinator=coord, site=s, seed=1, n_init=4,
                             **FAST) for s in ("a", "b")]
    for o in opts:
        for t in o.ask(n=4):
            o.tell(t, float(t.params["temperature"]) / 100 + t.params["passes"] + (t.params["solvent"] == "water"))
    trials = [o.ask() for o in opts]
    for t in trials:
        assert mixed_space.validate_params(t.params)[1] == []
        assert t.params["solvent"] in ["water", 7, 2.5, True] and 1 <= t.params["passes"] <= 8
    assert any(isinstance(m, OptimumBelief) for m in opts[0].sent_messages())
