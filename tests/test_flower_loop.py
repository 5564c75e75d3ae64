"""The Flower ServerApp loop and the site bridge, on an in-process grid (no Flower processes).

The grid below stands in for Flower's: each message goes through the real codec
(``to_content`` / ``from_content``) and the real bridge protocol (``call_site``) to the
sites' bridges, in threads, so the loop's semantics are checked in seconds.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from campaign import local_proposals

import labfbo
from labfbo.coordinator import Coordinator
from labfbo.core.messages import NoGuidance

pytest.importorskip("flwr")

from labfbo.flower_app import labfbo_flower_relay as relay  # noqa: E402
from labfbo.server.config import hash_token  # noqa: E402
from labfbo.transport import flower_server  # noqa: E402
from labfbo.transport.flower import FlowerCoordinator  # noqa: E402
from labfbo.transport.flower_deploy import free_port  # noqa: E402
from labfbo.transport.flower_server import FlowerServer  # noqa: E402

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
FAST = {"num_restarts": 2, "raw_samples": 32}


@pytest.fixture(autouse=True)
def _run_context(monkeypatch):
    """Flower messages need a run's identity (a ServerApp has one)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(flower_server, "PULL_PAUSE", 0.02)


class Grid:
    """Nodes answer through ``handlers[node](control, body) -> (control, body)``, in threads."""

    def __init__(self, handlers: dict[int, Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]]):
        self.handlers = handlers
        self.ids = itertools.count()
        self.pool = ThreadPoolExecutor(8)
        self.futures: dict[str, Any] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.handlers)

    def push_messages(self, msgs) -> list[str]:
        ids = []
        for m in msgs:
            mid = f"m{next(self.ids)}"
            control, body = relay.from_content(m.content)
            self.futures[mid] = self.pool.submit(self.handlers[m.metadata.dst_node_id], control, body)
            ids.append(mid)
        return ids

    def pull_messages(self, ids) -> list[Any]:
        out = []
        for mid in ids:
            fut = self.futures.get(mid)
            if fut is None or not fut.done():
                continue
            del self.futures[mid]
            meta = SimpleNamespace(reply_to_message_id=mid)
            if fut.exception() is not None:
                err = SimpleNamespace(code=2, reason=repr(fut.exception()))
                out.append(SimpleNamespace(metadata=meta, has_error=lambda: True, error=err))
            else:
                out.append(SimpleNamespace(metadata=meta, has_error=lambda: False, content=relay.to_content(
                    fut.result()[1], **fut.result()[0])))
        return out


def bridged(sites: dict[str, tuple[str, str]]) -> Grid:
    """Node ``i + 1`` relays to site ``i``'s bridge ``(address, token)``, as the ClientApp does."""
    return Grid({i + 1: (lambda c, b, a=a, t=t: relay.call_site(a, t, c, b))
                 for i, (a, t) in enumerate(sites.values())})


def test_the_quorum_counts_only_answers_that_decode() -> None:
    """A site that reports an error does not make the quorum: the exchange waits for the slow one."""
    def failing(control, body):
        return {"op": "answer"}, json.dumps({"error": "ValueError", "message": "broken"}).encode()

    def slow(control, body):
        time.sleep(0.5)
        return {"op": "answer"}, NoGuidance().to_wire()

    coord = Coordinator("consensus", sites=["a", "b"], space=SPACE, horizon=3)
    server = FlowerServer(coord, Grid({1: failing, 2: slow}), tokens={"a": hash_token("x"), "b": hash_token("y")})
    server.node_of = {"a": 1, "b": 2}
    out = server.gather({"a": NoGuidance(), "b": NoGuidance()}, quorum=1, deadline=0.0)
    assert isinstance(out["b"], NoGuidance)
    assert isinstance(out["a"], labfbo.FederationError) and "broken" in str(out["a"])


class Study:
    """A FlowerServer in a thread and bridges on free ports."""

    def __init__(self, names: list[str], **coord: Any) -> None:
        self.tokens = {n: f"token-{n}" for n in names}
        self.addresses = {n: f"127.0.0.1:{free_port()}" for n in names}
        self.coord = Coordinator("consensus", sites=names, space=SPACE, seed=0, horizon=6, **coord)
        self.server = FlowerServer(self.coord, bridged({n: (self.addresses[n], self.tokens[n]) for n in names}),
                                   tokens={n: hash_token(t) for n, t in self.tokens.items()}, poll_timeout=5)
        self.thread = threading.Thread(target=self.server.serve, kwargs={"max_seconds": 120}, daemon=True)
        self.thread.start()

    def site(self, name: str, **kw: Any) -> labfbo.Optimizer:
        link = FlowerCoordinator(f"flower://{self.addresses[name]}", self.tokens[name], linger=0.2, **kw)
        return labfbo.Optimizer(SPACE, protocol="consensus", site=name, seed=0, n_init=3, coordinator=link, **FAST)


def _f(t) -> float:
    return t.params["x"] ** 2 + t.params["y"] ** 2


