"""The round model (docs/concepts.md, "Rounds"): the coordinator owns the clock; a site asking
again before its results are in moves no counter; nobody can skip rounds for everyone; a
round starts when the sites have asked for it and uses the data each had when it asked."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import labfbo
from labfbo import Coordinator, Optimizer
from labfbo.server.app import CoordinatorServer, ServerThread
from labfbo.server.config import ServerConfig, new_token
from labfbo.transport.http import HTTPCoordinator

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
FAST = {"num_restarts": 2, "raw_samples": 32}
DIST = {"M": 64, "candidates": 128}


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.2 * i) ** 2 + (p["y"] + 0.1) ** 2


def _local_sites(protocol: str, names=("a", "b", "c"), **kw):
    coord = Coordinator(protocol, sites=list(names), seed=0, **kw)
    opts = [Optimizer(SPACE, protocol=protocol, coordinator=coord, site=s, seed=0, n_init=2, **kw) for s in names]
    for i, o in enumerate(opts):
        for t in o.ask(n=2):
            o.tell(t, _f(i, t.params))
    return coord, opts


def test_asking_again_before_telling_moves_no_counter(sum_protocol) -> None:
    coord, (a, b, c) = _local_sites("test-sum")
    first = [a.ask() for _ in range(3)]  # three reactors: round 0, then the same guidance
    assert [t.metadata["round"] for t in first] == [0, 0, 0] and coord.last_round == 0
    assert len({tuple(t.params.values()) for t in first}) == 3  # pending-aware: three distinct points
    assert a.agent.logic.guidance[0] is a.agent.logic.guidance[2]  # served from the guidance it holds
    for i, o in enumerate((b, c)):  # the other sites' round 0 is intact
        t = o.ask()
        assert t.metadata["round"] == 0 and t.metadata["source"] == "model"
        o.tell(t, _f(i + 1, t.params))
    a.tell(first[0], 1.0)  # a result is in: the next ask asks for round 1
    assert a.ask().metadata["round"] == 1 and coord.last_round == 1
    assert [b.ask().metadata["round"], c.ask().metadata["round"]] == [1, 1]


def test_the_clock_survives_a_restart_of_the_site(sum_protocol, tmp_path) -> None:
    coord = Coordinator("test-sum", sites=["a", "b"], seed=0)
    path = str(tmp_path / "a.jsonl")
    a = Optimizer(SPACE, protocol="test-sum", coordinator=coord, site="a", n_init=2, storage=path)
    b = Optimizer(SPACE, protocol="test-sum", coordinator=coord, site="b", n_init=2)
    for o in (a, b):
        for t in o.ask(n=2):
            o.tell(t, 1.0)
    a.ask(), a.ask()
    a.close()
    a = Optimizer(SPACE, protocol="test-sum", coordinator=coord, site="a", n_init=2, storage=path)
    assert a.ask().metadata["round"] == 0 and coord.last_round == 0  # still nothing new to say
    a.tell(a.pending[0], 2.0)
    assert a.ask().metadata["round"] == 1


def test_no_site_can_skip_rounds_for_everyone(sum_protocol) -> None:
    coord, (a, b, c) = _local_sites("test-sum")
    for t in (1, 999_999_999, -1):
        with pytest.raises(labfbo.RoundError, match="the next is 0"):
            a.agent.link.guidance(t)
    assert coord.last_round == -1 and not coord.rounds
    assert [o.ask().metadata["round"] for o in (a, b, c)] == [0, 0, 0]


def test_a_site_behind_the_clock_gets_the_current_guidance(sum_protocol) -> None:
    coord, (a, b, c) = _local_sites("test-sum")
    for r in range(3):  # a and b move on; c (say, a long experiment) does not ask
        for o in (a, b):
            o.tell(o.ask(), float(r))
    assert coord.last_round == 2
    t = c.ask()  # c asks for its round 0: it gets round 2's guidance and continues from there
    assert t.metadata["round"] == 2 and c.agent.logic.guidance[-1].round == 2
    c.tell(t, 0.0)
    assert c.ask().metadata["round"] == 3


# --------------------------------------------------------------------------------- over HTTP
def _server(protocol: str, names, **cfg_kw):
    tokens = {s: new_token() for s in names}
    cfg = ServerConfig(protocol=protocol, seed=0, sites={s: h for s, (_, h) in tokens.items()},
                       space=SPACE.model_dump(mode="json"), **cfg_kw)
    return ServerThread(CoordinatorServer(cfg)), {s: t for s, (t, _) in tokens.items()}


@pytest.mark.integration
def test_a_round_uses_the_data_each_site_had_when_it_asked(sum_protocol) -> None:
    """Site a asks for round 0, then (from another thread of its script) tells a result while
    the round waits for site b: a's answers still count the data it asked with."""
    server, tokens = _server("test-sum", ["a", "b"])
    with server as srv:
        a, b = (Optimizer(SPACE, protocol="test-sum", site=s, seed=0, n_init=0,
                          coordinator=HTTPCoordinator(srv.url, tokens[s])) for s in ("a", "b"))
        a.add_observations([{"x": 0.0, "y": 0.0}, {"x": 0.5, "y": 0.5}], [1.0, 2.0])
        b.add_observations([{"x": 0.1, "y": 0.1}], [1.0])
        running = a.enqueue({"x": -0.5, "y": 0.2})  # an experiment in progress
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(a.ask)
            engine = srv.server.engine
            for _ in range(500):
                with engine.cv:
                    if engine.gate.wants.get("a") == 0:
                        break
                time.sleep(0.01)
            a.tell(running, 3.0)  # told while round 0 waits for b
            b.ask()
            assert asked.result(timeout=60).metadata["round"] == 0
        received = srv.server.coordinator.aggregator().received
        from_a = {m.step: m.value for t, s, m in received if s == "a" and t == 0}
        assert from_a == {1: 2.0, 2: 1.0}  # 2 observations and 1 pending, as when a asked
        a.close(), b.close()


