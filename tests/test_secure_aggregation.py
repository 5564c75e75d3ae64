"""Secure aggregation for `gradient`: masks cancel, a single upload is noise, results equal the plain run's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import labfbo
from campaign import run_campaign
from labfbo.privacy import secagg
from labfbo.protocols.gradient import MaskedScores, ScoreResponse, meta_step, secure_meta_step

FAST = {"num_restarts": 2, "raw_samples": 32, "n_particles": 4, "hidden": (8, 8), "warmup_steps": 4, "svgd_steps": 3}
SPACE = labfbo.SearchSpace([labfbo.Real("x", -2.0, 2.0), labfbo.Real("y", 0.0, 1.0)])
SITES = ["lab-a", "lab-b", "lab-c", "lab-d"]


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.3 * i) ** 2 + np.sin(3 * p["y"] + i)


def _run(rounds: int, sites: list[str] = SITES, **opts: object):
    coord = labfbo.Coordinator("gradient", sites=sites, seed=3, horizon=5, **{**FAST, **opts})
    opts = {**FAST, **opts}
    opts.pop("quorum", None)
    opt = [labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site=s, seed=3, n_init=4, secret=11 + i,
                            **opts) for i, s in enumerate(sites)]
    return coord, opt, run_campaign(opt, _f, 4, rounds)


def test_masks_cancel_to_fixed_point_precision_and_a_single_upload_is_uniform() -> None:
    secrets = {"a": 5, "b": 6, "c": 7}
    cohort = {s: secagg.public_key(k, s) for s, k in secrets.items()}
    info = secagg.context("study", 2, 0, list(cohort))
    x = {s: np.random.default_rng(i).normal(scale=50.0, size=4000) for i, s in enumerate(secrets)}
    y = {s: secagg.mask(secagg.encode(x[s], 3), s, secrets[s], cohort, info) for s in secrets}
    total = secagg.decode(secagg.aggregate(list(y.values())))
    assert np.max(np.abs(total - sum(x.values()))) <= 3 * 2.0 ** -33 + 1e-12
    # one site's masked vector: its bytes are uniform and it says nothing about the site's values
    counts = np.bincount(y["a"].view(np.uint8), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert abs(np.corrcoef(secagg.decode(y["a"]), x["a"])[0, 1]) < 0.1
    assert secagg.decode(secagg.aggregate([y["a"], y["b"]])).std() > 1e8  # a partial sum is noise too
    # other context (round / cohort): other masks
    assert not np.array_equal(y["a"], secagg.mask(secagg.encode(x["a"], 3), "a", 5, cohort,
                                                  secagg.context("study", 3, 0, list(cohort))))
    with pytest.raises(labfbo.exceptions.ProtocolError, match="too large"):
        secagg.encode(np.array([1e9]), 3)


def test_a_secure_meta_update_equals_the_plain_one_to_fixed_point_precision() -> None:
    coord, _, _ = _run(1)
    agg, gen = coord.aggregator(), np.random.default_rng(0)
    theta = agg.particles
    scores = [torch.as_tensor(gen.normal(scale=s, size=tuple(theta.shape))) for s in (0.1, 10.0, 300.0)]
    n_obs = [5, 7, 9]
    plain = meta_step(theta, scores, n_obs, agg.cfg)
    uploads = [secagg.encode(np.concatenate([a.numpy().ravel(), [1 / n, 1.0]]), 3) for a, n in zip(scores, n_obs)]
    secure = secure_meta_step(theta, secagg.decode(secagg.aggregate(uploads)), agg.cfg)
    assert torch.linalg.norm(secure - plain) / torch.linalg.norm(plain - theta) <= 1e-9


def test_a_campaign_with_secure_aggregation_equals_the_plain_one() -> None:
    """Per step the updates agree to ~1e-10; over a campaign the acquisition optimizer's tolerance
    (not the masking) sets how closely the proposals agree."""
    plain_coord, plain, prop_plain = _run(3)
    sa_coord, sa, prop_sa = _run(3, secure_aggregation=True)
    p, q = plain_coord.aggregator().particles, sa_coord.aggregator().particles
    assert torch.linalg.norm(p - q) / torch.linalg.norm(p) <= 1e-5
    for rp, rs in zip(prop_plain, prop_sa):
        for a, b in zip(rp, rs):
            assert a == pytest.approx(b, abs=1e-4)
    kinds = [m.kind for m in sa[0].sent_messages()]
    assert kinds[:3] == ["join", "secagg_public_key", "masked_score"] and "score" not in kinds
    assert kinds.count("secagg_public_key") == 1  # keys are exchanged once
    up = [m for m in sa[0].sent_messages() if isinstance(m, MaskedScores)][0]
    plain_up = [m for m in plain[0].sent_messages() if isinstance(m, ScoreResponse)][0]
    assert up.masked.dtype == "uint64" and up.masked.shape == (plain_up.scores.n_scalars + 2,)
    assert "n_obs" not in up.model_dump()  # the count is summed too


def _declining(secure: bool) -> tuple[labfbo.Coordinator, list[int]]:
    """A 4-site federation in which lab-d declines to send its scores (after sending its key)."""
    declined: list[int] = []

    def decline(msg) -> bool:
        if isinstance(msg, (MaskedScores, ScoreResponse)):
            declined.append(msg.step)
            return False
        return True

    opts = {**FAST, "secure_aggregation": secure}
    coord = labfbo.Coordinator("gradient", sites=SITES, seed=3, horizon=5, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site=s, seed=3, n_init=4, secret=11 + i,
                              approve=decline if s == "lab-d" else None, **opts) for i, s in enumerate(SITES)]
    run_campaign(sites, _f, 4, 2)
    return coord, declined


def test_a_dropout_redoes_the_step_without_the_site() -> None:
    """lab-d's masked scores never arrive, so its masks would not cancel: each step is asked again of the
    other three, and the result is the plain protocol's with lab-d abstaining."""
    sa, declined = _declining(True)
    plain, _ = _declining(False)
    assert sa.aggregator().redone == 2 and len(declined) == 2  # the first step of each round; then lab-d is out
    p, q = sa.aggregator().particles, plain.aggregator().particles
    assert torch.linalg.norm(p - q) / torch.linalg.norm(q) <= 1e-6  # agreement as in the campaign test


def test_secure_aggregation_needs_three_sites() -> None:
    with pytest.raises(labfbo.exceptions.ConfigurationError, match="at least 3 sites"):
        labfbo.Coordinator("gradient", sites=["a", "b"], seed=0, secure_aggregation=True, **FAST)
