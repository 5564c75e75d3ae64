"""The main job (``make demo``): a reagent screen of three labs on real reaction data.

Each lab is one aryl halide of the Buchwald–Hartwig screen of Ahneman et al. (*Science*
360, 186 (2018); :mod:`labfbo.benchmarks.reactions_data`) and chooses a base, a ligand and
an additive (3 × 4 × 23 = 276 combinations); its "experiment" returns the yield measured
in that screen. By default the three labs are the most related of the data (the three of
scenario (a) with the largest minimum pairwise Spearman correlation of yield).

Three ways to run the screen, each lab from the same initial experiments (enqueued), then
``budget`` more:

* **together**: labfbo's ``surface`` protocol (recommended for categorical lab spaces), one
  thread per lab against an in-process :class:`~labfbo.Coordinator`; every lab journals,
  and each gets its campaign report (HTML);
* **alone**: labfbo's ``independent`` (the same GP engine, no partner);
* **Optuna alone**: Optuna's ``GPSampler`` with its defaults.

It prints, per lab, the best yield each found after 5, 10 and all experiments against the
lab's best in the data, with a one-line reading, and writes under ``runs/demo-<time>/`` a
plot of best yield so far (PNG), ``summary.md``, ``results.json`` and one report per lab.
"""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from labfbo.benchmarks.reactions_data import ReactionData, describe, load_reactions, scenarios, spearman_matrix
from labfbo.demo_plot import plot_best_so_far
from labfbo.demo_runs import METHODS, Experiment, Screen, run_labfbo, run_optuna
from labfbo.exceptions import ConfigurationError

CITATION = ("Data: Ahneman, Estrada, Lin, Dreher, Doyle, 'Predicting reaction performance in C–N cross-coupling "
            "using machine learning', Science 360, 186 (2018), doi:10.1126/science.aar5169")
CHECKPOINTS = (5, 10)  # experiments per lab, beside the full budget


@dataclass
class DemoConfig:
    """``labs``: aryl halide names, or how many of the most related labs (2 to 5)."""

    labs: Sequence[str] | int = 3
    budget: int = 17  # experiments per lab after the shared initial ones
    seed: int = 0
    n_init: int = 3
    optuna: bool = True
    out: str = "runs"


@dataclass
class DemoResult:
    out: Path
    labs: tuple[str, ...]
    best_in_data: dict[str, float]
    experiments: dict[str, list[list[Experiment]]]  # method -> per lab, in order
    plot: Path
    summary: Path
    reports: dict[str, Path] = field(default_factory=dict)  # lab -> its campaign report (together)

    def best_after(self, method: str, lab: int, n: int) -> float | None:
        """The best yield ``method`` found in ``lab``'s first ``n`` experiments (None: none succeeded)."""
        ys = [e.yield_ for e in self.experiments[method][lab][:n] if e.yield_ is not None]
        return max(ys) if ys else None


def related_labs(data: ReactionData, n: int) -> tuple[str, ...]:
    """The ``n`` labs of scenario (a) with the largest minimum pairwise Spearman correlation."""
    import itertools

    pool = scenarios(data)["a"]
    if not 2 <= n <= len(pool):
        raise ConfigurationError(f"--labs {n}: the demo picks 2 to {len(pool)} related labs (or give their names)")
    C = spearman_matrix(data)
    idx = {name: data.labs.index(name) for name in pool}

    def closeness(sub: tuple[str, ...]) -> float:
        return min(C[idx[a], idx[b]] for a, b in itertools.combinations(sub, 2))

    return max(itertools.combinations(pool, n), key=closeness)  # first of the ties, in the pool's order


def pick_labs(data: ReactionData, labs: Sequence[str] | int) -> tuple[str, ...]:
    if isinstance(labs, int):
        return related_labs(data, labs)
    unknown = [n for n in labs if n not in data.labs]
    if unknown or len(set(labs)) < 2 or len(set(labs)) != len(labs):
        raise ConfigurationError(f"--labs {' '.join(labs)}: give 2 or more distinct aryl halides of the data "
                                 f"({', '.join(data.labs)}){'; unknown: ' + ', '.join(unknown) if unknown else ''}")
    return tuple(labs)


def _out_dir(root: str) -> Path:
    base = Path(root) / time.strftime("demo-%Y%m%d-%H%M%S")
    out, k = base, 1
    while out.exists():  # two demos in one second: never resume another run's journals
        k += 1
        out = base.with_name(f"{base.name}-{k}")
    out.mkdir(parents=True)
    return out