def test_a_site_behind_the_clock_gets_the_current_guidance_and_a_leave_is_acknowledged() -> None:
    study = Study(["a", "b"], quorum=1, deadline=0.3)
    a = study.site("a")
    for t in a.ask(n=3):
        a.tell(t, _f(t))
    for _ in range(2):  # rounds 0 and 1 without b (quorum 1)
        t = a.ask(timeout=30)
        assert t.metadata["source"] == "model"
        a.tell(t, _f(t))
    assert study.coord.last_round == 1
    b = study.site("b")  # joins late: it asks for round 0 and gets round 1's guidance, at once
    for t in b.ask(n=3):
        b.tell(t, _f(t))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the local model
        late = b.ask(timeout=30)
    assert late.metadata["round"] == 1 and late.metadata["source"] == "model"
    b.tell(late, _f(late))
    start, link = time.monotonic(), a.agent.link
    a.close()  # heard and acknowledged at the next poll
    assert time.monotonic() - start < 10 and link.left_heard
    nxt = b.ask(timeout=30)
    assert nxt.metadata["round"] == 2
    b.tell(nxt, _f(nxt))
    b.close()
    study.thread.join(30)
    assert not study.thread.is_alive() and study.server.done()


def test_a_site_on_a_new_node_is_told_to_join_again() -> None:
    """A SuperNode restarted without node authentication comes back with a new node id."""
    study = Study(["a"])
    a = study.site("a")
    for t in a.ask(n=3):
        a.tell(t, _f(t))
    t = a.ask(timeout=30)
    a.tell(t, _f(t))
    grid = study.server.grid
    grid.handlers = {7: grid.handlers[1]}  # the same bridge behind node 7
    t = a.ask(timeout=30)
    assert t.metadata["round"] == 1 and t.metadata["source"] == "model"
    assert study.server.node_of["a"] == 7
    a.close()
    study.thread.join(30)
    assert not study.thread.is_alive()


def test_the_bridge_checks_the_token_before_reading_a_body() -> None:
    link = FlowerCoordinator(f"flower://127.0.0.1:{free_port()}", "s3cret", linger=0).connect("a")
    link._start()
    try:
        address = f"{link.cfg.host}:{link.cfg.port}"
        with pytest.raises(relay.RelayError, match="wrong token"):
            relay.call_site(address, "guess", {"op": "poll"}, b"x" * 1000)
        with pytest.raises(relay.RelayError):  # refused and cut off before its 10 MB are read
            relay.call_site(address, "guess", {"op": "poll"}, b"x" * 10_000_000)
        status, body = relay.call_site(address, "s3cret", {"op": "poll"}, b"")
        assert status == {"op": "status", "site": "a", "wants": -1, "closed": False, "join": False} and body == b""
        _, answer = relay.call_site(address, "s3cret", {"op": "request"}, NoGuidance().to_wire())
        assert json.loads(answer)["error"] == "FederationError"  # not joined: nothing is answered
    finally:
        link.close()
    with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="token"):
        FlowerCoordinator("flower://127.0.0.1:9", "")
    with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="this machine only"):
        FlowerCoordinator("flower://0.0.0.0:9500", "t")


def test_the_bridge_cuts_off_trickling_and_surplus_connections(monkeypatch) -> None:
    """A connection that trickles its control part holds its thread at most CONTROL_TIMEOUT; beyond
    MAX_BRIDGE_CONNECTIONS at once a new connection is closed at once; the relay then still gets in."""
    import socket
    import time

    from labfbo.transport import flower

    monkeypatch.setattr(flower, "CONTROL_TIMEOUT", 1.0)
    link = FlowerCoordinator(f"flower://127.0.0.1:{free_port()}", "s3cret", linger=0).connect("a")
    link._start()
    try:
        address = (link.cfg.host, link.cfg.port)
        trickle = socket.create_connection(address)
        trickle.settimeout(10)
        start = time.monotonic()
        for _ in range(4):  # one byte of the length prefix a second (each under any per-read timeout)
            try:
                trickle.sendall(b"\x00")
            except OSError:
                break
            time.sleep(0.4)
        assert trickle.recv(10) == b"" and time.monotonic() - start < 5  # closed by the control deadline
        idle = [socket.create_connection(address) for _ in range(flower.MAX_BRIDGE_CONNECTIONS + 8)]
        for sock in idle:
            sock.settimeout(5)
        time.sleep(0.3)
        cut = sum(1 for sock in idle[flower.MAX_BRIDGE_CONNECTIONS:] if sock.recv(10) == b"")
        assert cut == 8  # the surplus closed at once, long before the control deadline
        time.sleep(1.5)  # the others' deadline passes: their slots are free again
        status, _ = relay.call_site(f"{address[0]}:{address[1]}", "s3cret", {"op": "poll"}, b"")
        assert status["op"] == "status"
        for sock in idle + [trickle]:
            sock.close()
    finally:
        link.close()


