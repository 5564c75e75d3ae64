"""``labfbo bench engine``: the command-line front of :mod:`labfbo_bench.engine`."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from labfbo.datasets.families import FAMILIES as REACTIONS
from labfbo_bench import engine
from labfbo_bench.engine_chem import PAIRING_INSTANCES, family_labs
from labfbo_bench.engine_lofo import curves, lofo, paired
from labfbo_bench.engine_panel import FAMILIES, PANEL, QUICK, REAL, SYNTHETIC, family_problems

GROUPS = {"synthetic": SYNTHETIC, "real": REAL}


def run(args: argparse.Namespace) -> int:
    from labfbo.apps.harness import run_with_progress

    families = tuple(args.families or FAMILIES) if args.families is not None else ()
    if args.lofo:
        families = families or tuple(FAMILIES)
        args.family = args.family or list(REACTIONS)
    reactions = tuple(p for fam in args.family or () for p in _spread(family_labs(fam), args.labs))
    reactions += tuple(f"pairing#{i}" for i in range(PAIRING_INSTANCES)) if args.pairing else ()
    if families or reactions:
        problems = tuple(p for fam in families for p in family_problems(fam)) + reactions
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
    if args.lofo:
        groups = [*(args.family or ()), *(["pairing"] if args.pairing else []), *(["continuous"] if families else [])]
        text = lofo(records, groups, [m for m in methods if m != "optuna"])
    elif families or reactions:
        text = "\n\n".join(t for t in (engine.family_report(records, families, methods) if families else "",
                                         reaction_report(records, [*(args.family or ()), *(["pairing"] if args.pairing
                                                                                        else [])], methods)) if t)
    else:
        text = engine.report(records, problems, methods)
    out = Path(args.out)
    (out / "summary.md").write_text(f"# engine suite\n\n`{cmd}`\n\n{text}\n")
    print(text)
    return 0


def _spread(labs: list[str], k: int | None) -> list[str]:
    """About ``k`` labs spread over the list: every ``ceil(n/k)``-th from the first (all with None)."""
    if k is None or k >= len(labs):
        return labs
    return labs[::math.ceil(len(labs) / k)]


def reaction_report(records: list[dict], families: Sequence[str], methods: Sequence[str]) -> str:
    """Markdown: per reaction family, each method's regret (yield points, mean over labs, then
    over seeds) after 5, 10 and at the end, with the s.e. of the seed-paired difference to Optuna."""
    lines = ["| family | method | seeds | after 5 | after 10 | at the end |", "|---|---|---:|---:|---:|---:|"]
    for fam in families:
        for m in methods:
            rows = paired(records, fam, m) if "optuna" in methods else []
            seeds = len(curves(records, fam, m))
            if not rows:
                continue
            cells = [f"{a:.1f}" + (f" ({a - o:+.1f} ± {se:.1f})" if m != "optuna" else "") for a, o, se in rows]
            lines.append(f"| {fam} | {m} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


BENCH_ORDER = 130  # where `labfbo bench --help` lists it


def add_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    en = bsub.add_parser("engine", help="single-site engine: labfbo vs Optuna GPSampler, BoTorch, random "
                         "(cached, resumable)")
    en.add_argument("--quick", action="store_true", help=f"{len(QUICK)} of the {len(PANEL)} problems, 3 seeds")
    en.add_argument(
        "--problems",
        nargs="+",
        choices=[*GROUPS, *PANEL],
        help="these panel problems only (synthetic: the 15 synthetic ones; real: the Buchwald–Hartwig labs)",
    )
    en.add_argument("--families", nargs="*", choices=list(FAMILIES), default=None,
                    help="instead of the panel: every site of these related-site families (all without a name: "
                    f"{', '.join(FAMILIES)}), each alone")
    en.add_argument("--family", nargs="+", choices=list(REACTIONS), default=None,
                    help="instead of the panel: every lab of these shipped reaction families, each alone "
                    "(3 first experiments, then the family's budget)")
    en.add_argument("--labs", type=int, default=None, help="with --family: this many labs per family, spread evenly")
    en.add_argument("--pairing", action="store_true", help="add the synthetic pairing screens (4 instances, "
                    "576 combinations each) as a group")
    en.add_argument("--lofo", action="store_true", help="leave-one-family-out: pick among --methods on all groups "
                    "but one (the reaction families and the continuous families), report the pick on the one left")
    en.add_argument("--methods", nargs="+", default=list(engine.DEFAULT_METHODS), choices=list(engine.METHODS),
                    help="labfbo (defaults), optuna, botorch, random, and labfbo-* variants")
    en.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; 3 with --quick)")
    en.add_argument("--workers", type=int, default=2)
    en.add_argument("--report-only", action="store_true", help="run nothing; report the cached runs")
    en.add_argument("--out", default="runs/bench/engine")
    en.set_defaults(func=run)