@pytest.mark.integration
@pytest.mark.parametrize("order_seed", [0, 1])
def test_sites_started_in_any_order_all_get_the_federations_first_round(order_seed: int) -> None:
    names = ["a", "b", "c"]
    delays = [0.0, 5.0, 10.0]
    random.Random(order_seed).shuffle(delays)
    server, tokens = _server("distribution", names, options={**FAST, **DIST})
    results: dict[str, object] = {}

    def lab(i: int, s: str) -> None:
        time.sleep(delays[i])
        try:
            with Optimizer(SPACE, protocol="distribution", site=s, seed=0, n_init=2, **FAST, **DIST,
                           coordinator=HTTPCoordinator(srv.url, tokens[s])) as o:
                for t in o.ask(n=2):
                    o.tell(t, _f(i, t.params))
                results[s] = o.ask()  # a plain ask: waits for the others to join and ask
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[s] = exc

    with server as srv:
        threads = [threading.Thread(target=lab, args=(i, s)) for i, s in enumerate(names)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=180)
        rounds = dict(srv.server.coordinator.contributors)
    for s in names:
        assert isinstance(results[s], labfbo.Trial), results[s]
        assert results[s].metadata["source"] == "model" and results[s].metadata["round"] == 0
    assert rounds[0] == [["a", "b", "c"]]  # one round, every site in it


@pytest.mark.integration
def test_parallel_experiments_over_http_leave_the_other_sites_rounds_intact() -> None:
    import requests

    names = ["a", "b", "c"]
    server, tokens = _server("distribution", names, options={**FAST, **DIST})
    with server as srv:
        opts = [Optimizer(SPACE, protocol="distribution", site=s, seed=0, n_init=2, **FAST, **DIST,
                          coordinator=HTTPCoordinator(srv.url, tokens[s])) for s in names]
        for i, o in enumerate(opts):
            for t in o.ask(n=2):
                o.tell(t, _f(i, t.params))
        r = requests.post(f"{srv.url}/v1/sites/a/rounds/999999999/want",
                          headers={"Authorization": f"Bearer {tokens['a']}"}, timeout=10)
        assert r.status_code == 409
        with ThreadPoolExecutor(3) as pool:
            trials = list(pool.map(lambda o: o.ask(), opts))
        extra = [opts[0].ask() for _ in range(2)]  # site a: three experiments in parallel
        assert [t.metadata["round"] for t in trials + extra] == [0] * 5
        assert srv.server.coordinator.last_round == 0
        for i, (o, t) in enumerate(zip(opts, trials)):
            o.tell(t, _f(i, t.params))
        with ThreadPoolExecutor(3) as pool:
            again = list(pool.map(lambda o: o.ask(), opts))
        assert [t.metadata["round"] for t in again] == [1, 1, 1]
        assert all(t.metadata["source"] == "model" for t in again)
        for o in opts:
            o.close()
