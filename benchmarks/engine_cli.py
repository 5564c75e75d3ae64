"""``labfbo bench engine``: the command-line front of :mod:`labfbo_bench.engine`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labfbo_bench import engine
from labfbo_bench.engine_panel import FAMILIES, PANEL, QUICK, REAL, SYNTHETIC, family_problems

GROUPS = {"synthetic": SYNTHETIC, "real": REAL}


def run(args: argparse.Namespace) -> int:
    from labfbo.harness import run_with_progress

    families = tuple(args.families or FAMILIES) if args.families is not None else ()
    if families:
        problems = tuple(p for fam in families for p in family_problems(fam))
    else:
        problems = (tuple(dict.fromkeys(q for p in args.problems for q in GROUPS.get(p, (p,)))) if args.problems
                    else (QUICK if args.quick else tuple(PANEL)))
    seeds = list(range(3 if args.quick and args.seeds is None else (args.seeds or 5)))
    methods = tuple(args.methods)
    jobs = engine.jobs(args.out, problems, seeds, methods)
    cmd = "labfbo bench engine " + " ".join(sys.argv[3:])
    todo = sum(not Path(j.path).exists() for j in jobs)
    print(f"{cmd}\n{len(jobs)} runs ({todo} to do), cache: {args.out}")
    run_with_progress(jobs, engine.run_engine_job, args.workers, "engine", args.report_only)
    records = engine.load(jobs)
    text = (engine.family_report(records, families, methods) if families
            else engine.report(records, problems, methods))
    out = Path(args.out)
    (out / "summary.md").write_text(f"# engine suite\n\n`{cmd}`\n\n{text}\n")
    print(text)
    return 0


BENCH_ORDER = 130  # where `labfbo bench --help` lists it


def add_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    en = bsub.add_parser("engine", help="single-site engine: labfbo vs Optuna GPSampler, BoTorch, random "
                         "(cached, resumable)")
    en.add_argument("--quick", action="store_true", help=f"{len(QUICK)} of the {len(PANEL)} problems, 3 seeds")
    en.add_argument("--problems", nargs="+", choices=[*GROUPS, *PANEL],
                    help="these panel problems only (synthetic: the 15 synthetic ones; real: the Buchwald–Hartwig labs)")
    en.add_argument("--families", nargs="*", choices=list(FAMILIES), default=None,
                    help="instead of the panel: every site of these related-site families (all without a name: "
                    f"{', '.join(FAMILIES)}), each alone")
    en.add_argument("--methods", nargs="+", default=list(engine.DEFAULT_METHODS), choices=list(engine.METHODS),
                    help="labfbo (defaults), optuna, botorch, random, and labfbo-* variants")
    en.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; 3 with --quick)")
    en.add_argument("--workers", type=int, default=2)
    en.add_argument("--report-only", action="store_true", help="run nothing; report the cached runs")
    en.add_argument("--out", default="runs/bench/engine")
    en.set_defaults(func=run)
