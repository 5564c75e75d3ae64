"""DP on the distribution uplink, and the per-site privacy report of every protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest
from campaign import run_campaign

import labfbo
from labfbo.privacy import gaussian_epsilon
from labfbo.privacy.belief_dp import SD_MAX, SD_MIN, from_unit, privatize_belief, sensitivity, to_unit
from labfbo.protocols.distribution.protocol import OptimumBelief

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1), labfbo.Real("z", -1, 1)])
SITES = ["s0", "s1", "s2"]
DIST = {"num_restarts": 2, "raw_samples": 32, "M": 64, "candidates": 128}
GRAD = {"num_restarts": 2, "raw_samples": 32, "n_particles": 4, "hidden": (8, 8), "warmup_steps": 3, "svgd_steps": 2}


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.1 * i) ** 2 + (p["y"] + 0.2) ** 2 + 0.5 * p["z"] ** 2


def _run(protocol: str, rounds: int, opts: dict, storage=None):
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=0, horizon=5, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol=protocol, coordinator=coord, site=s, seed=0, n_init=4, secret=7 + i,
                              storage=None if storage is None else str(storage / s), **opts)
             for i, s in enumerate(SITES)]
    run_campaign(sites, _f, 4, rounds)
    return sites


def test_belief_mechanism_clips_to_the_cube_and_inverts() -> None:
    mean, var = np.array([0.2, 0.7, 1.3]), np.array([1e-6, 0.04, 4.0])
    z = to_unit(0.4, mean, var, value=7.0, clip=3.0)
    assert z.shape == (8,) and z.min() >= 0 and z.max() <= 1 and z[-1] == 1.0  # v clipped to C
    w, m, v, val = from_unit(z, clip=3.0)
    np.testing.assert_allclose(m, [0.2, 0.7, 1.0])
    np.testing.assert_allclose(np.sqrt(v), [SD_MIN, 0.2, SD_MAX])
    assert (w, val) == (0.4, 3.0) and sensitivity(3) == math.sqrt(8)
    dp = labfbo.DP(clip=3.0, noise_multiplier=1.0)
    noisy = [privatize_belief(0.4, mean, var, 0.5, dp, np.random.default_rng(s)) for s in range(200)]
    means = np.array([n[1] for n in noisy])
    assert means.min() >= 0 and means.max() <= 1 and means.std() > 0.3  # noise std sqrt(8) before clipping


@pytest.mark.integration  # a multi-site campaign
def test_dp_on_the_distribution_uplink_is_noised_and_accounted(tmp_path) -> None:
    dp = labfbo.DP(clip=3.0, noise_multiplier=2.0, delta=1e-5)
    plain = _run("distribution", 2, DIST)
    noisy = _run("distribution", 2, {**DIST, "privacy": dp}, storage=tmp_path)
    ups = [m for m in noisy[0].sent_messages() if isinstance(m, OptimumBelief)]
    plain_ups = [m for m in plain[0].sent_messages() if isinstance(m, OptimumBelief)]
    assert len(ups) == 2 and all(m.dp_noise_multiplier == 2.0 and m.dp_clip == 3.0 for m in ups)
    assert not np.allclose(ups[0].mean.numpy(), plain_ups[0].mean.numpy())
    assert noisy[0].epsilon() == pytest.approx(gaussian_epsilon(2.0, 2, 1e-5), rel=1e-9)
    rows = noisy[0].privacy_report()
    assert [r["message"] for r in rows] == ["optimum_belief"] * 2
    assert rows[0]["sensitivity"] == math.sqrt(8) and rows[0]["noise_std"] == 2.0 * math.sqrt(8)
    assert rows[-1]["epsilon"] == pytest.approx(noisy[0].epsilon()) and not rows[0]["secure_aggregation"]
    for o in noisy:
        o.close()
    again = labfbo.Optimizer(SPACE, protocol="distribution", site="s0", seed=0, n_init=4,
                             storage=str(tmp_path / "s0"), coordinator=labfbo.Coordinator("distribution", sites=SITES,
                                                                                          seed=0, **DIST, privacy=dp),
                             **DIST, privacy=dp)
    assert again.privacy_report() == rows  # journaled: the report survives a restart
    again.close()


def test_the_report_lists_every_release_and_says_when_there_is_no_guarantee() -> None:
    plain = _run("gradient", 1, GRAD)[0].privacy_report()
    assert len(plain) == GRAD["warmup_steps"] and all(r["mechanism"].startswith("none") for r in plain)
    assert all(r["epsilon"] == math.inf and r["message"] == "score" for r in plain)
    dp = labfbo.DP(clip=1.0, noise_multiplier=4.0)
    rows = _run("gradient", 1, {**GRAD, "privacy": dp, "secure_aggregation": True})[0].privacy_report()
    assert [r["message"] for r in rows] == ["masked_score"] * GRAD["warmup_steps"]
    assert all(r["secure_aggregation"] for r in rows)
    assert rows[0]["sensitivity"] == pytest.approx(2.0 * math.sqrt(GRAD["n_particles"]))
    assert rows[-1]["epsilon"] == pytest.approx(gaussian_epsilon(4.0 / 2.0, GRAD["warmup_steps"], 1e-5))
    assert "task level" in rows[0]["neighbouring"]
    assert _run("consensus", 1, {"num_restarts": 2, "raw_samples": 32})[0].privacy_report()[0]["epsilon"] == math.inf


def test_load_refuses_other_dp_settings(tmp_path) -> None:
    dp = labfbo.DP(clip=3.0, noise_multiplier=2.0)
    sites = _run("distribution", 1, {**DIST, "privacy": dp})
    sites[0].save(str(tmp_path / "snap"))
    coord = labfbo.Coordinator("distribution", sites=SITES, seed=0, **DIST)
    with pytest.raises(labfbo.core.exceptions.JournalError, match="made with privacy="):
        labfbo.Optimizer.load(
            str(tmp_path / "snap"), coordinator=coord, privacy=labfbo.DP(clip=3.0, noise_multiplier=50.0)
        )
    again = labfbo.Optimizer.load(str(tmp_path / "snap"), coordinator=coord)
    assert again.epsilon() == pytest.approx(sites[0].epsilon()) and again.privacy_report() == sites[0].privacy_report()
