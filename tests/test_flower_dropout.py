"""The Flower transport when a SuperNode is killed mid-campaign: a deployment of its own (a module
of its own, so the suite's two processes run it beside the same-proposals tests of test_flower.py)."""

from __future__ import annotations

import json
import re
import threading
import time
import warnings

import pytest
import yaml

import labfbo

flwr = pytest.importorskip("flwr")

from flower_fixtures import deployment, logs  # noqa: E402,F401 - the module's deployment fixture

from labfbo.server.config import ServerConfig, hash_token  # noqa: E402
from labfbo.transport.flower import FlowerCoordinator  # noqa: E402
from labfbo.transport.flower_deploy import LocalFlowerDeployment  # noqa: E402

FAST = {"num_restarts": 2, "raw_samples": 32}
EXTRA = {"distribution": {"M": 64, "candidates": 128}}
SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])

pytestmark = pytest.mark.integration


def test_a_killed_supernode_is_left_out_by_quorum_and_its_site_resumes_from_its_journal(deployment, tmp_path) -> None:  # noqa: F811 - the fixture
    fl = deployment
    names = [s.name for s in fl.sites]
    cfg = ServerConfig(protocol="distribution", seed=1, quorum=2, deadline=30.0, space=SPACE.model_dump(mode="json"),
                       sites={n: hash_token(s.token) for n, s in zip(names, fl.sites)},
                       options={**FAST, **EXTRA["distribution"]})
    path = tmp_path / "consortium.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    run = fl.run(path, **{"poll-timeout": 20.0})

    def site(i: int) -> labfbo.Optimizer:
        s = fl.sites[i]
        return labfbo.Optimizer(SPACE, protocol="distribution", site=s.name, seed=1, n_init=3,
                                storage=str(tmp_path / f"{s.name}.jsonl"), **FAST, **EXTRA["distribution"],
                                coordinator=FlowerCoordinator(s.coordinator, s.token, close_wait=30))

    def f(i: int, t) -> float:
        return (t.params["x"] - 0.1 * i) ** 2 + t.params["y"] ** 2

    opts = [site(i) for i in range(3)]
    try:
        for i, o in enumerate(opts):
            for t in o.ask(n=3):
                o.tell(t, f(i, t))
        first = _ask_all(opts, timeout=120)
        for i, (o, t) in enumerate(zip(opts, first)):
            o.tell(t, f(i, t))
        # round 1: every site asks; site 2's SuperNode dies while the round waits for its answer
        arrived, release = threading.Event(), threading.Event()
        answer = opts[2].agent.link.handler

        def stuck(frame: bytes) -> bytes:
            arrived.set()
            release.wait(120)
            return answer(frame)

        opts[2].agent.link.handler = stuck
        got: dict[int, object] = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, _try_ask(opts[i], 45 if i == 2 else 120)))
                   for i in range(3)]
        for th in threads:
            th.start()
        assert arrived.wait(120), "round 1 never asked site 2"
        fl.kill_node(2)
        release.set()
        for th in threads:
            th.join()
        assert got[2].metadata["source"] == "model-last-guidance"  # its SuperNode is gone: it proposed alone
        for i in range(3):
            opts[i].tell(got[i], f(i, got[i]))
        assert all(got[i].metadata["round"] == 1 and got[i].metadata["source"] == "model" for i in (0, 1))
        assert _contributions(fl, run, 1) and all(c == ["site-0", "site-1"] for c in _contributions(fl, run, 1))
        # the lab restarts: its SuperNode, and its script from the journal
        opts[2].agent.link.cfg.close_wait = 0  # (a crash: no goodbye reaches the coordinator)
        opts[2].close()
        fl.start_node(2)
        opts[2] = site(2)
        assert len(opts[2].observations) == 5 and opts[2].context.site_index == 2
        caught_up = opts[2].ask(timeout=180)  # behind the clock: round 1's guidance, at once
        assert caught_up.metadata["round"] == 1 and caught_up.metadata["source"] == "model"
        opts[2].tell(caught_up, f(2, caught_up))
        second = _ask_all(opts, timeout=180)
        assert all(t.metadata["round"] == 2 and t.metadata["source"] == "model" for t in second)
        for i, (o, t) in enumerate(zip(opts, second)):
            o.tell(t, f(i, t))
    finally:
        for o in opts:
            o.close()
    fl.wait(run, timeout=120)
    assert _contributions(fl, run, 2) and all(c == ["site-0", "site-1", "site-2"] for c in _contributions(fl, run, 2))


def _contributions(fl: LocalFlowerDeployment, run, t: int) -> list[list[str]]:
    """Who contributed to each exchange of round ``t`` (the ServerApp's log)."""
    found = re.search(rf"round {t} done in [0-9.]+ s; contributions (\[.*\])", logs(fl, run.log.name))
    assert found, logs(fl, run.log.name)[-3000:]
    return json.loads(found.group(1))


def _try_ask(opt: labfbo.Optimizer, timeout: float):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no guidance": the site whose SuperNode died proposes alone
        return opt.ask(timeout=timeout)


def _ask_all(opts, **kw) -> list:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(opts)) as pool:
        return list(pool.map(lambda o: o.ask(**kw), opts))


def _wait_for(cond, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.2)
