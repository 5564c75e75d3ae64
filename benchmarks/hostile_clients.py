r"""A site's round latency while strangers attack the coordinator (``labfbo bench http-hostile``).

A real coordinator server in its own process (``labfbo coordinator serve`` on 127.0.0.1, its
default limits, SQLite state and an audit log). ``sites`` light sites (asyncio clients,
:class:`~labfbo_bench.transport.LightClient`, answering each request with a recorded ``distribution`` belief, as
``http-rounds``) run
``rounds`` rounds: first alone, then while an attacker process, from other loopback
addresses,

* holds ``slow`` connections that trickle header lines and never end them (slowloris, from
  127.0.0.2; each reconnects 0.2 s after the server closes it), and
* floods tokenless requests with 60 kB paths (from 127.0.0.3, ``flooders`` clients), each of
  which the server refuses and audits.

Reported: the round latency (median and max over rounds) alone and under attack and their
ratio, what the attack got (connections refused at once, closed at the header deadline,
requests answered), and the audit log's size and longest line.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from labfbo.core.messages import Array, JoinRequest
from labfbo.protocols import get_protocol, parse_options
from labfbo.protocols.distribution.protocol import OptimumBelief
from labfbo.server.config import new_token
from labfbo.space.search import Real, SearchSpace
from labfbo_bench.transport import LightClient, _wait_health, light_round, start_server

PATH = "/v1/sites/" + "x" * 60_000 + "/work"


async def _slowloris(port: int, n: int, stop: float, counts: dict[str, int]) -> None:
    async def one() -> None:
        while time.monotonic() < stop:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            except OSError:
                counts["slow: connect failed"] += 1
                await asyncio.sleep(0.2)
                continue
            counts["slow: connections"] += 1
            try:
                writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
                while time.monotonic() < stop:
                    writer.write(b"X-Slow: 1\r\n")
                    await writer.drain()
                    try:
                        data = await asyncio.wait_for(reader.read(100), timeout=1.0)
                    except asyncio.TimeoutError:
                        continue  # held: trickle the next line
                    if data.startswith(b"HTTP/1.1 503"):
                        counts["slow: 503 at connect"] += 1
                        break
                    if not data:
                        counts["slow: closed by the server"] += 1
                        break
            except OSError:
                counts["slow: closed by the server"] += 1
            finally:
                writer.close()
            await asyncio.sleep(0.2)

    await asyncio.gather(*(one() for _ in range(n)))


async def _flood(port: int, n: int, stop: float, counts: dict[str, int]) -> None:
    request = f"GET {PATH} HTTP/1.1\r\nHost: x\r\n\r\n".encode()

    async def one() -> None:
        while time.monotonic() < stop:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
                writer.write(request)
                await writer.drain()
                head = await asyncio.wait_for(reader.read(64), timeout=10.0)
                counts[f"flood: {head[9:12].decode(errors='replace')}"] += 1
                writer.close()
            except (OSError, asyncio.TimeoutError):
                counts["flood: failed"] += 1

    await asyncio.gather(*(one() for _ in range(n)))


def _attack(port: int, slow: int, flooders: int, seconds: float, out: Any) -> None:
    from collections import Counter

    counts: Counter[str] = Counter()
    stop = time.monotonic() + seconds

    async def main() -> None:
        await asyncio.gather(_slowloris(port, slow, stop, counts), _flood(port, flooders, stop, counts))

    asyncio.run(main())
    out.send(dict(counts))


async def _rounds(url: str, tokens: dict[str, str], space: SearchSpace, first: int, rounds: int) -> list[float]:
    gen = np.random.default_rng(first)
    async with LightClient(url, connections=len(tokens) + 5) as client:
        latencies = []
        for t in range(first, first + rounds):
            answers = {s: OptimumBelief(weight=0.5, mean=Array.of(gen.random(space.dim)),
                                        variance=Array.of(np.full(space.dim, 5e-3)), value=0.0, round=t)
                       for s in tokens}
            t0 = time.perf_counter()
            await asyncio.gather(*(light_round(client, s, tok, t, lambda _, m=answers[s]: m.model_dump_json())
                                   for s, tok in tokens.items()))
            latencies.append(time.perf_counter() - t0)
        return latencies


def _join(url: str, tokens: dict[str, str], space: SearchSpace) -> None:
    import requests

    proto = get_protocol("distribution")
    opts = parse_options(proto, {}).model_dump(mode="json")
    shared = {k: opts[k] for k in proto.shared_options}
    for site, token in tokens.items():
        req = JoinRequest(site=site, protocol="distribution", space_hash=space.fingerprint(),
                          space=space.model_dump(mode="json"), n_init=0, shared_options=shared)
        requests.post(url + "/v1/join", data=req.model_dump_json(), timeout=60, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}).raise_for_status()


def hostile(sites: int = 10, rounds: int = 10, slow: int = 1000, flooders: int = 8) -> dict[str, Any]:
    space = SearchSpace([Real(f"x{j}", 0.0, 1.0) for j in range(4)])
    tokens = {f"site{i:02d}": new_token() for i in range(sites)}
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit.jsonl"
        cfg = {"protocol": "distribution", "seed": 0, "space": space.model_dump(mode="json"), "deadline": 60.0,
               "sites": {s: h for s, (_, h) in tokens.items()}, "state": str(Path(tmp) / "state.sqlite"),
               "audit_log": str(audit)}
        proc, port = start_server(cfg, Path(tmp), stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_health(url, proc)
            plain = {s: t for s, (t, _) in tokens.items()}
            _join(url, plain, space)
            alone = asyncio.run(_rounds(url, plain, space, 0, rounds))
            receiver, sender = multiprocessing.get_context("spawn").Pipe(duplex=False)
            seconds = 5.0 + 3.0 * rounds * max(np.median(alone), 0.2) + 20.0
            attacker = multiprocessing.get_context("spawn").Process(
                target=_attack, args=(port, slow, flooders, seconds, sender), daemon=True)
            attacker.start()
            time.sleep(5.0)  # the attack builds up
            attacked = asyncio.run(_rounds(url, plain, space, rounds, rounds))
            got = receiver.recv() if receiver.poll(seconds + 60) else {}
            attacker.join(10)
            lines = audit.read_bytes().splitlines() if audit.exists() else []
            size = sum(p.stat().st_size for p in Path(tmp).glob("audit.jsonl*"))
        finally:
            proc.kill()
            proc.wait()
    return {"sites": sites, "alone": alone, "attacked": attacked, "attack": got, "audit_bytes": size,
            "audit_longest_line": max((len(x) for x in lines), default=0), "audit_lines": len(lines)}


def report(sites: int, rounds: int, slow: int, flooders: int) -> str:
    r = hostile(sites, rounds, slow, flooders)
    a, b = np.median(r["alone"]), np.median(r["attacked"])
    attack = ", ".join(f"{k}: {v}" for k, v in sorted(r["attack"].items()))
    return "\n".join([
        "| sites | rounds | round latency alone, median / max (s) | under attack, median / max (s) | ratio (median) "
        "| audit log | longest audit line |", "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {sites} | {rounds} | {a:.3f} / {max(r['alone']):.3f} | {b:.3f} / {max(r['attacked']):.3f} | "
        f"{b / a:.2f}x | {r['audit_bytes'] / 1e6:.1f} MB ({r['audit_lines']} lines) | {r['audit_longest_line']} B |",
        "", f"attack ({slow} slow-header connections, {flooders} tokenless flooders): {attack}"])


def _cmd(args: argparse.Namespace) -> int:
    print("labfbo bench http-hostile " + " ".join(sys.argv[3:]) + "\n")
    print(report(args.sites, args.rounds, args.slow, args.flooders))
    return 0


BENCH_ORDER = 85  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench http-hostile``."""
    hp = bsub.add_parser("http-hostile", help="a site's round latency under slow-header connections and a "
                         "tokenless flood")
    hp.add_argument("--sites", type=int, default=10)
    hp.add_argument("--rounds", type=int, default=10)
    hp.add_argument("--slow", type=int, default=1000, help="slow-header connections held by the attacker")
    hp.add_argument("--flooders", type=int, default=8, help="concurrent tokenless clients")
    hp.set_defaults(func=_cmd)
