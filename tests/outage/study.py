"""A 4-lab ``surface`` study over HTTP whose coordinator is SIGKILLed mid-round and restarted.

    python tests/outage/study.py WORKDIR --outages 3:12 6:60   # kill in round 3 for 12 s, in round 6 for 60 s

Every lab runs in a thread of this process and calls ``ask(timeout=300)``; the coordinator is a
``labfbo coordinator serve`` subprocess with durable state. Prints one JSON line: each lab's
proposals per round, the rounds in which the coordinator was killed, and the same study's
proposals without outages (in-process transport: the same proposals on every transport).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the coordinator's process

from coordinator_process import free_port, start_coordinator  # noqa: E402

import labfbo
from labfbo.server.config import new_token
from labfbo.transport.http import HTTPCoordinator

LABS = ["lab-a", "lab-b", "lab-c", "lab-d"]
SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Categorical("c", ["a", "b", "c"])])
OPTIONS = {"num_restarts": 2, "raw_samples": 32}
SEED, N_INIT = 5, 2


def f(i: int, p: dict[str, Any]) -> float:
    return (p["x"] - 0.2 - 0.15 * i) ** 2 + {"a": 0.0, "b": 0.3, "c": -0.2}[p["c"]] + 0.05 * math.sin(9 * p["x"])


class Server:
    """``labfbo coordinator serve`` in a subprocess, killed and restarted at will."""

    def __init__(self, tmp: Path, rounds: int) -> None:
        self.tmp, self.port = tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tokens = {s: new_token() for s in LABS}
        self.admin, admin_hash = new_token()
        cfg = {"protocol": "surface", "seed": SEED, "horizon": rounds, "admin_token_sha256": admin_hash,
               "sites": {s: h for s, (_, h) in self.tokens.items()}, "space": SPACE.model_dump(mode="json"),
               "options": OPTIONS, "state": str(tmp / "coord.sqlite")}
        (tmp / "consortium.yaml").write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = start_coordinator(self.tmp / "consortium.yaml", self.port, self.tmp / "coord.err")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def run(tmp: Path, rounds: int, outages: dict[int, float]) -> dict[str, Any]:
    """The study over HTTP, the coordinator killed in round ``r`` for ``outages[r]`` seconds."""
    srv = Server(tmp, rounds)
    srv.start()
    killed: list[int] = []
    asking = {lab: -1 for lab in LABS}  # the round each lab is in (the number of model proposals before it)
    proposals: dict[str, list[dict[str, Any]]] = {lab: [] for lab in LABS}
    errors: list[str] = []

    def lab(i: int, name: str) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt = labfbo.Optimizer(SPACE, protocol="surface", site=name, seed=SEED, n_init=N_INIT,
                                       coordinator=HTTPCoordinator(srv.url, srv.tokens[name][0]), horizon=rounds,
                                       **OPTIONS)
                for t in opt.ask(n=N_INIT):
                    opt.tell(t, f(i, t.params))
                for r in range(rounds):
                    asking[name] = r
                    t = opt.ask(timeout=300)
                    proposals[name].append({**t.params, "source": t.metadata.get("source")})
                    opt.tell(t, f(i, t.params))
                opt.close()
        except Exception as exc:  # noqa: BLE001 - reported in the result
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=lab, args=(i, n), daemon=True) for i, n in enumerate(LABS)]
    for th in threads:
        th.start()
    try:
        pending = dict(outages)
        while any(th.is_alive() for th in threads):
            if pending and min(asking.values()) >= min(pending):
                r = min(pending)
                seconds = pending.pop(r)
                time.sleep(0.2)  # inside the round: every lab has asked for it
                srv.kill()
                killed.append(r)
                time.sleep(seconds)
                srv.start()
            time.sleep(0.05)
        for th in threads:
            th.join()
    finally:
        srv.kill()
    return {"proposals": proposals, "killed": killed, "errors": errors}


def reference(rounds: int) -> dict[str, list[dict[str, Any]]]:
    """The same study in one process, without outages."""
    coord = labfbo.Coordinator("surface", sites=LABS, space=SPACE, seed=SEED, horizon=rounds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opts = [labfbo.Optimizer(SPACE, protocol="surface", site=n, seed=SEED, n_init=N_INIT, coordinator=coord,
                                 horizon=rounds, **OPTIONS) for n in LABS]
        out: dict[str, list[dict[str, Any]]] = {n: [] for n in LABS}
        for i, o in enumerate(opts):
            for t in o.ask(n=N_INIT):
                o.tell(t, f(i, t.params))
        for _ in range(rounds):
            trials = [None] * len(opts)

            def one(i: int) -> None:
                trials[i] = opts[i].ask()  # noqa: B023 - runs within this round

            ths = [threading.Thread(target=one, args=(i,)) for i in range(len(opts))]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            for i, (o, t) in enumerate(zip(opts, trials)):
                out[LABS[i]].append({**t.params, "source": t.metadata.get("source")})
                o.tell(t, f(i, t.params))
        for o in opts:
            o.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--outages", nargs="*", default=["3:12", "6:60"], help="ROUND:SECONDS")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    outages = {int(a.split(":")[0]): float(a.split(":")[1]) for a in args.outages}
    start = time.monotonic()
    got = run(args.workdir, args.rounds, outages)
    got["seconds"] = round(time.monotonic() - start, 1)
    got["reference"] = reference(args.rounds)
    print(json.dumps(got))


if __name__ == "__main__":
    main()
