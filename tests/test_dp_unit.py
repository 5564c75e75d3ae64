"""``DP(unit="site"|"experiment")``: what is protected, stated in the unit, and the noise each unit needs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from campaign import run_campaign

import labfbo
from labfbo.core.messages import PrivacyDeclaration
from labfbo.core.release import EXPERIMENT_NEIGHBOURING, NEIGHBOURING, Release
from labfbo.privacy.budget import PrivacyFloor, declaration
from labfbo.privacy.report import report
from labfbo.protocols import SiteContext, get_protocol, parse_options
from labfbo.protocols.surface.model import (
    SurfaceFeatures,
    dp_sensitivity,
    experiment_sensitivity,
    private_statistics,
    rank_scores,
    site_statistics,
    upper,
)

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
MIXED = labfbo.SearchSpace([labfbo.Real("t", 0, 1), labfbo.Integer("n", 1, 5),
                            labfbo.Categorical("c", ["a", "b", "c", "d"])])
SITES = ["s0", "s1", "s2"]


# -- the setting and what it serializes to -------------------------------------------------------------
def test_the_unit_round_trips_and_the_default_dumps_byte_for_byte_as_before() -> None:
    assert labfbo.DP().model_dump_json() == '{"clip":1.0,"noise_multiplier":1.0,"delta":0.00001}'
    assert labfbo.DP(epsilon=2.0).model_dump_json() == \
        '{"clip":1.0,"noise_multiplier":null,"delta":0.00001,"epsilon":2.0}'
    assert labfbo.DP(unit="site") == labfbo.DP() and labfbo.DP().unit == "site"
    exp = labfbo.DP(epsilon=2.0, delta=1e-5, unit="experiment")
    assert exp.model_dump()["unit"] == "experiment"
    assert labfbo.DP.model_validate_json(exp.model_dump_json()) == exp
    assert labfbo.DP(**json.loads(exp.model_dump_json())) == exp
    assert exp.model_copy(update={"noise_multiplier": 3.0}).unit == "experiment"  # calibration keeps it
    with pytest.raises(ValueError, match="unit"):
        labfbo.DP(unit="lab")


def test_the_join_declares_the_unit_and_the_release_states_it() -> None:
    site = declaration(labfbo.DP(epsilon=2.0))
    assert "unit" not in site.model_dump() and site.unit == "site"  # the join as before
    exp = declaration(labfbo.DP(epsilon=2.0, unit="experiment"), horizon=5)
    assert exp.unit == "experiment" and PrivacyDeclaration.model_validate(exp.model_dump()) == exp
    dp = labfbo.DP(noise_multiplier=2.0)
    old = Release.gaussian("surface_stats", 0, dp, "m", sensitivity=4.0, noise_std=8.0)
    assert "unit" not in old.model_dump() and old.neighbouring == NEIGHBOURING  # journals as before
    new = Release.gaussian("surface_stats", 0, dp.model_copy(update={"unit": "experiment"}), "m", sensitivity=0.2,
                           noise_std=0.4)
    assert new.model_dump()["unit"] == "experiment" and new.neighbouring == EXPERIMENT_NEIGHBOURING
    assert Release.model_validate(new.model_dump()) == new and new.event == old.event == 2.0
    rows = report([old, new])
    assert [r["unit"] for r in rows] == ["site", "experiment"]


# -- surface: the experiment-level sensitivity -------------------------------------------------------------
def test_rank_scores_lie_in_the_clip_and_share_ties() -> None:
    z = rank_scores(np.array([3.0, 1.0, 1.0, 5.0, 2.0]), 2.0)
    assert z.tolist() == [1.0, -1.5, -1.5, 2.0, 0.0]
    assert rank_scores(np.array([7.0, 7.0, 7.0]), 1.0).tolist() == [0.0, 0.0, 0.0]
    assert rank_scores(np.array([4.0]), 1.0).tolist() == [0.0]


def _stack(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    return np.concatenate([gram.ravel(), moment.ravel()])


def _neighbours(gen: np.random.Generator, n: int, m: int, d: int) -> tuple[np.ndarray, ...]:
    """A dataset and one with experiment k replaced: random, or the worst kind of replacement
    (the lowest result becomes the highest, far out; ties of zero yields)."""
    X = gen.random((n, d))
    Y = gen.choice([gen.random((n, m)), np.round(gen.random((n, m)), 1), np.where(gen.random((n, m)) < 0.5, 0.0,
                                                                                  gen.random((n, m)))])
    k = int(gen.integers(n))
    X2, Y2 = X.copy(), Y.copy()
    X2[k] = gen.random(d)
    kind = gen.integers(3)
    Y2[k] = gen.random(m) if kind == 0 else (1e6 * gen.standard_normal(m) if kind == 1 else Y.max(axis=0) + 100)
    if kind == 2:
        Y[k] = Y.min(axis=0) - 100
    return X, Y, X2, Y2


def replacements(space: labfbo.SearchSpace, outcomes: int, seed: int, trials: int = 400):  # type: ignore[no-untyped-def]
    """``(n, clip, X, y, X2, y2)`` of random neighbouring datasets: one experiment replaced (:func:`_neighbours`)."""
    gen = np.random.default_rng(seed)
    for _ in range(trials):
        n, clip = int(gen.integers(2, 40)), float(gen.choice([0.5, 1.0, 2.0]))
        X, Y, X2, Y2 = _neighbours(gen, n, outcomes, space.dim)
        yield (n, clip, X, *((Y[:, 0], X2, Y2[:, 0]) if outcomes == 1 else (Y, X2, Y2)))


@pytest.mark.parametrize("outcomes", [1, 2])
def test_replacing_one_experiment_never_moves_the_statistics_beyond_the_stated_sensitivity(outcomes) -> None:
    """Random datasets (with ties and results far out), one experiment replaced: the statistics of
    ``unit="experiment"`` move by at most :func:`experiment_sensitivity` — and by a good part of it."""
    feats = SurfaceFeatures(MIXED, fourier=8)
    worst = 0.0
    for trial, (n, clip, X, y, X2, y2) in enumerate(replacements(MIXED, outcomes, seed=1)):
        a = _stack(*site_statistics(feats.of_unit(X), y, clip, "experiment"))
        b = _stack(*site_statistics(feats.of_unit(X2), y2, clip, "experiment"))
        bound = experiment_sensitivity(feats.norm_bound, clip, n, outcomes)
        assert bound == dp_sensitivity(feats.norm_bound, clip, outcomes, "experiment", n)
        change = float(np.linalg.norm(a - b))
        assert change <= bound * (1 + 1e-12), (trial, n, change, bound)
        worst = max(worst, change / bound)
    assert worst > 0.25  # the bound is not vacuous: some replacements come near it


def test_a_values_own_mean_and_std_give_no_experiment_level_bound() -> None:
    """Why ranks: with the site's mean and std, one result far out moves every standardized value,
    so the statistics move far beyond the experiment-level sensitivity (and ranks stay within it)."""
    feats = SurfaceFeatures(MIXED, fourier=8)
    gen = np.random.default_rng(0)
    n, clip = 200, 1.0
    X = gen.random((n, MIXED.dim))
    y = X[:, 0].copy()  # a result that follows the first setting: a large moment on its feature
    y2 = y.copy()
    y2[0] = 1e6
    bound = experiment_sensitivity(feats.norm_bound, clip, n)
    moved = {unit: float(np.linalg.norm(_stack(*site_statistics(feats.of_unit(X), y, clip, unit))
                                        - _stack(*site_statistics(feats.of_unit(X), y2, clip, unit))))
             for unit in ("site", "experiment")}
    assert moved["site"] > 2 * bound and moved["experiment"] <= bound


def test_private_statistics_add_noise_of_the_units_sensitivity_and_site_level_as_before() -> None:
    from labfbo.protocols.surface.model import privatize_statistics as privatize

    feats = SurfaceFeatures(MIXED, fourier=8)
    gen = np.random.default_rng(3)
    X, y = gen.random((20, MIXED.dim)), gen.random(20)
    Phi = feats.of_unit(X)
    site = labfbo.DP(noise_multiplier=2.0, clip=1.0)
    g1, h1, d1 = private_statistics(Phi, y, site, feats.norm_bound, np.random.default_rng(7))
    g0, h0 = privatize(*site_statistics(Phi, y, 1.0), site, feats.norm_bound, np.random.default_rng(7))
    assert d1 == dp_sensitivity(feats.norm_bound, 1.0) and np.array_equal(g0, g1) and np.array_equal(h0, h1)
    exp = site.model_copy(update={"unit": "experiment"})
    g2, h2, d2 = private_statistics(Phi, y, exp, feats.norm_bound, np.random.default_rng(7))
    clean_g, clean_h = site_statistics(Phi, y, 1.0, "experiment")
    assert d2 == experiment_sensitivity(feats.norm_bound, 1.0, 20) and d2 < d1 / 20
    draws = np.random.default_rng(7)  # the same stream: the noise is N(0, (sigma Delta_e)^2), gram then moment
    assert np.allclose(g2 - clean_g, draws.normal(0.0, 2.0 * d2, clean_g.shape), atol=1e-12)
    assert np.allclose(h2 - clean_h, draws.normal(0.0, 2.0 * d2, clean_h.shape), atol=1e-12)
    assert np.allclose(clean_g, upper(Phi.T @ Phi) / 20)


# -- surface: a campaign under each unit ---------------------------------------------------------------
def _campaign(unit: str, horizon: int = 3, n_init: int = 4) -> list[labfbo.Optimizer]:
    dp = labfbo.DP(epsilon=2.0, delta=1e-5, unit=unit)
    opts = {"num_restarts": 2, "raw_samples": 32, "fourier_features": 8, "privacy": dp, "secure_aggregation": "off"}
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, horizon=horizon, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site=s, seed=0, n_init=n_init,
                              secret=11 + i, **opts) for i, s in enumerate(SITES)]
    run_campaign(sites, lambda i, p: (p["x"] - 0.1 * i) ** 2 + (p["y"] + 0.2) ** 2, n_init, horizon)
    return sites


@pytest.mark.integration
def test_a_surface_campaign_per_experiment_needs_far_less_noise_within_the_same_budget() -> None:
    """Statistics in the clear (``secure_aggregation="off"``; over secure sums see
    ``test_surface_ranked.py``). Same budget, same plan, so the same noise multiplier (noise std over
    sensitivity); the sensitivity and with it the noise std per entry are about n times smaller per experiment."""
    site, exp = _campaign("site"), _campaign("experiment")
    norm = SurfaceFeatures(SPACE, fourier=8).norm_bound
    for a, b in zip(site, exp):
        sa, sb = a.privacy_budget(), b.privacy_budget()
        assert (sa["unit"], sb["unit"]) == ("site", "experiment")
        assert sb["noise_multiplier"] == pytest.approx(sa["noise_multiplier"])
        assert b.epsilon() <= 2.0 and a.epsilon() <= 2.0 and sb["spent"] <= 2.0
        ra, rb = a.releases(), b.releases()
        assert len(ra) == len(rb) == 3
        for r_site, r_exp, n in zip(ra, rb, (4, 5, 6)):  # the site's count at each release
            assert r_exp.unit == "experiment" and r_site.unit == "site"
            assert r_exp.sensitivity == pytest.approx(experiment_sensitivity(norm, 1.0, n))
            ratio = r_site.noise_std / r_exp.noise_std
            assert ratio == pytest.approx(dp_sensitivity(norm, 1.0) / experiment_sensitivity(norm, 1.0, n))
            assert ratio > 0.6 * n  # n = 4..6 here: ~0.7/n of the site level's noise
        assert {row["unit"] for row in b.privacy_report()} == {"experiment"}
        assert all("experiment level" in row["neighbouring"] for row in b.privacy_report())
    for s in site + exp:
        s.close()


# -- the other protocols ---------------------------------------------------------------------------------
def test_gradient_refuses_the_experiment_unit_and_says_why() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="no sum over experiments"):
        labfbo.protocols.Gradient(privacy=labfbo.DP(epsilon=2.0, unit="experiment"))
    from labfbo.privacy import privatize

    with pytest.raises(labfbo.ConfigurationError, match="use DP\\(unit='site'\\)"):
        privatize(np.ones((2, 3)), labfbo.DP(unit="experiment"), np.random.default_rng(0))
    assert labfbo.protocols.Gradient(privacy=labfbo.DP(epsilon=2.0, unit="site")).privacy.unit == "site"


def test_distribution_and_vote_keep_the_site_noise_and_say_one_experiment_can_change_the_release() -> None:
    from labfbo.privacy.belief_dp import sensitivity

    for name, kind, opts in (("distribution", "optimum_belief", {}), ("vote", "optimum_vote", {"codebook": 8})):
        proto = get_protocol(name)
        rels = {}
        for unit in ("site", "experiment"):
            options = parse_options(proto, {**opts, "privacy": labfbo.DP(noise_multiplier=2.0, unit=unit)})
            logic = proto.site_logic(SPACE, options, SiteContext(site="s0", horizon=4))
            rels[unit] = logic.declare_release(kind, 0, None, True, None)
        site, exp = rels["site"], rels["experiment"]
        assert (site.unit, exp.unit) == ("site", "experiment") and site.event == exp.event  # the same noise
        assert "can change this release entirely" in exp.neighbouring and site.neighbouring == NEIGHBOURING
        if name == "distribution":
            assert exp.sensitivity == site.sensitivity == sensitivity(SPACE.dim)


# -- the consortium's floor ------------------------------------------------------------------------------
def test_a_floor_of_unit_site_refuses_experiment_sites_and_one_of_unit_experiment_admits_both() -> None:
    exp, site = declaration(labfbo.DP(epsilon=2.0, unit="experiment")), declaration(labfbo.DP(epsilon=2.0))
    with pytest.raises(labfbo.FederationError, match="protects one experiment at a time.*requires DP\\(unit='site'\\)"):
        PrivacyFloor(epsilon=4.0).check("s0", exp)  # the default floor: a site hides its whole campaign
    PrivacyFloor(epsilon=4.0).check("s0", site)
    loose = PrivacyFloor(epsilon=4.0, unit="experiment")
    loose.check("s0", exp)
    loose.check("s0", site)
    with pytest.raises(labfbo.FederationError, match="weaker than the study's floor"):
        loose.check("s0", declaration(labfbo.DP(epsilon=8.0, unit="experiment")))
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, horizon=3, privacy_floor=PrivacyFloor(epsilon=4.0))
    with pytest.raises(labfbo.FederationError, match="unit='site'"):
        labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0",
                         privacy=labfbo.DP(epsilon=2.0, unit="experiment"))
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, horizon=3,
                               privacy_floor=PrivacyFloor(epsilon=4.0, unit="experiment"))
    ok = labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0",
                          privacy=labfbo.DP(epsilon=2.0, unit="experiment"))
    ok.close()
