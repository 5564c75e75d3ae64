"""gradient's compact wire: unbiased 8-bit codes, shared reconstructions, an eighth of the bytes."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo.core.messages import Array, parse
from labfbo.protocols.gradient.protocol import GradientOptions, ParticlesRequest, ScoreResponse
from labfbo.protocols.gradient.wire import (
    BLOCK,
    MISSED,
    CoordinatorWire,
    ParticlesDelta,
    SiteWire,
    dequantize,
    quantize,
)

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
        delta, full, _ = coord.request(theta, step, round=2)
        msg = parse((delta or ParticlesRequest(step=step, particles=full, round=2)).to_wire())
        assert isinstance(msg, ParticlesDelta if step else ParticlesRequest)
        held = site.particles(msg, 2)
        assert np.array_equal(held, coord.ref[1])  # bit-identical reconstructions, no drift
        assert np.array_equal(site.particles(msg, 2), held)  # the same request again: the same particles
        assert np.max(np.abs(held - theta)) <= np.max(np.abs(theta)) / 127
        if step == 2:
            assert late.particles(msg, 2) is None  # missed steps 0 and 1: it cannot read a delta
        theta = theta + 1e-3 * rng.normal(size=theta.shape)
    coord.behind.add("late")
    delta, full, behind = coord.request(theta, 6, round=2)
    assert behind == {"late"} and np.array_equal(full.numpy(), coord.ref[1])  # the reconstruction, in full
    assert np.array_equal(late.particles(ParticlesRequest(step=6, particles=full), 2), site.particles(delta, 2))


def test_a_delta_on_another_attempts_particles_is_refused():
    """A round run again reuses its step numbers: the base's fingerprint tells the attempts apart."""
    rng = np.random.default_rng(1)
    first, second, site = CoordinatorWire(seed=0), CoordinatorWire(seed=0), SiteWire()
    a, b = rng.normal(size=(2, 30)), rng.normal(size=(2, 30))
    site.particles(ParticlesRequest(step=0, particles=first.request(a, 0, round=5)[1]), 5)
    second.request(b, 0, round=5)  # the retry's step 0, which this site missed
    delta, _, _ = second.request(b + 0.01, 1, round=5)
    assert site.particles(delta, 5) is None


@pytest.mark.integration  # a campaign on every transport
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


@pytest.mark.parametrize("lost", ["nobody", "a", "both"])
def test_a_site_that_lost_the_thread_gets_the_next_step_in_full(lost):
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Real("y", 0, 1)])
    agg = labfbo.Coordinator("gradient", sites=["a", "b"], space=space, seed=0, warmup_steps=5, svgd_steps=2,
                             wire="compact").aggregator()
    step = agg.open_round(0)
    assert all(isinstance(m, ParticlesRequest) for m in step.requests.values())  # a round opens in full
    codes, scale = quantize(np.full(agg.particles.shape, 0.1), np.random.default_rng(0))
    scored = ScoreResponse(step=0, scores=codes, scale=scale, n_obs=5, round=0)
    answers = {"a": scored, "b": scored}
    for s in {"nobody": [], "a": ["a"], "both": ["a", "b"]}[lost]:
        agg.abstained(s, MISSED)  # the coordinator reports abstentions; the answer is not a response
        del answers[s]
    nxt = agg.on_responses(0, answers)
    kinds = {s: type(m) for s, m in nxt.requests.items()}
    if lost == "both":  # nobody could score: the same step again, in full, to everyone
        assert set(kinds.values()) == {ParticlesRequest} and all(m.step == 0 for m in nxt.requests.values())
    else:
        assert kinds == {"a": ParticlesRequest if lost == "a" else ParticlesDelta, "b": ParticlesDelta}
        assert all(m.step == 1 for m in nxt.requests.values())


def test_a_failed_exchange_costs_a_site_one_step_not_the_round(monkeypatch):
    from labfbo.protocols.gradient.protocol import GradientSite

    log: list[tuple[int, int, int, str]] = []
    answer = GradientSite.answer
    failed = []

    def flaky(self, request, data, round):
        if (self.context.site_index == 1 and isinstance(request, ParticlesDelta) and request.step == 3
                and not failed):
            failed.append(round)
            raise RuntimeError("instrument PC rebooted")
        out = answer(self, request, data, round)
        if isinstance(request, (ParticlesDelta, ParticlesRequest)):
            log.append((self.context.site_index, round, request.step, getattr(out, "reason", out.kind)))
        return out

    import labfbo.apps.simulation as simulation

    build = simulation._coordinator

    def with_quorum(*args, **kwargs):  # a round goes on without the failed site
        coordinator = build(*args, **kwargs)
        coordinator.quorum = 2
        return coordinator

    monkeypatch.setattr(GradientSite, "answer", flaky)
    monkeypatch.setattr(simulation, "_coordinator", with_quorum)
    labfbo.simulate("branin", "gradient", wire="compact", **{**FAST, "budget": 2})
    mine = [(t, step, what) for i, t, step, what in log if i == 1 and t == failed[0]]
    assert [what for _, _, what in mine].count(MISSED) == 1  # one abstention, then back in
    assert mine[-1][2] == "score" and len([1 for _, _, w in mine if w == "score"]) >= len(mine) - 1


def test_compact_wire_refuses_secure_aggregation():
    with pytest.raises(ValueError, match="secure_aggregation"):
        GradientOptions(wire="compact", secure_aggregation=True)
