"""Protocol `surface`: a shared response surface as each site's GP prior mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from campaign import run_campaign

import labfbo
from labfbo.core.messages import Array
from labfbo.models.gp import fit_local_gp
from labfbo.protocols.surface.aggregate import leave_one_out
from labfbo.protocols.surface.messages import SurfaceStats, SurfaceTotals
from labfbo.protocols.surface.model import (
    SurfaceFeatures,
    SurfaceMean,
    dp_sensitivity,
    ridge_weights,
    site_statistics,
    symmetric,
    upper,
)

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("t", 0.0, 1.0),
                            labfbo.Categorical("base", ["a", "b", "c"])])
SITES = ["lab-a", "lab-b", "lab-c"]
FAST = {"num_restarts": 2, "raw_samples": 32}
EFFECT = {"a": 0.0, "b": 1.0, "c": -1.0}


def _f(i: int, p: dict) -> float:
    return -(p["x"] - 0.6) ** 2 - 0.5 * (p["t"] - 0.3) ** 2 + 0.4 * EFFECT[p["base"]] + 0.1 * i


def test_features_are_main_effects_and_a_full_quadratic() -> None:
    feats = SurfaceFeatures(SPACE)
    assert feats.p == 1 + 3 + 2 * 2 + 1 and feats.norm_bound == 1 + 1 + 2 * 2 + 1
    X = SPACE.encode([{"x": 0.5, "t": 0.2, "base": "b"}])
    phi = feats.of_unit(X)[0]
    np.testing.assert_allclose(phi, [1, 0, 1, 0, 0.5, 0.2, 0.25, 0.04, 0.1])
    assert float((phi ** 2).sum()) <= feats.norm_bound
    desc = labfbo.SearchSpace([labfbo.Categorical("s", ["w", "e"], descriptors={"w": [1.0, 0.0], "e": [0.0, 2.0]})])
    assert SurfaceFeatures(desc).p == 1 + 2                      # descriptors enter as main effects


def test_ridge_on_pooled_statistics_recovers_the_shared_surface() -> None:
    feats = SurfaceFeatures(SPACE)
    gen = np.random.default_rng(0)
    stats = []
    for i in range(3):
        X = np.c_[gen.random((40, 2)), gen.integers(0, 3, 40) / 2]
        y = np.array([_f(i, p) for p in SPACE.decode(X)]) * (1 + i)   # same shape, different scales
        g, h = site_statistics(feats.of_unit(X), y)
        stats.append(SurfaceStats(count=40, gram=Array.of(g), moment=Array.of(h)))
    totals = leave_one_out(dict(zip(SITES, stats)), SITES)
    assert totals["lab-a"].sites == 2 and totals["lab-a"].count == 80
    w = ridge_weights(symmetric(totals["lab-a"].gram.numpy(), feats.p), totals["lab-a"].moment.numpy(), 1e-6)
    Xt = np.c_[gen.random((200, 2)), gen.integers(0, 3, 200) / 2]
    truth = np.array([_f(0, p) for p in SPACE.decode(Xt)])
    assert np.corrcoef(feats.of_unit(Xt) @ w, truth)[0, 1] > 0.999  # the surface family holds f exactly


def test_totals_do_not_depend_on_the_order_answers_arrive_in() -> None:
    gen = np.random.default_rng(1)
    stats = {s: SurfaceStats(count=int(gen.integers(2, 9)), gram=Array.of(gen.normal(size=6) * 1e3),
                             moment=Array.of(gen.normal(size=3) * 1e-3)) for s in SITES}
    a = leave_one_out(stats, SITES)
    b = leave_one_out(dict(reversed(list(stats.items()))), SITES)
    assert all(a[s].gram.numpy().tobytes() == b[s].gram.numpy().tobytes() for s in SITES)
    with pytest.raises(ValueError, match="absolute value"):
        SurfaceStats(count=2, gram=Array.of(np.full(6, 1e300)), moment=Array.of(np.zeros(3)))
    with pytest.raises(ValueError):
        SurfaceStats(count=10**9, gram=Array.of(np.zeros(6)), moment=Array.of(np.zeros(3)))


def test_the_coordinator_never_returns_a_site_its_own_statistics() -> None:
    p = 3
    mk = lambda v, n: SurfaceStats(count=n, gram=Array.of(np.full(6, v)), moment=Array.of(np.full(p, v)))  # noqa: E731
    out = leave_one_out({"a": mk(1.0, 2), "b": mk(10.0, 3)}, ["a", "b", "c"])
    np.testing.assert_allclose(out["a"].moment.numpy(), 30.0)
    np.testing.assert_allclose(out["b"].moment.numpy(), 2.0)
    np.testing.assert_allclose(out["c"].moment.numpy(), 32.0)   # a site that did not contribute gets everyone's
    assert (out["a"].sites, out["c"].sites, out["c"].count) == (1, 2, 5)
    with pytest.raises(ValueError, match="upper triangle"):
        SurfaceStats(count=2, gram=Array.of(np.zeros(5)), moment=Array.of(np.zeros(3)))
    with pytest.raises(ValueError, match="finite"):
        SurfaceStats(count=2, gram=Array.of(np.zeros(6)), moment=Array.of([0.0, np.nan, 0.0]))


def test_the_agreement_scale_follows_the_sites_data() -> None:
    """A surface that agrees with the site keeps c near 1; one of the opposite sign is damped."""
    feats = SurfaceFeatures(SPACE)
    gen = np.random.default_rng(3)
    X = np.c_[gen.random((12, 2)), gen.integers(0, 3, 12) / 2]
    y = np.array([_f(0, p) for p in SPACE.decode(X)])
    Xo = np.c_[gen.random((60, 2)), gen.integers(0, 3, 60) / 2]
    yo = np.array([_f(1, p) for p in SPACE.decode(Xo)])
    g, h = site_statistics(feats.of_unit(Xo), yo)
    w = ridge_weights(symmetric(g, feats.p) * 60, h * 60, 1.0)
    scales = {}
    for name, ww in (("agrees", w), ("contradicts", -w)):
        model = fit_local_gp(X, y, space=SPACE, seed=0, mean_module=SurfaceMean(feats, ww))
        scales[name] = float(model.mean_module.scale.detach())
    assert scales["agrees"] > 0.8 and scales["contradicts"] < 0.5


@pytest.mark.integration  # a multi-site campaign
def test_a_campaign_sends_only_statistics_and_repeats_under_its_seed() -> None:
    def campaign() -> tuple[list, list]:  # the statistics in the clear (tests/test_surface_secagg.py: masked)
        opts = {**FAST, "secure_aggregation": "off"}
        coord = labfbo.Coordinator("surface", sites=SITES, space=SPACE, seed=2, horizon=3, **opts)
        sites = [labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site=s, seed=2, n_init=3, **opts)
                 for s in SITES]
        return run_campaign(sites, _f, 3, 3), sites

    props, sites = campaign()
    sent = sites[0].sent_messages()
    assert {m.kind for m in sent} == {"join", "surface_stats"}
    stats = [m for m in sent if isinstance(m, SurfaceStats)]
    p = 1 + 3 + 2 * 2 + 1 + 100                                     # the quadratic and 100 Fourier features
    assert stats and stats[-1].p == p and stats[-1].count == 5
    assert stats[-1].nbytes() < 1.4 * 8 * (p * (p + 1) // 2 + p) + 500  # base64 float64 and a JSON envelope
    got = [m for m in sites[0].received_messages() if isinstance(m, SurfaceTotals)]
    assert got and got[-1].sites == 2
    mean, _ = sites[0].predict([{"x": 0.6, "t": 0.3, "base": "b"}, {"x": 0.0, "t": 1.0, "base": "c"}])
    assert mean[0] > mean[1]                                         # the model of the proposals, with the surface
    again, _ = campaign()
    assert props == again


def test_dp_noises_the_statistics_and_is_accounted() -> None:
    dp = labfbo.DP(clip=2.0, noise_multiplier=1.0)
    opts = {**FAST, "secure_aggregation": "off"}  # local noise on statistics in the clear
    coord = labfbo.Coordinator("surface", sites=SITES, space=SPACE, seed=4, horizon=1, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site=s, seed=4, n_init=3,
                              privacy=dp, **opts) for s in SITES]
    run_campaign(sites, _f, 3, 1)
    stats = [m for m in sites[0].sent_messages() if isinstance(m, SurfaceStats)]
    feats = SurfaceFeatures(SPACE, fourier=100)
    assert feats.norm_bound == pytest.approx(1 + 1 + 2 * 2 + 1 + 2)   # the Fourier block adds at most F (2/F)
    assert stats[0].dp_sensitivity == pytest.approx(dp_sensitivity(feats.norm_bound, 2.0))
    g = symmetric(stats[0].gram.numpy(), feats.p)
    assert abs(g[0, 0] - 1.0) > 1e-6                                # G/n's intercept entry is 1 before the noise
    eps = sites[0].epsilon()
    assert eps is not None and 0 < eps < float("inf")
    assert any(r["message"] == "surface_stats" and r["sensitivity"] == pytest.approx(stats[0].dp_sensitivity)
               for r in sites[0].privacy_report())


def test_the_fourier_basis_is_the_studys_and_sites_must_agree_on_it() -> None:
    a, b = SurfaceFeatures(SPACE, fourier=8), SurfaceFeatures(labfbo.SearchSpace.from_json(SPACE.to_json()), fourier=8)
    X = np.c_[np.random.default_rng(0).random((5, 2)), np.zeros(5)]
    np.testing.assert_array_equal(a.of_unit(X), b.of_unit(X))       # the basis is a function of the space
    assert np.abs(a.of_unit(X)[:, -8:]).max() <= 1.0
    other = labfbo.SearchSpace([labfbo.Real("x", 0.0, 2.0), labfbo.Real("t", 0.0, 1.0),
                                labfbo.Categorical("base", ["a", "b", "c"])])
    assert not np.allclose(a.of_unit(X), SurfaceFeatures(other, fourier=8).of_unit(X))
    cat_only = labfbo.SearchSpace([labfbo.Categorical("c", ["a", "b"])])
    assert SurfaceFeatures(cat_only, fourier=100).p == 3           # nothing ordered: no Fourier features


def test_the_fourier_block_is_a_unit_variance_rbf_kernel() -> None:
    """Scaled by sqrt(2/F), the Fourier features' inner product approximates the RBF kernel
    exp(-|u - u'|^2 / (2 l^2)) of unit variance (Rahimi & Recht), whatever F."""
    F, ell = 4000, 0.3
    feats = SurfaceFeatures(SPACE, fourier=F, lengthscale=ell)
    U = np.random.default_rng(1).random((6, 2))
    phi = feats.of_unit(np.c_[U, np.zeros(6)])[:, -F:]
    d2 = ((U[:, None, :] - U[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(phi @ phi.T, np.exp(-d2 / (2 * ell ** 2)), atol=0.06)
    assert (phi ** 2).sum(axis=1).max() <= 2.0 and feats.norm_bound == pytest.approx(1 + 1 + 2 * 2 + 1 + 2)
    assert SurfaceFeatures(SPACE, fourier=1).fourier_scale == 1.0  # capped: every feature stays in [-1, 1]
    coord = labfbo.Coordinator("surface", sites=SITES, space=SPACE, seed=0)
    with pytest.raises(labfbo.FederationError, match="fourier_features=10"):
        labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="lab-a", fourier_features=10)


def test_options_refuse_input_warping() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="input_warping"):
        labfbo.Coordinator("surface", sites=SITES, input_warping=True)


def test_upper_and_symmetric_round_trip() -> None:
    A = np.random.default_rng(0).random((4, 4))
    A = A + A.T
    np.testing.assert_allclose(symmetric(upper(A), 4), A)
    assert torch.is_tensor(SurfaceFeatures(SPACE)(torch.zeros(2, 3, dtype=torch.float64)))


# -- several objectives: one surface per objective ----------------------------------------------------
TWO = [labfbo.Objective("yield", "maximize"), labfbo.Objective("cost", "minimize")]


def _two(i: int, p: dict) -> dict:
    return {"yield": _f(i, p), "cost": (p["x"] - 0.2) ** 2 + 0.3 * p["t"] + 0.05 * i}


def test_several_objectives_give_one_moment_and_one_surface_each() -> None:
    feats = SurfaceFeatures(SPACE)
    gen = np.random.default_rng(3)
    X = np.c_[gen.random((12, 2)), gen.integers(0, 3, 12) / 2]
    Y = gen.normal(size=(12, 2)) * [1.0, 50.0] + [0.0, 7.0]
    g, H = site_statistics(feats.of_unit(X), Y, clip=1.5)
    assert H.shape == (2, feats.p)
    for j in range(2):  # each objective standardized and clipped on its own, the same Gram matrix
        gj, hj = site_statistics(feats.of_unit(X), Y[:, j], clip=1.5)
        np.testing.assert_array_equal(g, gj)
        np.testing.assert_allclose(H[j], hj, atol=1e-15)
    G = symmetric(g, feats.p)
    W = ridge_weights(G, H, 0.5)
    np.testing.assert_allclose(W[1], ridge_weights(G, H[1], 0.5), atol=1e-12)
    # the DP sensitivity counts every moment: 2 sqrt(P^2 + m C^2 P)
    assert dp_sensitivity(7.0, 1.5, 2) == pytest.approx(2 * np.sqrt(49 + 2 * 1.5 ** 2 * 7))
    stats = {s: SurfaceStats(count=12, gram=Array.of(g), moment=Array.of(H)) for s in SITES}
    totals = leave_one_out(stats, SITES)
    assert totals["lab-a"].moment.shape == (2, feats.p)
    np.testing.assert_allclose(totals["lab-a"].moment.numpy(), 24 * H)
    with pytest.raises(ValueError, match="one per objective"):
        SurfaceStats(count=12, gram=Array.of(g), moment=Array.of(np.zeros((1, feats.p))))


@pytest.mark.integration  # a multi-site campaign with qLogNEHVI asks
def test_several_objectives_federate_each_objective_and_keep_the_hypervolume_acquisition() -> None:
    from labfbo.protocols.surface.model import SurfaceMean

    coord = labfbo.Coordinator("surface", sites=SITES, space=SPACE, seed=5, horizon=3, **FAST)
    sites = [labfbo.Optimizer(SPACE, objective=TWO, protocol="surface", coordinator=coord, site=s, seed=5, n_init=3,
                              **FAST) for s in SITES]
    for i, o in enumerate(sites):
        for t in o.ask(n=3):
            o.tell(t, _two(i, t.params))
    for _ in range(2):
        for i, (o, t) in enumerate(zip(sites, [o.ask() for o in sites])):
            o.tell(t, _two(i, t.params))
    # three sites: the statistics leave masked, one moment per objective inside the cohort's sum
    logic = sites[0].agent.logic
    p = logic.features.p
    ups = [m for m in sites[0].sent_messages() if m.kind == "masked_score"]
    assert ups and all(m.masked.n_scalars == p * (p + 1) // 2 + 2 * p + 2 for m in ups)
    assert logic._weights is not None and logic._weights.shape == (2, p)
    data = sites[0].site_data()
    for j in range(2):  # the proposal's models: each objective's GP on its own surface
        assert isinstance(logic.outcome_model(data, j).mean_module, SurfaceMean)
    pred = sites[0].predict([{"x": 0.6, "t": 0.3, "base": "b"}, {"x": 0.6, "t": 0.3, "base": "c"}])
    assert pred["yield"][0][0] > pred["yield"][0][1]            # the partners' main effect of the base
    assert all(len(o.observations) == 5 for o in sites)


def test_sites_must_agree_on_how_several_objectives_federate() -> None:
    coord = labfbo.Coordinator("surface", sites=SITES, space=SPACE, seed=0)
    with pytest.raises(labfbo.FederationError, match="multi_objective"):
        labfbo.Optimizer(SPACE, objective=TWO, protocol="surface", coordinator=coord, site="lab-a",
                         multi_objective="parego")
    # statistics of another shape than the majority's are left out, with a warning
    from labfbo.protocols.surface.protocol import SurfaceAggregator, SurfaceOptions

    agg = SurfaceAggregator(SurfaceOptions(fourier_features=0, secure_aggregation="off"), SITES, 0, None, SPACE)
    p = SurfaceFeatures(SPACE).p
    two = {s: SurfaceStats(count=4, gram=Array.of(np.ones(p * (p + 1) // 2)), moment=Array.of(np.ones((2, p))))
           for s in SITES[:2]}
    one = SurfaceStats(count=4, gram=Array.of(np.ones(p * (p + 1) // 2)), moment=Array.of(np.ones(p)))
    with pytest.warns(UserWarning, match="lab-c"):
        replies = agg.on_responses(0, {**two, "lab-c": one}).replies
    assert replies["lab-c"].sites == 2 and replies["lab-c"].moment.shape == (2, p)
    assert replies["lab-a"].sites == 1


@pytest.mark.integration  # three 20-round campaigns of five labs on real data (about 45 s)
def test_the_agreement_estimate_ranks_each_harmful_partner_below_every_related_lab() -> None:
    """Buchwald-Hartwig scenario (b): 3 related labs and 2 dissimilar ones; each lab's agreement with
    its partners' surface (journaled with its asks), at the end of the campaign, mean over 3 seeds."""
    from labfbo.datasets import initial_design, load_reactions, scenarios

    data = load_reactions()
    labs = scenarios(data)["b"]
    d = data.subset(labs)
    names = [f"lab{i}" for i in range(len(labs))]
    agreement = np.zeros((3, len(labs)))
    for seed in range(3):
        coord = labfbo.Coordinator("surface", sites=names, space=d.space, seed=seed, horizon=20)
        opts = [labfbo.Optimizer(d.space, objective="maximize", protocol="surface", coordinator=coord, site=n,
                                 seed=seed, n_init=3, horizon=20) for n in names]

        def run(i: int, trial) -> None:
            y = d.tables[i].get(tuple(trial.params[n] for n in d.space.names))
            opts[i].tell(trial, y) if y is not None else opts[i].tell_failed(trial, "not in the data")  # noqa: B023 - runs within this seed

        for i, o in enumerate(opts):
            for combo in initial_design(d, i, seed, 3):
                run(i, o.enqueue(dict(zip(d.space.names, combo))))
        for _ in range(20):
            for i, trial in enumerate([o.ask() for o in opts]):
                run(i, trial)
        agreement[seed] = [o.transfer_estimates()[-1][1].agreement for o in opts]
        for o in opts:
            o.close()
    mean = agreement.mean(0)
    related, harmful = mean[:3], mean[3:]  # scenario (b): the 3 related labs first
    assert harmful.max() < related.min(), (related, harmful)
