r"""Transport benchmarks: HTTP round latency at scale, and the same campaign on every transport.

* :func:`http_rounds`: a real coordinator server in its own process (``labfbo coordinator
  serve`` on 127.0.0.1) and ``N`` light sites — asyncio clients (:class:`LightClient`) that join, ask for each
  round as the site client does (:func:`light_round`), and answer each request with a recorded ``distribution`` message
  instead of fitting a
  GP. Reports the round latency (a site asks for round ``t`` until every site has its
  guidance) and the coordinator's CPU seconds per round (from ``/proc``).
* :func:`campaign_seconds`: one small ``distribution`` campaign (Branin, 1–3 sites,
  5 rounds): the round latency (slowest ``ask()`` of the round, median over rounds) on
  ``local`` and ``http`` in this process, or on ``mpi`` when run under ``mpiexec``
  (``python -m mpi4py -m labfbo_bench.transport mpi``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from labfbo.core import wire
from labfbo.core.messages import Array, JoinRequest
from labfbo.protocols import get_protocol, parse_options
from labfbo.protocols.distribution.protocol import OptimumBelief
from labfbo.server.config import new_token
from labfbo.space.search import Real, SearchSpace


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Reply:
    """A finished response, read whole: what :func:`light_round` uses of it (``status_code``, ``headers``,
    ``content``, ``json()``, ``raise_for_status()``)."""

    def __init__(self, status: int, headers: Any, content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content

    def json(self) -> Any:
        import json

        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self.content[:300]!r}")


class LightClient:
    """Many light sites' HTTP client: aiohttp (its C parser), a keep-alive connection per concurrent
    request, ``get``/``post`` taking ``params``, ``headers`` and ``content``. A load generator on the
    coordinator's own machine must spend little CPU per request, or the coordinator idles between
    requests and each costs it a wake-up."""

    def __init__(self, base_url: str, connections: int, timeout: float = 120.0) -> None:
        self.base_url, self.connections, self.timeout = base_url, connections, timeout

    async def __aenter__(self) -> "LightClient":
        import aiohttp

        self.session = aiohttp.ClientSession(self.base_url, connector=aiohttp.TCPConnector(limit=self.connections),
                                             timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      headers: dict[str, str] | None = None, content: bytes | str | None = None) -> _Reply:
        query = {k: str(v) for k, v in (params or {}).items()}
        async with self.session.request(method, path, params=query, headers=headers, data=content) as r:
            return _Reply(r.status, r.headers, await r.read())

    async def get(self, path: str, **kw: Any) -> _Reply:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, **kw: Any) -> _Reply:
        return await self.request("POST", path, **kw)


async def light_round(client: Any, site: str, token: str, t: int, answer: Callable[[bytes], bytes | str]) -> None:
    """One site-round as :mod:`labfbo.transport.http`'s ``ask()`` does it: ``POST .../want?wait``
    (the want and a long poll for the work in one call), then each request answered by
    ``POST .../answers/{seq}?wait``, whose reply is the next work, until the guidance.

    ``answer`` maps a request's wire frame to the site's answer (a frame or JSON text).
    """
    h = {"Authorization": f"Bearer {token}", "Accept": wire.MEDIA_TYPE}
    poll = {"wait": 25, "round": t}
    r = await client.post(f"/v1/sites/{site}/rounds/{t}/want", params={"wait": 25}, headers=h)
    while True:
        r.raise_for_status()
        kind = r.headers.get("x-labfbo-work") or r.json()["type"]
        if kind == "request":
            body = answer(r.content)
            body = body.encode() if isinstance(body, str) else body
            r = await client.post(
                f"/v1/sites/{site}/answers/{r.headers['x-labfbo-seq']}",
                params=poll,
                content=body,
                headers={**h, "Content-Type": wire.MEDIA_TYPE if wire.is_frame(body) else "application/json"},
            )
        elif kind == "guidance":
            return
        elif kind == "error":
            raise RuntimeError(r.json()["message"])
        else:  # nothing yet: poll again
            r = await client.get(f"/v1/sites/{site}/work", params=poll, headers=h)


def _replying(message: Any) -> Callable[[bytes], str]:
    """A light site's answer to any request: ``message``, as it stands now."""
    return lambda _request: message.model_dump_json()


async def _drive(url: str, tokens: dict[str, str], space: SearchSpace, rounds: int) -> list[float]:
    proto = get_protocol("distribution")
    opts = parse_options(proto, {}).model_dump(mode="json")
    shared = {k: opts[k] for k in proto.shared_options}
    gen = np.random.default_rng(0)
    async with LightClient(url, connections=len(tokens) + 10, timeout=60.0) as client:
        sem = asyncio.Semaphore(64)

        async def join(site: str, token: str) -> None:
            req = JoinRequest(site=site, protocol="distribution", space_hash=space.fingerprint(),
                              space=space.model_dump(mode="json"), n_init=0, shared_options=shared)
            async with sem:
                (await client.post("/v1/join", content=req.model_dump_json(), headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"})).raise_for_status()

        await asyncio.gather(*(join(s, tok) for s, tok in tokens.items()))
        answers = {s: OptimumBelief(weight=float(gen.uniform(0.2, 1)), mean=Array.of(gen.random(space.dim)),
                                    variance=Array.of(gen.uniform(1e-3, 1e-2, space.dim)),
                                    value=float(gen.standard_normal())) for s in tokens}
        latencies = []
        for t in range(rounds):
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    light_round(client, s, tok, t, _replying(answers[s].model_copy(update={"round": t})))
                    for s, tok in tokens.items()
                )
            )
            latencies.append(time.perf_counter() - t0)
        return latencies


