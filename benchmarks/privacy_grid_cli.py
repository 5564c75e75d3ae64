"""The driver of `labfbo bench privacy-utility` over campaign budgets (:mod:`labfbo_bench.privacy_grid`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from labfbo_bench import privacy_grid as pg


def _pacd(args: argparse.Namespace, names: list[str], epsilons: list[float], seeds: list[int]) -> tuple[str, dict]:
    from labfbo.apps.harness import load_result, run_job, run_with_progress

    functions = tuple(args.functions or pg.PACD_FUNCTIONS)
    jobs = pg.pacd_jobs(args.pacd_out, names, epsilons, seeds, functions, budget=args.budget or 30,
                        n_sites=args.sites, initial=args.initial)
    todo = len({j.path for j in jobs if not Path(j.path).exists()})
    print(f"{len({j.path for j in jobs})} runs ({todo} to do), cache: {args.pacd_out}")
    run_with_progress(jobs, run_job, args.workers, "privacy-utility", args.report_only)
    done = [j for j in jobs if Path(j.path).exists()]
    summary = pg.pacd_summary([load_result(j) for j in done], done)
    panels = {}
    for fn in functions:
        alone = summary.get((fn, pg.NON_PRIVATE["independent"]))
        if alone is None:
            continue
        for metric, ylabel in (("final", "final normalized simple regret"),
                               ("auc", "AUC (mean normalized regret, first 10 % of rounds)")):
            rows = {n: ([e for e in epsilons if (fn, pg.label(n, e)) in summary],
                        [float(np.mean(summary[(fn, pg.label(n, e))][metric])) for e in epsilons
                         if (fn, pg.label(n, e)) in summary]) for n in names}
            plain = {n: float(np.mean(summary[(fn, pg.NON_PRIVATE[n])][metric])) for n in names
                     if n in pg.NON_PRIVATE and (fn, pg.NON_PRIVATE[n]) in summary}
            panels[f"pacd suite: {fn}, {args.sites} sites, T = {args.budget or 30} "
                   f"({'final' if metric == 'final' else 'AUC'})"] = {
                "ylabel": ylabel, "log": metric == "final", "independent": float(np.mean(alone[metric])),
                "rows": rows, "plain": plain}
    png = pg.plot(panels, Path(args.pacd_out) / "privacy_utility.png") if panels else None
    return pg.pacd_table(summary, names, epsilons), {"png": png}


def _reactions(args: argparse.Namespace, names: list[str], epsilons: list[float], seeds: list[int]) -> tuple[str, dict]:
    from labfbo.apps.harness import run_with_progress
    from labfbo.datasets import load_reactions
    from labfbo_bench import reactions as rx
    from labfbo_bench.reactions_cli import scenarios

    data = load_reactions(None)
    scen = {args.scenario: scenarios(data)[args.scenario]}
    plain = ["independent", *sorted({pg.reaction_plain(n) for n in names})]
    methods = plain + [pg.reaction_method(n, e) for n in names for e in epsilons]
    jobs = rx.jobs(args.reactions_out, scen, methods, seeds, budget=20)
    print(f"{len(jobs)} campaigns ({sum(not Path(j.path).exists() for j in jobs)} to do), cache: {args.reactions_out}")
    run_with_progress(jobs, rx.run_reaction_job, args.workers, "privacy-utility (reactions)", args.report_only)
    paths: dict[str, list[Path]] = {}
    for j in jobs:
        paths.setdefault(j.method, []).append(Path(j.path))
    summary = pg.reaction_summary(paths)
    panels: dict[str, Any] = {}
    if "independent" in summary:
        for k in ("@10", "@20"):
            rows = {n: ([e for e in epsilons if pg.reaction_method(n, e) in summary],
                        [float(np.mean(summary[pg.reaction_method(n, e)][k])) for e in epsilons
                         if pg.reaction_method(n, e) in summary]) for n in names}
            panels[f"reactions ({args.scenario}), {len(scen[args.scenario])} labs: regret after {k[1:]}"] = {
                "ylabel": "yield regret (points)", "independent": float(np.mean(summary["independent"][k])),
                "rows": rows, "plain": {n: float(np.mean(summary[n][k])) for n in names if n in summary}}
    png = pg.plot(panels, Path(args.reactions_out) / "privacy_utility.png") if panels else None
    return pg.reaction_table(summary, names, epsilons), {"png": png}


def run(args: argparse.Namespace) -> int:
    epsilons = list(args.epsilons or (pg.QUICK_EPSILONS if args.quick else pg.EPSILONS))
    names = list(args.protocols or ("gradient", "distribution", "surface"))
    unknown = sorted(set(names) - set(pg.PRIVATE))
    if unknown:
        print(f"unknown protocols {unknown}; available: {sorted(pg.PRIVATE)}", file=sys.stderr)
        return 2
    seeds = list(range(args.seeds))
    print("labfbo bench privacy-utility " + " ".join(sys.argv[3:]))
    table, extra = (_pacd if args.suite == "pacd" else _reactions)(args, names, epsilons, seeds)
    print(table + (f"\n\nplot: {extra['png']}" if extra.get("png") else ""))
    return 0
