"""The main job (``make demo``): a reagent screen of three labs on real reaction data.

Each lab is one aryl halide of the Buchwald–Hartwig screen of Ahneman et al. (*Science*
360, 186 (2018); :mod:`labfbo.datasets`) and chooses a base, a ligand and
an additive (3 × 4 × 23 = 276 combinations); its "experiment" returns the yield measured
in that screen. By default the three labs are the most related of the data (the three of
scenario (a) with the largest minimum pairwise Spearman correlation of yield).

Three ways to run the screen, each lab from the same initial experiments (enqueued), then
``budget`` more:

* **together**: labfbo's ``surface`` protocol (recommended for categorical lab spaces), one
  thread per lab against an in-process :class:`~labfbo.Coordinator`; every lab journals
  (first seed), and each gets its campaign report (HTML);
* **alone**: labfbo's ``independent`` (the same GP engine, no partner);
* **Optuna alone**: Optuna's ``GPSampler`` with its defaults.

All three run for each of several seeds (default 0–3; a seed draws the first experiments
and seeds every model), the seeds in parallel worker processes. It prints, per lab, the
mean over seeds (and range) of the best yield each found after 5, 10 and all experiments
against the lab's best in the data, in how many seeds together beat alone at 10, and a
reading computed from those numbers; it writes under ``runs/demo-<time>/`` a plot of the
mean best yield so far (PNG), ``summary.md``, ``results.json`` and one report per lab.
"""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from labfbo.apps.demo.plot import plot_best_so_far
from labfbo.apps.demo.runs import METHODS, Experiment, SeedJob, SeedRun, run_seeds
from labfbo.core.exceptions import ConfigurationError
from labfbo.datasets import ReactionData, describe, load_reactions, scenarios, spearman_matrix

CITATION = ("Data: Ahneman, Estrada, Lin, Dreher, Doyle, 'Predicting reaction performance in C–N cross-coupling "
            "using machine learning', Science 360, 186 (2018), doi:10.1126/science.aar5169")
CHECKPOINTS = (5, 10)  # experiments per lab, beside the full budget


@dataclass
class DemoConfig:
    """``labs``: aryl halide names, or how many of the most related labs (2 to 5)."""

    labs: Sequence[str] | int = 3
    budget: int = 17  # experiments per lab after the shared initial ones
    seeds: Sequence[int] = (0, 1, 2, 3)
    n_init: int = 3
    optuna: bool = True
    out: str = "runs"
    workers: int = 2  # processes running seeds' campaigns in parallel


@dataclass
class DemoResult:
    out: Path
    labs: tuple[str, ...]
    seeds: tuple[int, ...]
    best_in_data: dict[str, float]
    experiments: dict[int, dict[str, list[list[Experiment]]]]  # seed -> method -> per lab, in order
    plot: Path
    summary: Path
    reports: dict[str, Path] = field(default_factory=dict)  # lab -> its campaign report (first seed, together)

    @property
    def methods(self) -> list[str]:
        return list(self.experiments[self.seeds[0]])

    @property
    def total(self) -> int:
        """Experiments per lab (the shared first ones included)."""
        return len(self.experiments[self.seeds[0]][self.methods[0]][0])

    def best_after(self, method: str, lab: int, n: int, seed: int) -> float | None:
        """The best yield ``method`` found in ``lab``'s first ``n`` experiments under ``seed`` (None: none
        succeeded)."""
        ys = [e.yield_ for e in self.experiments[seed][method][lab][:n] if e.yield_ is not None]
        return max(ys) if ys else None

    def found(self, method: str, lab: int, n: int) -> np.ndarray:
        """:meth:`best_after` for every seed (0 where no experiment succeeded yet)."""
        return np.array([self.best_after(method, lab, n, s) or 0.0 for s in self.seeds])


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


def seeds_text(seeds: Sequence[int]) -> str:
    """"seed 0", "seeds 0–3" (consecutive) or "seeds 0, 2, 5"."""
    seeds = list(seeds)
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def checkpoints(res: DemoResult) -> list[int]:
    return [n for n in CHECKPOINTS if n < res.total] + [res.total]


