"""`gradient` with ``dp_noise="distributed"``: each cohort member adds a share of the DP noise, the secure sum
carries the full noise, and every release is declared and accounted exactly as in local mode."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest
import torch
from campaign import run_campaign

import labfbo
from labfbo.core.messages import Array
from labfbo.models.pacoh import site_score
from labfbo.privacy import clip_rows, distributed, privatize, secagg
from labfbo.privacy.budget import calibrate
from labfbo.protocols import get_protocol, parse_options
from labfbo.protocols.gradient.protocol import ParticlesRequest
from labfbo.protocols.secure_sum import MaskedScores, SelfMaskSeed, UnmaskRequest, digest, reveal

FAST = {"num_restarts": 2, "raw_samples": 32, "n_particles": 3, "hidden": (8, 8), "warmup_steps": 3, "svgd_steps": 2}
SPACE = labfbo.SearchSpace([labfbo.Real("x", -2.0, 2.0), labfbo.Real("y", 0.0, 1.0)])
SITES = ["lab-a", "lab-b", "lab-c", "lab-d"]
DP = labfbo.DP(clip=1.0, noise_multiplier=1.0)
DISTRIBUTED = {"secure_aggregation": True, "dp_noise": "distributed", "dp_colluders": 1}


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.3 * i) ** 2 + np.sin(3 * p["y"] + i)


def _run(rounds: int, horizon: int = 5, **opts: object):
    opts = {**FAST, "privacy": DP, **opts}
    coord = labfbo.Coordinator("gradient", sites=SITES, seed=3, horizon=horizon, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site=s, seed=3, n_init=4, secret=11 + i,
                              **opts) for i, s in enumerate(SITES)]
    return coord, sites, run_campaign(sites, _f, 4, rounds)


def test_distributed_noise_needs_secure_aggregation_and_privacy() -> None:
    grad = get_protocol("gradient")
    with pytest.raises(labfbo.ConfigurationError, match="dp_noise='distributed' needs secure_aggregation=True"):
        parse_options(grad, {"dp_noise": "distributed", "privacy": DP})
    with pytest.raises(labfbo.ConfigurationError, match=r"dp_noise='distributed' needs privacy=labfbo.DP"):
        parse_options(grad, {"dp_noise": "distributed", "secure_aggregation": True})
    with pytest.raises(labfbo.ConfigurationError, match="dp_colluders applies to dp_noise='distributed' only"):
        parse_options(grad, {"dp_colluders": 1, "privacy": DP})
    with pytest.raises(labfbo.ConfigurationError, match="dp_colluders"):
        parse_options(grad, {**DISTRIBUTED, "dp_colluders": -1, "privacy": DP})
    assert parse_options(grad, {}).dp_noise == "local"  # the default: today's behaviour
    with pytest.raises(labfbo.ConfigurationError, match="at most one honest member"):  # t >= n_sites - 1
        labfbo.Coordinator("gradient", sites=SITES, seed=0, privacy=DP, **{**FAST, **DISTRIBUTED, "dp_colluders": 3})
    coord = labfbo.Coordinator("gradient", sites=SITES, seed=0, privacy=DP, **{**FAST, **DISTRIBUTED})
    with pytest.raises(labfbo.FederationError, match="dp_noise"):  # every member must add its share
        labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site="lab-a", n_init=4, privacy=DP,
                         secure_aggregation=True, **FAST)


@pytest.mark.parametrize("n, t", [(3, 0), (4, 1), (5, 2), (3, 2)])
def test_the_honest_members_shares_sum_to_the_full_noise(n: int, t: int) -> None:
    dp = labfbo.DP(clip=0.5, noise_multiplier=1.7)
    full = dp.noise_std ** 2  # (sigma 2C)^2
    h = distributed.honest_members(n, t)
    assert h == max(n - t, 1) and distributed.share_std(dp, n, t) == pytest.approx(dp.noise_std / math.sqrt(h))
    zeros = np.zeros((20_000, 10))  # clipped rows are 0: what remains is the noise
    shares = [distributed.privatize_share(zeros, dp, np.random.default_rng(i), n, t) for i in range(n)]
    honest, total = sum(shares[:h]), sum(shares)
    assert honest.var() == pytest.approx(full, rel=0.03)  # 200k draws: relative sd ~0.3 %
    assert total.var() == pytest.approx(n / h * full, rel=0.03)
    assert shares[0].var() == pytest.approx(full / h, rel=0.03)
    # no saving possible (h = 1): the share is local mode's noise, draw for draw
    g = np.random.default_rng(9).normal(size=(3, 7))
    np.testing.assert_array_equal(distributed.privatize_share(g, dp, np.random.default_rng(1), t + 1, t),
                                  privatize(g, dp, np.random.default_rng(1)))
    np.testing.assert_array_equal(distributed.privatize_share(g, labfbo.DP(noise_multiplier=0.0),
                                                              np.random.default_rng(1), n, t), clip_rows(g, 1.0))


def test_a_redo_with_another_cohort_size_draws_independent_noise() -> None:
    """Two draws of one noise at two scales would reveal it (their difference); one scale, one draw."""
    assert distributed.share_purpose("dp-noise/0/ab", 4, 1) == distributed.share_purpose("dp-noise/0/ab", 4, 1)
    assert distributed.share_purpose("dp-noise/0/ab", 4, 1) != distributed.share_purpose("dp-noise/0/ab", 3, 1)
    assert distributed.share_purpose("dp-noise/0/ab", 3, 3) == distributed.share_purpose("dp-noise/0/ab", 2, 3)


def _secure_sum(sites: list[labfbo.Optimizer], theta: torch.Tensor, step: int) -> tuple[np.ndarray, np.ndarray]:
    """What the coordinator decodes from every site's answer to one ParticlesRequest, and the sum of the
    sites' clipped scores without noise."""
    ctx = {o.site: o.agent.logic.context for o in sites}
    cohort = {s: secagg.public_key(c.key_seed) for s, c in ctx.items()}
    particles = Array.of(theta.numpy())
    request = ParticlesRequest(step=step, particles=particles, cohort=cohort, study="st", round=7)
    uploads, clipped = [], []
    for o in sites:
        data = o.site_data()
        answer = o.agent.logic.answer(request, data, 7)
        assert isinstance(answer, MaskedScores)
        uploads.append(answer.masked.numpy())
        A = site_score(theta, o.agent.logic.features.numpy(data.X), data.y, o.agent.logic.options.pacoh()).numpy()
        clipped.append(clip_rows(A, o.agent.logic.options.privacy.clip))
    unmask = UnmaskRequest(step=step, cohort=cohort, particles_sha256=digest(particles), study="st")
    seeds = []
    for s, c in ctx.items():
        msg = reveal(unmask, s, c.key_seed, "st", 7)
        assert isinstance(msg, SelfMaskSeed)
        seeds.append(base64.b64decode(msg.seed))
    total = secagg.decode(secagg.aggregate(uploads, seeds))
    return total[:-2].reshape(theta.shape), sum(clipped)


