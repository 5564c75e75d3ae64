"""``labfbo bench report``: how long ``labfbo report`` takes on a long campaign's journal.

The journal: 200 experiments on a 6-parameter mixed space (3 real parameters with units,
an integer, a discrete grid, a 4-choice categorical), the first 12 from the initial design
and the rest enqueued space-filling points (how they were chosen does not change the
report's work), 5 % failed. It is written once and cached. The report is timed phase by
phase and as the command a lab runs (a new process: Python, torch and BoTorch imports
included), median over ``--repeats``, next to two baselines in the same run: one ``ask()``
of the same site resumed from the same journal, and a process that only imports labfbo (and exits as the command line
does,
skipping the interpreter's last garbage collection).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

N_EXPERIMENTS, N_DESIGN = 200, 12


def space() -> Any:
    import labfbo

    return labfbo.SearchSpace([
        labfbo.Real("temperature", 20.0, 140.0, unit="degC"),
        labfbo.Real("residence_time", 0.5, 30.0, log=True, unit="min"),
        labfbo.Real("concentration", 0.05, 1.0, unit="M"),
        labfbo.Integer("equivalents", 1, 6),
        labfbo.Discrete("catalyst_loading", [0.5, 1.0, 2.5, 5.0]),
        labfbo.Categorical("solvent", ["DMF", "DMAc", "MeCN", "toluene"]),
    ])


def lab_yield(p: dict[str, Any], rng: np.random.Generator) -> float:
    """A made-up yield surface (%): two interacting reals, a solvent effect, noise."""
    t = (p["temperature"] - 95.0) / 30.0
    r = np.log(p["residence_time"] / 8.0)
    solvent = {"DMF": 6.0, "DMAc": 4.0, "MeCN": -2.0, "toluene": -8.0}[p["solvent"]]
    return float(70.0 - 12.0 * t ** 2 - 6.0 * r ** 2 + 4.0 * t * r + 10.0 * p["concentration"]
                 + 1.5 * p["equivalents"] + 2.0 * np.log(p["catalyst_loading"]) + solvent + rng.normal(0.0, 1.5))


def write_journal(path: Path, seed: int = 0) -> Path:
    """The benchmark's journal (kept when it exists)."""
    import labfbo

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    sp = space()
    rng = np.random.default_rng(seed)
    with labfbo.Optimizer(sp, "maximize", seed=seed, storage=tmp, n_init=N_DESIGN) as opt:
        points = sp.decode(sp.sample(N_EXPERIMENTS, seed))
        for i in range(N_EXPERIMENTS):
            t = opt.ask() if i < N_DESIGN else opt.enqueue(points[i])
            if rng.random() < 0.05:
                opt.tell_failed(t, "instrument fault")
            else:
                opt.tell(t, lab_yield(t.params, rng))
    tmp.rename(path)
    return path


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(journal: Path, out: Path) -> dict[str, float]:
    """Seconds per phase of one report, the whole of it, and one ``ask()`` (the baseline)."""
    import labfbo
    from labfbo.report import write_report
    from labfbo.report.campaign import Campaign
    from labfbo.report.insight import SiteModel

    t: dict[str, float] = {}
    campaign, t["read + replay"] = _timed(lambda: Campaign.from_journal(journal))
    model, t["model fit"] = _timed(lambda: SiteModel(campaign))
    _, t["predicted best + EI left"] = _timed(model.belief)
    shares, t["importance (Sobol)"] = _timed(model.importance)
    top = sorted(shares, key=lambda n: -shares[n])[:3]
    _, t["partial dependence (3)"] = _timed(lambda: [model.dependence(n) for n in top])
    _, t["labfbo report (all)"] = _timed(lambda: write_report(journal, out / "report.html"))
    cli = [sys.executable, "-m", "labfbo.cli", "report", str(journal), "-o", str(out / "cli.html")]
    _, t["command line: labfbo report (a new process)"] = _timed(lambda: subprocess.run(cli, check=True,
                                                                                       capture_output=True))
    _, t["baseline: a process that imports labfbo"] = _timed(
        lambda: subprocess.run([sys.executable, "-c", "import gc, labfbo; gc.freeze()"], check=True))
    copy = out / "resumed.journal"
    copy.write_bytes(journal.read_bytes())
    opt = labfbo.Optimizer(space(), "maximize", seed=0, storage=copy, n_init=N_DESIGN)
    _, t["baseline: one ask()"] = _timed(opt.ask)
    opt.close()
    copy.unlink()
    return t


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    journal = write_journal(out / "site-200.journal")
    runs = [measure(journal, out) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total, ask = med["command line: labfbo report (a new process)"], med["baseline: one ask()"]
    lines = [f"`labfbo bench report --repeats {args.repeats}`: {N_EXPERIMENTS} experiments, 6-parameter mixed space "
             f"(median of {args.repeats})", "", "| phase | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in med.items()]
    lines += ["", f"in-process report / ask() = {med['labfbo report (all)'] / ask:.1f}x; target: `labfbo report` "
                  f"under 10 s "
                  f"({'met' if total < 10 else 'NOT met'})"]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps({"median": med, "runs": runs}, indent=1))
    print(text)
    return 0


BENCH_ORDER = 160  # where `labfbo bench --help` lists it


def add_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = bsub.add_parser("report", help="labfbo report on a 200-experiment journal of a 6-parameter mixed space")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="runs/bench/report")
    p.set_defaults(func=run)
