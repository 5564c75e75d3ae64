r"""Suite ``guide``: GUIDE-FBO Tables 1, 3, 4 and 8–10 — distribution exchange vs local BO.

Setting (GUIDE-FBO §5.1, App. C): the 12 functions of Table 5 in :math:`d = 10`
(:mod:`labfbo.problems.guide_functions`), heterogeneity levels 1–3, :math:`N = 16`
sites, 30 initial points per site by collaborative LHS, 50 rounds, observation noise
:math:`\sigma = 0.1` (on the raw objective; the authors' code adds it to an objective
divided by a per-function constant), 10 runs. Methods: UCB / NEI / TS (``independent``)
and GUIDE-UCB / NEI / TS (``distribution``), with :math:`\beta = 2` for UCB (the authors'
code) and the protocol's Table 7 defaults. Regret: each site's simple regret against
its own optimum (numerical at level 3), averaged over sites, final round, mean over runs.

``--quick``: level 2; Ackley, Ellipsoid, Sphere, Zakharov; UCB vs GUIDE-UCB; N = 8,
20 initial points, 25 rounds, 3 seeds. Ranks are recomputed over the methods we ran,
for ours and for the paper's numbers (Tables 8–10) alike.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import rankdata

from labfbo.apps.harness import Job
from labfbo.apps.simulation import SimulationResult
from labfbo.models.gp import PAPERS_SURROGATE
from labfbo.problems.guide_functions import GUIDE_NAMES

PAPER_NAMES = {
    "ackley": "Ackley", "levy": "Levy", "griewank": "Griewank", "rastrigin": "Rastrigin",
    "weierstrass": "Weierstrass", "ellipsoid": "Ellipsoid", "sphere": "Sphere", "zakharov": "Zakharov",
    "rosenbrock": "Rosenbrock", "michalewicz": "Michalewicz", "powell": "Powell",
    "styblinski_tang": "Styblinski–Tang"}
#: the functions `labfbo bench guide --functions` accepts (its default: all of them)
ALL_FUNCTIONS = ("ackley", "levy", "griewank", "rastrigin", "weierstrass", "ellipsoid", "sphere",
                 "zakharov", "rosenbrock", "michalewicz", "powell", "styblinski_tang")
QUICK_FUNCTIONS = ("ackley", "ellipsoid", "sphere", "zakharov")
ABLATION_FUNCTIONS = ("ackley", "rastrigin", "zakharov", "michalewicz")
COMMON: dict[str, Any] = {"beta": 2.0}
#: the paper's rows (UCB, TS and the ablations) model the outputs as they are; the NEI rows are labfbo's defaults
PAPER = PAPERS_SURROGATE
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "UCB": ("independent", {"acquisition": "ucb", **PAPER}),
    "NEI": ("independent", {"acquisition": "nei"}),
    "TS": ("independent", {"acquisition": "ts", **PAPER}),
    "GUIDE-UCB": ("distribution", {"acquisition": "ucb", **PAPER}),
    "GUIDE-NEI": ("distribution", {"acquisition": "nei"}),
    "GUIDE-TS": ("distribution", {"acquisition": "ts", **PAPER}),
}
#: variants run only when named (``--methods``), never by default: method -> (protocol, options)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # the engine's default transform, which `distribution` does not take (docs/benchmarks/engine.md)
    "GUIDE-NEI-winsorize": ("distribution", {"acquisition": "nei", "output_transform": "winsorize"}),
}
#: every method a job may name, in table order (the paper's first)
RUNNABLE: dict[str, tuple[str, dict[str, Any]]] = {**METHODS, **VARIANTS}
# Table 3 rows -> our method (the full method and vanilla UCB reuse the main runs)
ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "Vanilla UCB": METHODS["UCB"],
    "Single-Gaussian belief": ("distribution", {"acquisition": "ucb", **PAPER, "belief": "single_gaussian"}),
    "w/o value-aware reweighting": ("distribution", {"acquisition": "ucb", **PAPER, "value_reweighting": False}),
    "w/o component merging": ("distribution", {"acquisition": "ucb", **PAPER, "merging": False}),
    "w/o agent-specific sampling": ("distribution", {"acquisition": "ucb", **PAPER, "agent_specific": False}),
    "Uniform uncertainty scaling": ("distribution", {"acquisition": "ucb", **PAPER, "spatial": False}),
    "Full GUIDE-UCB": METHODS["GUIDE-UCB"],
}


def reference() -> dict[str, Any]:
    text = resources.files("labfbo_bench").joinpath("reference_tables.json").read_text()
    return json.loads(text)["guide_fbo"]


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


def jobs(out: str, functions: Sequence[str], levels: Sequence[int], methods: Sequence[str], seeds: Sequence[int],
         n_sites: int = 16, n_init: int = 30, budget: int = 50, noise_std: float = 0.1,
         ablation: bool = False, ablation_functions: Sequence[str] = ABLATION_FUNCTIONS) -> list[Job]:
    """One cached job per (level, function, method, seed); ``ablation`` adds Table 3 (level 2)."""
    table = {m: RUNNABLE[m] for m in methods}
    result: list[Job] = []

    def add(level: int, fn: str, label: str, protocol: str, opts: dict[str, Any], s: int) -> None:
        key = next((k for k, v in METHODS.items() if v == (protocol, opts)), label)  # share runs
        setting = f"N{n_sites}-init{n_init}-T{budget}-noise{noise_std:g}"  # cached runs never mix settings
        result.append(Job(path=str(Path(out) / setting / f"level{level}" / fn / _slug(key) / f"seed{s}.json"),
                          label=label, problem=fn,
                          problem_kwargs={"n_sites": n_sites, "heterogeneity": level, "noise_std": noise_std},
                          protocol=protocol, seed=s, n_init=n_init, budget=budget, options={**COMMON, **opts}))

    for level in levels:
        for fn in functions:
            for label, (protocol, opts) in table.items():
                for s in seeds:
                    add(level, fn, label, protocol, opts, s)
    if ablation:
        for fn in ablation_functions:
            for label, (protocol, opts) in ABLATIONS.items():
                for s in seeds:
                    add(2, fn, f"ablation:{label}", protocol, opts, s)
    return result


def final_regret(res: SimulationResult) -> float:
    """Simple regret at the last round, averaged over sites."""
    return float(res.simple_regret[:, -1].mean())


def _group(results: Sequence[SimulationResult], jobs_: Sequence[Job]) -> dict[tuple[int, str, str], list[float]]:
    by: dict[tuple[int, str, str], list[float]] = {}
    for job, r in zip(jobs_, results):
        level = int(job.problem_kwargs["heterogeneity"])
        by.setdefault((level, job.problem, job.label), []).append(final_regret(r))
    return by


def average_ranks(table: dict[str, dict[str, float]], methods: Sequence[str]) -> dict[str, float]:
    """Mean over functions of each method's rank (1 = lowest regret; ties share ranks)."""
    ranks = [rankdata([row[m] for m in methods]) for row in table.values() if all(m in row for m in methods)]
    if not ranks:
        return {}
    mean = np.mean(ranks, axis=0)
    return {m: float(v) for m, v in zip(methods, mean)}