@pytest.mark.integration  # two 4-site campaigns
def test_the_secure_sum_carries_the_full_noise_and_the_accounting_is_local_modes() -> None:
    local_coord, local, _ = _run(2, secure_aggregation=True)
    coord, sites, _ = _run(2, **DISTRIBUTED)
    # every site declares, and so accounts, what local mode does: epsilon, noise std, sensitivity, count
    for lo, di in zip(local, sites):
        a, b = lo.releases(), di.releases()
        assert len(a) == len(b) == FAST["warmup_steps"] + FAST["svgd_steps"]
        assert [(r.noise_std, r.sensitivity, r.effective_noise_multiplier) for r in a] == \
               [(r.noise_std, r.sensitivity, r.effective_noise_multiplier) for r in b]
        assert di.epsilon() == pytest.approx(lo.epsilon(), rel=1e-12) and math.isfinite(di.epsilon())
        row = di.privacy_report()[-1]
        assert row["mechanism"].startswith("distributed") and "honest-but-curious coordinator" in row["mechanism"]
        assert "at most 1 other site(s) collude" in row["mechanism"] and row["secure_aggregation"]
        assert lo.privacy_report()[-1]["mechanism"].startswith("Gaussian on K")
    # the coordinator's sum: noise variance n/(n-t) (sigma 2C)^2 per coordinate, not n (sigma 2C)^2
    full, n = DP.noise_std ** 2, len(SITES)
    theta = coord.aggregator().particles
    residual = {name: np.concatenate([np.ravel(np.subtract(*_secure_sum(opts, theta, step))) for step in range(4)])
                for name, opts in (("distributed", sites), ("local", local))}
    assert residual["distributed"].var() == pytest.approx(n / (n - 1) * full, rel=0.15)
    assert residual["local"].var() == pytest.approx(n * full, rel=0.15)
    assert abs(residual["distributed"].mean()) < 0.2