def _mid(res: DemoResult) -> int:
    """The checkpoint the seed counts and the reading compare at (10 by default)."""
    cps = checkpoints(res)
    return cps[-2] if len(cps) > 1 else cps[-1]


TIE = 1.0  # yield points: a smaller difference of best yields is read as a tie
SHORT = {"surface": "together", "independent": "alone", "optuna": "Optuna alone"}


def _cell(ys: np.ndarray) -> str:
    """Mean over seeds, with the range over seeds (one seed: the value)."""
    return f"{ys.mean():.1f}" if len(ys) == 1 else f"{ys.mean():.1f} ({ys.min():.1f}–{ys.max():.1f})"


def wins(res: DemoResult, lab: int, n: int, other: str = "independent") -> tuple[int, int]:
    """In how many seeds together's best after ``n`` beat ``other``'s by more than :data:`TIE`
    points, and in how many it fell behind by more than that."""
    d = res.found("surface", lab, n) - res.found(other, lab, n)
    return int((d > TIE).sum()), int((d < -TIE).sum())


def header(res: DemoResult) -> list[str]:
    return ["lab (aryl halide)", "best in the data", "method", *[f"after {n}" for n in checkpoints(res)],
            f"seeds together > alone at {_mid(res)}"]


def table_rows(res: DemoResult) -> list[list[str]]:
    """One row per lab and method: lab, best in the data, method, the mean (range) over seeds of the
    best yield after each checkpoint, and (together's row) in how many seeds together beat alone by
    more than :data:`TIE` points at the middle checkpoint."""
    rows, mid = [], _mid(res)
    for i, lab in enumerate(res.labs):
        for m in res.methods:
            won = f"{wins(res, i, mid)[0]} of {len(res.seeds)}" if m == "surface" else ""
            rows.append([lab, f"{res.best_in_data[lab]:.1f}", METHODS[m],
                         *[_cell(res.found(m, i, n)) for n in checkpoints(res)], won])
    return rows


def _versus(res: DemoResult, other: str) -> str:
    """Together against ``other`` at the middle checkpoint: campaigns ahead and behind, the mean
    difference with its standard error over seeds, and whether that tells them apart."""
    mid, n_seeds = _mid(res), len(res.seeds)
    d = np.array([res.found("surface", i, mid) - res.found(other, i, mid) for i in range(len(res.labs))])
    per_seed = d.mean(axis=0)  # mean over labs, one value per seed
    mean = float(per_seed.mean())
    won, lost = int((d > TIE).sum()), int((d < -TIE).sum())
    line = (f"against {SHORT[other]}, together was ahead by more than {TIE:g} point in {won} of {d.size} "
            f"campaigns (lab × seed) and behind in {lost}, a mean difference of {mean:+.1f} points")
    if n_seeds < 2:
        return line
    se = float(per_seed.std(ddof=1) / np.sqrt(n_seeds))
    told = abs(mean) > max(TIE, 2 * se)
    return line + (f" ± {se:.1f} (standard error over seeds): "
                   + (f"more than two standard errors, together {'ahead' if mean > 0 else 'behind'}" if told
                      else "within two standard errors (or a point), not told apart"))


def reading(res: DemoResult, n_init: int) -> str:
    """What the table says, computed from it (differences under :data:`TIE` points are ties)."""
    mid, end = _mid(res), res.total
    n_seeds, bests = len(res.seeds), list(enumerate(res.best_in_data[lab] for lab in res.labs))

    def short(m: str, n: int) -> float:
        return float(np.mean([res.best_in_data[lab] - res.found(m, i, n) for i, lab in enumerate(res.labs)]))

    over = f"mean over {seeds_text(res.seeds)}" if n_seeds > 1 else seeds_text(res.seeds)
    parts = [f"After {mid} experiments per lab ({over}, {len(res.labs)} labs), "
             + "; ".join(_versus(res, o) for o in res.methods if o != "surface") + "."]
    gaps = "; ".join(f"after {n}, " + ", ".join(f"{SHORT[m]} {short(m, n):.1f}" for m in res.methods)
                     for n in dict.fromkeys((mid, end)))
    over = "mean over labs and seeds" if n_seeds > 1 else "mean over labs"
    parts.append(f"Points short of each lab's best in the data ({over}): {gaps} "
                 f"({short('surface', n_init):.1f} after the {n_init} shared first experiments).")
    reached = ", ".join(f"{SHORT[m]} {sum(int((res.found(m, i, end) >= best - 1e-9).sum()) for i, best in bests)}"
                        for m in res.methods)
    parts.append(f"Campaigns that found their lab's best by {end}, of {len(res.labs) * n_seeds}: {reached}.")
    if n_seeds == 1:
        parts.append("One seed: one campaign per lab, an example, not a verdict.")
    return " ".join(parts)


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    lines, last = [], None
    for r in [head, *rows]:
        shown = r if r[0] != last or r is head else ["", "", *r[2:]]
        last = r[0]
        cells = zip(shown, widths)
        lines.append("  ".join(c.ljust(w) if k in (0, 2) else c.rjust(w) for k, (c, w) in enumerate(cells)).rstrip())
    return "\n".join(lines)