def tables(results: Sequence[SimulationResult], jobs_: Sequence[Job]) -> str:
    """Markdown: regret per function and level (ours vs paper), ranks, matched wins, ablation."""
    ref = reference()
    by = _group(results, jobs_)
    lines: list[str] = []
    levels = sorted({k[0] for k in by})
    for level in levels:
        methods = [m for m in RUNNABLE if any(k[0] == level and k[2] == m for k in by)]
        fns = [f for f in GUIDE_NAMES if any(k[0] == level and k[1] == f for k in by)]
        paper_level = ref["final_regret"].get(str(level), {})
        lines += [f"\n### Level {level}: final mean simple regret (ours: mean ± sd over runs; paper: Tables 8–10)\n",
                  "| function | runs | " + " | ".join(f"{m} (ours) | {m} (paper)" for m in methods) + " |",
                  "|---|---:|" + "---:|---:|" * len(methods)]
        ours_tab: dict[str, dict[str, float]] = {}
        paper_tab: dict[str, dict[str, float]] = {}
        for fn in fns:
            cells, n = [], 0
            for m in methods:
                vals = np.array(by.get((level, fn, m), []))
                n = max(n, len(vals))
                p = paper_level.get(PAPER_NAMES[fn], {}).get(m)
                cells += [
                    f"{vals.mean():.4g} ± {vals.std():.2g}" if len(vals) else "—",
                    f"{p:.4g}" if p is not None else "—",
                ]
                if len(vals):
                    ours_tab.setdefault(fn, {})[m] = float(vals.mean())
                if p is not None:
                    paper_tab.setdefault(fn, {})[m] = float(p)
            lines.append(f"| {fn} | {n} | " + " | ".join(cells) + " |")
        in_paper = [m for m in methods if any(m in row for row in paper_tab.values())]  # not the variants
        ro, rp = average_ranks(ours_tab, methods), average_ranks(paper_tab, in_paper)
        lines += ["", "| average rank over these functions | " + " | ".join(methods) + " |",
                  "|---|" + "---:|" * len(methods),
                  "| ours | " + " | ".join(f"{ro.get(m, float('nan')):.2f}" for m in methods) + " |",
                  "| paper (recomputed over these methods) | " + " | ".join(
                      f"{rp.get(m, float('nan')):.2f}" for m in methods) + " |", ""]
        for base in ("UCB", "NEI", "TS"):
            g = f"GUIDE-{base}"
            if base in methods and g in methods:
                both = [f for f in fns if base in ours_tab.get(f, {}) and g in ours_tab.get(f, {})]
                wins = sum(ours_tab[f][g] < ours_tab[f][base] for f in both)
                pw = [f for f in both if base in paper_tab.get(f, {}) and g in paper_tab.get(f, {})]
                pwins = sum(paper_tab[f][g] < paper_tab[f][base] for f in pw)
                lines.append(
                    f"- matched wins {g} vs {base}: ours {wins}/{len(both)}, paper {pwins}/{len(pw)} "
                    "on the same functions"
                )
    abl = {k: v for k, v in by.items() if k[2].startswith("ablation:")}
    if abl:
        rows = list(ABLATIONS)
        fns = [f for f in GUIDE_NAMES if any(k[1] == f for k in abl)]
        lines += ["\n### Ablation (Table 3, level 2): final mean simple regret, ours / paper\n",
                  "| function | " + " | ".join(rows) + " |", "|---|" + "---:|" * len(rows)]
        ours_tab = {}
        for fn in fns:
            cells = []
            for r in rows:
                vals = abl.get((2, fn, f"ablation:{r}"), [])
                p = ref["ablation"]["2"].get(PAPER_NAMES[fn], {}).get(r)
                if vals:
                    ours_tab.setdefault(fn, {})[r] = float(np.mean(vals))
                cells.append((f"{np.mean(vals):.4g}" if vals else "—") + " / " + (f"{p:.4g}" if p is not None else "—"))
            lines.append(f"| {fn} | " + " | ".join(cells) + " |")
        ranks = average_ranks(ours_tab, rows)
        lines.append("| average rank (ours) | " + " | ".join(f"{ranks.get(r, float('nan')):.2f}" for r in rows) + " |")
    return "\n".join(lines)


