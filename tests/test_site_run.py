"""The closed lab loop: `CampaignLoop`, crash recovery, and `labfbo site run` on every transport."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import labfbo
from labfbo.adapters import Adapter, InstrumentBusy, Measurement
from labfbo.core.trial import Trial
from labfbo.lab import CampaignLoop, SiteConfig, StopRule, run_site
from labfbo.lab.loop import INTERRUPTED
from tests.fake_instrument import FakeInstrument

pytestmark = pytest.mark.integration  # `labfbo site run` in subprocesses

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0)])
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _f(params: dict[str, Any]) -> float:
    return (params["x"] - 0.3) ** 2


class Bench(Adapter):
    """A scripted asynchronous instrument: records every start; ``script`` decides each outcome."""

    name = "bench"
    poll_interval = 0.0

    def __init__(self, started: list[int], script: dict[int, Any] | None = None, crash_on: tuple = ()) -> None:
        self.started, self.script, self.crash_on = started, script or {}, crash_on
        self.polls: collections.Counter = collections.Counter()

    def submit(self, trial: Trial) -> dict:
        if ("submit-before", trial.id) in self.crash_on:
            raise KeyboardInterrupt  # the site dies before the instrument got the run
        self.started.append(trial.id)
        if ("submit-after", trial.id) in self.crash_on:
            raise KeyboardInterrupt  # ... or after it started, before the handle was journaled
        return {"id": trial.id, "x": trial.params["x"]}

    def poll(self, handle: dict) -> Any:
        self.polls[handle["id"]] += 1
        if ("poll", handle["id"]) in self.crash_on:
            raise KeyboardInterrupt
        outcome = self.script.get(handle["id"])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome if outcome is not None else _f(handle)

    def recover(self, trial: Trial) -> dict | None:
        return {"id": trial.id, "x": trial.params["x"]} if trial.id in self.started else None


def _opt(path: Path, n_init: int = 3) -> labfbo.Optimizer:
    return labfbo.Optimizer(SPACE, storage=str(path), seed=0, n_init=n_init, site="lab-a")


def test_loop_runs_the_budget_and_instrument_errors_become_failed_trials(tmp_path: Path) -> None:
    started: list[int] = []
    busy_once = iter([InstrumentBusy("column equilibrating")])

    class Flaky(Bench):
        def poll(self, handle: dict) -> Any:
            if handle["id"] == 1 and self.polls[1] == 0:
                self.polls[1] += 1
                raise next(busy_once)  # transient: asked again, not failed
            return super().poll(handle)

    adapter = Flaky(started, {2: RuntimeError("lamp failure"), 4: Measurement.failure("out of reagent", lot="A7"),
                              5: float("nan"), 6: (0.5, 0.1)})
    with _opt(tmp_path / "j") as opt:
        report = CampaignLoop(opt, adapter, budget=5, max_in_flight=2).run()
        assert report.stopped == "budget" and report.experiments == 8
        assert (report.completed, report.failed) == (5, 3) and sorted(started) == list(range(8))
        failed = {t.id: opt.state.trials[t.id].reason for t in opt.trials if opt.state.trials[t.id].state == "failed"}
        assert failed[2] == "RuntimeError: lamp failure" and failed[4] == "out of reagent"
        assert "unusable measurement nan" in failed[5]
        assert opt.state.trials[4].metadata["instrument"] == {"lot": "A7"}
        told = {o.trial_id: o for o in opt.observations}
        assert told[6].sem == 0.1 and told[0].value == pytest.approx(_f(opt.state.trials[0].params))
        assert opt.state.trials[0].metadata["dispatch"]["state"] == "submitted"  # the journaled way through


def test_stop_rules(tmp_path: Path) -> None:
    class Broken(Bench):
        def poll(self, handle: dict) -> Any:
            raise OSError("serial port closed")

    with _opt(tmp_path / "a") as opt:
        report = CampaignLoop(opt, Broken([]), budget=10, stop=StopRule(max_consecutive_failures=3)).run()
        assert report.stopped == "failures" and report.failed == 3 and len(opt.trials) == 3
        assert report.failures[0] == "trial 0: OSError: serial port closed"
    with _opt(tmp_path / "b") as opt:
        report = CampaignLoop(opt, Bench([]), budget=10, stop=StopRule(target=10.0)).run()
        assert report.stopped == "target" and report.completed == 1
    with _opt(tmp_path / "c", n_init=2) as opt:
        const = Bench([], {i: 1.0 for i in range(20)})
        report = CampaignLoop(opt, const, budget=10, stop=StopRule(patience=3)).run()
        assert report.stopped == "patience" and report.completed == 4  # the first, then 3 without improvement


@pytest.mark.parametrize("where", ["submit-before", "submit-after", "poll"])
def test_a_crash_loses_nothing_and_runs_nothing_twice(tmp_path: Path, where: str) -> None:
    """The site dies while trial 4 is being submitted / polled; a restarted loop finishes the campaign."""
    journal, started = tmp_path / "j", []
    opt = _opt(journal)
    with pytest.raises(KeyboardInterrupt):
        CampaignLoop(opt, Bench(started, crash_on=((where, 4),)), budget=4, max_in_flight=2).run()
    opt.close()
    before = {o.trial_id: o.value for o in opt.observations}
    with _opt(journal) as opt:
        opt.ask()  # a trial proposed but never sent before a crash: the loop sends it
        adapter = Bench(started)
        report = CampaignLoop(opt, adapter, budget=4, max_in_flight=2).run()
        after = {o.trial_id: o.value for o in opt.observations}
        assert before.items() <= after.items()  # no observation lost or changed
        assert len(started) == len(set(started))  # no experiment run twice
        assert report.completed + report.failed == 7  # n_init + budget, the trial asked by hand included
        state = opt.state.trials[4].state
        if where == "submit-before":  # never reached the instrument: unknown, so failed, not re-run
            assert state == "failed" and opt.state.trials[4].reason == INTERRUPTED and report.abandoned == 1
        else:  # the instrument has it: re-attached and polled
            assert state == "complete" and report.recovered >= 1 and adapter.polls[4] >= 1


def _site_yaml(path: Path, **overrides: Any) -> Path:
    cfg = {"site": "lab-a", "protocol": "independent", "seed": 0, "n_init": 3, "budget": 5, "max_in_flight": 2,
           "adapter": {"name": "simulated", "config": {"problem": "branin", "noise_std": 0.05, "run_time": 0.6,
                                                       "log": "runs.log"}}}
    cfg.update(overrides)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _labfbo(*args: str, cwd: Path, **kw: Any) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "labfbo"), *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _in_flight(recs: list[dict]) -> set[int]:
    """Runs the instrument has accepted ("submitted") and the journal has no result for; one killed while
    "submitting" is, by design, failed on restart (it may or may not have started): not what the drill checks."""
    state = {r["id"]: r["metadata"]["dispatch"]["state"] for r in recs
             if r["op"] == "note" and "dispatch" in r.get("metadata", {})}
    return {i for i, st in state.items() if st == "submitted"} - {r["id"] for r in recs if r["op"] in ("tell", "fail")}


def _records(journal: Path) -> list[dict]:
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip().endswith("}")]


def test_site_run_sigkill_drill(tmp_path: Path) -> None:
    """kill -9 `labfbo site run` mid-campaign, twice; each restart loses nothing and runs nothing twice."""
    cfg, journal = _site_yaml(tmp_path / "site.yaml"), tmp_path / "lab-a.journal"
    being_started: set[int] = set()  # runs the kill caught between "submitting" and "submitted"
    for kill_after_tells in (2, 5):
        for _attempt in range(3):  # a run may finish between the look and the kill: then kill again
            proc = _labfbo("site", "run", "--config", str(cfg), "--no-progress", cwd=tmp_path)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                recs = _records(journal) if journal.exists() else []
                tells = sum(r["op"] in ("tell", "fail") for r in recs)
                if tells >= kill_after_tells and _in_flight(recs):
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            in_flight = _in_flight(_records(journal))  # as the kill left it
            if in_flight:
                break
        assert in_flight, "the drill must kill the site with a run in flight"
        recs = _records(journal)
        kept = {r["id"]: r["value"] for r in recs if r["op"] == "tell"}
        done = {r["id"] for r in recs if r["op"] in ("tell", "fail")}
        last = {r["id"]: r["metadata"]["dispatch"]["state"] for r in recs
                if r["op"] == "note" and "dispatch" in r.get("metadata", {})}
        being_started |= {i for i, st in last.items() if st == "submitting" and i not in done}
    proc = _labfbo("site", "run", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert re.search(r"^stopped\s+budget$", out, re.M) and "8 of 8" in out
    assert int(out.split("re-attached after restart")[1].split()[0]) >= 1
    starts = [json.loads(line)["trial"] for line in (tmp_path / "runs.log").read_text().splitlines()]
    assert len(starts) == len(set(starts)), f"an experiment ran twice: {starts}"
    recs = _records(journal)
    final = {r["id"]: r["value"] for r in recs if r["op"] == "tell"}
    failed = {r["id"]: r["reason"] for r in recs if r["op"] == "fail"}
    assert kept.items() <= final.items() and len(final) + len(failed) == 8
    # the only failures are runs the kill caught while they were being started: the instrument cannot
    # tell whether they ran, so they are failed (not re-run), as documented in labfbo.lab.loop
    assert set(failed) <= being_started and all(v.startswith("interrupted") for v in failed.values()), failed


def test_site_run_reports_bad_configs_clearly(tmp_path: Path) -> None:
    bad = _site_yaml(tmp_path / "bad.yaml", colour="red")
    proc = _labfbo("site", "run", "--config", str(bad), cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "colour" in err and "Extra inputs are not permitted" in err
    proc = _labfbo("site", "run", "--config", str(_site_yaml(tmp_path / "ok.yaml")), "--adapter", "nope",
                   cwd=tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no adapter 'nope'; installed: command, csv, http, simulated" in err
    assert not (tmp_path / "lab-a.journal").exists()  # nothing was started


def test_site_run_federated_over_http_with_the_http_instrument(tmp_path: Path, monkeypatch) -> None:
    """Two sites in a `distribution` federation behind an HTTP coordinator, each on a REST instrument."""
    from labfbo.server.app import CoordinatorServer, ServerThread
    from labfbo.server.config import ServerConfig, new_token

    tokens = {s: new_token() for s in ("lab-a", "lab-b")}
    server_cfg = ServerConfig(protocol="distribution", seed=0, sites={s: h for s, (_, h) in tokens.items()},
                              space=SPACE.model_dump(mode="json"))
    reports: dict[str, Any] = {}
    with ServerThread(CoordinatorServer(server_cfg)) as srv, FakeInstrument(_f, polls_to_finish=2) as inst:
        def site(name: str) -> None:
            (tmp_path / f"{name}.token").write_text(tokens[name][0])
            cfg = SiteConfig.model_validate({
                "site": name, "protocol": "distribution", "coordinator": srv.url, "token_file": f"{name}.token",
                "space": SPACE.model_dump(mode="json")["params"], "n_init": 3, "budget": 3, "base_dir": tmp_path,
                "adapter": {"name": "http", "config": {"url": inst.url, "poll_interval": 0.01}}})
            reports[name] = run_site(cfg, progress=False)

        threads = [threading.Thread(target=site, args=(s,)) for s in tokens]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        keys = [k.split("/") for k in inst.started]  # site / campaign / trial id
        assert sorted((site, int(i)) for site, _, i in keys) == [(s, i) for s in sorted(tokens) for i in range(6)]
        assert len({(site, c) for site, c, _ in keys}) == 2  # one campaign id per site
    for name, report in reports.items():
        assert report.stopped == "budget" and report.completed == 6, name
    assert set(reports) == set(tokens)


MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not installed (pip install 'labfbo[mpi]')")
def test_site_run_over_mpi_as_in_the_example(tmp_path: Path) -> None:
    """The MPMD launch of examples/closed_loop/README.md: coordinator rank + two `site run` ranks."""
    shutil.copytree(ROOT / "examples" / "closed_loop" / "mpi", tmp_path, dirs_exist_ok=True)
    lab = str(BIN / "labfbo")
    cmd = [MPIEXEC, "-n", "1", lab, "coordinator", "serve", "--mpi", "--config", "consortium.yaml",
           ":", "-n", "1", lab, "site", "run", "--no-progress", "--budget", "2", "--config", "plant-1.yaml",
           ":", "-n", "1", lab, "site", "run", "--no-progress", "--budget", "2", "--config", "plant-2.yaml"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("6 of 6 (6 measured, 0 failed)") == 2
    for plant in ("plant-1", "plant-2"):
        sent = {r["op"] for r in _records(tmp_path / f"{plant}.journal")}
        assert "join" in sent and "tell" in sent


def test_a_plugin_package_is_discovered_after_pip_install(tmp_path: Path) -> None:
    """pip-install the adapter template (a separate package) into a folder; labfbo then finds and runs it."""
    target = tmp_path / "site-packages"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
    if importlib.util.find_spec("setuptools") and importlib.util.find_spec("wheel"):
        pip.append("--no-build-isolation")  # offline, with the build tools already here
    build = tmp_path / "plugin"
    shutil.copytree(ROOT / "examples" / "adapter_plugin", build)
    subprocess.run([*pip, str(build)], check=True, env=ENV, timeout=300, capture_output=True)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    listed = subprocess.run([str(BIN / "labfbo"), "site", "adapters"], env=env, capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert "toy_reactor      labfbo_toy_reactor.reactor:ToyReactorAdapter" in listed
    (tmp_path / "site.yaml").write_text("site: reactor-1\nobjective: maximize\nn_init: 3\nbudget: 1\n")
    run = subprocess.run([str(BIN / "labfbo"), "site", "run", "--adapter", "toy_reactor", "--config", "site.yaml",
                          "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "4 of 4 (4 measured, 0 failed)" in run.stdout


def test_runs_in_flight_on_another_adapter_are_not_touched(tmp_path: Path) -> None:
    journal, started = tmp_path / "j", []
    opt = _opt(journal)
    with pytest.raises(KeyboardInterrupt):
        CampaignLoop(opt, Bench(started, crash_on=(("poll", 0),)), budget=2).run()
    opt.close()
    size = journal.stat().st_size

    class Other(Bench):
        name = "other"

    with _opt(journal) as opt:
        with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="in flight on adapter bench; resume with"):
            CampaignLoop(opt, Other([]), budget=2).run()
    assert journal.stat().st_size == size


def test_ctrl_c_stops_cleanly_and_the_next_run_re_polls(tmp_path: Path) -> None:
    cfg = _site_yaml(tmp_path / "site.yaml", n_init=2, budget=0)
    cfg.write_text(cfg.read_text().replace("run_time: 0.6", "run_time: 3.0"))
    journal = tmp_path / "lab-a.journal"
    proc = _labfbo("site", "run", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (journal.exists() and '"submitted"' in journal.read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and re.search(r"^stopped\s+interrupted$", out, re.M), out + err
    assert "signal again to stop now" in err
    proc = _labfbo("site", "run", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "2 of 2 (2 measured, 0 failed)" in out, out + err
    assert int(out.split("re-attached after restart")[1].split()[0]) >= 1


def test_busy_instruments_non_json_metadata_and_restarts(tmp_path: Path) -> None:
    """Busy at submission -> deferred and re-sent after a restart; busy during recovery -> asked again,
    never guessed; metadata that is not JSON is dropped, the measurement kept."""
    journal, started = tmp_path / "j", []

    class Busy(Bench):
        poll_interval = 0.01

        def __init__(self, *a: Any, busy_submits: int = 0, busy_recovers: int = 0, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.busy_submits, self.busy_recovers = busy_submits, busy_recovers

        def submit(self, trial: Trial) -> dict:
            if self.busy_submits:
                self.busy_submits -= 1
                raise InstrumentBusy("autosampler busy")
            return super().submit(trial)

        def recover(self, trial: Trial) -> dict | None:
            if self.busy_recovers:
                self.busy_recovers -= 1
                raise InstrumentBusy("instrument unreachable")
            return super().recover(trial)

        def poll(self, handle: dict) -> Any:
            return Measurement.ok(_f(handle), when=np.datetime64("2026-01-01"))  # not JSON

    opt = _opt(journal)
    loop = CampaignLoop(opt, Busy(started, busy_submits=10), budget=2)
    with pytest.warns(UserWarning, match="autosampler busy; retrying with back-off"):
        threading.Timer(0.3, loop.interrupt).start()
        assert loop.run().stopped == "interrupted"
    assert opt.pending[0].metadata["dispatch"]["state"] == "deferred" and not started
    opt.close()
    # the deferred trial never started: a restart sends it (then a crash right after the instrument
    # started trial 2), and the next restart finds trial 2 while the instrument is unreachable at first
    with _opt(journal) as opt:
        with pytest.raises(KeyboardInterrupt):
            CampaignLoop(opt, Busy(started, crash_on=(("submit-after", 2),)), budget=2).run()
    with _opt(journal) as opt, pytest.warns(UserWarning, match="metadata dropped"):
        adapter = Busy(started, busy_recovers=2)
        report = CampaignLoop(opt, adapter, budget=2).run()
        assert report.stopped == "budget" and report.completed == 5 and report.abandoned == 0
        assert report.recovered == 1
        assert sorted(started) == [0, 1, 2, 3, 4] and "instrument" not in opt.trials[0].metadata


def test_a_refused_configuration_leaves_no_journal(tmp_path: Path) -> None:
    cfg = SiteConfig.model_validate({"site": "lab-a", "space": [{"name": "temperature", "type": "real", "low": 0,
                                                                   "high": 1}], "base_dir": tmp_path,
                                     "adapter": {"name": "simulated", "config": {"problem": "branin"}}})
    with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="not the simulated problem's"):
        run_site(cfg, progress=False)
    assert not (tmp_path / "lab-a.journal").exists()


def test_the_loop_does_not_spin_while_runs_are_in_flight(tmp_path: Path) -> None:
    """One slot, a long run in flight and a proposed trial waiting for the slot: the loop polls the
    run at the poll interval instead of spinning."""

    class Slow(Bench):
        poll_interval = 0.05

        def submit(self, trial: Trial) -> dict:
            return {**super().submit(trial), "t": time.monotonic()}

        def poll(self, handle: dict) -> Any:
            self.polls[handle["id"]] += 1
            return 0.0 if time.monotonic() - handle["t"] >= 0.5 else None  # a 0.5 s run

    with _opt(tmp_path / "j") as opt:
        opt.ask(n=2)  # two proposed trials, one slot: the second waits while the first runs
        adapter = Slow([])
        report = CampaignLoop(opt, adapter, budget=0, max_in_flight=1).run()
        assert report.completed == 3 and adapter.polls[0] <= 15  # ~ one poll per 0.05 s, not thousands