def _markdown_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|---|---:|---|" + "---:|" * (len(head) - 3)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _failures(res: DemoResult) -> str:
    counts: dict[tuple[int, str], int] = {}
    for per_method in res.experiments.values():
        for m, per_lab in per_method.items():
            for i, runs in enumerate(per_lab):
                counts[i, m] = counts.get((i, m), 0) + sum(e.yield_ is None for e in runs)
    notes = [f"{res.labs[i]}: {k} with {METHODS[m]}" for (i, m), k in counts.items() if k]
    return ("Experiments proposed on a combination the data does not have (a failed experiment, budget used; "
            f"over all seeds): {'; '.join(notes)}.") if notes else ""


def _describe(cfg: DemoConfig, data: ReactionData, related: str) -> str:
    sizes = " × ".join(str(len(p.choices)) for p in data.space.params)
    n = len(cfg.seeds)
    return (f"{len(data.labs)} labs, each one aryl halide of a Buchwald–Hartwig C–N coupling screen ({related}), "
            f"choose {' × '.join(data.space.names)} ({sizes} = {len(data.combos())} combinations); every lab "
            f"starts from the same {cfg.n_init} experiments under every method, then runs {cfg.budget} more; "
            + (f"{n} seeds ({seeds_text(cfg.seeds)}), each its own first experiments and campaigns. "
               if n > 1 else f"{seeds_text(cfg.seeds)}. ")
            + "Together: labfbo `surface`, the labs share a response surface, never a yield (one thread per lab, "
            "in-process coordinator). Alone: labfbo `independent`. Optuna alone: Optuna's `GPSampler`, its "
            "defaults. Best yields in %" + (": mean over seeds (range over seeds)." if n > 1 else "."))


def run_demo(cfg: DemoConfig) -> DemoResult:
    """Run the screen for every seed; print the table and reading; write the plot, summary and reports."""
    if cfg.budget < 1 or cfg.n_init < 1:
        raise ConfigurationError(f"the demo needs budget >= 1 and n_init >= 1, got {cfg.budget} and {cfg.n_init}")
    seeds = tuple(cfg.seeds)
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ConfigurationError(f"--seeds {' '.join(map(str, seeds))}: give one or more distinct seeds >= 0")
    if cfg.workers < 1:
        raise ConfigurationError(f"--workers {cfg.workers}: give 1 or more worker processes")
    full = load_reactions()
    labs = pick_labs(full, cfg.labs)
    data = full.subset(labs)
    out = _out_dir(cfg.out)
    about = _describe(cfg, data, f"how alike their yields rank: {describe(full, labs)}")
    print("labfbo demo: a reagent screen on real data\n" + textwrap.fill(about, 110) + f"\n{CITATION}\n")
    workers = min(cfg.workers, len(seeds))
    print(f"{len(seeds)} seed(s) × {2 + cfg.optuna} methods, in {workers} process(es):", flush=True)
    jobs = [SeedJob(labs, s, cfg.n_init, cfg.budget, cfg.optuna, str(out / "journals") if k == 0 else None)
            for k, s in enumerate(seeds)]
    t0 = time.perf_counter()
    reports: dict[str, Path] = {}

    def done(run: SeedRun) -> None:
        took = ", ".join(f"{SHORT[m]} {t:.0f} s" for m, t in run.seconds.items())
        print(f"  seed {run.seed}: {took}  ({time.perf_counter() - t0:.0f} s so far)", flush=True)
        if run.seed == seeds[0]:  # its reports, while the other seeds run
            reports.update(_reports(out, labs))
            print(f"  seed {run.seed}: each lab's report written ({time.perf_counter() - t0:.0f} s so far)",
                  flush=True)

    runs = run_seeds(jobs, cfg.workers, done)
    res = DemoResult(out=out, labs=labs, seeds=seeds, best_in_data={lab: data.best(i) for i, lab in enumerate(labs)},
                     experiments={r.seed: r.experiments for r in runs}, plot=out / "best_yield.png",
                     summary=out / "summary.md", reports=reports)
    _write(res, cfg, data, about)
    return res


