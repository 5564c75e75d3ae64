"""``labfbo bench reactions``: command line, table and plot of :mod:`labfbo_bench.reactions`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from labfbo.core.exceptions import ConfigurationError
from labfbo.datasets import FAMILIES, ReactionData, describe, scenarios
from labfbo_bench import reactions as rx


def _load(jobs: Sequence[rx.ReactionJob]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for j in jobs:
        if Path(j.path).exists():
            out.setdefault((j.scenario, j.method), []).append(json.loads(Path(j.path).read_text()))
    return out


def curves(records: list[dict[str, Any]]) -> np.ndarray:
    """``(seeds, labs, budget + 1)`` regret of a method's completed runs."""
    return np.array([r["regret"] for r in records if "regret" in r])


def _cell(per_seed: np.ndarray) -> str:
    if len(per_seed) == 0:
        return ""
    se = per_seed.std(ddof=1) / np.sqrt(len(per_seed)) if len(per_seed) > 1 else 0.0
    return f"{per_seed.mean():.1f} ± {se:.1f}"


def scenario_table(data: ReactionData, name: str, labs: tuple[str, ...], recs: dict[tuple[str, str], list],
                   methods: Sequence[str], n_init: int, budget: int, stock: str | None = None) -> str:
    sub = data.subset(labs)
    marks = [c for c in rx.CHECKPOINTS if c < budget] + [budget]  # and the campaign's end
    rand = rx.random_regret(sub, n_init, budget, stock)
    mean_at: dict[str, np.ndarray] = {}
    lab_at: dict[str, np.ndarray] = {}
    for m in methods:
        C = rand[None] if m == "random" else curves(recs.get((name, m), []))
        if len(C):
            mean_at[m] = C.mean(1)[:, marks]            # (seeds, marks): mean over labs
            lab_at[m] = C[:, :, marks].mean(0)          # (labs, marks): regret per lab, mean over seeds
    head = ("| method | seeds | " + " | ".join(f"regret @{c}" for c in marks)
            + f" | transfer eff. @{marks[1] if len(marks) > 1 else marks[0]} | transfer eff. @{marks[-1]}"
            + " | worst lab vs alone " + " / ".join(f"@{c}" for c in marks)
            + " | s / ask | bytes up / site-round | failed |")
    stocked = "" if stock is None else (f"; each lab lacks a different quarter of the {stock} choices (its own "
                                        "allowed=), regret against the best it stocks")
    lines = [f"**({name})** {len(labs)} labs, {describe(data, labs)}: " + ", ".join(labs) + stocked, "", head,
             "|---|---:|" + "---:|" * (len(marks) + 6)]
    alone, pooled = mean_at.get("independent"), mean_at.get("pooled")
    for m in methods:
        refused = [r["refused"] for r in recs.get((name, m), []) if "refused" in r]
        if m not in mean_at:
            lines.append(f"| {m} | 0 | " + (f"refused: {refused[0]}" if refused else "not run") + " |"
                         + " |" * (len(marks) + 5))
            continue
        A = mean_at[m]
        cells = [_cell(A[:, k]) for k in range(len(marks))]
        te = []
        for k in ((1 if len(marks) > 1 else 0), len(marks) - 1):
            if alone is None or pooled is None or m in ("independent", "pooled", "random"):
                te.append("")
                continue
            gain = alone[:, k].mean() - pooled[:, k].mean()
            te.append(f"{(alone[:, k].mean() - A[:, k].mean()) / gain:.0%}" if gain > 1e-9 else "n/a")
        worst = ""
        if "independent" in lab_at and m not in ("independent", "random"):
            diff = lab_at[m] - lab_at["independent"]  # (labs, marks)
            lab = int(np.unravel_index(diff.argmax(), diff.shape)[0])
            worst = " / ".join(f"{v:+.1f}" for v in diff.max(0)) + f" ({labs[lab][:24]})"
        rs = [r for r in recs.get((name, m), []) if "regret" in r]
        s_ask = f"{np.mean([r['ask_seconds'] for r in rs]):.2f}" if rs else "0"
        up = f"{np.mean([r['bytes_up_per_site_round'] for r in rs]):.0f}" if rs and m != "pooled" else (
            "raw data" if m == "pooled" else "0")
        failed = f"{np.mean([np.sum(r['failed']) for r in rs]):.1f}" if rs else "—"
        if any(sum(r.get("out_of_stock", [])) for r in rs):
            failed += f" ({sum(sum(r['out_of_stock']) for r in rs)} out of stock)"
        seeds = "exact" if m == "random" else str(len(A))
        lines.append(
            f"| {m} | {seeds} | " + " | ".join(cells) + f" | {te[0]} | {te[1]} | {worst} | {s_ask} | {up} | {failed} |"
        )
    return "\n".join(lines)


