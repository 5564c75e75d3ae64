"""One site of the chaos test: two experiments in flight, random measurement times, restart-safe.

    python tests/chaos/site.py URL SITE TOKEN WORKDIR BUDGET

The simulated instrument keeps its own log (``SITE.instrument.jsonl``: every start and
every finish, fsync-ed), as a real one would: after a restart the script tells what
finished while it was down and waits for what is still running — it never starts an
experiment twice. At the end it writes ``SITE.final.json`` (its observations and trials).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import labfbo  # noqa: E402
from labfbo.transport.http import HTTPCoordinator  # noqa: E402

URL, SITE, TOKEN, WORKDIR, BUDGET = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
OPTIONS = {"M": 32, "candidates": 64, "num_restarts": 1, "raw_samples": 16}
N_INIT, IN_FLIGHT = 2, 2
LOG = os.path.join(WORKDIR, f"{SITE}.instrument.jsonl")


def measure(params: dict) -> float:
    shift = int(SITE[-1]) * 0.1
    return (params["x"] - shift) ** 2 + (params["y"] + shift) ** 2


def log(event: dict) -> None:
    with open(LOG, "a") as fh:
        fh.write(json.dumps(event) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def instrument_state() -> tuple[set[int], dict[int, float]]:
    started, finished = set(), {}
    if os.path.exists(LOG):
        for line in open(LOG).read().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a torn last line: the event did not happen
            if e["event"] == "start":
                started.add(e["id"])
            else:
                finished[e["id"]] = e["value"]
    return started, finished


rng = random.Random(f"{SITE}-{time.time_ns()}")
link = HTTPCoordinator(URL, TOKEN, retries=20, backoff=0.2)
with labfbo.Optimizer(SPACE, protocol="distribution", coordinator=link, site=SITE, seed=3, n_init=N_INIT,
                      storage=os.path.join(WORKDIR, f"{SITE}.jsonl"), **OPTIONS) as opt:
    started, finished = instrument_state()
    running: dict[int, tuple[labfbo.Trial, float]] = {}

    def run(trial: labfbo.Trial) -> None:
        if trial.id not in started:
            log({"event": "start", "id": trial.id, "params": trial.params})
            started.add(trial.id)
        running[trial.id] = (trial, time.monotonic() + rng.uniform(0.05, 0.8))

    for trial in opt.pending:  # what was in flight when the script stopped
        if trial.id in finished:
            opt.tell(trial, finished[trial.id])
        else:
            run(trial)
    while len(opt.observations) < N_INIT + BUDGET:
        while len(running) < IN_FLIGHT and len(opt.observations) + len(running) < N_INIT + BUDGET:
            run(opt.ask())  # a plain ask: waits for the round, however long
        tid = min(running, key=lambda k: running[k][1])
        trial, done_at = running.pop(tid)
        time.sleep(max(0.0, done_at - time.monotonic()))
        value = measure(trial.params)
        log({"event": "finish", "id": tid, "value": value})
        opt.tell(trial, value)
    final = {"observations": [o.model_dump() for o in opt.observations],
             "trials": [t.model_dump() for t in opt.trials]}
with open(os.path.join(WORKDIR, f"{SITE}.final.json"), "w") as fh:
    json.dump(final, fh)
print(f"{SITE}: done, {len(final['observations'])} observations", flush=True)