def plot(results: Sequence[SimulationResult], jobs_: Sequence[Job], out: Path) -> list[Path]:
    """Convergence plot per (level, function): mean simple regret over sites and runs."""
    from labfbo.apps.harness import plot_curves

    curves: dict[tuple[int, str], dict[str, list[np.ndarray]]] = {}
    for job, r in zip(jobs_, results):
        key = (int(job.problem_kwargs["heterogeneity"]), job.problem)
        curves.setdefault(key, {}).setdefault(job.label.replace("ablation:", ""), []).append(r.simple_regret.mean(0))
    return [plot_curves({label: np.mean(cs, axis=0) for label, cs in by_label.items()}, out / f"level{level}-{fn}.png",
                        f"GUIDE suite: {fn}, level {level}", "BO round", "simple regret (mean over sites and runs)")
            for (level, fn), by_label in sorted(curves.items())]


def _cmd(args: argparse.Namespace) -> int:
    from labfbo_bench.suite_cli import run_cached

    if args.quick:
        kw = dict(functions=QUICK_FUNCTIONS, levels=(2,), methods=tuple(args.methods or ("UCB", "GUIDE-UCB")),
                  seeds=range(3), n_sites=8, n_init=20, budget=25)
    else:
        kw = dict(functions=tuple(args.functions), levels=tuple(args.levels), methods=tuple(args.methods or METHODS),
                  seeds=range(args.seeds), n_sites=args.sites, n_init=args.n_init, budget=args.budget)
    out = Path(args.out)
    todo = jobs(str(out), ablation=args.ablation, ablation_functions=tuple(args.ablation_functions),
                **kw)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    cmd, results = run_cached("guide", todo, args.workers, str(out))
    table = tables(results, todo)
    plots = plot(results, todo, out)
    cpu = sum(r.wall_time for r in results)
    note = (
        f"{len(todo)} runs, {cpu / 3600:.2f} CPU-hours of simulation, this invocation {time.perf_counter() - t0:.0f} s"
    )
    (out / "summary.md").write_text(f"# guide suite\n\n`{cmd}`\n\n{note}\n{table}\n")
    print(note)
    print(table)
    print("\nplots: " + ", ".join(map(str, plots)))
    return 0


