"""Task-level DP (paper Section VI): clipping, Gaussian noise, and (epsilon, delta) accounting."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pydantic
import pytest

import labfbo
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.seeding import rng as stream
from labfbo.privacy import DP, PrivacyLedger, clip_rows, gaussian_epsilon, privatize

pytest.importorskip("dp_accounting")


# ----------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("sigma,T,pld,rdp", [
    (1.0, 1, 4.3772, 4.7285),
    (1.0, 10, 17.8566, 19.0536),
    (2.0, 50, 20.6755, 22.0199),
    (5.0, 100, 9.9973, 10.7255),
])
def test_gaussian_epsilon_regression(sigma: float, T: int, pld: float, rdp: float) -> None:
    assert gaussian_epsilon(sigma, T, 1e-5) == pytest.approx(pld, abs=1e-3)
    assert gaussian_epsilon(sigma, T, 1e-5, accountant="pld") == pytest.approx(pld, abs=1e-3)
    assert gaussian_epsilon(sigma, T, 1e-5, accountant="rdp") == pytest.approx(rdp, abs=1e-3)
    assert pld < rdp  # PLD is the tighter accountant


def test_gaussian_epsilon_edge_cases() -> None:
    assert gaussian_epsilon(1.0, 0, 1e-5) == 0.0
    assert gaussian_epsilon(0.0, 0, 1e-5) == 0.0
    assert gaussian_epsilon(0.0, 1, 1e-5) == math.inf
    assert gaussian_epsilon(0.0, 5, 1e-5, accountant="rdp") == math.inf
    with pytest.raises(labfbo.ValidationError, match="accountant"):
        gaussian_epsilon(1.0, 1, 1e-5, accountant="moments")
    with pytest.raises(labfbo.ValidationError, match="compositions"):
        gaussian_epsilon(1.0, -1, 1e-5)
    with pytest.raises(labfbo.ValidationError, match="noise_multiplier"):
        gaussian_epsilon(-1.0, 1, 1e-5)
    with pytest.raises(labfbo.ValidationError, match="delta"):
        gaussian_epsilon(1.0, 1, 1.0)


def test_pld_is_fast_for_2000_compositions() -> None:
    sigma_eff = 8.0 / math.sqrt(10)  # the paper's sigma = 8 with K = 10 particles
    t = time.perf_counter()
    eps = gaussian_epsilon(sigma_eff + 1e-9, 2000, 1e-5)  # + 1e-9: bypass the cache
    assert time.perf_counter() - t < 1.0
    assert math.isfinite(eps) and eps > 0


# ----------------------------------------------------------------------------- mechanism
def test_clip_rows_bounds_norms_and_keeps_short_rows() -> None:
    g = stream(0, 0, 0, "test-dp").normal(size=(50, 7)) * np.linspace(0.01, 10, 50)[:, None]
    g[3] = 0.0
    before = g.copy()
    out = clip_rows(g, 1.5)
    norms = np.linalg.norm(g, axis=1)
    assert np.all(np.linalg.norm(out, axis=1) <= 1.5 * (1 + 1e-12))
    short = norms <= 1.5
    assert short.any() and (~short).any()
    np.testing.assert_array_equal(out[short], g[short])
    np.testing.assert_allclose(np.linalg.norm(out[~short], axis=1), 1.5, rtol=1e-12)
    # long rows keep their direction
    np.testing.assert_allclose(out[~short] * norms[~short, None] / 1.5, g[~short], rtol=1e-10)
    np.testing.assert_array_equal(g, before)  # input untouched


def test_clip_rows_rejects_bad_input() -> None:
    with pytest.raises(labfbo.ValidationError, match="shape"):
        clip_rows(np.ones(3), 1.0)
    with pytest.raises(labfbo.ValidationError, match="NaN"):
        clip_rows(np.array([[1.0, np.nan]]), 1.0)
    with pytest.raises(labfbo.ValidationError, match="clip"):
        clip_rows(np.ones((2, 2)), 0.0)


def test_privatize_without_noise_is_clipping() -> None:
    g = stream(0, 0, 0, "test-dp").normal(size=(10, 20)) * 3
    out = privatize(g, DP(clip=0.7, noise_multiplier=0.0), np.random.default_rng(1))
    np.testing.assert_array_equal(out, clip_rows(g, 0.7))


def test_privatize_noise_std_is_sigma_times_2c() -> None:
    dp = DP(clip=0.5, noise_multiplier=3.0)
    g = stream(0, 0, 0, "test-dp").normal(size=(10, 400)) * 5
    clipped = clip_rows(g, dp.clip)
    r = stream(7, 1, 2, "dp-noise")
    noise = np.stack([privatize(g, dp, r) - clipped for _ in range(50)])  # 200,000 draws
    assert dp.noise_std == pytest.approx(3.0 * 2 * 0.5)
    assert abs(noise.mean()) < 4 * dp.noise_std / math.sqrt(noise.size)
    # sample std of n normals has relative s.e. ~ 1/sqrt(2n) ~ 0.0016: allow 1%
    assert noise.std() == pytest.approx(dp.noise_std, rel=0.01)
    # independent per particle: rows uncorrelated
    corr = np.corrcoef(noise[:, 0, :].ravel(), noise[:, 1, :].ravel())[0, 1]
    assert abs(corr) < 0.02
    # the same stream gives the same draws
    assert np.array_equal(privatize(g, dp, stream(7, 1, 2, "dp-noise")),
                          privatize(g, dp, stream(7, 1, 2, "dp-noise")))


# ----------------------------------------------------------------------------- DP settings
def test_dp_defaults_and_keywords() -> None:
    dp = DP(clip=1.0, noise_multiplier=8.0)
    assert (dp.clip, dp.noise_multiplier, dp.delta) == (1.0, 8.0, 1e-5)
    assert DP(2.0, 4.0, 1e-6) == DP(clip=2.0, noise_multiplier=4.0, delta=1e-6)
    assert DP() == DP(clip=1.0, noise_multiplier=1.0, delta=1e-5)
    assert DP.model_validate(dp.model_dump()) == dp
    with pytest.raises(pydantic.ValidationError):
        dp.clip = 2.0  # frozen


@pytest.mark.parametrize("kw,msg", [
    ({"clip": 0.0}, "clip"), ({"clip": -1.0}, "clip"), ({"clip": math.inf}, "clip"),
    ({"noise_multiplier": -0.1}, "noise_multiplier"), ({"noise_multiplier": math.nan}, "noise_multiplier"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"), ({"delta": 1.5}, "delta"),
    ({"epsilon": -1.0}, "epsilon"), ({"epsilon": math.inf}, "epsilon"), ({"budget": 1.0}, "budget"),
])
def test_dp_validation(kw: dict, msg: str) -> None:
    with pytest.raises(ConfigurationError, match=f"DP settings: .*{msg}"):  # a labfbo error, naming the setting
        DP(**kw)


# ----------------------------------------------------------------------------- ledger
def test_ledger_epsilon_grows_and_matches_gaussian_epsilon() -> None:
    dp, K = DP(clip=1.0, noise_multiplier=8.0), 10
    ledger = PrivacyLedger(dp, n_particles=K)
    assert ledger.epsilon() == 0.0 and ledger.report() == []
    eps = []
    for r in range(6):
        ledger.record(r, steps=20)
        eps.append(ledger.epsilon())
    assert all(b > a for a, b in zip(eps, eps[1:]))
    assert ledger.epsilon() == pytest.approx(gaussian_epsilon(8.0 / math.sqrt(K), 120, 1e-5), abs=1e-12)
    rows = ledger.report()
    assert [row["round"] for row in rows] == list(range(6))
    assert [row["steps_total"] for row in rows] == [20 * (r + 1) for r in range(6)]
    assert [row["releases"] for row in rows] == [20 * K * (r + 1) for r in range(6)]
    assert [row["epsilon"] for row in rows] == eps
    json.dumps(rows)  # a journal can store the report as is


def test_ledger_same_round_accumulates_and_any_order_composes() -> None:
    ledger = PrivacyLedger(DP(noise_multiplier=2.0), n_particles=4)
    ledger.record(0)
    ledger.record(0, steps=2)
    ledger.record(3, steps=1)
    assert [(e.round, e.steps) for e in ledger.entries] == [(0, 3), (3, 1)]
    ledger.record(1)  # e.g. a new coordinator restarted the round count: still composed
    assert [(e.round, e.steps) for e in ledger.entries] == [(0, 3), (3, 1), (1, 1)]
    with pytest.raises(labfbo.ValidationError, match="steps"):
        ledger.record(4, steps=-1)
    assert ledger.total_steps == 5  # refused calls changed nothing
    with pytest.raises(labfbo.ValidationError, match="n_particles"):
        PrivacyLedger(DP(), n_particles=0)


def test_ledger_without_noise_reports_infinite_epsilon() -> None:
    ledger = PrivacyLedger(DP(noise_multiplier=0.0), n_particles=5)
    assert ledger.epsilon() == 0.0
    ledger.record(0, steps=0)
    assert ledger.epsilon() == 0.0
    ledger.record(1)
    assert ledger.epsilon() == math.inf


def test_ledger_json_round_trip() -> None:
    ledger = PrivacyLedger(DP(clip=0.5, noise_multiplier=4.0, delta=1e-6), n_particles=3)
    for r in range(4):
        ledger.record(r, steps=5)
    back = PrivacyLedger.from_json(ledger.to_json())
    assert back.dp == ledger.dp and back.n_particles == 3
    assert back.report() == ledger.report()
    assert PrivacyLedger.from_json(ledger.to_dict()).epsilon() == ledger.epsilon()
    with pytest.raises(labfbo.ValidationError, match="privacy ledger"):
        PrivacyLedger.from_json('{"v": 1, "dp": {"clip": -1}}')


def test_a_tiny_noise_multiplier_is_accounted_by_rdp_in_bounded_memory() -> None:
    """A site (or a hostile answer) stating sigma = 0.001 must not make the coordinator's PLD
    accountant allocate gigabytes: below PLD_MIN_SIGMA the looser RDP bound is used."""
    import resource

    from labfbo.privacy.dp import PLD_MIN_SIGMA, composed_epsilon, gaussian_epsilon

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tiny = gaussian_epsilon(0.001, 100, 1e-5)
    assert math.isfinite(tiny) and tiny > gaussian_epsilon(PLD_MIN_SIGMA, 100, 1e-5) > 0
    assert tiny == gaussian_epsilon(0.001, 100, 1e-5, accountant="rdp")
    mixed = composed_epsilon({0.001: 3, 2.0: 10}, 1e-5)
    assert mixed >= gaussian_epsilon(0.001, 3, 1e-5, accountant="rdp")
    with_vote = composed_epsilon({0.001: 3, (4, 2.0): 1}, 1e-5)
    assert math.isfinite(with_vote) and with_vote > gaussian_epsilon(0.001, 3, 5e-6, accountant="rdp")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # kB: no PLD of sigma 0.001
    # at and above the floor the tight PLD accountant is used as before
    assert gaussian_epsilon(PLD_MIN_SIGMA, 100, 1e-5) < gaussian_epsilon(PLD_MIN_SIGMA, 100, 1e-5, accountant="rdp")
