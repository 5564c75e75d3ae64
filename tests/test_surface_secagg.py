"""Protocol `surface` over secure sums: the coordinator learns only the cohort's totals."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from campaign import run_campaign
from scipy import stats

import labfbo
from labfbo.core.messages import Array
from labfbo.privacy import secagg
from labfbo.protocols.secure_sum import MaskedScores
from labfbo.protocols.surface.messages import SealedTotals
from labfbo.protocols.surface.protocol import SurfaceStats, SurfaceTotals
from labfbo.protocols.surface.secure import as_summed, open_totals


def _opened(o) -> list[SurfaceTotals]:
    """The sums a site received, opened as it opens them."""
    logic = o.agent.logic
    return [open_totals(m, o.site, logic.context.key_seed, logic.features.p) if isinstance(m, SealedTotals) else m
            for m in o.received_messages() if isinstance(m, (SealedTotals, SurfaceTotals))]

#: a small categorical space like the Buchwald-Hartwig one (base x ligand x additive)
SPACE = labfbo.SearchSpace([labfbo.Categorical("base", ["P2Et", "BTMG", "MTBD"]),
                            labfbo.Categorical("ligand", ["XPhos", "t-BuXPhos", "t-BuBrettPhos", "AdBrettPhos"]),
                            labfbo.Categorical("additive", ["a0", "a1", "a2", "a3", "a4"])])
EFFECT = {"P2Et": 0.0, "BTMG": 0.6, "MTBD": 0.3, "XPhos": 0.0, "t-BuXPhos": 0.5, "t-BuBrettPhos": 0.9,
          "AdBrettPhos": 0.2, "a0": 0.0, "a1": -0.4, "a2": 0.3, "a3": -0.1, "a4": 0.2}
FAST = {"num_restarts": 2, "raw_samples": 32}
SITES = ["lab-a", "lab-b", "lab-c"]
KEY_KINDS = {"join", "secagg_public_key", "masked_score"}


def _f(i: int, p: dict) -> float:
    return sum(EFFECT[v] for v in p.values()) + 0.15 * i * (p["base"] == "MTBD")


def _run(sites=SITES, rounds=3, storage: Path | None = None, approve=None, **opts):
    opts = {**FAST, **opts}
    coord = labfbo.Coordinator("surface", sites=sites, space=SPACE, seed=5, horizon=rounds + 1, **opts)
    opt = [labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site=s, seed=5, n_init=3, secret=21 + i,
                            storage=None if storage is None else str(storage / f"{s}.jsonl"),
                            approve=approve.get(s) if approve else None, **opts)
           for i, s in enumerate(sites)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        props = run_campaign(opt, _f, 3, rounds)
    return coord, opt, props


def test_uploads_look_uniform_and_no_statistics_leave_in_the_clear() -> None:
    coord, sites, _ = _run()
    agg = coord.aggregator()
    assert agg.masked and agg.held_sum is not None and agg.held_sum.members == tuple(SITES)
    for o in sites:
        sent = o.sent_messages()
        assert {m.kind for m in sent} == KEY_KINDS and not any(isinstance(m, SurfaceStats) for m in sent)
        ups = [m for m in sent if isinstance(m, MaskedScores)]
        assert len(ups) == 3 and all(m.masked.dtype == "uint64" for m in ups)
        words = np.concatenate([m.masked.numpy() for m in ups])
        assert stats.chisquare(np.bincount(words.view(np.uint8), minlength=256)).pvalue > 1e-4
        assert stats.chisquare(np.bincount((words >> np.uint64(60)).astype(np.int64), minlength=16)).pvalue > 1e-4
        assert all(r.message == "masked_score" and r.secure_aggregation for r in o.releases())
        got = [m for m in o.received_messages() if isinstance(m, (SurfaceTotals, SealedTotals))]
        assert got and all(isinstance(m, SealedTotals) for m in got)  # the sum reaches a site only sealed
        assert _opened(o)[-1].members == SITES and _opened(o)[-1].sites == 3  # the cohort's sum, not a leave-one-out
    # the last upload says nothing of the vector it carries (round 2: 3 design points and 2 results)
    mine = sites[0].agent.logic._mine[2][1]
    up = [m for m in sites[0].sent_messages() if isinstance(m, MaskedScores)][-1].masked.numpy()
    assert abs(np.corrcoef(secagg.decode(up), mine)[0, 1]) < 0.3 and mine[-2:].tolist() == [5.0, 1.0]


@pytest.mark.integration  # two three-site campaigns
def test_proposals_and_surfaces_equal_the_unmasked_run() -> None:
    """Per round the others' sums agree to fixed-point precision (2^-32 per entry), so the surfaces agree
    to ~1e-10 and the categorical proposals are the same."""
    c_off, off, p_off = _run(secure_aggregation="off")
    c_on, on, p_on = _run()
    assert not c_off.aggregator().masked and c_on.aggregator().masked
    assert p_on == p_off
    for a, b in zip(on, off):
        wa, wb = a.agent.logic._weights, b.agent.logic._weights
        assert wa is not None and wb is not None
        assert np.linalg.norm(wa - wb) <= 1e-6 * np.linalg.norm(wb)
    kinds = {m.kind for m in off[0].sent_messages()}
    assert kinds == {"join", "surface_stats"}  # "off": today's clear protocol


def test_two_sites_run_unmasked_with_a_warning_the_report_repeats(tmp_path: Path) -> None:
    coord = labfbo.Coordinator("surface", sites=SITES[:2], space=SPACE, seed=0, horizon=3, **FAST)
    sites = [labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site=s, seed=0, n_init=3,
                              storage=str(tmp_path / f"{s}.jsonl"), **FAST) for s in SITES[:2]]
    with pytest.warns(UserWarning) as caught:
        run_campaign(sites, _f, 3, 2)
    said = [str(w.message) for w in caught if "secure aggregation is off in this study of 2 sites" in str(w.message)]
    assert len(said) == 2  # once per site, not once per round
    assert not coord.aggregator().masked
    assert any(isinstance(m, SurfaceStats) for m in sites[0].sent_messages())
    from labfbo.report import write_report

    page = write_report(str(tmp_path / "lab-a.jsonl"), tmp_path / "report.html").html.read_text(encoding="utf-8")
    assert (
        'id="unmasked"' in page and "this study had 2 sites" in page and "surface_stats left this site unmasked" in page
    )
    with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="at least 3 sites"):
        labfbo.Coordinator("surface", sites=SITES[:2], secure_aggregation="on")


def test_a_report_names_the_releases_secure_aggregation_hid(tmp_path: Path) -> None:
    _, sites, _ = _run(rounds=1, storage=tmp_path)
    from labfbo.report import write_report

    page = write_report(str(tmp_path / "lab-a.jsonl"), tmp_path / "report.html").html.read_text(encoding="utf-8")
    assert 'id="secure-aggregation"' in page and "hid masked_score from the coordinator" in page
    assert 'id="unmasked"' not in page


def _decline(declined: list[int]):
    def approve(msg) -> bool:
        if isinstance(msg, (MaskedScores, SurfaceStats)):
            declined.append(msg.round)
            return False
        return True
    return approve


@pytest.mark.integration  # two four-site campaigns
def test_a_member_that_drops_out_is_left_out_and_the_round_completes() -> None:
    """lab-d sends its key, then never its masked statistics: each round is asked again of the other
    three (new masks), and they propose as in the clear protocol with lab-d abstaining."""
    four = SITES + ["lab-d"]
    declined: list[int] = []
    c_on, on, p_on = _run(four, rounds=2, approve={"lab-d": _decline(declined)})
    c_off, _, p_off = _run(four, rounds=2, approve={"lab-d": _decline([])}, secure_aggregation="off")
    agg = c_on.aggregator()
    assert agg.redone == 2 and declined == [0, 1]  # each round asked again of the other three
    assert agg.held_sum.members == tuple(SITES)
    assert [p[:3] for p in p_on] == [p[:3] for p in p_off]
    assert _opened(on[3])[-1].members == SITES  # lab-d, not in the cohort, opens the others' sum and uses it as it is


def test_a_cohort_below_three_ends_the_round_without_a_sum_and_nothing_in_the_clear() -> None:
    declined: list[int] = []
    coord, sites, _ = _run(rounds=1, approve={"lab-c": _decline(declined)})
    agg = coord.aggregator()
    assert agg.held_sum is None and declined and agg.redone >= 1
    for o in sites:
        assert not any(isinstance(m, (SurfaceStats, SurfaceTotals, SealedTotals))
                       for m in o.sent_messages() + o.received_messages())
        assert o.agent.logic._weights is None  # each proposed from its own GP


@pytest.mark.integration  # three journaled campaigns
def test_a_restarted_site_recomputes_its_upload_and_proposes_the_same(tmp_path: Path) -> None:
    _, _, straight = _run(rounds=3)
    coord, sites, first = _run(rounds=1, storage=tmp_path)
    sites[0].close()
    again = labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="lab-a", seed=5, n_init=3, secret=21,
                             storage=str(tmp_path / "lab-a.jsonl"), **FAST)
    sites = [again, *sites[1:]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rest = []
        for _ in range(2):
            trials = [o.ask() for o in sites]
            rest.append([t.params for t in trials])
            for i, (o, t) in enumerate(zip(sites, trials)):
                o.tell(t, _f(i, t.params))
    assert first + rest == straight
    # the upload a site keeps in memory is what it recomputes from the round's data and private stream
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for o in sites:
            o.ask()  # round 3: the data now is the round's
    logic, data = again.agent.logic, again.site_data()
    total = _opened(again)[-1]
    kept = logic.others(total, data, total.summed_round)
    logic._mine.clear()
    recomputed = logic.others(total, data, total.summed_round)
    assert kept.gram.numpy().tobytes() == recomputed.gram.numpy().tobytes()
    assert kept.sites == 2 and kept.count == 2 * data.n
    with pytest.warns(UserWarning, match="holds no record of its upload"):  # a sum of an earlier round: no data
        assert logic.others(total, data, total.summed_round + 1) is None


@pytest.mark.integration  # a three-site campaign under DP
def test_dp_over_secure_sums_adds_shares_declared_as_distributed_and_accounted() -> None:
    dp = labfbo.DP(clip=2.0, noise_multiplier=1.0)
    coord, sites, _ = _run(rounds=2, privacy=dp)
    logic, data = sites[0].agent.logic, sites[0].site_data()
    for o in sites:
        rel = o.releases()
        assert rel and all(r.message == "masked_score" and r.secure_aggregation for r in rel)
        assert all("distributed Gaussian" in r.mechanism and r.effective_noise_multiplier == pytest.approx(1.0)
                   for r in rel)
        eps = o.epsilon()
        assert eps is not None and 0 < eps < float("inf")
        assert not any(isinstance(m, SurfaceStats) for m in o.sent_messages())
    # a member's share has std sigma Delta / sqrt(3): a third of the variance local mode adds
    clean = logic.contribution(data, 99, 3)[0]
    from labfbo.protocols.surface.model import dp_sensitivity, site_statistics

    gram, moment = site_statistics(logic.features.of_unit(data.X), data.y, dp.clip)
    noise = clean[:-2] - np.concatenate([gram, moment])
    delta = dp_sensitivity(logic.features.norm_bound, dp.clip)
    assert 0.4 < noise.std() / delta < 0.75
    # a budget plans the masked releases as it planned the clear ones
    budget = _run(rounds=2, privacy=labfbo.DP(epsilon=2.0))[1][0].privacy_budget()
    assert (budget["planned_releases"], budget["releases"], budget["exhausted"]) == (3, 2, False)  # horizon 3, 2 rounds


def test_a_cohort_stating_different_dp_noise_is_not_unmasked() -> None:
    from labfbo.protocols.surface.protocol import SurfaceAggregator, SurfaceOptions

    agg = SurfaceAggregator(SurfaceOptions(), SITES, 0, None, SPACE)
    keys = {s: secagg.public_key(bytes([i + 1]) * 32) for i, s in enumerate(SITES)}
    agg.secure.keys = dict(keys)
    first = agg.open_round(0)
    assert set(first.requests) == set(SITES) and first.requests["lab-a"].cohort == keys
    ups = {s: MaskedScores(step=0, masked=Array.of(np.zeros(4), dtype="uint64"), dp_clip=1.0,
                           dp_noise_multiplier=1.0 + (s == "lab-c")) for s in SITES}
    with pytest.warns(UserWarning, match="different DP noise"):
        done = agg.on_responses(0, ups)
    assert done.replies == {} and agg.held_sum is None


def test_the_coordinator_holds_only_a_masked_sum_that_the_members_open() -> None:
    """By default (sum_seen_by="members") the sum stays behind the leader's group mask, whose key
    only the sites get (sealed): what the coordinator holds of the sum is uniform words, and each
    member opens the exact sum of the members' uploads (the same bits as a sum the coordinator
    unmasks) — in one exchange a round instead of two."""
    coord, sites, props = _run(rounds=2)
    held = coord.aggregator().held_sum
    ups = [m for m in sites[0].sent_messages() if isinstance(m, MaskedScores)]
    assert all(set(m.sealed) == {"lab-b", "lab-c"} for m in ups)  # lab-a leads: its key sealed for the others
    assert all(m.sealed is None for o in sites[1:] for m in o.sent_messages() if isinstance(m, MaskedScores))
    assert held.sealed is not None and held.total.dtype == np.uint64
    truth = sum(as_summed(o.agent.logic._mine[1][1], 3) for o in sites)  # round 1's uploads, as they entered the sum
    assert abs(np.corrcoef(secagg.decode(held.total), truth)[0, 1]) < 0.3  # decoded, the coordinator's sum says nothing
    assert stats.chisquare(np.bincount(held.total.view(np.uint8), minlength=256)).pvalue > 1e-4
    for o in sites:
        assert not any(m.kind == "secagg_self_mask" for m in o.sent_messages())
        opened = _opened(o)[-1]
        assert opened.summed_round == 1 and opened.count == int(truth[-2]) and opened.sites == 3
        assert np.array_equal(opened.gram.numpy(), truth[:opened.gram.numpy().size])
    c_vis, vis, p_vis = _run(rounds=2, sum_seen_by="coordinator")
    assert c_vis.aggregator().held_sum.sealed is None and p_vis == props  # the same proposals either way
    assert any(m.kind == "secagg_self_mask" for m in vis[0].sent_messages())
    unmask = [[m for m in o.received_messages() if m.kind == "secagg_unmask_request"] for o in (sites[0], vis[0])]
    assert not unmask[0] and len(unmask[1]) == 2  # one exchange a round instead of two


def test_a_key_that_does_not_open_or_a_sum_out_of_range_leaves_the_site_on_its_own_gp() -> None:
    coord, sites, _ = _run(rounds=1)
    o = sites[1]  # lab-b: lab-a leads
    logic = o.agent.logic
    msg = [m for m in o.received_messages() if isinstance(m, SealedTotals)][-1]
    theirs = [m for m in sites[2].received_messages() if isinstance(m, SealedTotals)][-1]
    forged = msg.model_copy(update={"sealed": theirs.sealed})  # lab-c's copy of the key
    with pytest.raises(labfbo.core.exceptions.ProtocolError, match="does not open"):
        open_totals(forged, o.site, logic.context.key_seed, logic.features.p)
    with pytest.raises(labfbo.core.exceptions.ProtocolError, match="no group key sealed by 'lab-a'"):
        open_totals(msg.model_copy(update={"sealed": {}}), o.site, logic.context.key_seed, logic.features.p)
    # a member that adds a huge vector spoils the sum: each member refuses it (nobody can be named)
    spoiled = msg.masked.numpy() + secagg.encode(
        np.full(msg.masked.numpy().size, 1e3) * (np.arange(msg.masked.numpy().size) < logic.features.p), 3
    )
    bad = msg.model_copy(update={"masked": Array.of(spoiled, dtype="uint64")})
    with pytest.raises(labfbo.core.exceptions.ProtocolError, match="outside what"):
        open_totals(bad, o.site, logic.context.key_seed, logic.features.p)
    with pytest.warns(UserWarning, match="outside what .* own GP"):
        o.agent.logic.propose(o.site_data(), bad, 1, 1)
    assert logic._weights is None


def test_a_site_whose_sums_only_the_members_open_never_reveals_a_seed_and_the_leader_seals_for_all() -> None:
    from labfbo.protocols.secure_sum import SelfMaskSeed, UnmaskRequest, open_sum, reveal, upload_sealed

    seeds = {s: bytes([i + 1]) * 32 for i, s in enumerate([*SITES, "lab-d"])}
    keys = {s: secagg.public_key(k) for s, k in seeds.items()}
    cohort = {s: keys[s] for s in SITES}
    req = UnmaskRequest(step=0, cohort=cohort, particles_sha256="0" * 64)
    assert isinstance(reveal(req, "lab-a", seeds["lab-a"], "s", 0), SelfMaskSeed)
    refused = reveal(req, "lab-a", seeds["lab-a"], "s", 0, members_only=True)
    assert refused.kind == "abstain" and "never by the coordinator" in refused.reason
    values = {s: np.array([0.5 * i, -1.25, 3.0, 1.0]) for i, s in enumerate(SITES)}
    ups = {s: upload_sealed(values[s], s, seeds[s], cohort, {"lab-d": keys["lab-d"]}, "s", 4, 0, "c" * 64)
           for s in SITES}
    assert set(ups["lab-a"][1]) == {"lab-b", "lab-c", "lab-d"} and ups["lab-b"][1] is None
    masked = secagg.aggregate([ups[s][0].numpy() for s in SITES], [])
    want = sum(values.values())
    for s in [*SITES, "lab-d"]:  # every member, and a site with a key outside the cohort
        got = open_sum(masked, {} if s == "lab-a" else {"lab-a": ups["lab-a"][1][s]}, s, seeds[s], list(cohort),
                       cohort["lab-a"], "s", 4, 0, "c" * 64)
        assert np.allclose(got, [*want[:-1], 3.0])
    # what a member receives names the members and the leader's key only (not every member's key), and a
    # journal written with the whole cohort's keys still reads
    old = {"kind": "surface_sealed_totals", "masked": Array.of(masked, dtype="uint64").model_dump(mode="json"),
           "cohort": cohort, "sealed": {"lab-a": ups["lab-a"][1]["lab-b"]}, "summed_round": 4}
    msg = SealedTotals.model_validate(old)
    assert msg.members == sorted(cohort) and msg.leader_key == cohort["lab-a"] and "cohort" not in msg.model_dump()
    assert abs(np.corrcoef(secagg.decode(masked), want)[0, 1]) < 0.9



def test_a_restarted_coordinator_sends_the_sealed_sum_it_held() -> None:
    """The held sum (masked words, sealed seeds, keys) is in the aggregator's snapshot: a coordinator
    restored from it sends every member what it would have sent, and the member opens it."""
    from labfbo.protocols.surface.protocol import SurfaceAggregator, SurfaceOptions

    coord, sites, _ = _run(rounds=1, release_every=2)
    agg = coord.aggregator()
    state = json.loads(json.dumps(agg.state()))  # as the store keeps it
    again = SurfaceAggregator(SurfaceOptions(release_every=2, **FAST), SITES, 5, None, SPACE)
    again.restore(state)
    h0, h1 = agg.held_sum, again.held_sum
    assert np.array_equal(h1.total, h0.total) and (h1.sealed, h1.keys, h1.members) == (h0.sealed, h0.keys, h0.members)
    sent = again._finish(1, None).replies  # round 1: round 0's sum still stands (release_every=2)
    o = sites[1]
    logic = o.agent.logic
    opened = open_totals(sent[o.site].model_copy(update={"study": coord.study}), o.site, logic.context.key_seed,
                         logic.features.p)
    assert opened.summed_round == 0 and opened.sites == 3 and opened.members == SITES


def test_a_round_that_formed_no_secure_sum_is_named_at_each_lab_and_in_its_trials() -> None:
    """Two of four labs left: the round runs with two, no secure sum forms, and each lab says so (a
    warning, the trial's source ``model-alone``) instead of proposing as if it had its partners' surface."""
    import threading
    import warnings

    space = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Categorical("c", ["a", "b", "c"])])
    coord = labfbo.Coordinator("surface", sites=["a", "b", "c", "d"], space=space, seed=1, horizon=4, quorum=2)
    opts = [labfbo.Optimizer(space, protocol="surface", site=s, seed=1, n_init=2, coordinator=coord, num_restarts=2,
                             raw_samples=32) for s in "abcd"]

    def f(i: int, p: dict) -> float:
        return (p["x"] - 0.2 - 0.1 * i) ** 2 + {"a": 0.0, "b": 0.3, "c": -0.2}[p["c"]]

    for i, o in enumerate(opts):
        for t in o.ask(n=2):
            o.tell(t, f(i, t.params))

    def round_of(active: list[int]) -> dict[int, labfbo.Trial]:
        out: dict[int, labfbo.Trial] = {}
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, opts[i].ask())) for i in active]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for i in active:
            opts[i].tell(out[i], f(i, out[i].params))
        return out

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert {t.metadata["source"] for t in round_of([0, 1, 2, 3]).values()} == {"model"}
        opts[2].close()
        opts[3].close()
        alone = round_of([0, 1])
    assert {t.metadata["source"] for t in alone.values()} == {"model-alone"}
    said = [str(w.message) for w in caught if "a secure sum needs 3 labs" in str(w.message)]
    assert len(said) == 2 and all("round 1" in m for m in said)
    for o in opts[:2]:
        o.close()
