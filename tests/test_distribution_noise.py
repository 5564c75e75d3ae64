"""`distribution` under DP: the guidance states how noisy each component's centre is, and a site
discounts it (wider bumps) or leaves it out (mostly noise), so noise alone never steers a lab."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import labfbo
from labfbo.core.messages import Array, parse
from labfbo.privacy.belief_dp import sensitivity
from labfbo.protocols.base import SiteContext, SiteData
from labfbo.protocols.distribution.messages import NOISE_GUARD
from labfbo.protocols.distribution.protocol import (
    Components,
    DistributionAggregator,
    DistributionOptions,
    DistributionSite,
    GuidancePacket,
    OptimumBelief,
    merge_components,
)

SPACE = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
SITES = ["s0", "s1", "s2"]


def _belief(mean, noise_sd: float | None = None, value: float = 0.0) -> OptimumBelief:
    return OptimumBelief(weight=0.5, mean=Array.of(mean), variance=Array.of([0.01, 0.01]), value=value,
                         dp_clip=None if noise_sd is None else 3.0,
                         dp_noise_multiplier=None if noise_sd is None else noise_sd / sensitivity(2),
                         dp_noise_sd=noise_sd)


def _packet(noise_sd) -> GuidancePacket:
    return GuidancePacket(weights=Array.of([0.6, 0.4]), means=Array.of([[0.2, 0.3], [0.8, 0.7]]),
                          variances=Array.of([[0.01, 0.01], [0.02, 0.02]]),
                          noise_sd=None if noise_sd is None else Array.of(noise_sd))


def test_a_component_is_widened_by_its_noise_and_left_out_beyond_the_guard() -> None:
    plain = _packet(None).field(SPACE)
    noisy = _packet([0.1, 0.0]).field(SPACE)
    np.testing.assert_allclose(noisy.variances, plain.variances + np.array([[0.01], [0.0]]))
    np.testing.assert_array_equal(noisy.means, plain.means)
    half = _packet([NOISE_GUARD * 1.01, 0.05]).field(SPACE)
    assert len(half) == 1 and half.means[0].tolist() == [0.8, 0.7]
    assert len(_packet([30.0, 31.0]).field(SPACE)) == 0  # all noise: an empty field, i.e. the local GP


def test_the_aggregator_states_each_components_noise_and_merging_averages_it() -> None:
    agg = DistributionAggregator(DistributionOptions(P=3, merging=False), SITES, 0, None, SPACE)
    resp = {"s0": _belief([0.2, 0.2], 0.3), "s1": _belief([0.5, 0.5], 0.1), "s2": _belief([0.8, 0.8], 0.2)}
    pkt = agg.on_responses(0, resp).replies["s0"]
    by_centre = {tuple(np.round(m, 3)): s for m, s in zip(pkt.means.numpy(), pkt.noise_sd.numpy())}
    assert by_centre == {(0.2, 0.2): 0.3, (0.5, 0.5): 0.1, (0.8, 0.8): 0.2}
    c = Components(np.array([1.0, 3.0]), np.array([[0.5, 0.5], [0.51, 0.5]]), np.full((2, 2), 0.01),
                   np.zeros(2), noise_sd=np.array([0.4, 0.2]))
    merged = merge_components(c, 0.1)
    assert len(merged) == 1
    assert merged.noise_sd[0] == pytest.approx(np.sqrt(0.4 ** 2 + (3 * 0.2) ** 2) / 4)


def test_without_dp_nothing_about_noise_goes_on_the_wire() -> None:
    agg = DistributionAggregator(DistributionOptions(P=2), SITES, 0, None, SPACE)
    resp = {s: _belief([0.1 * i, 0.2]) for i, s in enumerate(SITES)}
    pkt = agg.on_responses(0, resp).replies["s0"]
    assert pkt.noise_sd is None and "noise_sd" not in pkt.model_dump(mode="json")
    assert "dp_noise_sd" not in resp["s0"].model_dump(mode="json")
    again = parse(_packet([0.1, 0.2]).model_dump_json())
    assert isinstance(again, GuidancePacket) and again.noise_sd.numpy().tolist() == [0.1, 0.2]
    with pytest.raises(ValueError, match="noise_sd"):
        _packet([0.1])
    with pytest.raises(ValueError, match="noise_sd"):
        _packet([0.1, -1.0])


def test_a_private_site_states_its_noise_and_falls_back_to_its_gp_when_the_guidance_is_noise() -> None:
    gen = np.random.default_rng(0)
    X = gen.random((8, 2))
    y = -((X - 0.3) ** 2).sum(1)
    data = SiteData(SPACE, X, y, None, np.zeros((0, 2)))
    dp = labfbo.DP(noise_multiplier=4.0, clip=3.0)
    opts = DistributionOptions(privacy=dp, M=64, candidates=128)
    site = DistributionSite(SPACE, opts, SiteContext(site="s0", seed=0))
    from labfbo.protocols.distribution.protocol import BeliefRequest

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        belief = site.answer(BeliefRequest(), data, 0)
    assert isinstance(belief, OptimumBelief) and belief.dp_noise_sd == pytest.approx(4.0 * sensitivity(2))
    agg = DistributionAggregator(opts, SITES, 0, None, SPACE)
    pkt = agg.on_responses(0, {s: belief for s in SITES}).replies["s0"]
    assert pkt.noise_sd is not None and np.all(pkt.noise_sd.numpy() > NOISE_GUARD)
    assert len(site.figp(data, pkt, 3).field) == 0
