"""``labfbo bench multiobjective``: the command-line front of :mod:`labfbo_bench.multiobjective`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from labfbo.apps.harness import run_with_progress
    from labfbo_bench import multiobjective as mo

    seeds = list(range(args.seeds if args.seeds is not None else (3 if args.quick else 5)))
    jobs = mo.jobs(args.out, args.quick, seeds)
    if args.parts:
        jobs = [j for j in jobs if j.part in args.parts]
    if args.methods:
        jobs = [j for j in jobs if j.method in args.methods]
    if args.families:
        jobs = [j for j in jobs if j.part != "family" or j.problem in args.families]
    cmd = "labfbo bench multiobjective " + " ".join(sys.argv[3:])
    todo = sum(not Path(j.path).exists() for j in jobs)
    print(f"{cmd}\n{len(jobs)} runs ({todo} to do), cache: {args.out}")
    run_with_progress(jobs, mo.run_job, args.workers, "multiobjective", args.report_only)
    text = mo.report(mo.load(jobs))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.md").write_text(f"# multiobjective suite\n\n`{cmd}`\n\n{text}\n")
    print(text)
    return 0


BENCH_ORDER = 150  # where `labfbo bench --help` lists it


def add_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from labfbo_bench import multiobjective as mo

    p = bsub.add_parser("multiobjective", help="several objectives and outcome constraints: one site against a "
                        "BoTorch qLogNEHVI loop, and a federated family (cached, resumable)")
    p.add_argument("--quick", action="store_true", help="3 seeds, 20 iterations, no gradient protocol")
    p.add_argument("--parts", nargs="+", choices=["single", "constrained", "family"], help="these parts only")
    p.add_argument("--methods", nargs="+", help="these methods / protocols only (e.g. to split a run over processes)")
    p.add_argument("--families", nargs="+", choices=list(mo.FAMILIES), help="these federated families only")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; 3 with --quick)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--report-only", action="store_true", help="run nothing; report the cached runs")
    p.add_argument("--out", default="runs/bench/multiobjective")
    p.set_defaults(func=run)
