"""What the suites' command lines share: the cached run behind a progress bar, the suite's summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence


def command_line(name: str) -> str:
    """``labfbo bench <name> <the arguments given>`` (for reports)."""
    return f"labfbo bench {name} " + " ".join(sys.argv[3:])


def run_cached(name: str, jobs: Sequence[Any], workers: int, cache: str) -> tuple[str, list]:
    """Run (or resume) cached benchmark jobs with a progress bar; returns (command line, results)."""
    from tqdm.auto import tqdm

    from labfbo.apps.harness import run_jobs

    cmd = command_line(name)
    paths = {j.path for j in jobs}
    print(f"{cmd}\n{len(paths)} runs ({sum(not Path(p).exists() for p in paths)} to do), cache: {cache}")
    bar = tqdm(total=len(paths), desc=name, unit="run")

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    results = run_jobs(jobs, workers=workers, progress=progress)
    bar.close()
    return cmd, results


def run_suite(name: str, module: Any, jobs: Sequence[Any], out: Path, functions: tuple[str, ...], workers: int) -> int:
    """Run (or resume) a suite's cached jobs, then print and save its table and plots."""
    cmd, results = run_cached(name, jobs, workers, str(out))
    table = module.table(results, functions)
    plots = module.plot(results, out, functions)
    (out / "summary.md").write_text(f"# {name} suite\n\n`{cmd}`\n\n{table}\n")
    print(table)
    print("\nplots: " + ", ".join(map(str, plots)))
    return 0
