"""Protocol `consensus`: W schedules, the leader rule, aggregation, end to end."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from campaign import run_campaign

import labfbo
from labfbo.core.messages import Array
from labfbo.protocols.consensus import (
    ConsensusAggregator,
    ConsensusOptions,
    ConsensusProposal,
    ConsensusReply,
    combine,
    leader_matrix,
    sinkhorn,
    uniform_schedule,
)

FAST = {"num_restarts": 2, "raw_samples": 32}


def assert_doubly_stochastic(W: np.ndarray) -> None:
    assert (W >= 0).all()
    np.testing.assert_allclose(W.sum(0), 1.0, atol=1e-9)
    np.testing.assert_allclose(W.sum(1), 1.0, atol=1e-9)
    np.testing.assert_allclose(W, W.T, atol=1e-9)


@pytest.mark.parametrize("L,T", [(2, 1), (3, 5), (5, 4), (5, 30), (6, 10)])
def test_uniform_schedule_goes_from_uniform_to_identity(L: int, T: int) -> None:
    np.testing.assert_allclose(uniform_schedule(L, T, 0), np.full((L, L), 1 / L))
    for t in range(T + 3):
        assert_doubly_stochastic(uniform_schedule(L, T, t))
    np.testing.assert_allclose(uniform_schedule(L, T, T), np.eye(L), atol=1e-12)
    np.testing.assert_allclose(uniform_schedule(L, T, T + 2), np.eye(L), atol=1e-12)
    # Eq. 10: each step adds (L-1)/(TL) on the diagonal and -1/(TL) off it
    if T > 1:
        step = uniform_schedule(L, T, 1) - uniform_schedule(L, T, 0)
        np.testing.assert_allclose(np.diag(step), (L - 1) / (T * L))
        assert step[0, 1] == pytest.approx(-1 / (T * L))


@pytest.mark.parametrize("L,T", [(2, 3), (3, 4), (5, 4), (5, 30), (6, 10)])
def test_leader_matrix_is_doubly_stochastic_and_favours_the_leader(L: int, T: int) -> None:
    for t, leader in itertools.product(range(T + 1), range(L)):
        W = leader_matrix(L, T, t, leader)
        assert_doubly_stochastic(W)
        if t < T and L > 2:
            others = [m for m in range(L) if m != leader]
            a, b = others[0], others[1]
            assert W[a, leader] > W[a, b]  # non-leaders lean towards the leader


def test_leader_rule_negative_diagonal_is_clamped() -> None:
    # as written, the leader's diagonal is 1/5 - 16/20 = -0.6 at L=5, T=4, t=0
    W = leader_matrix(5, 4, 0, leader=2)
    assert W[2, 2] >= 0
    assert_doubly_stochastic(W)


def test_sinkhorn_keeps_an_isolated_site_on_its_own_point() -> None:
    W = sinkhorn(np.array([[0.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_allclose(W, np.eye(2))


def test_combine_is_a_convex_combination_snapped_to_the_grids() -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Integer("k", 0, 4),
                                labfbo.Discrete("c", [0.057, 0.1, 0.153])])
    X = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5, 1.0]])
    W = uniform_schedule(3, 10, 0)
    out = combine(space, W, X)
    assert out[0, 0] == pytest.approx(0.5)
    assert out[0, 1] in space.discrete_dims()[1] and out[0, 2] in space.discrete_dims()[2]
    assert ((out >= 0) & (out <= 1)).all()


def test_consensus_refuses_categorical_parameters_naming_them() -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Categorical("solvent", ["a", "b"])])
    coord = labfbo.Coordinator("consensus", sites=["a", "b"], seed=0, horizon=3)
    with pytest.raises(labfbo.ProtocolError, match="consensus' does not support categorical parameters \\(solvent\\)"):
        labfbo.Optimizer(space, protocol="consensus", coordinator=coord, site="a")


def _aggregator(sites: list[str], horizon: int = 4, **opts: object) -> ConsensusAggregator:
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Real("y", 0, 1)])
    return ConsensusAggregator(ConsensusOptions(**opts), sites, 0, horizon, space)


def test_aggregator_returns_w_times_proposals_and_skips_missing_sites() -> None:
    agg = _aggregator(["a", "b", "c"])
    props = {s: ConsensusProposal(points=Array.of([[i / 2, 1 - i / 2]])) for i, s in enumerate("abc")}
    step = agg.on_responses(0, props)
    for s in "abc":
        reply = step.replies[s]
        assert isinstance(reply, ConsensusReply)
        np.testing.assert_allclose(reply.points.numpy()[0], [0.5, 0.5])
    # at t = T the matrix is the identity: every site keeps its own proposal
    step = agg.on_responses(4, props)
    np.testing.assert_allclose(step.replies["b"].points.numpy()[0], [0.5, 0.5])
    np.testing.assert_allclose(step.replies["c"].points.numpy()[0], [1.0, 0.0])
    # a straggler is left out; the others average among themselves
    step = agg.on_responses(0, {s: props[s] for s in "ab"})
    assert "c" not in step.replies
    np.testing.assert_allclose(step.replies["a"].points.numpy()[0], [0.25, 0.75])


def test_aggregator_batches_align_by_index() -> None:
    agg = _aggregator(["a", "b"])
    props = {"a": ConsensusProposal(points=Array.of([[0.0, 0.0], [0.2, 0.2]])),
             "b": ConsensusProposal(points=Array.of([[1.0, 1.0]]))}
    step = agg.on_responses(0, props)
    pa = step.replies["a"].points.numpy()
    assert pa.shape == (2, 2)
    np.testing.assert_allclose(pa[0], [0.5, 0.5])
    np.testing.assert_allclose(pa[1], [0.2, 0.2])  # only "a" proposed a second point


def test_consensus_needs_a_horizon() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="horizon"):
        _aggregator(["a", "b"], horizon=0)


def _federation(n_sites: int = 3, **opts: object) -> tuple[labfbo.Coordinator, list[labfbo.Optimizer]]:
    space = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
    names = [f"s{i}" for i in range(n_sites)]
    coord = labfbo.Coordinator("consensus", sites=names, seed=0, horizon=5, **opts)
    opts_ = [labfbo.Optimizer(space, protocol="consensus", coordinator=coord, site=n, seed=0, n_init=3,
                              **FAST, **opts) for n in names]
    return coord, opts_


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.2 * i) ** 2 + (p["y"] + 0.1) ** 2


def _campaign(opts: list[labfbo.Optimizer], rounds: int) -> None:
    for i, o in enumerate(opts):
        for t in o.ask(n=3):
            o.tell(t, _f(i, t.params))
    for _ in range(rounds):
        trials = [o.ask() for o in opts]
        for i, (o, t) in enumerate(zip(opts, trials)):
            o.tell(t, _f(i, t.params))


def test_uniform_round_zero_gives_every_site_the_same_point() -> None:
    _, opts = _federation(matrix="uniform")
    _campaign(opts, 1)
    r0 = [o.trials[3].params for o in opts]
    assert all(p == pytest.approx(r0[0]) for p in r0)


def test_leader_sites_evaluate_consensus_points_and_send_no_raw_values() -> None:
    coord, opts = _federation(matrix="leader")
    _campaign(opts, 2)
    proposal = [m for m in opts[0].sent_messages() if isinstance(m, ConsensusProposal)][0]
    own = opts[0].space.decode(proposal.points.numpy())[0]
    assert opts[0].trials[3].params != pytest.approx(own)  # it evaluated the consensus point
    assert proposal.improvement is not None
    sent = opts[0].sent_messages()
    kinds = [m.kind for m in sent]
    assert kinds[0] == "join" and kinds.count("consensus_proposal") == 2
    raw = {round(o.value, 12) for o in opts[0].observations}
    for m in sent:
        if isinstance(m, ConsensusProposal) and m.improvement is not None:
            assert round(m.improvement, 12) not in raw
    assert all(len(c[0]) == 3 for c in coord.contributors.values())


def test_ask_n_under_consensus_returns_distinct_points() -> None:
    _, opts = _federation(n_sites=2)
    run_campaign(opts, _f, 3, 0)
    batch = opts[0].ask(n=2)
    assert len(batch) == 2
    assert batch[0].params != batch[1].params
    one = opts[1].ask(n=1)  # round 0 already ran with site 1's single proposal
    assert isinstance(one, list) and len(one) == 1


def test_simulate_consensus_shapes_and_bytes() -> None:
    res = labfbo.simulate("branin", protocol="consensus", n_sites=3, n_init=3, budget=2, seed=1,
                          heterogeneity=0.0, **FAST)
    assert res.proposals.shape == (3, 2, 2)
    assert (res.bytes_up > 0).all() and (res.bytes_down > 0).all()
    # a message is a few hundred bytes: one 2-d point up, one point and a row of W down
    assert res.bytes_up.max() < 1000


def test_leader_alone_in_a_batch_slot_keeps_a_finite_point() -> None:
    # L=3, T=3: the leader's clamped diagonal is 0; if it alone proposes a second point,
    # that slot's weights would be [[0]] — it must keep its own point, never NaN
    agg = _aggregator(["a", "b", "c"], horizon=3, matrix="leader")
    props = {"a": ConsensusProposal(points=Array.of([[0.1, 0.1], [0.9, 0.9]]), improvement=5.0),
             "b": ConsensusProposal(points=Array.of([[0.5, 0.5]]), improvement=0.0),
             "c": ConsensusProposal(points=Array.of([[0.7, 0.3]]), improvement=-1.0)}
    step = agg.on_responses(0, props)
    pa = step.replies["a"].points.numpy()
    assert np.isfinite(pa).all()
    np.testing.assert_allclose(pa[1], [0.9, 0.9])
    assert sum(step.replies["a"].weights) == pytest.approx(1.0)


def test_coordinator_checks_horizon_and_shared_options() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="horizon"):
        labfbo.Coordinator("consensus", sites=["a", "b"])
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1)])
    coord = labfbo.Coordinator("consensus", sites=["a", "b"], horizon=5, matrix="uniform")
    with pytest.raises(labfbo.FederationError, match="matrix='leader' \\(the study: 'uniform'\\)"):
        labfbo.Optimizer(space, protocol="consensus", coordinator=coord, site="a", matrix="leader")
    labfbo.Optimizer(space, protocol="consensus", coordinator=coord, site="a", acquisition="ei")  # local option
    from labfbo.core.messages import JoinRequest  # a site of another labfbo version sends an option the study lacks

    extra = JoinRequest(site="b", protocol="consensus", space_hash=space.fingerprint(),
                        space=space.model_dump(mode="json"), n_init=1,
                        shared_options={"matrix": "uniform", "gossip": True})
    with pytest.raises(labfbo.FederationError, match="gossip=True \\(the study: '<not set>'\\)"):
        coord.join(extra)
    with pytest.raises(labfbo.ConfigurationError, match="labfbo coordinator serve"):
        labfbo.Coordinator("consensus", sites=["a", "b"], horizon=5, transport="http")


def test_a_site_without_data_abstains() -> None:
    from labfbo.core.messages import Abstain
    from labfbo.protocols.base import SiteContext, SiteData
    from labfbo.protocols.consensus import ConsensusRequest, ConsensusSite

    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1)])
    site = ConsensusSite(space, ConsensusOptions(), SiteContext(site="a"))
    empty = SiteData(space=space, X=np.zeros((0, 1)), y=np.zeros(0), yvar=None, pending=np.zeros((0, 1)))
    assert isinstance(site.answer(ConsensusRequest(), empty, 0), Abstain)
