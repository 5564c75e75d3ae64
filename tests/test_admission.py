"""A member whose contribution a protocol cannot use (a wrong shape, a value out of range, scores
for another step) costs only its own participation: the coordinator leaves it out, names it, and
the others get the round they would have had had it abstained; a bounded score is clipped."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

import labfbo
from labfbo.core.messages import Abstain, Array, JoinRequest, Message
from labfbo.protocols.consensus import IMPROVEMENT_BOUND, ConsensusProposal
from labfbo.protocols.distribution.protocol import VALUE_BOUND, OptimumBelief
from labfbo.protocols.gradient.protocol import ScoreResponse

SPACE = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
SITES = ["a", "b", "c"]


def shared(coord: labfbo.Coordinator) -> dict[str, Any]:
    opts = coord.options.model_dump(mode="json")
    return {k: opts[k] for k in coord.protocol_cls.shared_options}


def _coordinator(protocol: str, **options: Any) -> labfbo.Coordinator:
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=0, space=SPACE, horizon=5, **options)
    for s in SITES:
        coord.join(JoinRequest(site=s, protocol=protocol, space_hash=SPACE.fingerprint(),
                               space=SPACE.model_dump(mode="json"), shared_options=shared(coord)))
    return coord


def _round(protocol: str, answer: Callable[[str, Message], Message], **options: Any
           ) -> tuple[dict[str, Message], labfbo.Coordinator]:
    coord = _coordinator(protocol, **options)

    def gather(requests, quorum, deadline) -> dict:
        return {s: answer(s, m) for s, m in requests.items()}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return coord.run_round(0, gather), coord


def _same_for_the_others(protocol: str, honest: Callable[[str, Message], Message], hostile: Message,
                         **options: Any) -> labfbo.Coordinator:
    """Round 0 with site c hostile, and with c abstaining: a and b get the same replies."""
    bad, coord = _round(protocol, lambda s, m: hostile if s == "c" else honest(s, m), **options)
    away, _ = _round(protocol, lambda s, m: Abstain(reason="away") if s == "c" else honest(s, m), **options)
    for s in ("a", "b"):
        assert bad[s].model_dump(mode="json") == away[s].model_dump(mode="json"), s
    assert "c" in coord.rejected[0]
    return coord


def _belief(mean, value: float = 0.5, variance=(0.01, 0.01)) -> OptimumBelief:
    return OptimumBelief(weight=0.5, mean=Array.of(mean), variance=Array.of(list(variance)), value=value)


HONEST_BELIEFS = {"a": [0.2, 0.3], "b": [0.7, 0.6], "c": [0.5, 0.5]}


@pytest.mark.parametrize("hostile", [
    _belief([1e300, -1e300]),                  # finite, so the schema passes; far outside the cube
    _belief([0.2, 0.3, 0.4], variance=(0.01, 0.01, 0.01)),  # another dimension
    _belief([0.4, 0.4], variance=(50.0, 50.0)),  # wider than the cube
])
def test_distribution_leaves_out_a_belief_it_cannot_use(hostile: OptimumBelief) -> None:
    coord = _same_for_the_others("distribution", lambda s, m: _belief(HONEST_BELIEFS[s]), hostile, P=3)
    assert "belief" in coord.rejected[0]["c"]


def test_distribution_clips_a_value_score_to_its_bound() -> None:
    coord = _coordinator("distribution", P=3)
    agg = coord.aggregator()
    clipped = agg.admit("c", _belief([0.5, 0.5], value=1e308))
    assert clipped.value == VALUE_BOUND
    assert agg.admit("c", _belief([0.5, 0.5], value=-7.0)).value == -VALUE_BOUND
    dp = _belief([0.5, 0.5], value=9.0).model_copy(update={"dp_clip": 5.0})
    assert agg.admit("c", dp).value == 5.0  # under DP the clip bounds the released score
    # with its score clipped, the extreme member is one of three components, as an honest one at the bound
    replies, _ = _round("distribution", lambda s, m: _belief(HONEST_BELIEFS[s], value=1e308 if s == "c" else 0.5), P=3)
    capped, _ = _round("distribution", lambda s, m: _belief(HONEST_BELIEFS[s], value=VALUE_BOUND if s == "c" else 0.5),
                       P=3)
    assert replies["a"].model_dump(mode="json") == capped["a"].model_dump(mode="json")


def _proposal(s: str, m: Message) -> Message:
    return ConsensusProposal(points=Array.of([HONEST_BELIEFS[s]]), improvement=0.1 * SITES.index(s))


@pytest.mark.parametrize("hostile", [
    ConsensusProposal(points=Array.of([[1e300, 0.5]])),
    ConsensusProposal(points=Array.of([[0.5, 0.5, 0.5]])),
    ConsensusProposal(points=Array.of(np.full((65, 2), 0.5))),
])
def test_consensus_leaves_out_proposals_it_cannot_use(hostile: ConsensusProposal) -> None:
    _same_for_the_others("consensus", _proposal, hostile)


def test_consensus_clips_a_stated_improvement() -> None:
    agg = _coordinator("consensus").aggregator()
    got = agg.admit("c", ConsensusProposal(points=Array.of([[0.5, 0.5]]), improvement=1e300))
    assert got.improvement == IMPROVEMENT_BOUND


def test_gradient_leaves_out_scores_of_another_shape_or_step() -> None:
    options = {"warmup_steps": 1, "svgd_steps": 1, "n_particles": 2}
    coord = _coordinator("gradient", **options)
    K, P = tuple(coord.aggregator().particles.shape)

    def honest(s: str, m: Message) -> Message:
        A = np.random.default_rng(SITES.index(s)).normal(size=(K, P))
        return ScoreResponse(step=m.step, scores=Array.of(A), n_obs=5)

    for hostile in (ScoreResponse(step=0, scores=Array.of(np.ones((K, P + 1))), n_obs=5),
                    ScoreResponse(step=7, scores=Array.of(np.ones((K, P))), n_obs=5)):
        _same_for_the_others("gradient", honest, hostile, **options)


def _stats(s: str, count: int = 8) -> Message:
    from labfbo.protocols.surface.messages import SurfaceStats
    from labfbo.protocols.surface.model import SurfaceFeatures, site_statistics

    gen = np.random.default_rng(SITES.index(s))
    X = gen.random((count, 2))
    gram, moment = site_statistics(SurfaceFeatures(SPACE, 100, 0.2).of_unit(X), np.sin(3 * X).sum(1))
    return SurfaceStats(count=count, gram=Array.of(gram), moment=Array.of(moment))


def test_surface_leaves_out_statistics_no_site_data_can_produce() -> None:
    honest = _stats("c")
    far = honest.gram.numpy().copy()
    far[3] = 1e300  # finite: the schema passes
    for hostile in (honest.model_copy(update={"gram": Array.of(far)}),
                    honest.model_copy(update={"moment": Array.of(50.0 * honest.moment.numpy())}),
                    _stats("c").model_copy(update={"gram": Array.of(far[:-1])})):
        coord = _same_for_the_others("surface", lambda s, m: _stats(s), hostile, secure_aggregation="off")
        assert "surface statistics" in coord.rejected[0]["c"]
    noisy = honest.model_copy(update={"moment": Array.of(3.0 * honest.moment.numpy()), "dp_clip": 2.0,
                                      "dp_noise_multiplier": 1.0, "dp_sensitivity": 1.0})
    assert _coordinator("surface", secure_aggregation="off").aggregator().admit("c", noisy) is noisy  # DP noise


def test_surface_caps_a_stated_count_at_the_rounds_median() -> None:
    """A member stating a huge count weighs as one at the median count, not more."""
    huge, _ = _round("surface", lambda s, m: _stats(s).model_copy(update={"count": 10**6}) if s == "c" else _stats(s),
                     secure_aggregation="off")
    fair, _ = _round("surface", lambda s, m: _stats(s), secure_aggregation="off")
    for s in ("a", "b"):
        assert huge[s].model_dump(mode="json") == fair[s].model_dump(mode="json")
    raw, _ = _round("surface", lambda s, m: _stats(s).model_copy(update={"count": 10**6}) if s == "c" else _stats(s),
                    secure_aggregation="off", count_cap="off")
    assert raw["a"].count == 10**6 + 8  # without the cap the member owns the others' totals


def test_vote_leaves_out_a_vote_over_another_codebook_and_weighs_each_vote_one_count() -> None:
    from labfbo.protocols.vote.messages import OptimumVote

    def honest(s: str, m: Message) -> Message:
        return OptimumVote(index=SITES.index(s), codebook=8)

    coord = _same_for_the_others("vote", honest, OptimumVote(index=12, codebook=16), sealed=False, codebook=8)
    assert "codebook of 16" in coord.rejected[0]["c"]
    replies, _ = _round("vote", honest, sealed=False, codebook=8)
    assert replies["a"].counts.numpy().sum() == 2  # the others' two votes, one count each


def test_gradient_caps_a_members_scores_at_ten_times_the_steps_median_norm() -> None:
    """With ``score_clip=10``, a member sending huge (finite, well-shaped) scores weighs as one sending
    them at the cap."""
    options = {"warmup_steps": 1, "svgd_steps": 1, "n_particles": 2, "score_clip": 10.0}
    K, P = tuple(_coordinator("gradient", **options).aggregator().particles.shape)
    A = {s: np.random.default_rng(SITES.index(s)).normal(size=(K, P)) for s in SITES}
    cap = 10.0 * sorted(np.linalg.norm(A[s]) for s in SITES)[1]  # the median of three

    def answers(c_scores: np.ndarray) -> Callable[[str, Message], Message]:
        return lambda s, m: ScoreResponse(step=m.step, scores=Array.of(c_scores if s == "c" else A[s]), n_obs=5)

    huge, _ = _round("gradient", answers(1e6 * A["c"]), **options)
    capped, _ = _round("gradient", answers(A["c"] * cap / np.linalg.norm(A["c"])), **options)
    raw, _ = _round("gradient", answers(1e6 * A["c"]), **{**options, "score_clip": None})
    assert huge["a"].particles.numpy() == pytest.approx(capped["a"].particles.numpy(), rel=1e-9, abs=1e-12)
    assert not np.allclose(raw["a"].particles.numpy(), huge["a"].particles.numpy())  # without the cap it owns the step


def test_every_builtin_aggregator_admits_what_its_honest_sites_send() -> None:
    """The default is to admit: a protocol that declares no range changes nothing."""
    from labfbo.protocols.base import Aggregator

    assert Aggregator.admit(None, "s", Abstain(reason="x")).reason == "x"  # type: ignore[arg-type]


def test_a_join_asking_for_a_huge_design_is_refused_and_changes_nothing() -> None:
    from labfbo.coordinator import MAX_DESIGN_CELLS

    big = labfbo.SearchSpace([labfbo.Real(f"x{i}", 0, 1) for i in range(1000)])
    coord = labfbo.Coordinator("distribution", sites=SITES, seed=0)
    join = JoinRequest(site="a", protocol="distribution", space_hash=big.fingerprint(),
                       space=big.model_dump(mode="json"), n_init=10_000, shared_options=shared(coord))
    with pytest.raises(labfbo.FederationError, match="lower n_init"):
        coord.join(join)
    assert coord.space is None and not coord.members  # a refused join changes nothing
    assert 3 * 10_000 * 1000 > MAX_DESIGN_CELLS
    ok = coord.join(join.model_copy(update={"n_init": 10}))
    assert ok.design.shape == (10, 1000) and coord.members == {"a": 0}
