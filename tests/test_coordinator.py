"""Coordinator: membership, collaborative design, rounds over the local transport, quorum."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo import Coordinator, Optimizer, Real, SearchSpace
from labfbo.core.messages import JoinRequest, parse


def snapshot(opt, storage=None):
    return (opt.observations, tuple(opt.trials), tuple(opt.pending),
            None if storage is None else storage.read_bytes())


# ----------------------------------------------------------------------- membership
def test_site_with_another_space_is_refused(cont_space, fast):
    coord = Coordinator("independent", sites=["a", "b"], seed=0, **fast)
    Optimizer(cont_space, coordinator=coord, site="a", n_init=2, **fast)
    other = SearchSpace([Real("x", -2.0, 3.0), Real("rate", 1e-3, 1.0)])  # not log
    with pytest.raises(labfbo.FederationError, match="space"):
        Optimizer(other, coordinator=coord, site="b", n_init=2, **fast)
    assert coord.site_names == ["a"]
    Optimizer(cont_space, coordinator=coord, site="b", n_init=2, **fast)
    assert coord.site_names == ["a", "b"]


def test_study_space_is_enforced_for_the_first_site(cont_space):
    coord = Coordinator("independent", sites=["a"], space=cont_space)
    with pytest.raises(labfbo.FederationError):
        Optimizer(SearchSpace([Real("x", 0.0, 1.0)]), coordinator=coord, site="a")
    assert coord.members == {}


def test_refused_site_leaves_no_journal(cont_space, tmp_path, fast):
    coord = Coordinator("independent", sites=["a"], space=cont_space)
    path = tmp_path / "a.journal"
    with pytest.raises(labfbo.FederationError):
        Optimizer(SearchSpace([Real("x", 0.0, 1.0)]), coordinator=coord, site="a", storage=str(path))
    assert not path.exists() or path.read_bytes() == b""
    # the corrected configuration then works with the same storage
    opt = Optimizer(cont_space, coordinator=coord, site="a", storage=str(path), n_init=2, **fast)
    assert opt.ask().metadata["source"] == "design"
    opt.close()


def test_site_with_another_protocol_is_refused(cont_space, sum_protocol, fast):
    coord = Coordinator("test-sum", sites=["a", "b"])
    with pytest.raises(labfbo.FederationError, match="protocol"):
        Optimizer(cont_space, protocol="independent", coordinator=coord, site="a", **fast)
    coord2 = Coordinator("independent", sites=["a", "b"])
    with pytest.raises(labfbo.FederationError, match="protocol"):
        Optimizer(cont_space, protocol="test-sum", coordinator=coord2, site="a")
    assert coord.members == {} and coord2.members == {}


def test_unknown_site_and_full_study_are_refused(cont_space, fast):
    coord = Coordinator("independent", sites=["a", "b"])
    with pytest.raises(labfbo.FederationError, match="zeta"):
        Optimizer(cont_space, coordinator=coord, site="zeta", **fast)
    coord = Coordinator("independent", sites=2)
    Optimizer(cont_space, coordinator=coord, site="x", **fast)
    Optimizer(cont_space, coordinator=coord, site="y", **fast)
    with pytest.raises(labfbo.FederationError, match="full"):
        Optimizer(cont_space, coordinator=coord, site="z", **fast)
    assert coord.site_names == ["x", "y"]


def test_coordinator_configuration_errors():
    with pytest.raises(labfbo.ConfigurationError):
        Coordinator("no-such-protocol", sites=2)
    with pytest.raises(labfbo.ConfigurationError):
        Coordinator("independent", sites=["a", "a"])
    with pytest.raises(labfbo.ConfigurationError):
        Coordinator("independent", sites=[])
    with pytest.raises(labfbo.ConfigurationError):
        Coordinator("independent", sites=0)
    for q in (0, 4):
        with pytest.raises(labfbo.ConfigurationError):
            Coordinator("independent", sites=3, quorum=q)
    with pytest.raises(labfbo.ConfigurationError):
        Coordinator("independent", sites=2, acquisitoin="ei")


def test_restarted_site_rejoins_with_its_index(cont_space, tmp_path, fast):
    coord = Coordinator("independent", sites=["a", "b"], seed=0)
    path = tmp_path / "b.journal"
    b = Optimizer(cont_space, coordinator=coord, site="b", storage=str(path), n_init=3, **fast)
    first = b.ask()
    b.close()
    b2 = Optimizer(cont_space, coordinator=coord, site="b", storage=str(path), n_init=3, **fast)
    assert b2.context.site_index == 1 and b2.context.n_sites == 2
    assert b2.pending == [first]
    twin = Optimizer(cont_space, coordinator=Coordinator("independent", sites=["a", "b"], seed=0),
                     site="b", n_init=3, **fast)
    assert twin.ask(n=2)[1] == b2.ask()


# ----------------------------------------------------------------------- collaborative design
def designs(space, protocol, seed, n_init=4, sites=("a", "b", "c"), **kw):
    coord = Coordinator(protocol, sites=list(sites), seed=seed)
    out = {}
    for s in sites:
        opt = Optimizer(space, protocol=protocol, coordinator=coord, site=s, n_init=n_init, seed=seed, **kw)
        trials = opt.ask(n=n_init)
        assert [t.metadata["source"] for t in trials] == ["design"] * n_init
        out[s] = space.encode([t.params for t in trials])
    return out


def test_collaborative_design_is_a_latin_hypercube(cont_space, fast):
    d = designs(cont_space, "independent", seed=3, **fast)
    X = np.vstack([d["a"], d["b"], d["c"]])
    assert X.shape == (12, 2)
    for j in range(2):
        strata = np.floor(X[:, j] * 12).astype(int)
        assert sorted(strata) == list(range(12)), strata
    again = designs(cont_space, "independent", seed=3, **fast)
    for s in "abc":
        np.testing.assert_array_equal(again[s], d[s])
    other = designs(cont_space, "independent", seed=4, **fast)
    assert not np.array_equal(other["a"], d["a"])


def test_every_protocol_gets_the_same_design(cont_space, sum_protocol, fast):
    ind = designs(cont_space, "independent", seed=5, **fast)
    fed = designs(cont_space, "test-sum", seed=5)
    for s in "abc":
        np.testing.assert_array_equal(ind[s], fed[s])


# ----------------------------------------------------------------------- federated rounds
HIST = {"a": [11.125], "b": [22.375, 23.5], "c": [31.25, 32.625, 33.875]}


def federation(space, sites=("a", "b", "c"), **coord_kw):
    coord = Coordinator("test-sum", sites=list(sites), seed=0, **coord_kw)
    opts = {}
    for s in sites:
        opt = Optimizer(space, protocol="test-sum", coordinator=coord, site=s, n_init=0, seed=0)
        values = HIST[s]
        opt.add_observations([{"x": 0.1 * k, "rate": 0.01 * (k + 1)} for k in range(len(values))], values)
        opts[s] = opt
    return coord, opts


def test_dummy_protocol_runs_through_the_local_transport(cont_space, sum_protocol):
    coord, opts = federation(cont_space)
    a, b, c = opts["a"], opts["b"], opts["c"]
    b.enqueue({"x": 0.0, "rate": 0.5})

    ta = a.ask()
    assert ta.metadata["source"] == "model" and ta.metadata["round"] == 0
    reply = a.agent.logic.guidance[-1]
    assert reply.kind == "test_sum_reply" and reply.round == 0 and reply.version == 1
    assert (reply.total_n, reply.total_pending, reply.contributors) == (6.0, 1.0, ["a", "b", "c"])
    assert coord.contributors[0] == [["a", "b", "c"], ["a", "b", "c"]]
    b.ask()
    c.ask()  # round 0 is not run again: the same reply
    assert b.agent.logic.guidance[-1] == reply and c.agent.logic.guidance[-1] == reply

    a.tell(ta, 1.0)
    a.ask()  # round 1: a has 2 observations; b has 2 pending trials, c has 1
    r1 = a.agent.logic.guidance[-1]
    assert (r1.round, r1.total_n, r1.total_pending) == (1, 7.0, 3.0)

    agg = coord.aggregator()
    for s, opt in opts.items():
        sent = opt.sent_messages()
        assert all(m.version == 1 for m in sent)
        assert isinstance(sent[0], JoinRequest) and sent[0].site == s and sent[0].round == -1
        # exactly what the coordinator received from this site, in order
        assert sent[1:] == [m for (_, site, m) in agg.received if site == s]
        assert [(m.kind, m.round, m.step) for m in sent[1:]] == [
            ("test_sum_answer", 0, 1), ("test_sum_answer", 0, 2),
            ("test_sum_answer", 1, 1), ("test_sum_answer", 1, 2)]
        for m in sent:
            assert parse(m.model_dump_json()) == m
            for v in HIST[s]:  # raw measurements never cross the boundary
                assert repr(v) not in m.model_dump_json()
        for t in (0, 1):
            up, down = opt.ledger.round_bytes(t)
            assert up > 0 and down > 0
            assert up == sum(m.nbytes() for m in sent if m.round == t)
    assert [m.value for m in a.sent_messages()[1:]] == [1.0, 0.0, 2.0, 0.0]
    assert opts["b"].sent_messages()[2].value == 1.0


def test_quorum_tolerates_a_failing_site(cont_space, sum_protocol):
    coord, opts = federation(cont_space, quorum=2)
    opts["c"].agent.logic.fail = True
    opts["a"].ask()
    reply = opts["a"].agent.logic.guidance[-1]
    assert coord.contributors[0] == [["a", "b"], ["a", "b"]]
    assert (reply.total_n, reply.contributors) == (3.0, ["a", "b"])
    assert len(opts["c"].sent_messages()) == 1  # only its join request
    t = opts["c"].ask()  # the failing site still gets its guidance and proposes
    assert opts["c"].agent.logic.guidance[-1] == reply and t.metadata["source"] == "model"


def test_quorum_not_reached_raises_and_changes_nothing(cont_space, sum_protocol):
    coord, opts = federation(cont_space, quorum=3)
    opts["c"].agent.logic.fail = True
    before = snapshot(opts["a"])
    with pytest.raises(labfbo.RoundError, match="quorum"):
        opts["a"].ask()
    assert snapshot(opts["a"]) == before
    assert 0 not in coord.rounds


def test_round_waits_for_all_sites_to_join(cont_space, sum_protocol):
    coord = Coordinator("test-sum", sites=["a", "b"], seed=0)
    a = Optimizer(cont_space, protocol="test-sum", coordinator=coord, site="a", n_init=0)
    a.add_observations([{"x": 0.0, "rate": 0.1}], [1.0])
    with pytest.raises(labfbo.RoundError, match="join"):
        a.ask()
    assert a.pending == []
