"""Summary tables and convergence plots for groups of :class:`SimulationResult`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from labfbo.simulation import SimulationResult


def group(results: Iterable[SimulationResult]) -> dict[str, list[SimulationResult]]:
    """Results by protocol label (insertion order kept)."""
    out: dict[str, list[SimulationResult]] = defaultdict(list)
    for r in results:
        out[r.options.get("label", r.protocol)].append(r)
    return dict(out)


def _mean_std(values: Sequence[float]) -> str:
    a = np.asarray(values, dtype=np.float64)
    return f"{a.mean():.3g} ± {a.std():.2g}"


def summary_table(results: Iterable[SimulationResult]) -> str:
    """Markdown table: per protocol, final normalized regret and AUC (mean ± std over
    seeds of the site-average), bytes per site per round and wall time per run."""
    lines = ["| protocol | runs | final normalized regret | AUC (first 10%) | bytes up/site/round "
             "| bytes down/site/round | mean ask() s | wall s/run |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, rs in group(results).items():
        final = [float(r.final_regret().mean()) for r in rs]
        auc = [float(r.auc.mean()) for r in rs]
        up = np.mean([r.bytes_up.mean() for r in rs]) if rs[0].budget else 0.0
        down = np.mean([r.bytes_down.mean() for r in rs]) if rs[0].budget else 0.0
        ask = np.mean([r.ask_seconds.mean() for r in rs]) if rs[0].budget else 0.0
        wall = np.mean([r.wall_time for r in rs])
        lines.append(f"| {label} | {len(rs)} | {_mean_std(final)} | {_mean_std(auc)} | {up:.0f} | "
                     f"{down:.0f} | {ask:.3f} | {wall:.1f} |")
    return "\n".join(lines)


def plot_convergence(results: Iterable[SimulationResult], path: str | Path, title: str = "") -> Path:
    """Mean normalized regret (over sites and seeds) per iteration, ±1 std band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for label, rs in group(results).items():
        curves = np.stack([r.normalized_regret.mean(axis=0) for r in rs])  # seeds x T
        mean, std = curves.mean(0), curves.std(0)
        t = np.arange(1, curves.shape[1] + 1)
        ax.plot(t, mean, label=label, lw=1.8)
        ax.fill_between(t, np.maximum(mean - std, 1e-6), mean + std, alpha=0.2)
    ax.set_yscale("log")
    return _finish(fig, ax, path, title, "BO iteration (after the initial design)",
                   "normalized simple regret (mean over sites)", legend={})


def _finish(fig: Any, ax: Any, path: str | Path, title: str, xlabel: str, ylabel: str,
            legend: dict[str, Any]) -> Path:
    """Labels, grid and legend; write the PNG and close the figure."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(**legend)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_curves(curves: dict[str, np.ndarray], path: str | Path, title: str, xlabel: str, ylabel: str,
                log: bool = False) -> Path:
    """One line per label (``curves[label]`` is the mean curve over iterations); writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=110)
    for label, c in curves.items():
        ax.plot(np.arange(1, len(c) + 1), np.maximum(c, 1e-8) if log else c, label=label, lw=1.4)
    if log:
        ax.set_yscale("log")
    return _finish(fig, ax, path, title, xlabel, ylabel, legend={"fontsize": 7, "ncol": 2 if len(curves) > 6 else 1})
