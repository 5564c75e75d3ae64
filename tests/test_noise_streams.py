"""A DP draw never depends on the last bits of the values it protects (`labfbo.privacy.streams`):
the first query of a round draws the same stream on every machine, the same query repeats its
bytes, another query draws fresh noise, and a restarted site remembers which streams it used."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo.core.messages import Array
from labfbo.privacy.streams import NoiseStreams
from labfbo.protocols.base import SiteContext, SiteData
from labfbo.protocols.gradient.messages import ParticlesRequest
from labfbo.protocols.gradient.protocol import GradientOptions, GradientSite

SPACE = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
OPTS = {"warmup_steps": 1, "svgd_steps": 1, "n_particles": 2}


def test_streams_follow_the_order_of_first_use_not_the_values() -> None:
    s = NoiseStreams()
    assert s.index(3, "dp", "q1") == 0 and s.index(3, "dp", "q2") == 1 and s.index(3, "dp", "q1") == 0
    assert s.index(4, "dp", "q2") == 0 and s.index(3, "other", "q2") == 0
    assert s.drawn(3) == ["dp#q1", "dp#q2", "other#q2"]  # round 4's draw never left with round 3's answer
    assert s.drawn(3) == []
    with pytest.raises(ValueError, match="'#'"):
        s.index(0, "dp#x", "q")


def test_a_restarted_site_never_draws_a_used_stream_for_another_query() -> None:
    before = NoiseStreams()
    before.index(2, "dp", "q1")
    again = NoiseStreams()
    again.resume([(2, before.drawn(2))])
    assert again.index(2, "dp", "q9") == 1 and again.index(2, "dp", "q1") == 0


def _site() -> GradientSite:
    dp = labfbo.DP(noise_multiplier=1.0, clip=1.0)
    return GradientSite(SPACE, GradientOptions(privacy=dp, **OPTS), SiteContext(site="a", n_sites=3, secret=11))


def _data(shift: float = 0.0) -> SiteData:
    X = np.random.default_rng(0).random((6, 2)) + shift
    return SiteData(SPACE, X, -((X - 0.3) ** 2).sum(1), None, np.zeros((0, 2)))


def _noise(site: GradientSite, particles: np.ndarray, data: SiteData) -> np.ndarray:
    """The DP noise of one answer: what the site sent minus the same answer without DP."""
    plain = GradientSite(SPACE, GradientOptions(**OPTS), SiteContext(site="a", n_sites=3, secret=11))
    request = ParticlesRequest(step=0, particles=Array.of(particles), round=1)
    clean = plain.answer(request, data, 1).values()
    from labfbo.privacy import clip_rows

    return site.answer(request, data, 1).values() - clip_rows(clean, 1.0)


def test_the_noise_of_a_first_answer_does_not_follow_the_last_bits() -> None:
    """Particles and data that another machine computed 1e-13 apart get the same noise: the same
    seed gives the same proposals on every CPU (a stream named by a hash of the values did not)."""
    particles = np.random.default_rng(1).normal(size=(2, _particle_size()))
    here = _noise(_site(), particles, _data())
    there = _noise(_site(), particles * (1 + 1e-13), _data(1e-13))
    assert np.allclose(here, there, atol=1e-9) and np.abs(here).max() > 0.1


def test_another_query_draws_fresh_noise_and_the_same_query_repeats_it() -> None:
    site = _site()
    particles = np.random.default_rng(1).normal(size=(2, _particle_size()))
    first = _noise(site, particles, _data())
    other = _noise(site, particles + 0.5, _data())
    assert np.array_equal(_noise(site, particles, _data()), first)  # recomputed: the same bytes leave
    assert not np.allclose(first, other, atol=0.05)  # reused noise would cancel in their difference
    release = site.release(site.answer(ParticlesRequest(step=0, particles=Array.of(particles), round=1), _data(), 1)
                           .model_copy(update={"round": 1}))
    # every stream the site drew this round is journaled with the release that leaves (two queries here)
    assert release is not None and len(release.streams) == 2
    assert all(key.startswith("dp-noise/0#") for key in release.streams)


def _particle_size() -> int:
    from labfbo.protocols.gradient.protocol import GradientAggregator

    agg = GradientAggregator(GradientOptions(**OPTS), ["a", "b", "c"], 0, 5, SPACE)
    return int(agg.particles.shape[1])