def _fmt(y: float | None, best: float) -> str:
    return "—" if y is None else f"{y:.1f}" + ("*" if y >= best - 1e-9 else "")


def table_rows(res: DemoResult) -> list[list[str]]:
    """One row per lab and method: lab, best in the data, method, best after each checkpoint."""
    rows = []
    for i, lab in enumerate(res.labs):
        best = res.best_in_data[lab]
        for m in res.experiments:
            rows.append([lab, f"{best:.1f}", METHODS[m],
                         *[_fmt(res.best_after(m, i, n), best) for n in checkpoints(res)]])
    return rows


def checkpoints(res: DemoResult) -> list[int]:
    total = len(next(iter(res.experiments.values()))[0])
    return [n for n in CHECKPOINTS if n < total] + [total]


def header(res: DemoResult) -> list[str]:
    return ["lab (aryl halide)", "best in the data", "method", *[f"after {n}" for n in checkpoints(res)]]


TIE = 1.0  # yield points: a smaller difference of best yields is read as a tie


def reading(res: DemoResult, n_init: int) -> str:
    """One line: what the table says, for a chemist (differences under :data:`TIE` points are ties)."""
    n_labs, cps = len(res.labs), checkpoints(res)
    mid, end = (cps[-2] if len(cps) > 1 else cps[-1]), cps[-1]

    def best(m: str, i: int, n: int) -> float:
        return res.best_after(m, i, n) or 0.0

    def versus(other: str, name: str) -> str:
        d = [best("surface", i, mid) - best(other, i, mid) for i in range(n_labs)]
        won, lost = sum(x > TIE for x in d), sum(x < -TIE for x in d)
        return (f"than {name} in {won} of {n_labs} labs, a lower one in {lost}, the same within {TIE:g} point "
                f"in {n_labs - won - lost}")

    line = (f"After {mid} experiments per lab, working together found a higher best yield "
            + versus("independent", "going alone"))
    if "optuna" in res.experiments:
        line += "; a higher one " + versus("optuna", "Optuna alone")
    gaps = ", ".join(f"{'together' if m == 'surface' else METHODS[m]} "
                     f"{np.mean([res.best_in_data[lab] - best(m, i, end) for i, lab in enumerate(res.labs)]):.1f}"
                     for m in res.experiments)
    start = np.mean([res.best_in_data[lab] - best("surface", i, n_init) for i, lab in enumerate(res.labs)])
    after = f"After {end}, points" if end != mid else "Points"
    return (f"{line}. {after} short of each lab's best in the data (mean over labs): {gaps} "
            f"({start:.1f} after the {n_init} shared first experiments). One seed: one campaign each, not an "
            f"average (`labfbo bench reactions` gives means over seeds).")


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    lines, last = [], None
    for r in [head, *rows]:
        shown = r if r[0] != last or r is head else ["", "", *r[2:]]
        last = r[0]
        cells = zip(shown, widths)
        lines.append("  ".join(c.ljust(w) if k in (0, 2) else c.rjust(w) for k, (c, w) in enumerate(cells)))
    return "\n".join(lines)


def _markdown_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|---|---:|---|" + "---:|" * (len(head) - 3)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _failures(res: DemoResult) -> str:
    notes = [f"{res.labs[i]}: {k} with {METHODS[m]}" for m, per_lab in res.experiments.items()
             for i, runs in enumerate(per_lab) if (k := sum(e.yield_ is None for e in runs))]
    return ("Experiments proposed on a combination the data does not have (a failed experiment, budget used): "
            + "; ".join(notes) + ".") if notes else ""


def _describe(cfg: DemoConfig, data: ReactionData, related: str) -> str:
    sizes = " × ".join(str(len(p.choices)) for p in data.space.params)
    return (f"{len(data.labs)} labs, each one aryl halide of a Buchwald–Hartwig C–N coupling screen ({related}), "
            f"choose {' × '.join(data.space.names)} ({sizes} = {len(data.combos())} combinations); every lab "
            f"starts from the same {cfg.n_init} experiments under every method, then runs {cfg.budget} more "
            f"(seed {cfg.seed}). Together: labfbo `surface`, the labs share a response surface, never a yield "
            f"(one thread per lab, in-process coordinator). Alone: labfbo `independent`. Optuna alone: "
            f"Optuna's `GPSampler`, its defaults. Yields in %; * = the lab's best yield in the data.")