def _reports(out: Path, labs: Sequence[str]) -> dict[str, Path]:
    """Each lab's campaign report from its journal (the first seed's ``together`` run), as the lab
    would see it after the campaign."""
    from labfbo.report import write_report

    return {lab: write_report(out / "journals" / f"{lab}.journal", out / f"report-{lab}.html",
                              objective_label="yield (%)").html for lab in labs}


def curves(res: DemoResult) -> dict[str, list[np.ndarray]]:
    """The plot's data: method -> per lab, seeds × experiments, the best yield after 1, 2, ... experiments."""
    return {m: [np.array([res.found(m, i, k) for k in range(1, res.total + 1)]).T for i in range(len(res.labs))]
            for m in res.methods}


def plot_title(res: DemoResult, cfg: DemoConfig, data: ReactionData) -> str:
    sizes = " × ".join(str(len(p.choices)) for p in data.space.params)
    n = len(res.seeds)
    return (f"Reagent screen of {len(res.labs)} labs: {' × '.join(data.space.names)} ({sizes} = "
            f"{len(data.combos())} combinations); the same {cfg.n_init} first experiments, then {cfg.budget} more; "
            + (f"mean over {n} seeds ({seeds_text(res.seeds)[6:]}), band: range over seeds" if n > 1
               else seeds_text(res.seeds)))


def _write(res: DemoResult, cfg: DemoConfig, data: ReactionData, about: str) -> None:
    """The plot, the table and reading (printed and in summary.md) and results.json."""
    plot_best_so_far(res.labs, res.best_in_data, curves(res), res.plot, title=plot_title(res, cfg, data),
                     citation=CITATION, n_init=cfg.n_init)
    head, rows, line = header(res), table_rows(res), reading(res, cfg.n_init)
    notes, n = _failures(res), len(res.seeds)
    what = "mean (range) over " + seeds_text(res.seeds) if n > 1 else seeds_text(res.seeds)
    print(f"\nBest yield found (%), {what}:\n" + _text_table(head, rows) + "\n\n" + textwrap.fill(line, 110)
          + (f"\n{notes}" if notes else ""))
    (res.out / "results.json").write_text(json.dumps({
        "config": {"labs": list(res.labs), "budget": cfg.budget, "seeds": list(res.seeds), "n_init": cfg.n_init},
        "best_in_data": res.best_in_data,
        "experiments": {str(s): {m: {lab: [{"params": e.params, "yield": e.yield_} for e in per_lab[i]]
                                     for i, lab in enumerate(res.labs)} for m, per_lab in per_method.items()}
                        for s, per_method in res.experiments.items()}}, indent=1))
    links = ", ".join(f"[{lab}]({p.name})" for lab, p in res.reports.items())
    parts = [f"# labfbo demo: a reagent screen of {len(res.labs)} labs on real data", about,
             f"![best yield so far per lab]({res.plot.name})", f"## Best yield found (%), {what}",
             _markdown_table(head, rows), line, notes,
             f"Campaign reports (together, {seeds_text(res.seeds[:1])}, one per lab): {links}", f"{CITATION}."]
    res.summary.write_text("\n\n".join(p for p in parts if p) + "\n")
    print(f"\nplot:    {res.plot}\nsummary: {res.summary}\nreports ({seeds_text(res.seeds[:1])}, together): "
          + "\n         ".join(str(p) for p in res.reports.values())
          + f"  (open them in a browser)\n\n{CITATION}.")