BENCH_ORDER = 50  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench guide``."""
    gu = bsub.add_parser("guide", help="GUIDE-FBO Tables 1, 3, 8-10: distribution vs local BO (cached, resumable)")
    gu.add_argument(
        "--quick",
        action="store_true",
        help="level 2, Ackley/Ellipsoid/Sphere/Zakharov, UCB vs GUIDE-UCB, N=8, 20 init, 25 rounds, 3 seeds",
    )
    gu.add_argument("--functions", nargs="+", default=list(ALL_FUNCTIONS), choices=list(ALL_FUNCTIONS))
    gu.add_argument("--levels", nargs="+", type=int, default=[1, 2, 3], choices=[1, 2, 3])
    gu.add_argument("--methods", nargs="+", default=None,
                    choices=["UCB", "NEI", "TS", "GUIDE-UCB", "GUIDE-NEI", "GUIDE-TS", "GUIDE-NEI-winsorize"],
                    help="default: the six of the paper (with --quick: UCB and GUIDE-UCB); GUIDE-NEI-winsorize only "
                         "when named")
    gu.add_argument(
        "--ablation", action="store_true", help="add Table 3 (level 2, Ackley/Rastrigin/Zakharov/Michalewicz)"
    )
    gu.add_argument("--ablation-functions", nargs="+", default=["ackley", "rastrigin", "zakharov", "michalewicz"],
                    choices=list(ALL_FUNCTIONS))
    gu.add_argument("--seeds", type=int, default=10)
    gu.add_argument("--sites", type=int, default=16)
    gu.add_argument("--n-init", type=int, default=30)
    gu.add_argument("--budget", type=int, default=50)
    gu.add_argument("--workers", type=int, default=2)
    gu.add_argument("--out", default="runs/bench/guide")
    gu.set_defaults(func=_cmd)
