"""The simulation harness: cached, resumable, parallel ``simulate`` runs, their tables and plots.

A *job* is one ``simulate`` call, identified by a path under the suite's output folder
(``<out>/<problem>/<method>/seed<k>.json``). A job whose JSON exists is not run again, so
an interrupted suite resumes where it stopped; jobs run in worker processes with one
torch thread each (``--workers``).

A job that names its protocol and options has a *fingerprint* (:func:`options_fingerprint`):
its complete option set, labfbo's defaults included, hashed. It is written into the JSON, and
a cached JSON whose fingerprint differs (or that has none) is stale: it is set aside as
``seed<k>.stale.json`` and the job runs again, so a change of labfbo's defaults never
reaches a table through a cache keyed by the method's label.

:func:`summary_table`, :func:`plot_convergence` and :func:`plot_curves` tabulate and plot
groups of :class:`~labfbo.apps.simulation.SimulationResult` (by their ``label`` option).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from labfbo.apps.simulation import SimulationResult


@dataclass(frozen=True)
class Job:
    """One simulation: problem name and keywords, protocol options, where to cache it."""

    path: str
    label: str
    problem: str
    problem_kwargs: dict[str, Any]
    protocol: str
    seed: int
    n_init: int
    budget: int
    options: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        return options_fingerprint(self.protocol, self.options)


def options_fingerprint(protocol: str, options: Mapping[str, Any]) -> str:
    """A hash of ``protocol``'s complete option set: the explicit ``options`` and every default
    they leave. Keywords that are not the protocol's (``simulate``'s own, such as ``transport``;
    per-site priors) are hashed as given; where the run journals (``storage_dir``) is not hashed."""
    from labfbo.protocols import get_protocol, parse_options

    cls = get_protocol(protocol)
    fields = cls.Options.model_fields
    own = {k: v for k, v in options.items() if k in fields and k != "prior"}
    other = {k: v for k, v in options.items() if k not in own and k not in _NOT_HASHED}
    text = json.dumps({"protocol": protocol, "options": parse_options(cls, own).model_dump(mode="json"),
                       "other": other}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_NOT_HASHED = frozenset({"storage_dir"})


def _job_fingerprint(job: Any) -> str | None:
    fp = getattr(job, "fingerprint", None)
    return fp() if callable(fp) else fp


def cached_fingerprint(path: str) -> str | None:
    """The fingerprint a cached job's JSON was written with (None: none, or unreadable)."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    fp = record.get("fingerprint") or (record.get("options") or {}).get("fingerprint")
    return fp if isinstance(fp, str) else None


def set_aside_stale(jobs: Sequence[Any], rerun: bool = True) -> list[str]:
    """Move every cached JSON whose fingerprint is not its job's aside (``*.stale.json``); the paths.
    ``rerun=False`` (a report that runs nothing) only changes what the message says."""
    moved = []
    for j in {j.path: j for j in jobs}.values():
        want = _job_fingerprint(j)
        if want is None or not Path(j.path).exists() or cached_fingerprint(j.path) == want:
            continue
        os.replace(j.path, Path(j.path).with_suffix(".stale.json"))
        moved.append(j.path)
    if moved:
        then = "and run again" if rerun else "and are left out of this report (run without --report-only to redo them)"
        print(f"{len(moved)} cached run(s) were made with other options (labfbo's defaults changed?) "
              f"{then}; set aside as *.stale.json, e.g. {moved[0]}", file=sys.stderr)
    return moved


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_job(job: Job) -> str:
    """Run one job (in a worker) and write its JSON; returns the path."""
    from labfbo.apps.simulation import simulate
    from labfbo.problems.families import get_problem

    problem = get_problem(job.problem, seed=job.seed, **job.problem_kwargs)
    res = simulate(problem, protocol=job.protocol, n_init=job.n_init, budget=job.budget, seed=job.seed,
                   **job.options)
    res.options["label"] = job.label
    res.options["fingerprint"] = job.fingerprint()
    return write_atomic(job.path, res.to_json())


def write_atomic(path: str, text: str) -> str:
    """Write ``text`` to ``path`` through a temporary file (a killed run leaves no half file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, p)
    return path


def run_with_progress(jobs: Sequence[Any], run: Callable[[Any], str], workers: int, name: str,
                      report_only: bool = False) -> None:
    """:func:`run_pending` behind a progress bar. With ``report_only`` nothing runs, and a stale
    cached run is set aside all the same, so the report never shows a run of other options."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=name, unit="run")

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    if report_only:
        set_aside_stale(jobs, rerun=False)
    else:
        run_pending(jobs, run, workers, progress)
    bar.close()


def run_jobs(jobs: Sequence[Job], workers: int = 1,
             progress: Callable[[int, int], None] | None = None) -> list[SimulationResult]:
    """Run the jobs that are not cached yet; return every job's result (in order)."""
    run_pending(jobs, run_job, workers, progress)
    return [load_result(j) for j in jobs]


def run_pending(jobs: Sequence[Any], run: Callable[[Any], str], workers: int = 1,
                progress: Callable[[int, int], None] | None = None) -> None:
    """Run ``run(job)`` for every job whose ``path`` does not exist yet (a shared path runs once),
    in ``workers`` spawned processes with one torch thread each. A stale cached run (its
    fingerprint is not the job's) is set aside first and runs again."""
    set_aside_stale(jobs)
    todo = list({j.path: j for j in jobs if not Path(j.path).exists()}.values())
    total = len({j.path for j in jobs})
    done = total - len(todo)
    if progress:
        progress(done, total)
    if not todo:
        return
    if workers <= 1:
        _init_worker()
        for j in todo:
            run(j)
            done += 1
            if progress:
                progress(done, total)
        return
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=_init_worker) as pool:
        for fut in as_completed([pool.submit(run, j) for j in todo]):
            fut.result()
            done += 1
            if progress:
                progress(done, total)


def load_result(job: Job) -> SimulationResult:
    res = SimulationResult.from_json(Path(job.path).read_text())
    res.options["label"] = job.label
    return res


# -- tables and plots of results ------------------------------------------------------------

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
