r"""Does one huge join hold up the other requests? (``labfbo bench http-join``)

A real coordinator server in its own process (``labfbo coordinator serve`` on 127.0.0.1,
default limits). This process measures the latency of ``GET /v1/health`` — one request at
a time — first alone, then while another thread posts joins whose space has ``n_params``
parameters (40 000 by default, about 3 MB: under ``max_body_bytes``, over ``max_params``).
The server reads such a join and counts its parameters on the raw JSON in a worker
thread, before any message or space is built, and refuses it (422); the event loop keeps
answering. Reported: the joins' status and seconds, and the health latency's median,
95th percentile and maximum with and without them, and their ratios.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from labfbo.benchmarks.transport import _free_port, _wait_health
from labfbo.server.config import new_token
from labfbo.space import Real, SearchSpace


def _health(url: str, n: int, stop: threading.Event | None = None) -> list[float]:
    import requests

    out: list[float] = []
    with requests.Session() as s:
        while len(out) < n and not (stop is not None and stop.is_set()):
            t0 = time.perf_counter()
            s.get(url + "/v1/health", timeout=60).raise_for_status()
            out.append(time.perf_counter() - t0)
    return out


def _stats(lat: list[float]) -> dict[str, float]:
    a = np.asarray(lat) * 1e3
    return {"n": len(a), "median_ms": float(np.median(a)), "p95_ms": float(np.percentile(a, 95)), "max_ms": float(a.max())}


def join_flood(n_params: int = 40_000, joins: int = 5, n_health: int = 300) -> dict[str, Any]:
    import requests
    import yaml

    space = SearchSpace([Real("x", 0.0, 1.0), Real("y", 0.0, 1.0)])
    token, digest = new_token()
    one = space.model_dump(mode="json")["params"][0]
    wide = json.dumps({"kind": "join", "site": "a", "protocol": "distribution", "space_hash": "0" * 64, "n_init": 1,
                       "space": {"params": [{**one, "name": f"x{i}"} for i in range(n_params)]}}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"protocol": "distribution", "seed": 0, "space": space.model_dump(mode="json"), "sites": {"a": digest}}
        (Path(tmp) / "c.yaml").write_text(yaml.safe_dump(cfg))
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "labfbo.cli", "coordinator", "serve", "--config",
                                 str(Path(tmp) / "c.yaml"), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_health(url, proc)
            _health(url, 50)  # warm up
            alone = _health(url, n_health)
            results: list[tuple[int, float]] = []
            stop = threading.Event()

            def flood() -> None:
                with requests.Session() as s:
                    for _ in range(joins):
                        t0 = time.perf_counter()
                        r = s.post(url + "/v1/join", data=wide, timeout=300,
                                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                        results.append((r.status_code, time.perf_counter() - t0))
                stop.set()

            th = threading.Thread(target=flood)
            th.start()
            during = _health(url, 10**9, stop)
            th.join()
        finally:
            proc.kill()
            proc.wait()
    a, d = _stats(alone), _stats(during)
    return {"n_params": n_params, "body_bytes": len(wide), "join_status": sorted({c for c, _ in results}),
            "join_seconds": float(np.median([s for _, s in results])), "alone": a, "during": d,
            "ratio_median": d["median_ms"] / a["median_ms"], "ratio_p95": d["p95_ms"] / a["p95_ms"]}


def report(n_params: int = 40_000, joins: int = 5) -> str:
    r = join_flood(n_params, joins)
    a, d = r["alone"], r["during"]
    return "\n".join([
        f"join of {r['n_params']} parameters ({r['body_bytes'] / 1e6:.1f} MB), {joins} times: status "
        f"{r['join_status']}, {r['join_seconds']:.2f} s each (median)",
        "| health latency | requests | median ms | p95 ms | max ms |",
        "|---|---|---|---|---|",
        f"| alone | {a['n']} | {a['median_ms']:.2f} | {a['p95_ms']:.2f} | {a['max_ms']:.1f} |",
        f"| during the joins | {d['n']} | {d['median_ms']:.2f} | {d['p95_ms']:.2f} | {d['max_ms']:.1f} |",
        f"ratio during/alone: median {r['ratio_median']:.2f}x, p95 {r['ratio_p95']:.2f}x"])