@pytest.mark.integration
def test_a_campaign_budget_calibrates_as_in_local_mode_and_holds() -> None:
    horizon = 3
    _, sites, _ = _run(horizon, horizon=horizon, privacy=labfbo.DP(epsilon=2.0, delta=1e-5), **DISTRIBUTED)
    k, planned = FAST["n_particles"], FAST["warmup_steps"] + FAST["svgd_steps"] * (horizon - 1)
    sigma = calibrate({"masked_score": 1 / math.sqrt(k)}, {"masked_score": planned}, 2.0, 1e-5)
    for o in sites:
        budget = o.privacy_budget()
        assert budget["noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
        assert budget["planned_releases"] == budget["releases"] == planned and not budget["exhausted"]
        assert o.epsilon() <= 2.0 and o.epsilon() > 1.5


@pytest.mark.integration
def test_same_seed_same_proposals() -> None:
    _, _, first = _run(2, **DISTRIBUTED)
    _, _, again = _run(2, **DISTRIBUTED)
    assert first == again


@pytest.mark.integration
def test_the_coordinator_never_unmasks_a_cohort_whose_members_stated_different_noise() -> None:
    # a study that declares only a budget (no noise of its own): the aggregator's guard ends the round
    opts = {**FAST, **DISTRIBUTED}
    coord = labfbo.Coordinator("gradient", sites=SITES, seed=0, horizon=5, **opts, privacy=labfbo.DP(epsilon=50.0))
    sites = [labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site=s, seed=0, n_init=3, secret=3 + i,
                              **{**opts, "privacy": labfbo.DP(noise_multiplier=0.1) if i == 0 else DP})
             for i, s in enumerate(SITES)]
    before = coord.aggregator().particles.clone() if coord._aggregator is not None else None
    with pytest.warns(UserWarning, match="stated different DP noise"):
        run_campaign(sites, _f, 3, 1)
    agg = coord.aggregator()
    assert not agg.trained  # no step of the sum was ever unmasked
    assert before is None or torch.equal(agg.particles, before)


def test_a_member_stating_less_noise_than_the_study_declares_is_left_out_of_the_sum() -> None:
    opts = {**FAST, **DISTRIBUTED, "privacy": DP}  # the study declares its noise: sigma = 1
    coord = labfbo.Coordinator("gradient", sites=SITES, seed=0, horizon=5, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site=s, seed=0, n_init=3, secret=3 + i,
                              **{**opts, "privacy": labfbo.DP(noise_multiplier=0.1) if i == 0 else DP})
             for i, s in enumerate(SITES)]
    with pytest.warns(UserWarning, match=f"site {SITES[0]!r} was left out: it states DP noise multiplier 0.1, less "
                                         "than the 1 the study declares"):
        run_campaign(sites, _f, 3, 1)
    assert SITES[0] in coord.rejected[0] and coord.ledger.account(SITES[0]).releases == 0  # never accounted
    # the step is redone with the members that stated the study's noise (fresh masks, shares for that cohort)
    assert coord.aggregator().trained and all(coord.ledger.account(s).releases > 0 for s in SITES[1:])
