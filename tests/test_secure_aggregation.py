"""Secure aggregation for `gradient`: masks cancel, a single upload is noise, results equal the plain run's;
large cohorts mask over a sparse graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from campaign import run_campaign
from scipy import stats

import labfbo
from labfbo.privacy import secagg
from labfbo.protocols.gradient.protocol import ScoreResponse, meta_step, secure_meta_step
from labfbo.protocols.secure_sum import MaskedScores

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


def _seeds(names: str) -> dict[str, bytes]:
    return {s: bytes([i + 1]) * 32 for i, s in enumerate(names)}


def test_masks_cancel_to_fixed_point_precision_and_a_single_upload_is_uniform() -> None:
    keys = _seeds("abc")
    cohort = {s: secagg.public_key(k) for s, k in keys.items()}
    info = secagg.context("study", 2, 0, list(cohort), b"particles")
    x = {s: np.random.default_rng(i).normal(scale=50.0, size=4000) for i, s in enumerate(keys)}
    y = {s: secagg.mask(secagg.encode(x[s], 3), s, keys[s], cohort, info) for s in keys}
    seeds = [secagg.self_mask_seed(keys[s], info) for s in keys]
    total = secagg.decode(secagg.aggregate(list(y.values()), seeds))
    assert np.max(np.abs(total - sum(x.values()))) <= 3 * 2.0 ** -33 + 1e-12
    # one site's masked vector: its bytes are uniform and it says nothing about the site's values
    counts = np.bincount(y["a"].view(np.uint8), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert abs(np.corrcoef(secagg.decode(y["a"]), x["a"])[0, 1]) < 0.1
    assert secagg.decode(secagg.aggregate([y["a"], y["b"]], seeds[:2])).std() > 1e8  # a partial sum is noise
    assert secagg.decode(secagg.aggregate(list(y.values()), [])).std() > 1e8  # so is the sum before unmasking
    # other context (round, cohort, particles): other masks
    for other in (secagg.context("study", 3, 0, list(cohort), b"particles"),
                  secagg.context("study", 2, 0, list(cohort), b"other particles")):
        assert not np.array_equal(y["a"], secagg.mask(secagg.encode(x["a"], 3), "a", keys["a"], cohort, other))
    with pytest.raises(labfbo.core.exceptions.ProtocolError, match="too large"):
        secagg.encode(np.array([1e9]), 3)


def test_a_large_cohort_masks_over_a_sparse_connected_graph_and_still_sums_exactly() -> None:
    """Beyond 17 members each masks with O(log n) neighbours on a ring fresh per release: symmetric and
    connected, so the masks cancel and no strict subset of uploads sums to anything but noise."""
    names = [f"lab{i:03d}" for i in range(60)]
    keys = {s: bytes([i + 1]) * 32 for i, s in enumerate(names)}
    cohort = {s: secagg.public_key(k) for s, k in keys.items()}
    info = secagg.context("study", 2, 0, names, b"")
    graph = {s: set(secagg.peers(s, cohort, info)) for s in names}
    assert {len(p) for p in graph.values()} == {secagg.mask_degree(60)} == {16}
    assert all(a in graph[b] for a in graph for b in graph[a])  # each mask once with each sign
    reached, todo = {names[0]}, [names[0]]
    while todo:  # connected: the only subset whose masks cancel is the whole cohort
        for p in graph[todo.pop()] - reached:
            reached.add(p)
            todo.append(p)
    assert reached == set(names)
    other = secagg.context("study", 3, 0, names, b"")
    assert any(set(secagg.peers(s, cohort, other)) != graph[s] for s in names)  # new neighbours each release
    assert secagg.peers("lab000", names[:17], info) == names[1:17]  # a small cohort: every other member
    x = {s: np.random.default_rng(i).normal(size=64) for i, s in enumerate(names)}
    y = {s: secagg.mask(secagg.encode(x[s], 60), s, keys[s], cohort, info, self_mask=False) for s in names}
    total = secagg.decode(secagg.aggregate(list(y.values()), []))
    assert np.max(np.abs(total - sum(x.values()))) <= 60 * 2.0 ** -33 + 1e-12
    assert secagg.decode(secagg.aggregate([y[s] for s in names[:59]], [])).std() > 1e8
    counts = np.bincount(y["lab007"].view(np.uint8), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_a_late_upload_of_a_dropped_site_stays_hidden() -> None:
    """Cohort abcd; d's upload comes too late, so the step is redone with abc. The coordinator then
    holds all four first uploads and the unmasked sum of abc: their difference is not x_d."""
    keys = _seeds("abcd")
    pub = {s: secagg.public_key(k) for s, k in keys.items()}
    x = {s: np.random.default_rng(i).normal(size=500) for i, s in enumerate(keys)}
    first = secagg.context("st", 0, 0, list(pub), b"p")
    ups = [secagg.mask(secagg.encode(x[s], 4), s, keys[s], pub, first) for s in keys]
    abc = {s: pub[s] for s in "abc"}
    redo = secagg.context("st", 0, 0, list(abc), b"p")
    ups2 = [secagg.mask(secagg.encode(x[s], 3), s, keys[s], abc, redo) for s in abc]
    sum_abc = secagg.aggregate(ups2, [secagg.self_mask_seed(keys[s], redo) for s in abc])
    np.testing.assert_allclose(secagg.decode(sum_abc), x["a"] + x["b"] + x["c"], atol=1e-8)
    with np.errstate(over="ignore"):
        guess = secagg.decode(secagg.aggregate(ups, []) - sum_abc)  # the first attempt was never unmasked
    assert abs(np.corrcoef(guess, x["d"])[0, 1]) < 0.2 and np.abs(guess).std() > 1e8


def test_a_secure_meta_update_equals_the_plain_one_to_fixed_point_precision() -> None:
    coord, _, _ = _run(1)
    agg, gen = coord.aggregator(), np.random.default_rng(0)
    theta = agg.particles
    scores = [torch.as_tensor(gen.normal(scale=s, size=tuple(theta.shape))) for s in (0.1, 10.0, 300.0)]
    n_obs = [5, 7, 9]
    assert agg.adam is not None                     # mid-campaign: the meta-optimizer has moments
    plain, plain_adam = meta_step(theta, scores, n_obs, agg.cfg, agg.adam)
    uploads = [secagg.encode(np.concatenate([a.numpy().ravel(), [1 / n, 1.0]]), 3) for a, n in zip(scores, n_obs)]
    secure, secure_adam = secure_meta_step(theta, secagg.decode(secagg.aggregate(uploads, [])), agg.cfg, agg.adam)
    assert torch.linalg.norm(secure - plain) / torch.linalg.norm(plain - theta) <= 1e-9
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.linalg.norm(secure_adam[key] - plain_adam[key]) <= 1e-9 * torch.linalg.norm(plain_adam[key])


@pytest.mark.integration  # a multi-site campaign
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
    assert kinds[:4] == ["join", "secagg_public_key", "masked_score", "secagg_self_mask"] and "score" not in kinds
    assert kinds.count("secagg_public_key") == 1  # keys are exchanged once
    up = [m for m in sa[0].sent_messages() if isinstance(m, MaskedScores)][0]
    plain_up = [m for m in plain[0].sent_messages() if isinstance(m, ScoreResponse)][0]
    assert up.masked.dtype == "uint64" and up.masked.shape == (plain_up.scores.n_scalars + 2,)


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
    with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="at least 3 sites"):
        labfbo.Coordinator("gradient", sites=["a", "b"], seed=0, secure_aggregation=True, **FAST)


def test_a_stale_key_is_replaced_and_the_round_goes_on() -> None:
    """The coordinator holds an old key of lab-a (say lab-a restarted from a fresh journal): lab-a sends
    its current key instead of scores, the step is redone without it, and the next round includes it."""
    coord, sites, _ = _run(1, secure_aggregation=True)
    agg = coord.aggregator()
    true_key = agg.secure.keys["lab-a"]
    agg.secure.keys["lab-a"] = secagg.public_key(b"\x07" * 32)
    before = agg.redone
    for _ in range(2):  # two more rounds
        trials = [o.ask() for o in sites]
        for i, (o, t) in enumerate(zip(sites, trials)):
            o.tell(t, _f(i, t.params))
    assert agg.secure.keys["lab-a"] == true_key and agg.redone == before + 1
    kinds = [m.kind for m in sites[0].sent_messages()]
    assert kinds.count("secagg_public_key") == 2 and kinds[-1] == "secagg_self_mask"
