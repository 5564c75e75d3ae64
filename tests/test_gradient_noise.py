"""`gradient` under DP: the coordinator states how noisy the score sums that trained its particles
were, and a site whose particles are mostly noise proposes from its own GP."""

from __future__ import annotations

import numpy as np
import torch

import labfbo
from labfbo.core.messages import Array
from labfbo.protocols.base import SiteContext, SiteData
from labfbo.protocols.gradient.messages import ParticlesReply, ScoreResponse
from labfbo.protocols.gradient.protocol import NOISE_GUARD, GradientAggregator, GradientOptions, GradientSite

SPACE = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
SITES = ["a", "b", "c"]
OPTS = {"warmup_steps": 1, "svgd_steps": 1, "n_particles": 2}


def _round(sigma: float | None) -> ParticlesReply:
    agg = GradientAggregator(GradientOptions(**OPTS), SITES, 0, 5, SPACE)
    req = agg.open_round(0).requests["a"]
    K, P = tuple(agg.particles.shape)
    answers = {s: ScoreResponse(step=req.step, scores=Array.of(np.random.default_rng(i).normal(size=(K, P))), n_obs=5,
                                dp_clip=None if sigma is None else 1.0, dp_noise_multiplier=sigma)
               for i, s in enumerate(SITES)}
    step = agg.on_responses(0, answers)
    return step.replies["a"]


def test_the_particles_state_their_noise_and_none_without_dp() -> None:
    plain, noisy, faint = _round(None), _round(59.0), _round(0.001)
    assert plain.dp_noise_ratio is None and "dp_noise_ratio" not in plain.model_dump(mode="json")
    P = plain.particles.numpy().shape[1]
    # three local noises of std 2C sigma each, against the 3C the clipped scores can sum to
    assert noisy.dp_noise_ratio == np.sqrt(3 * (2 * 59.0) ** 2 * P) / 3
    assert noisy.dp_noise_ratio > NOISE_GUARD > faint.dp_noise_ratio


def test_a_site_on_noise_trained_particles_proposes_from_its_own_gp() -> None:
    gen = np.random.default_rng(0)
    X = gen.random((8, 2))
    data = SiteData(SPACE, X, -((X - 0.3) ** 2).sum(1), None, np.zeros((0, 2)))
    site = GradientSite(SPACE, GradientOptions(harm_guard=False, **OPTS), SiteContext(site="a", n_sites=3))
    reply = _round(59.0)
    site.particles = torch.as_tensor(reply.particles.numpy())
    model = site.mixture(data)
    site.noise_ratio = reply.dp_noise_ratio
    assert not site.trusts(model, data)  # the noise, whatever the leave-one-out comparison would say
    site.noise_ratio = None
    assert site.trusts(model, data)  # harm_guard off and no noise stated: the particles are used
