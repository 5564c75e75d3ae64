r"""Does a huge join hold up the other requests? (``labfbo bench http-join``)

A real coordinator server in its own process (``labfbo coordinator serve`` on 127.0.0.1,
default limits). This process measures the latency of ``GET /v1/health`` — one request at
a time — first alone, then while another thread posts a join every ``every`` seconds for
``seconds``, whose space has ``n_params`` parameters:

* 2 parameters: a normal join (the baseline);
* 40 000 parameters (3.5 MB): over ``max_join_bytes`` (1 MB), refused from its
  ``Content-Length`` before the body is read (413);
* 10 000 parameters (0.9 MB): under ``max_join_bytes``, over ``max_params`` (1000): read,
  its parameters counted on the raw JSON in a worker thread before any message or space
  is built, and refused (422).

Reported: the joins' status and seconds, the health latency's median, 95th percentile and
maximum with and without them, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from labfbo.server.config import new_token
from labfbo.space.search import Real, SearchSpace
from labfbo_bench.transport import _wait_health, start_server


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
    return {
        "n": len(a),
        "median_ms": float(np.median(a)),
        "p95_ms": float(np.percentile(a, 95)),
        "max_ms": float(a.max()),
    }


def join_flood(n_params: int = 40_000, seconds: float = 5.0, every: float = 0.1, n_health: int = 300) -> dict[str, Any]:
    import requests

    space = SearchSpace([Real("x", 0.0, 1.0), Real("y", 0.0, 1.0)])
    token, digest = new_token()
    one = space.model_dump(mode="json")["params"][0]
    wide_space = space.model_dump(mode="json")  # 2 parameters: the study's own space, a join that succeeds
    if n_params > 2:
        wide_space = {"params": [{**one, "name": f"x{i}"} for i in range(n_params)]}
    wide = json.dumps({"kind": "join", "site": "a", "protocol": "distribution", "n_init": 1, "space": wide_space,
                       "space_hash": space.fingerprint() if n_params == 2 else "0" * 64}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"protocol": "distribution", "seed": 0, "space": space.model_dump(mode="json"), "sites": {"a": digest}}
        proc, port = start_server(cfg, Path(tmp))
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_health(url, proc)
            _health(url, 50)  # warm up
            alone = _health(url, n_health)
            results: list[tuple[int, float]] = []
            stop = threading.Event()

            def flood() -> None:
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    t0 = time.perf_counter()
                    try:
                        r = requests.post(url + "/v1/join", data=wide, timeout=300, headers={
                            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                        code = r.status_code
                    except requests.ConnectionError:  # refused before the body was sent: the server closed
                        code = 413
                    results.append((code, time.perf_counter() - t0))
                    time.sleep(max(0.0, every - (time.perf_counter() - t0)))
                stop.set()

            th = threading.Thread(target=flood)
            th.start()
            during = _health(url, 10**9, stop)
            th.join()
        finally:
            proc.kill()
            proc.wait()
    a, d = _stats(alone), _stats(during)
    return {"n_params": n_params, "body_bytes": len(wide), "joins": len(results),
            "join_status": sorted({c for c, _ in results}),
            "join_seconds": float(np.median([s for _, s in results])), "alone": a, "during": d,
            "ratio_median": d["median_ms"] / a["median_ms"], "ratio_p95": d["p95_ms"] / a["p95_ms"]}


def report(sizes: tuple[int, ...] = (2, 10_000, 40_000), seconds: float = 5.0) -> str:
    lines = ["| join | body | joins sent | status | s per join | health median ms (alone / during) | "
             "p95 ms (alone / during) | max ms during | ratio median | ratio p95 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        r = join_flood(n, seconds)
        a, d = r["alone"], r["during"]
        lines.append(f"| {n} params | {r['body_bytes'] / 1e6:.2f} MB | {r['joins']} | {r['join_status']} | "
                     f"{r['join_seconds']:.3f} | {a['median_ms']:.2f} / {d['median_ms']:.2f} | "
                     f"{a['p95_ms']:.2f} / {d['p95_ms']:.2f} | {d['max_ms']:.1f} | {r['ratio_median']:.2f}x | "
                     f"{r['ratio_p95']:.2f}x |")
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    print("labfbo bench http-join " + " ".join(sys.argv[3:]) + "\n")
    print(report(tuple(args.params), args.seconds))
    return 0


BENCH_ORDER = 80  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench http-join``."""
    hj = bsub.add_parser("http-join", help="health latency while huge joins are refused")
    hj.add_argument("--params", type=int, nargs="+", default=[2, 10_000, 40_000])
    hj.add_argument("--seconds", type=float, default=5.0)
    hj.set_defaults(func=_cmd)
