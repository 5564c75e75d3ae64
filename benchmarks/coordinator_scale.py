r"""``labfbo bench coordinator``: the HTTP coordinator's CPU per site-round, 10 to 500 light sites.

A real coordinator (``labfbo coordinator serve`` on 127.0.0.1, a SQLite state file with the
privacy ledger, an audit log) and ``N`` light sites: asyncio clients
(:class:`~labfbo_bench.transport.LightClient`, aiohttp) split over a few client processes,
speaking what :mod:`labfbo.transport.http` speaks (wire frames; per round a ``POST
.../want?wait`` and, per request, a ``POST .../answers/{seq}?wait`` whose reply is the next
work: :func:`~labfbo_bench.transport.light_round`). They answer without fitting a GP:

* ``distribution``: a canned :class:`~labfbo.protocols.distribution.protocol.OptimumBelief`;
* ``surface``: what a real surface site sends under the default secure aggregation — its
  :class:`~labfbo.protocols.secure_sum.PublicKeyShare` for the key request, then for each
  :class:`~labfbo.protocols.surface.messages.SurfaceRequest` the site's statistics (20
  observations in a Buchwald–Hartwig-like space: categoricals of 3, 4 and 23 choices) masked
  into the cohort's sum (:func:`~labfbo.protocols.surface.secure.masked_upload`, ``"members"``):
  up to 17 sites the complete pairwise mask graph, beyond it each site's
  :func:`~labfbo.privacy.secagg.mask_degree` ring neighbours (18 at 500 sites), key agreements
  and masks on the client side. Through the coordinator per site and round: the request with
  the cohort's ``N`` public keys (encoded once, sent to each member) and the sum's guidance with
  the ``N`` members' names — O(N) bytes per site-round.

A client process parses a request frame once for all its sites (it is the same for every member;
each lab would parse its own, in parallel). The coordinator runs alone on one core and the client
processes on the others (on two cores: one each), so that its CPU is not inflated by sharing a
core with the load it serves. Round 0 (joins, keys, warm-up) is not measured, and each cohort runs
enough rounds for at least ``--site-rounds`` site-rounds. The coordinator's CPU seconds are reported
by the server process itself (``cpu_seconds`` of ``GET /v1/admin/status``, its
:func:`time.process_time`), read before and after the measured rounds. Reported per protocol and
cohort: the median round latency (from the end of one round to the end of the next, as the
slowest client process sees it), server CPU per site-round, site-rounds per server CPU-second,
and that cost relative to the smallest cohort's.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from labfbo.core.messages import Abstain, Array, JoinRequest, Message, parse
from labfbo.privacy import secagg
from labfbo.protocols.secure_sum import KeyRequest, MaskedScores, PublicKeyShare, UnmaskRequest
from labfbo.protocols.surface.messages import SurfaceRequest
from labfbo.protocols.surface.secure import masked_upload
from labfbo.server.config import new_token
from labfbo.space.search import Categorical, Real, SearchSpace
from labfbo_bench.transport import LightClient, _wait_health, light_round, start_server

#: above this many surface sites per client CPU a run would take minutes per round (pairwise masks)
SURFACE_LIMIT = 10**9


def bench_space(protocol: str) -> SearchSpace:
    """``surface``: a Buchwald–Hartwig-like space (3 categoricals); ``distribution``: 10 reals."""
    if protocol == "surface":
        return SearchSpace([Categorical("base", [f"b{i}" for i in range(3)]),
                            Categorical("ligand", [f"l{i}" for i in range(4)]),
                            Categorical("aryl_halide", [f"a{i}" for i in range(23)])])
    return SearchSpace([Real(f"x{j}", 0.0, 1.0) for j in range(10)])


class LightSite:
    """One light site's answers (no GP): canned for ``distribution``, masked statistics for ``surface``."""

    def __init__(self, protocol: str, site: str, space: SearchSpace, seed: int) -> None:
        import os

        from labfbo.protocols import get_protocol, parse_options

        self.protocol, self.site, self.space = protocol, site, space
        self.key_seed = os.urandom(32)
        gen = np.random.default_rng(seed)
        options = parse_options(get_protocol(protocol), {})
        if protocol == "surface":
            from labfbo.protocols.surface.aggregate import features
            from labfbo.protocols.surface.model import site_statistics
            from labfbo.protocols.surface.secure import contribution

            points = [{p.name: p.choices[int(gen.integers(len(p.choices)))] for p in space.params} for _ in range(20)]
            z = gen.standard_normal(20)
            gram, moment = site_statistics(
                features(space, options).of_unit(space.encode(points)), (z - z.mean()) / z.std()
            )
            self.vector = contribution(gram, moment, 20, averaged=False)
        else:
            from labfbo.protocols.distribution.protocol import OptimumBelief

            self.belief = OptimumBelief(weight=float(gen.uniform(0.2, 1)), mean=Array.of(gen.random(space.dim)),
                                        variance=Array.of(gen.uniform(1e-3, 1e-2, space.dim)),
                                        value=float(gen.standard_normal()))

    def answer(self, request: Message, round: int) -> Message:
        """What this site sends for ``request`` of ``round``."""
        if self.protocol == "distribution":
            return self.belief.model_copy(update={"round": round})
        if isinstance(request, KeyRequest):
            out: Message = PublicKeyShare(public_key=secagg.public_key(self.key_seed))
        elif isinstance(request, SurfaceRequest) and request.cohort is not None:
            masked, sealed = masked_upload(self.vector, self.site, self.key_seed, request, round, "members")
            out = MaskedScores(step=0, masked=masked, sealed=sealed)
        elif isinstance(request, UnmaskRequest):
            out = Abstain(reason="this site's sums are opened by the members only, never by the coordinator")
        else:
            raise RuntimeError(f"light surface site: unexpected {request.kind}")
        return out.model_copy(update={"round": round})


