"""A Flower ServerApp stopped mid-campaign and started again resumes its study from ``state:``:
a deployment of its own (a SuperLink and two SuperNodes, no TLS: what is checked is the
coordinator's durability, not Flower's transport security, which test_flower.py covers)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest
import yaml

import labfbo

flwr = pytest.importorskip("flwr")

from campaign import local_proposals  # noqa: E402

from labfbo.server.config import ServerConfig, hash_token  # noqa: E402
from labfbo.transport.flower import FlowerCoordinator  # noqa: E402
from labfbo.transport.flower_deploy import FlowerSite, LocalFlowerDeployment  # noqa: E402

FAST = {"num_restarts": 2, "raw_samples": 32}
SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFlowerDeployment]:
    with LocalFlowerDeployment(2, tmp_path_factory.mktemp("flower-restart")) as fl:
        yield fl


def _f(i: int, t: labfbo.Trial) -> float:
    return (t.params["x"] - 0.3 * i) ** 2 + t.params["y"] ** 2


@pytest.mark.timeout(900, method="signal")
def test_a_serverapp_stopped_and_started_again_resumes_its_study(deployment, tmp_path) -> None:
    """Round 0 runs; site-0 waits for round 1 when the run is stopped (``flwr stop``); the study
    started again on the same consortium.yaml resumes at round 1 (its sites join again at their
    index) and proposes exactly what an uninterrupted in-process study does."""
    fl = deployment
    names = [s.name for s in fl.sites]
    cfg = ServerConfig(protocol="consensus", seed=3, horizon=6, space=SPACE.model_dump(mode="json"), options=FAST,
                       sites={s.name: hash_token(s.token) for s in fl.sites},
                       state="state.sqlite", audit_log="audit.jsonl")  # relative: beside the consortium.yaml
    path = tmp_path / "consortium.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    run = fl.run(path, **{"poll-timeout": 20.0})

    def site(s: FlowerSite) -> labfbo.Optimizer:
        return labfbo.Optimizer(SPACE, protocol="consensus", site=s.name, seed=3, n_init=3, **FAST,
                                coordinator=FlowerCoordinator(s.coordinator, s.token, close_wait=120))

    opts: list[labfbo.Optimizer] = []
    proposals = []
    try:
        with ThreadPoolExecutor(2) as pool:
            opts += pool.map(site, fl.sites)  # both join in the same polls
            for i, o in enumerate(opts):
                for t in o.ask(n=3):
                    o.tell(t, _f(i, t))
            got = list(pool.map(lambda o: o.ask(timeout=180), opts))  # round 0
            assert {t.metadata["source"] for t in got} == {"model"}
            proposals.append([t.params for t in got])
            for i, (o, t) in enumerate(zip(opts, got)):
                o.tell(t, _f(i, t))
            waiting = pool.submit(opts[0].ask, timeout=300)  # site-0 waits for round 1; site-1 has not asked
            fl.cancel(run)  # the ServerApp stops (flwr stop)
            assert "round 0 done" in run.log.read_text() and "round 1 starts" not in run.log.read_text()
            run = fl.run(path, **{"poll-timeout": 20.0})  # started again: the same study
            late = opts[1].ask(timeout=300)
            got = [waiting.result(), late]
            assert [t.metadata["round"] for t in got] == [1, 1] and {t.metadata["source"] for t in got} == {"model"}
            proposals.append([t.params for t in got])
    finally:
        with ThreadPoolExecutor(2) as pool:  # both leaves are heard in the same poll
            list(pool.map(lambda o: o.close(), opts))
    log = fl.wait(run, timeout=180)
    assert "resumed: 2 site(s) joined, last round 0" in log and "round 1 starts" in log
    assert "round 0 starts" not in log and "study labfbo-study done: 2 rounds" in log
    # an uninterrupted in-process study of the same seed proposes the same
    assert local_proposals("consensus", names, SPACE, 3, _f, 2, horizon=6, **FAST) == proposals[:2]
    audit = [json.loads(ln) for ln in (tmp_path / "audit.jsonl").read_text().splitlines()]
    joins = [e["site"] for e in audit if e["route"] == "flower/join" and e["decision"] == 200]
    assert sorted(joins) == sorted(names * 2)  # each site's join, and its join again after the restart
    assert {e["site"] for e in audit if e["route"] == "flower/answer" and e["round"] == 1} == set(names)
    assert not any(s.token in (tmp_path / "audit.jsonl").read_text() for s in fl.sites)
