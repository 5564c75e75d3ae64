"""Chaos: 4 sites over HTTP, two experiments each in flight with random measurement times; one
site and then the coordinator are SIGKILLed mid-campaign and restarted (quorum 3, deadline 2 s).

The campaign completes; no observation is lost, no experiment is started twice, no round
is skipped or run twice, and every site's journal replays to the state the site ended with.
About 1–3 minutes. ``LABFBO_CHAOS_RUNS=10`` runs it ten times in a row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from coordinator_process import free_port, start_coordinator

import labfbo
from labfbo.server.config import new_token
from labfbo.transport.http import HTTPCoordinator

pytestmark = pytest.mark.integration  # subprocess sites killed and restarted

SITES = ["s0", "s1", "s2", "s3"]
BUDGET = 8
SITE_SCRIPT = Path(__file__).parent / "chaos" / "site.py"
SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
OPTIONS = {"M": 32, "candidates": 64, "num_restarts": 1, "raw_samples": 16}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


class Consortium:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.port = tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tokens = {s: new_token() for s in SITES}
        self.admin, admin_hash = new_token()
        cfg = {"protocol": "distribution", "seed": 3, "quorum": 3, "deadline": 2.0,
               "sites": {s: h for s, (_, h) in self.tokens.items()}, "admin_token_sha256": admin_hash,
               "space": SPACE.model_dump(mode="json"), "options": OPTIONS, "state": str(tmp / "coord.sqlite")}
        (tmp / "consortium.yaml").write_text(yaml.safe_dump(cfg))
        self.coordinator: subprocess.Popen | None = None
        self.sites: dict[str, subprocess.Popen] = {}

    def start_coordinator(self) -> None:
        self.coordinator = start_coordinator(self.tmp / "consortium.yaml", self.port, self.tmp / "coord.err")

    def start_site(self, s: str) -> None:
        self.sites[s] = subprocess.Popen(
            [sys.executable, str(SITE_SCRIPT), self.url, s, self.tokens[s][0], str(self.tmp), str(BUDGET)],
            env=ENV, stdout=open(self.tmp / f"{s}.out", "a"), stderr=subprocess.STDOUT)

    def rounds_done(self) -> list[int]:
        try:
            r = requests.get(
                f"{self.url}/v1/admin/status", headers={"Authorization": f"Bearer {self.admin}"}, timeout=5
            )
            return r.json()["rounds_done"] if r.status_code == 200 else []
        except requests.RequestException:
            return []

    def kill(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for p in [*self.sites.values(), self.coordinator]:
            if p is not None and p.poll() is None:
                self.kill(p)


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a torn last line from the SIGKILL
    return out


def _campaign(tmp: Path) -> None:
    c = Consortium(tmp)
    c.start_coordinator()
    try:
        for s in SITES:
            c.start_site(s)
        stage, end = 0, time.monotonic() + 420
        while any(p.poll() is None for p in c.sites.values()):
            assert time.monotonic() < end, "the campaign did not finish in 7 minutes"
            done = c.rounds_done()
            if stage == 0 and len(done) >= 2:  # a site dies mid-flight and comes back
                c.kill(c.sites["s1"])
                c.start_site("s1")
                stage = 1
            elif stage == 1 and len(done) >= 4:  # then the coordinator
                c.kill(c.coordinator)
                c.start_coordinator()
                stage = 2
            time.sleep(0.3)
        assert stage == 2, f"the campaign ended before both kills ({c.rounds_done()})"
        for s, p in c.sites.items():
            assert p.returncode == 0, (s, (tmp / f"{s}.out").read_text()[-3000:])
        rounds = c.rounds_done()
        assert rounds == list(range(len(rounds))) and len(rounds) >= 4  # none skipped, none twice
        for s in SITES:
            events = _events(tmp / f"{s}.instrument.jsonl")
            starts = [e["id"] for e in events if e["event"] == "start"]
            assert len(starts) == len(set(starts)), f"{s} started an experiment twice"
            finished = {e["id"]: e["value"] for e in events if e["event"] == "finish"}
            final = json.loads((tmp / f"{s}.final.json").read_text())
            told = {o["trial_id"]: o["value"] for o in final["observations"]}
            assert len(told) == 2 + BUDGET and told == finished  # every measurement told, once
            assert set(starts) == set(told)
            # the journal replays to the state the site ended with
            with labfbo.Optimizer(SPACE, protocol="distribution", site=s, seed=3, n_init=2,
                                  storage=str(tmp / f"{s}.jsonl"), coordinator=HTTPCoordinator(c.url, c.tokens[s][0]),
                                  **OPTIONS) as again:
                assert [o.model_dump() for o in again.observations] == final["observations"]
                assert [t.model_dump() for t in again.trials] == final["trials"]
                used = [t.metadata["round"] for t in again.trials if t.metadata["source"] == "model"]
                assert used == sorted(used) and max(used) <= rounds[-1]  # the site's rounds never went back
    finally:
        c.stop()


@pytest.mark.timeout(1800, method="signal")
def test_chaos_campaign_completes_and_loses_nothing(tmp_path: Path) -> None:
    runs = int(os.environ.get("LABFBO_CHAOS_RUNS", "1"))
    for i in range(runs):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        start = time.monotonic()
        _campaign(run_dir)
        print(f"chaos run {i + 1}/{runs}: passed in {time.monotonic() - start:.0f} s", flush=True)
