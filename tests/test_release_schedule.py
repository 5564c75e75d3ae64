"""``release_every``: fewer DP releases (the coordinator reuses the last one), and
``dp_belief="centre"``: a lower-sensitivity belief for `distribution`."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from campaign import run_campaign

import labfbo
from labfbo.core.messages import Abstain, Array
from labfbo.privacy.belief_dp import CENTRE_SD, CENTRE_VALUE, CENTRE_WEIGHT, centre_sensitivity, privatize_centre
from labfbo.protocols.base import Finish, SiteContext
from labfbo.protocols.distribution.protocol import (
    DistributionAggregator,
    DistributionOptions,
    DistributionSite,
    GuidancePacket,
    OptimumBelief,
)
from labfbo.protocols.surface.protocol import SurfaceAggregator, SurfaceOptions, SurfaceSite, SurfaceStats

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
MIXED = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Real("t", 0, 1), labfbo.Categorical("c", ["a", "b", "c"])])
SITES = ["s0", "s1", "s2"]
FAST = {"num_restarts": 2, "raw_samples": 32}
PROTOCOLS = {"distribution": {"M": 64, "candidates": 128}, "surface": {"fourier_features": 8}}
REQUEST = {"distribution": "optimum_belief", "surface": "surface_stats"}
REPLY = {"distribution": "guidance_packet", "surface": "surface_sealed_totals"}
T = 4  # rounds 0..3: releases in rounds 0 and 3 with release_every=3


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.1 * i) ** 2 + (p["y"] + 0.2) ** 2


def _sites(protocol: str, horizon: int = T, **extra):
    opts = {**FAST, **PROTOCOLS[protocol], **extra}
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=0, horizon=horizon, **opts)
    return coord, [labfbo.Optimizer(SPACE, protocol=protocol, coordinator=coord, site=s, seed=0, n_init=3,
                                    secret=11 + i, **opts) for i, s in enumerate(SITES)]


# -- the schedule and the plan ---------------------------------------------------------------
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_the_plan_counts_the_release_rounds(protocol) -> None:
    logic = {"distribution": (DistributionSite, DistributionOptions), "surface": (SurfaceSite, SurfaceOptions)}
    site, options = logic[protocol]
    for k in (1, 2, 3, 7):
        s = site(SPACE, options(**PROTOCOLS[protocol], release_every=k), SiteContext("s0"))
        for horizon in (0, 1, 2, 3, 5, 6, 30):
            assert s.planned_releases(horizon) == {REQUEST[protocol]: sum(t % k == 0 for t in range(horizon))}
    with pytest.raises(ValueError):
        options(release_every=0)


def _belief(mean, k=None, weight=0.5, value=0.0) -> OptimumBelief:
    return OptimumBelief(weight=weight, mean=Array.of(mean), variance=Array.of(np.full(len(mean), 0.01)), value=value,
                         release_every=k)


def test_the_coordinator_reuses_a_belief_until_the_sites_next_release() -> None:
    def agg() -> DistributionAggregator:
        return DistributionAggregator(DistributionOptions(), SITES, 0, None, SPACE)

    a = agg()
    fresh = {s: _belief([0.2 + 0.3 * i, 0.5], k=3) for i, s in enumerate(SITES)}
    first = a.on_responses(0, fresh)
    assert isinstance(first, Finish) and set(first.replies) == set(SITES)
    assert a.on_responses(0, dict(reversed(list(fresh.items())))).replies == first.replies  # roster order
    b = agg()
    b.restore(a.state())  # a restarted coordinator holds the same beliefs
    for t in (1, 2):  # nobody sends: the round-0 beliefs stand
        got, again = a.on_responses(t, {}), b.on_responses(t, {})
        assert set(got.replies) == set(SITES) and got.replies == again.replies
        means = {tuple(r) for m in got.replies.values() for r in m.means.numpy()}
        assert means <= {tuple(m.mean.numpy()) for m in fresh.values()}
    assert a.on_responses(3, {}).replies == {} and a.held == {}  # past the schedule: gone
    plain = agg()  # release_every=1 (the default): nothing is reused, nothing is carried
    plain.on_responses(0, {s: _belief([0.5, 0.5]) for s in SITES})
    assert plain.on_responses(1, {}).replies == {} and plain.state() == {}
    # a belief of release_every=1 is byte for byte what it was
    assert "release_every" not in _belief([0.5, 0.5]).model_dump_json()


def test_the_coordinator_reuses_surface_statistics_in_roster_order() -> None:
    gen = np.random.default_rng(0)
    agg = SurfaceAggregator(SurfaceOptions(secure_aggregation="off"), SITES, 0, None, None)  # the clear protocol
    stats = {s: SurfaceStats(count=5, gram=Array.of(gen.normal(size=6)), moment=Array.of(gen.normal(size=3)),
                             release_every=2) for s in SITES}
    first = agg.on_responses(0, stats)
    second = agg.on_responses(1, {"s1": stats["s1"].model_copy(update={"release_every": None})})
    for s in SITES:
        np.testing.assert_array_equal(second.replies[s].gram.numpy(), first.replies[s].gram.numpy())
    assert "s1" not in agg.held and agg.on_responses(2, {}).replies == {}


# -- campaigns ------------------------------------------------------------------------------------
def _campaign(protocol: str, **extra):
    coord, sites = _sites(protocol, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proposals = run_campaign(sites, _f, 3, rounds=T)
    return coord, sites, proposals


@pytest.mark.integration
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_release_every_releases_the_plan_with_less_noise_and_guides_every_round(protocol) -> None:
    dp = labfbo.DP(epsilon=2.0)
    every = _sites(protocol, privacy=dp)[1][0].privacy_budget()["noise_multiplier"]  # calibrated when created
    coord, sites, proposals = _campaign(protocol, privacy=dp, release_every=3)
    for o in sites:
        b = o.privacy_budget()
        assert b["planned_releases"] == 2 == b["releases"] == len(o.releases())
        assert [r.round for r in o.releases()] == [0, 3] and not b["exhausted"]
        assert o.epsilon() <= 2.0 and b["noise_multiplier"] < every
        held = [m for m in o.sent_messages() if isinstance(m, Abstain)]
        assert [m.round for m in held] == [1, 2]
        assert {m.reason for m in held} == {"not a release round (release_every=3)"}
        assert [(g.round, g.kind) for g in o.state.guidance] == [(t, REPLY[protocol]) for t in range(T)]
    for t in range(T):
        assert all(m.kind == REPLY[protocol] for m in coord.rounds[t].values())
    if protocol == "surface":  # round 1's totals are round 0's, reused
        for s in SITES:
            np.testing.assert_array_equal(coord.rounds[1][s].masked.numpy(), coord.rounds[0][s].masked.numpy())
            assert coord.rounds[1][s].sealed == coord.rounds[0][s].sealed and coord.rounds[1][s].summed_round == 0
    _, _, again = _campaign(protocol, privacy=dp, release_every=3)
    assert again == proposals  # the same seeds, the same campaign


# -- a centre-only belief -----------------------------------------------------------------------
def test_the_centre_mechanism_has_the_centres_sensitivity() -> None:
    dp = labfbo.DP(noise_multiplier=1.0)
    for space, want in ((SPACE, math.sqrt(2)), (MIXED, math.sqrt(2 + 2 * 1))):
        rel = {}
        for mode in ("full", "centre"):
            site = DistributionSite(space, DistributionOptions(privacy=dp, dp_belief=mode), SiteContext("s0"))
            rel[mode] = site.declare_release("optimum_belief", 0, None, True, None)
        assert rel["centre"].sensitivity == pytest.approx(want)
        assert rel["full"].sensitivity == pytest.approx(math.sqrt(2 * space.dim + 2))
        assert rel["centre"].effective_noise_multiplier == rel["full"].effective_noise_multiplier == 1.0
        assert rel["centre"].noise_std < rel["full"].noise_std and rel["centre"].mechanism != rel["full"].mechanism
    assert centre_sensitivity(3) == math.sqrt(3)
    mean, probs, cats = np.array([0.5, 0.5]), np.array([0.7, 0.2, 0.1]), [(2, 3, 0)]
    for sigma in (0.01, 0.5):
        out = [privatize_centre(mean, labfbo.DP(noise_multiplier=sigma), np.random.default_rng(s), probs, cats)
               for s in range(400)]
        mus, ps = np.array([o[0] for o in out]), np.array([o[1] for o in out])
        assert mus.min() >= 0 and mus.max() <= 1 and np.allclose(ps.sum(1), 1) and ps.min() >= 1e-7
    small = np.array([privatize_centre(mean, labfbo.DP(noise_multiplier=0.01), np.random.default_rng(s))[0]
                      for s in range(400)])
    assert np.std(small) == pytest.approx(0.01 * math.sqrt(2), rel=0.1)  # std sigma * sqrt(d)
    clean, no_probs = privatize_centre(np.array([0.2, 1.4]), labfbo.DP(noise_multiplier=0.0), np.random.default_rng(0))
    np.testing.assert_array_equal(clean, [0.2, 1.0])
    assert no_probs is None


def test_constant_beliefs_aggregate_to_the_unweighted_mixture_of_the_centres() -> None:
    agg = DistributionAggregator(DistributionOptions(), SITES, 0, None, SPACE)
    centres = {s: [0.1 + 0.4 * i, 0.5] for i, s in enumerate(SITES)}
    sd = np.full(2, CENTRE_SD ** 2)
    got = agg.on_responses(0, {s: OptimumBelief(weight=CENTRE_WEIGHT, mean=Array.of(c), variance=Array.of(sd),
                                                value=CENTRE_VALUE) for s, c in centres.items()})
    for m in got.replies.values():
        assert isinstance(m, GuidancePacket) and len(m.weights.numpy()) == 3
        np.testing.assert_allclose(m.weights.numpy(), 1 / 3)
        np.testing.assert_allclose(m.variances.numpy(), CENTRE_SD ** 2)


@pytest.mark.integration
def test_a_centre_only_belief_sends_constants_with_less_noise_for_the_same_budget() -> None:
    dp = labfbo.DP(epsilon=2.0)
    _, full = _sites("distribution", privacy=dp)
    _, sites, proposals = _campaign("distribution", privacy=dp, dp_belief="centre")
    for o, f in zip(sites, full):
        ups = [m for m in o.sent_messages() if isinstance(m, OptimumBelief)]
        assert len(ups) == T and o.epsilon() <= 2.0
        for m in ups:
            assert (m.weight, m.value) == (CENTRE_WEIGHT, CENTRE_VALUE)
            np.testing.assert_array_equal(m.variance.numpy(), [CENTRE_SD ** 2] * 2)
            assert m.mean.numpy().min() >= 0 and m.mean.numpy().max() <= 1
        sigma = o.privacy_budget()["noise_multiplier"]
        assert sigma == f.privacy_budget()["noise_multiplier"]  # the effective multiplier is sigma in both modes
        rows = o.privacy_report()
        assert rows[0]["sensitivity"] == pytest.approx(math.sqrt(2))
        assert rows[0]["noise_std"] == pytest.approx(sigma * math.sqrt(2))
        assert rows[0]["noise_std"] < sigma * math.sqrt(2 * 2 + 2)  # "full": the same sigma times sqrt(2d + 2)
    _, _, again = _campaign("distribution", privacy=dp, dp_belief="centre")
    assert again == proposals