def run_demo(cfg: DemoConfig) -> DemoResult:
    """Run the screen; print the table and reading; write the plot, summary and reports."""
    if cfg.budget < 1 or cfg.n_init < 1:
        raise ConfigurationError(f"the demo needs budget >= 1 and n_init >= 1, got {cfg.budget} and {cfg.n_init}")
    full = load_reactions()
    labs = pick_labs(full, cfg.labs)
    data = full.subset(labs)
    screen = Screen(data, seed=cfg.seed, n_init=cfg.n_init, budget=cfg.budget)
    out = _out_dir(cfg.out)
    about = _describe(cfg, data, f"how alike their yields rank: {describe(full, labs)}")
    print("labfbo demo: a reagent screen on real data\n" + textwrap.fill(about, 110) + f"\n{CITATION}\n")
    methods: list[tuple[str, Callable[[], list[list[Experiment]]]]] = [
        ("surface", lambda: run_labfbo(screen, "surface", journals=out / "journals")),
        ("independent", lambda: run_labfbo(screen, "independent"))]
    if cfg.optuna:
        methods.append(("optuna", lambda: run_optuna(screen)))
    experiments: dict[str, list[list[Experiment]]] = {}
    for m, run in methods:
        t0 = time.perf_counter()
        print(f"  {METHODS[m]:<28} ...", end="", flush=True)
        experiments[m] = run()
        print(f" {time.perf_counter() - t0:.0f} s", flush=True)
    res = DemoResult(out=out, labs=labs, best_in_data={lab: data.best(i) for i, lab in enumerate(labs)},
                     experiments=experiments, plot=out / "best_yield.png", summary=out / "summary.md")
    _write(res, cfg, data, about)
    return res


def _write(res: DemoResult, cfg: DemoConfig, data: ReactionData, about: str) -> None:
    """The plot, the table and reading (printed and in summary.md), results.json and the reports."""
    from labfbo.report import write_report

    curves = {m: [[res.best_after(m, i, k) for k in range(1, len(lab_runs) + 1)] for i, lab_runs in enumerate(per_lab)]
              for m, per_lab in res.experiments.items()}
    sizes = " × ".join(str(len(p.choices)) for p in data.space.params)
    title = (f"Reagent screen of {len(res.labs)} labs: {' × '.join(data.space.names)} ({sizes} = "
             f"{len(data.combos())} combinations); the same {cfg.n_init} first experiments, then {cfg.budget} more "
             f"(seed {cfg.seed})")
    plot_best_so_far(res.labs, res.best_in_data, curves, res.plot, title=title, citation=CITATION, n_init=cfg.n_init)
    head, rows, line = header(res), table_rows(res), reading(res, cfg.n_init)
    notes = _failures(res)
    print("\nBest yield found (%):\n" + _text_table(head, rows) + f"\n\n{line}" + (f"\n{notes}" if notes else ""))
    (res.out / "results.json").write_text(json.dumps({
        "config": {"labs": list(res.labs), "budget": cfg.budget, "seed": cfg.seed, "n_init": cfg.n_init},
        "best_in_data": res.best_in_data,
        "experiments": {m: {lab: [{"params": e.params, "yield": e.yield_} for e in per_lab[i]]
                            for i, lab in enumerate(res.labs)} for m, per_lab in res.experiments.items()}}, indent=1))
    t0 = time.perf_counter()
    for lab in res.labs:  # each lab's campaign report, as the lab would see it after the campaign
        res.reports[lab] = write_report(res.out / "journals" / f"{lab}.journal", res.out / f"report-{lab}.html",
                                        objective_label="yield (%)").html
    links = ", ".join(f"[{lab}]({p.name})" for lab, p in res.reports.items())
    parts = [f"# labfbo demo: a reagent screen of {len(res.labs)} labs on real data", about,
             f"![best yield so far per lab]({res.plot.name})", "## Best yield found (%)",
             _markdown_table(head, rows), line, notes, f"Campaign reports (together, one per lab): {links}",
             f"{CITATION}."]
    res.summary.write_text("\n\n".join(p for p in parts if p) + "\n")
    print(f"\nplot:    {res.plot}\nsummary: {res.summary}\nreports: "
          + "\n         ".join(str(p) for p in res.reports.values())
          + f"  ({time.perf_counter() - t0:.0f} s; open them in a browser)\n\n{CITATION}.")