async def _client_main(url: str, protocol: str, sites: dict[str, str], rounds: int, barrier: Any) -> list[float]:
    from labfbo.protocols import get_protocol, parse_options

    space = bench_space(protocol)
    proto = get_protocol(protocol)
    opts = parse_options(proto, {}).model_dump(mode="json")
    shared = {k: opts[k] for k in proto.shared_options}
    lights = {s: LightSite(protocol, s, space, i) for i, s in enumerate(sites)}
    n = len(sites)
    parsed: dict[bytes, Message] = {}

    def read(frame: bytes) -> Message:
        """A request frame, parsed once for all this process's sites (each lab parses its own, in parallel)."""
        if frame not in parsed:
            parsed.clear()
            parsed[frame] = parse(frame)
        return parsed[frame]

    async with LightClient(url, connections=n + 5) as client:  # one request per site at a time
        sem = asyncio.Semaphore(32)

        async def join(site: str, token: str) -> None:
            req = JoinRequest(site=site, protocol=protocol, space_hash=space.fingerprint(),
                              space=space.model_dump(mode="json"), n_init=0, shared_options=shared)
            async with sem:
                (await client.post("/v1/join", content=req.model_dump_json(), headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"})).raise_for_status()

        await asyncio.gather(*(join(s, tok) for s, tok in sites.items()))

        async def run(t: int) -> float:
            await asyncio.gather(
                *(
                    light_round(client, s, tok, t, lambda req, light=lights[s]: light.answer(read(req), t).to_wire())
                    for s, tok in sites.items()
                )
            )
            return time.time()

        await run(0)  # warm-up: keys, caches; not measured
        await asyncio.to_thread(barrier.wait)  # every client process has done round 0: the parent reads the CPU
        await asyncio.to_thread(barrier.wait)
        return [await run(t) for t in range(1, rounds + 1)]


def _pin(pid: int, cores: set[int] | None) -> None:
    """Run ``pid`` (0: this process) on ``cores`` only (None, or no affinity on this platform: as is)."""
    import os

    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, cores)


def _cores() -> tuple[set[int] | None, set[int] | None]:
    """``(the server's core, the light sites' cores)``: the server alone on one core, so that its CPU
    figure is not inflated by sharing a core (its caches, its time slices) with the load generator;
    (None, None) on a single core."""
    import os

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return ({cores[0]}, set(cores[1:])) if len(cores) >= 2 else (None, None)


def _client(url: str, protocol: str, sites: dict[str, str], rounds: int, barrier: Any, out: Any) -> None:
    _pin(0, _cores()[1])
    try:
        out.put(asyncio.run(_client_main(url, protocol, sites, rounds, barrier)))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        barrier.abort()
        out.put(f"{type(exc).__name__}: {exc}")


def _server_cpu(url: str, admin: str) -> float:
    import requests

    r = requests.get(url + "/v1/admin/status", headers={"Authorization": f"Bearer {admin}"}, timeout=60)
    r.raise_for_status()
    return float(r.json()["cpu_seconds"])


def coordinator_rounds(protocol: str, n_sites: int, rounds: int = 5, processes: int = 2) -> dict[str, float]:
    """Server CPU per site-round and round latency for ``n_sites`` light ``protocol`` sites."""
    space = bench_space(protocol)
    tokens = {f"site{i:04d}": new_token() for i in range(n_sites)}
    admin, admin_digest = new_token()
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {
            "protocol": protocol,
            "seed": 0,
            "space": space.model_dump(mode="json"),
            "admin_token_sha256": admin_digest,
            "sites": {s: h for s, (_, h) in tokens.items()},
            "state": str(Path(tmp) / "state.sqlite"),
            "audit_log": str(Path(tmp) / "audit.jsonl"),  # every site on 127.0.0.1: one address
            "max_connections_per_address": n_sites + 50,
            "max_connections": max(1000, n_sites + 100),
            # a client process busy masking for its hundreds of sites leaves their connections idle for long
            "header_timeout": 600.0,
            "keep_alive": 600.0,
        }
        proc, port = start_server(cfg, Path(tmp))
        _pin(proc.pid, _cores()[0])
        url = f"http://127.0.0.1:{port}"
        k = max(1, min(processes, n_sites))
        names = sorted(tokens)
        barrier, out = ctx.Barrier(k + 1), ctx.Queue()
        clients = [ctx.Process(target=_client, args=(url, protocol, {s: tokens[s][0] for s in names[i::k]},
                                                     rounds, barrier, out), daemon=True) for i in range(k)]
        try:
            _wait_health(url, proc)
            for c in clients:
                c.start()
            try:
                barrier.wait()
            except Exception:  # noqa: BLE001 - a client process failed: say why
                raise RuntimeError(f"a client process failed: {out.get(timeout=10)}") from None
            cpu0 = _server_cpu(url, admin)
            start = time.time()
            barrier.wait()
            ends = []
            for _ in clients:  # a failed client process: stop now (the others would wait for its sites)
                ends.append(out.get())
                if isinstance(ends[-1], str):
                    break
            cpu = _server_cpu(url, admin) - cpu0
        finally:
            for c in clients:
                c.kill() if c.is_alive() else None
            proc.kill()
            proc.wait()
    failed = [e for e in ends if isinstance(e, str)]
    if failed:
        raise RuntimeError(f"a client process failed: {failed[0]}")
    last = np.max(np.array(ends), axis=0)  # the end of each round, as the slowest client process saw it
    lat = np.diff(np.concatenate([[start], last]))
    per = cpu / (rounds * n_sites)
    return {"protocol": protocol, "sites": n_sites, "latency_median": float(np.median(lat)),
            "cpu_per_site_round": per, "site_rounds_per_cpu_s": 1.0 / per if per > 0 else float("inf")}


def report(protocols: list[str], sites: list[int], rounds: int, processes: int,
           skip: dict[str, int] | None = None, site_rounds: int = 0) -> str:
    """A markdown table: one row per protocol and cohort (``skip``: protocol -> the largest cohort run);
    each cohort runs ``rounds`` rounds, or more to measure at least ``site_rounds`` site-rounds (a small
    cohort's few milliseconds of CPU a round are otherwise mostly noise)."""
    lines = [
        "| protocol | sites | rounds measured | round latency, median (s) | server CPU per site-round (ms) | "
        "site-rounds per server CPU-s | CPU per site-round vs smallest cohort |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for proto in protocols:
        base = None
        for n in sites:
            if skip and n > skip.get(proto, n):
                lines.append(f"| {proto} | {n} | not run (over --max-{proto}-sites) | | | | |")
                continue
            k = max(rounds, -(-site_rounds // n))
            r = coordinator_rounds(proto, n, k, processes)
            base = base or r["cpu_per_site_round"]
            lines.append(f"| {proto} | {n} | {k} | {r['latency_median']:.3f} | {1000 * r['cpu_per_site_round']:.2f} | "
                         f"{r['site_rounds_per_cpu_s']:.0f} | {r['cpu_per_site_round'] / base:.2f}x |")
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    print("labfbo bench coordinator " + " ".join(sys.argv[3:]) + "\n")
    print(report(args.protocols, sorted(args.sites), args.rounds, args.processes,
                 {"surface": args.max_surface_sites}, args.site_rounds))
    return 0


BENCH_ORDER = 71  # where `labfbo bench --help` lists it (after http-rounds)


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench coordinator``."""
    p = bsub.add_parser("coordinator", help="HTTP coordinator: server CPU per site-round and round latency, "
                        "10 to 500 light sites")
    p.add_argument("--sites", nargs="+", type=int, default=[10, 50, 200, 500])
    p.add_argument("--rounds", type=int, default=5, help="measured rounds (after a warm-up round)")
    p.add_argument("--site-rounds", type=int, default=1000, help="measure at least this many site-rounds per "
                   "cohort (more rounds for a small one)")
    p.add_argument("--protocols", nargs="+", choices=["distribution", "surface"], default=["distribution", "surface"])
    p.add_argument("--processes", type=int, default=2, help="client processes the light sites are split over")
    p.add_argument("--max-surface-sites", type=int, default=SURFACE_LIMIT,
                   help="larger surface cohorts are listed as not run (their pairwise masks are client CPU)")
    p.set_defaults(func=_cmd)
