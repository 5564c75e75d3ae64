"""Seconds per BO round of the ``gradient`` protocol: meta-update vs per-site acquisition.

N sites, each with ``n_obs`` observations of a related task, in one process on the local
transport (real Optimizers, real JSON messages). Per round we time

* the meta-update: the coordinator's ``svgd_steps`` exchanges (every site scoring the
  particles on its data, the messages' JSON round trips, the SVGD steps);
* the same computation without the transport (site scores + SVGD steps, direct calls),
  to show what the message layer costs;
* each site's acquisition on the particle mixture (its ``ask()`` once the round is done).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from statistics import median

import numpy as np
import torch

import labfbo
from labfbo.models.pacoh import site_score
from labfbo.protocols.gradient.protocol import meta_step
from labfbo.transport.local import LocalTransport


@dataclass
class RoundRow:
    round: int
    meta_update_s: float
    meta_compute_s: float
    acquisition_s: float  # mean per site
    round_s: float        # meta-update + all sites' acquisitions, as sequential in one process


def measure(n_sites: int, particles: int, n_obs: int, steps: int, repeats: int, dim: int = 2,
            secure_aggregation: bool = False) -> list[RoundRow]:
    space = labfbo.SearchSpace([labfbo.Real(f"x{j}", 0.0, 1.0) for j in range(dim)])
    names = [f"site-{i}" for i in range(n_sites)]
    opts = {"n_particles": particles, "svgd_steps": steps, "secure_aggregation": secure_aggregation}
    coord = labfbo.Coordinator("gradient", sites=names, seed=0, **opts)
    sites = [labfbo.Optimizer(space, protocol="gradient", coordinator=coord, site=n, seed=0, n_init=0, **opts)
             for n in names]
    gen = np.random.default_rng(0)
    for i, o in enumerate(sites):
        X = gen.random((n_obs, dim))
        y = np.sin(6 * X.sum(1) + 0.3 * i) + 0.1 * X[:, 0]
        o.add_observations(space.decode(X), y.tolist())
    rows = []
    transport = LocalTransport.of(coord)
    warm = time.perf_counter()
    coord.run_round(0, transport.gather)  # the first round meta-trains fresh particles (warmup_steps)
    warm = time.perf_counter() - warm
    for i, o in enumerate(sites):
        trial = o.ask()
        o.tell(trial, float(np.sin(6 * sum(trial.params.values()) + 0.3 * i)))
    rows.append(RoundRow(0, warm, float("nan"), float("nan"), float("nan")))
    for r in range(1, repeats + 1):
        theta, adam = coord.aggregator().particles.clone(), coord.aggregator().adam
        data = [o.site_data() for o in sites]
        t0 = time.perf_counter()
        for _ in range(steps):
            scores = [site_score(theta, d.X, d.y, coord.aggregator().cfg) for d in data]
            theta, adam = meta_step(theta, scores, [d.n for d in data], coord.aggregator().cfg, adam)
        compute = time.perf_counter() - t0
        t0 = time.perf_counter()
        coord.run_round(r, transport.gather)
        meta = time.perf_counter() - t0
        acq = []
        for i, o in enumerate(sites):
            t0 = time.perf_counter()
            trial = o.ask()
            acq.append(time.perf_counter() - t0)
            o.tell(trial, float(np.sin(6 * sum(trial.params.values()) + 0.3 * i)))
        rows.append(RoundRow(r, meta, compute, float(np.mean(acq)), meta + float(np.sum(acq))))
    return rows


def format_rows(rows: list[RoundRow]) -> str:
    lines = ["(round 0 = the warm-up meta-training of fresh particles, `warmup_steps` SVGD steps)", "",
             "| round | meta-update (transport) s | meta-update (direct) s | acquisition per site s | whole round s |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.round} | {r.meta_update_s:.3f} | {r.meta_compute_s:.3f} | {r.acquisition_s:.3f} | "
                     f"{r.round_s:.3f} |")
    rows = [r for r in rows if r.round > 0] or rows
    lines.append(f"| median (rounds >= 1) | {median(r.meta_update_s for r in rows):.3f} | "
                 f"{median(r.meta_compute_s for r in rows):.3f} | {median(r.acquisition_s for r in rows):.3f} | "
                 f"{median(r.round_s for r in rows):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    torch.set_num_threads(1)
    print(format_rows(measure(5, 10, 100, 20, 3)))


def _cmd(args: argparse.Namespace) -> int:
    import statistics

    print("labfbo bench round-time " + " ".join(sys.argv[3:]) + "\n")
    rows = measure(args.sites, args.particles, args.n_obs, args.steps, args.repeats, args.dim)
    print(format_rows(rows))
    if args.secure_aggregation:  # the same rounds with masked uploads, measured in the same run
        masked = measure(args.sites, args.particles, args.n_obs, args.steps, args.repeats, args.dim, True)
        print("\nwith secure_aggregation=True:\n\n" + format_rows(masked))
        ratio = (statistics.median(r.meta_update_s for r in masked[1:])
                 / statistics.median(r.meta_update_s for r in rows[1:]))
        print(f"\nmeta-update with / without secure aggregation: {ratio:.2f}x (median over rounds >= 1)")
    return 0


BENCH_ORDER = 110  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench round-time``."""
    rt = bsub.add_parser("round-time", help="seconds per gradient-protocol round: meta-update vs acquisition")
    rt.add_argument("--sites", type=int, default=5)
    rt.add_argument("--particles", type=int, default=10)
    rt.add_argument("--n-obs", type=int, default=100)
    rt.add_argument("--steps", type=int, default=20)
    rt.add_argument("--dim", type=int, default=2)
    rt.add_argument("--repeats", type=int, default=3)
    rt.add_argument("--secure-aggregation", action="store_true", help="also time masked rounds; print the ratio")
    rt.set_defaults(func=_cmd)