def test_a_join_without_a_coordinator_times_out_and_frees_its_port() -> None:
    port = free_port()
    with pytest.raises(labfbo.FederationError, match="no poll from the coordinator"):
        labfbo.Optimizer(SPACE, protocol="consensus", site="a", seed=0, n_init=3,
                         coordinator=FlowerCoordinator(f"flower://127.0.0.1:{port}", "t", join_timeout=1.0))
    link = FlowerCoordinator(f"flower://127.0.0.1:{port}", "t").connect("a")
    link._start()  # the port is free again
    link.close()


@pytest.fixture
def serving():
    """``serving(server)`` runs the server's loop in a thread and returns the function that stops it
    (after its current poll); every loop still running stops at the end of the test."""
    halts: list[Callable[[], None]] = []

    def start(server: FlowerServer) -> Callable[[], None]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set() and not server.done():
                server.poll()
                server.start_round()
            if server.done() and server.pending:
                server.poll()  # the last "bye" (as serve() does)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join(30)
            assert not thread.is_alive()
        halts.append(halt)
        return halt
    yield start
    for halt in halts:
        halt()


def test_a_server_restarted_on_its_store_resumes_the_study_and_hears_a_leave_made_while_it_was_away(
        tmp_path, serving) -> None:
    """The sites' bridges are told to join again, rejoin at their index, and the restored clock serves
    the round they wait for: the same proposals as in-process; a site that left while the server was
    away is heard, so the next server ends the study."""
    from labfbo.server.store import AuditLog, Store

    names = ["a", "b"]
    tokens = {n: f"token-{n}" for n in names}
    addresses = {n: f"127.0.0.1:{free_port()}" for n in names}
    grid = bridged({n: (addresses[n], tokens[n]) for n in names})
    state, log = str(tmp_path / "state.sqlite"), tmp_path / "audit.jsonl"

    def server() -> FlowerServer:
        return FlowerServer(Coordinator("consensus", sites=names, space=SPACE, seed=0, horizon=6), grid,
                            tokens={n: hash_token(t) for n, t in tokens.items()}, poll_timeout=5,
                            store=Store(state), audit=AuditLog(str(log)))

    def f(i: int, t) -> float:
        return (t.params["x"] - 0.3 * i) ** 2 + t.params["y"] ** 2

    first = server()
    halt = serving(first)
    opts = [labfbo.Optimizer(SPACE, protocol="consensus", site=n, seed=0, n_init=3, **FAST,
                             coordinator=FlowerCoordinator(f"flower://{addresses[n]}", tokens[n], linger=0.2,
                                                           close_wait=30)) for n in names]
    proposals = []
    with ThreadPoolExecutor(2) as pool:
        for i, o in enumerate(opts):
            for t in o.ask(n=3):
                o.tell(t, f(i, t))
        for _ in range(2):  # rounds 0 and 1
            got = list(pool.map(lambda o: o.ask(timeout=30), opts))
            proposals.append([t.params for t in got])
            for i, (o, t) in enumerate(zip(opts, got)):
                o.tell(t, f(i, t))
        waiting = pool.submit(opts[0].ask, timeout=60)  # a waits for round 2, b has not asked: the server stops
        end = time.monotonic() + 30
        while first.gate.wants.get("a") != 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert first.gate.wants.get("a") == 2
        halt()
        first.store.close()
        second = server()
        assert second.coord.members == {"a": 0, "b": 1} and second.coord.last_round == 1
        assert sorted(second.coord.rounds) == [0, 1] and not second.node_of
        halt = serving(second)
        late = opts[1].ask(timeout=60)  # b asks: round 2 runs on the restored clock
        got = [waiting.result(), late]
        assert [t.metadata["round"] for t in got] == [2, 2] and {t.metadata["source"] for t in got} == {"model"}
        proposals.append([t.params for t in got])
        for i, (o, t) in enumerate(zip(opts, got)):
            o.tell(t, f(i, t))
        halt()
        second.store.close()
        link = opts[0].agent.link
        leaving = pool.submit(opts[0].close)  # a leaves while no server runs: the next one hears it
        end = time.monotonic() + 30
        while not link.closed and time.monotonic() < end:  # closed before the next server polls its bridge
            time.sleep(0.01)
        third = server()
        halt = serving(third)
        leaving.result(timeout=30)
        assert link.left_heard
        opts[1].close()
        halt()
    assert third.done() and third.store.gone() == {"a", "b"}
    third.store.close()
    last = server()
    assert last.done()  # every site has left: a server started again on the store ends at once
    last.store.close()
    # an uninterrupted in-process study proposes the same
    assert local_proposals("consensus", names, SPACE, 0, f, 3, horizon=6, **FAST) == proposals[:3]
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    seen = {(e["site"], e["route"], e["round"], e["decision"]) for e in lines}
    assert {("a", "flower/join", None, 200), ("b", "flower/answer", 2, 200), ("a", "flower/want", 2, 202),
            ("a", "flower/leave", None, 200), ("b", "flower/leave", None, 200)} <= seen
    assert sum(e["route"] == "flower/join" and e["site"] == "a" for e in lines) == 2  # its join, its rejoin
    assert not any(t in log.read_text() for t in tokens.values())