def http_rounds(n_sites: int, rounds: int = 5, d: int = 10) -> dict[str, float]:
    """Median round latency and coordinator CPU seconds per round for ``n_sites`` light sites."""
    space = SearchSpace([Real(f"x{j}", 0.0, 1.0) for j in range(d)])
    tokens = {f"site{i:04d}": new_token() for i in range(n_sites)}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"protocol": "distribution", "seed": 0, "space": space.model_dump(mode="json"),
               "sites": {s: h for s, (_, h) in tokens.items()}, "state": str(Path(tmp) / "state.sqlite"),
               "audit_log": str(Path(tmp) / "audit.jsonl")}
        proc, port = start_server(cfg, Path(tmp))
        try:
            _wait_health(f"http://127.0.0.1:{port}", proc)
            cpu0 = _cpu_seconds(proc.pid)
            lat = asyncio.run(_drive(f"http://127.0.0.1:{port}", {s: t for s, (t, _) in tokens.items()}, space, rounds))
            cpu = _cpu_seconds(proc.pid) - cpu0
        finally:
            proc.kill()
            proc.wait()
    return {"sites": n_sites, "latency_median": float(np.median(lat)), "latency_max": float(np.max(lat)),
            "coordinator_cpu_per_round": cpu / rounds}


def start_server(cfg: dict[str, Any], folder: Path, stderr: int = subprocess.PIPE) -> tuple[subprocess.Popen, int]:
    """``labfbo coordinator serve`` of ``cfg`` (written to ``folder/c.yaml``) on a free loopback port:
    the process (not yet answering: :func:`_wait_health`) and its port."""
    import yaml

    (folder / "c.yaml").write_text(yaml.safe_dump(cfg))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "labfbo.cli", "coordinator", "serve", "--config",
                             str(folder / "c.yaml"), "--port", str(port)], stdout=subprocess.DEVNULL, stderr=stderr)
    return proc, port


def _wait_health(url: str, proc: subprocess.Popen) -> None:
    import requests

    for _ in range(600):
        try:
            if requests.get(url + "/v1/health", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"coordinator did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")


CAMPAIGN = dict(problem="branin", protocol="distribution", n_init=5, budget=5, seed=0,
                num_restarts=4, raw_samples=128, M=200, candidates=512)


def campaign_seconds(transport: str, n_sites: int) -> tuple[float, float] | None:
    """:data:`CAMPAIGN` with ``n_sites`` on ``transport``: the round latency (per round, the
    slowest site's ``ask()``, median over rounds) and the campaign's wall time (design
    included). None on MPI ranks > 0.

    On ``local`` the sites run one after another and a round runs inside the first site's
    ``ask``; on ``http`` and ``mpi`` each site runs its own loop, so a site's ``ask`` also
    waits, at the start of the round, for the other sites to have asked."""
    from labfbo.apps.simulation import simulate

    res = simulate(transport=transport, n_sites=n_sites, **CAMPAIGN)  # type: ignore[arg-type]
    return None if res is None else (float(np.median(res.ask_seconds.max(axis=0))), float(res.wall_time))


def report_http(sites: tuple[int, ...], rounds: int) -> str:
    lines = ["| sites | round latency, median (s) | max (s) | coordinator CPU per round (s) |", "|---:|---:|---:|---:|"]
    for n in sites:
        r = http_rounds(n, rounds)
        lines.append(
            f"| {n} | {r['latency_median']:.3f} | {r['latency_max']:.3f} | {r['coordinator_cpu_per_round']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # mpiexec -n K python -m mpi4py -m labfbo_bench.transport mpi
    import torch

    torch.set_num_threads(1)
    if sys.argv[1:2] == ["mpi"]:
        from mpi4py import MPI

        k = MPI.COMM_WORLD.Get_size()
        out = campaign_seconds("mpi", k - 1)
        if out is not None:
            print(f"| mpi | {k} ranks ({k - 1} sites) | {out[0]:.3f} | {out[1]:.1f} |")
    else:
        print("| transport | sites | round latency (s) | campaign wall time (s) |")
        for n in (1, 2, 3):
            for tr in ("local", "http"):
                lat, wall = campaign_seconds(tr, n)  # type: ignore[misc]
                print(f"| {tr} | {n} sites | {lat:.3f} | {wall:.1f} |")


def _cmd(args: argparse.Namespace) -> int:
    print("labfbo bench http-rounds " + " ".join(sys.argv[3:]) + "\n")
    print(report_http(tuple(args.sites), args.rounds))
    return 0


BENCH_ORDER = 70  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench http-rounds``."""
    hr = bsub.add_parser("http-rounds", help="HTTP round latency and coordinator CPU for many light sites")
    hr.add_argument("--sites", nargs="+", type=int, default=[10, 100, 500])
    hr.add_argument("--rounds", type=int, default=5)
    hr.set_defaults(func=_cmd)
