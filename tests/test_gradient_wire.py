"""gradient's compact wire: unbiased 8-bit codes, shared reconstructions, an eighth of the bytes."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo.messages import Abstain, Array, parse
from labfbo.protocols.gradient import GradientOptions, ParticlesRequest, ScoreResponse
from labfbo.protocols.gradient_wire import (BLOCK, MISSED, CoordinatorWire, ParticlesDelta, SiteWire, dequantize,
                                            quantize)

FAST = {"n_sites": 3, "n_init": 3, "budget": 3, "seed": 1, "warmup_steps": 20, "svgd_steps": 4,
        "num_restarts": 2, "raw_samples": 32}


def test_codes_are_int8_with_a_float32_scale_per_block_and_unbiased():
    x = np.random.default_rng(0).normal(size=(3, 100)) * np.logspace(-6, 2, 100)
    codes, scale = quantize(x, np.random.default_rng(1))
    assert codes.dtype == "int8" and codes.shape == (3, 100) and scale.dtype == "float32"
    assert scale.shape == (-(-300 // BLOCK),)
    one = dequantize(codes, scale)
    step = np.repeat(scale.numpy().astype(float), BLOCK)[:300].reshape(3, 100) / 127
    assert np.all(np.abs(one - x) <= step * (1 + 1e-12))  # within one quantization step
    mean = np.mean([dequantize(*quantize(x, np.random.default_rng(s))) for s in range(2000)], axis=0)
    assert np.all(np.abs(mean - x) <= 4 * step / np.sqrt(2000) + 1e-15)  # E[x^] = x
    zeros, z_scale = quantize(np.zeros((2, 5)), np.random.default_rng(0))
    assert np.array_equal(dequantize(zeros, z_scale), np.zeros((2, 5)))


def test_site_and_coordinator_hold_the_same_particles_and_a_gap_resets_the_thread():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(4, 70))
    coord, site, late = CoordinatorWire(seed=3), SiteWire(), SiteWire()
    for step in range(6):
        delta, full = coord.request(theta, step, round=2)
        msg = parse((delta or ParticlesRequest(step=step, particles=full, round=2)).to_wire())
        assert isinstance(msg, ParticlesDelta if step else ParticlesRequest)
        held = site.particles(msg, 2)
        assert np.array_equal(held, coord.ref[1])  # bit-identical reconstructions, no drift
        assert np.array_equal(site.particles(msg, 2), held)  # the same request again: the same particles
        assert np.max(np.abs(held - theta)) <= np.max(np.abs(theta)) / 127
        if step == 2:
            assert late.particles(msg, 2) is None  # missed steps 0 and 1: it cannot read a delta
        theta = theta + 1e-3 * rng.normal(size=theta.shape)
    coord.reset()
    delta, full = coord.request(theta, 6, round=2)
    assert delta is None and np.array_equal(late.particles(ParticlesRequest(step=6, particles=full), 2), theta)


def test_compact_wire_sends_an_eighth_and_every_transport_the_same_proposals():
    lossless = labfbo.simulate("branin", "gradient", **FAST)
    compact = labfbo.simulate("branin", "gradient", wire="compact", **FAST)
    http = labfbo.simulate("branin", "gradient", wire="compact", transport="http", **FAST)
    np.testing.assert_array_equal(http.proposals, compact.proposals)
    np.testing.assert_array_equal(http.bytes_up, compact.bytes_up)
    up = compact.bytes_up.sum() / lossless.bytes_up.sum()
    down = compact.bytes_down.sum() / lossless.bytes_down.sum()
    assert up < 0.15 and down < 0.35, (up, down)  # down: one full request per round and the guidance
    assert np.all(np.isfinite(compact.best_values))


def test_scores_on_the_compact_wire_read_back_as_float64_and_lossless_json_is_unchanged():
    A = np.arange(12.0).reshape(3, 4) - 5
    codes, scale = quantize(A, np.random.default_rng(0))
    msg = parse(ScoreResponse(step=1, scores=codes, scale=scale, n_obs=4, round=0).to_wire())
    assert np.max(np.abs(msg.values() - A)) <= 6 / 127 + 1e-12
    plain = ScoreResponse(step=1, scores=Array.of(A), n_obs=4)
    assert "scale" not in plain.model_dump_json() and np.array_equal(plain.values(), A)


@pytest.mark.parametrize("lost", [False, True])
def test_a_site_that_lost_the_thread_abstains_and_the_next_step_is_sent_in_full(lost):
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Real("y", 0, 1)])
    agg = labfbo.Coordinator("gradient", sites=["a", "b"], space=space, seed=0, warmup_steps=5, svgd_steps=2,
                             wire="compact").aggregator()
    step = agg.open_round(0)
    assert all(isinstance(m, ParticlesRequest) for m in step.requests.values())  # a round opens in full
    shape = agg.particles.shape
    codes, scale = quantize(np.full(shape, 0.1), np.random.default_rng(0))
    scored = ScoreResponse(step=0, scores=codes, scale=scale, n_obs=5, round=0)
    a = Abstain(reason=MISSED, round=0) if lost else scored
    nxt = agg.on_responses(0, {"a": a, "b": scored})
    kinds = {type(m) for m in nxt.requests.values()}
    assert kinds == ({ParticlesRequest} if lost else {ParticlesDelta})


def test_compact_wire_refuses_secure_aggregation():
    with pytest.raises(ValueError, match="secure_aggregation"):
        GradientOptions(wire="compact", secure_aggregation=True)