def plot(data: ReactionData, scen: dict[str, tuple[str, ...]], recs: dict, methods: Sequence[str], n_init: int,
         budget: int, path: Path, stock: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scen), figsize=(5 * len(scen), 3.8), squeeze=False)
    x = n_init + np.arange(budget + 1)
    for ax, (name, labs) in zip(axes[0], scen.items()):
        for m in methods:
            C = (
                rx.random_regret(data.subset(labs), n_init, budget, stock)[None]
                if m == "random"
                else curves(recs.get((name, m), []))
            )
            if len(C):
                ax.plot(x, C.mean(axis=(0, 1)), label=m, ls="--" if m in ("random", "pooled") else "-")
        ax.set_title(f"({name}) {len(labs)} labs")
        ax.set_xlabel("experiments per lab")
        ax.set_ylabel("mean yield regret (points)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from labfbo.apps.harness import run_with_progress

    if args.family and args.data:
        raise ConfigurationError("give --family (a shipped family) or --data (a CSV), not both")
    data = rx.load_data(args.data, args.family)
    budget = args.budget if args.budget is not None else (FAMILIES[args.family].budget if args.family else 20)
    every = scenarios(data)
    names = ["a"] if args.quick and not args.scenarios else (args.scenarios or list(every))
    scen = {n: every[n] for n in names}
    seeds = list(range(args.seeds if args.seeds is not None else (3 if args.quick else 5)))
    jobs = rx.jobs(args.out, scen, args.methods, seeds, budget=budget, data=args.data, stock=args.stock,
                   family=args.family)
    cmd = "labfbo bench reactions " + " ".join(sys.argv[3:])
    todo = sum(not Path(j.path).exists() for j in jobs)
    print(f"{cmd}\n{data.source}\n{len(jobs)} campaigns ({todo} to do), cache: {args.out}")
    run_with_progress(jobs, rx.run_reaction_job, args.workers, "reactions", args.report_only)
    recs = _load(jobs)
    text = "\n\n".join(scenario_table(data, n, labs, recs, args.methods, 3, budget, args.stock)
                       for n, labs in scen.items())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "reactions.png"
    plot(data, scen, recs, args.methods, 3, budget, png, args.stock)
    (out / "summary.md").write_text(f"# reactions suite\n\n`{cmd}`\n\n{data.source}\n\n{text}\n\nplot: {png}\n")
    print(text + f"\n\nplot: {png}")
    return 0


BENCH_ORDER = 140  # where `labfbo bench --help` lists it


def add_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rp = bsub.add_parser("reactions", help="real reaction data: federated protocols vs independent, random and "
                         "pooled-data transfer (cached, resumable)")
    rp.add_argument("--data", default=None, help="a CSV with columns lab, base, ligand, additive, yield "
                    "(default: the shipped Buchwald-Hartwig data, Ahneman et al. 2018)")
    rp.add_argument("--quick", action="store_true", help="scenario (a) only, 3 seeds")
    rp.add_argument("--scenarios", nargs="+", choices=["a", "b", "c", "d"], help="these scenarios only")
    rp.add_argument("--methods", nargs="+", default=list(rx.METHODS), choices=[*rx.METHODS, *rx.VARIANTS],
                    help="random, independent, the federated protocols with their defaults, pooled; and the "
                    "variants studied: " + ", ".join(rx.VARIANTS))
    rp.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; 3 with --quick)")
    rp.add_argument("--family", choices=list(FAMILIES), default=None,
                    help="a shipped reaction family instead of --data (labs are its substrates)")
    rp.add_argument("--budget", type=int, default=None, help="BO iterations per lab after 3 initial experiments "
                    "(default: the family's, 20 on the Buchwald–Hartwig data)")
    rp.add_argument("--stock", default=None, metavar="PARAM", help="labs with different stock: each lacks a different "
                    "quarter of PARAM's choices (lab i quarter i mod 4; e.g. ligand), passing its own allowed=")
    rp.add_argument("--workers", type=int, default=2)
    rp.add_argument("--report-only", action="store_true", help="run nothing; report the cached runs")
    rp.add_argument("--out", default="runs/bench/reactions")
    rp.set_defaults(func=run)
