"""`labfbo bench site-loop`: what the closed loop costs on top of a hand-written ask/tell loop.

Three measurements, each against a baseline in the same run:

* **campaign**: the same journaled campaign (same seed, same virtual instrument with no
  run time) driven by :class:`~labfbo.lab.CampaignLoop` and by a plain ``ask``/``tell``
  loop; the ratio of wall times, and the loop's own bookkeeping per run (wall time
  minus the time inside ``ask``, ``tell`` and the instrument);
* **restart**: reopening the journal and re-attaching the runs in flight, against
  reopening it with a plain ``Optimizer``;
* **csv poll**: one ``poll`` of the file-drop adapter against the size of its results file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from labfbo.adapters import load_adapter
from labfbo.lab import CampaignLoop
from labfbo.optimizer import Optimizer


class _Timed:
    """Wraps a callable and adds up the seconds spent in it."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kw)
        finally:
            self.seconds += time.perf_counter() - t0


def _campaign(folder: Path, problem: str, n_init: int, budget: int, closed_loop: bool) -> tuple[float, float]:
    """(wall seconds, seconds inside ask/tell/annotate and the instrument)."""
    adapter = load_adapter("simulated", problem=problem, noise_std=0.01)
    opt = Optimizer(
        adapter.space, objective=adapter.problem.objective, storage=str(folder / "j"), seed=0, n_init=n_init
    )
    timed = {name: _Timed(getattr(opt, name)) for name in ("ask", "tell", "tell_failed")}
    run = _Timed(adapter.run)
    for name, fn in timed.items():
        setattr(opt, name, fn)
    adapter.run = run  # type: ignore[method-assign]
    t0 = time.perf_counter()
    if closed_loop:
        CampaignLoop(opt, adapter, budget=budget).run()
    else:
        for _ in range(n_init + budget):
            trial = opt.ask()
            opt.tell(trial, run(trial).value)
    wall = time.perf_counter() - t0
    opt.close()
    return wall, sum(t.seconds for t in timed.values()) + run.seconds


def _restart(folder: Path, problem: str, in_flight: int) -> tuple[float, float]:
    """(seconds to reopen + re-attach with the loop, seconds to reopen a plain Optimizer)."""
    adapter = load_adapter("simulated", problem=problem, run_time=3600.0)
    opt = Optimizer(adapter.space, storage=str(folder / "r"), seed=0, n_init=in_flight)
    loop = CampaignLoop(opt, adapter, budget=0, max_in_flight=in_flight)
    loop.interrupt()
    for trial in opt.ask(n=in_flight):
        loop._submitted(trial, adapter.submit(trial))  # noqa: SLF001 — set up runs in flight, then "crash"
    opt.close()
    t0 = time.perf_counter()
    opt = Optimizer(adapter.space, storage=str(folder / "r"), seed=0, n_init=in_flight)
    plain = time.perf_counter() - t0
    loop = CampaignLoop(opt, adapter, budget=0, max_in_flight=in_flight)
    loop.interrupt()
    loop.run()
    resumed = time.perf_counter() - t0
    assert loop.report.recovered == in_flight
    opt.close()
    return resumed, plain


def _csv_poll(folder: Path, rows: int, repeats: int) -> float:
    """Median seconds of one poll that finds the last of ``rows`` result rows."""
    from labfbo.adapters import AdapterContext
    from labfbo.space.search import Real, SearchSpace

    results = folder / f"results-{rows}.csv"
    results.write_text("trial_id,value\n" + "".join(f"{i},{i * 0.5}\n" for i in range(rows)))
    adapter = load_adapter("csv", queue=str(folder / f"queue-{rows}.csv"), results=str(results))
    adapter.prepare(AdapterContext(site="bench", space=SearchSpace([Real("x", 0.0, 1.0)])))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        assert adapter.poll({"trial_id": rows - 1}) is not None
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def report(problem: str = "branin", n_init: int = 5, budget: int = 20, repeats: int = 3,
           in_flight: int = 8, csv_rows: tuple[int, ...] = (100, 1000, 10000)) -> str:
    lines = [f"campaign: {problem}, n_init {n_init}, budget {budget}, independent, journaled; median of {repeats}", "",
             "| driver | wall s | inside ask/tell/instrument s | loop bookkeeping ms/run |", "|---|---|---|---|"]
    walls: dict[str, list[float]] = {"plain ask/tell": [], "CampaignLoop": []}
    inside: dict[str, list[float]] = {k: [] for k in walls}
    with tempfile.TemporaryDirectory() as tmp:  # warm-up (imports, torch kernels), not counted
        _campaign(Path(tmp), problem, n_init, 2, False)
    for _ in range(repeats):
        for name in walls:  # interleaved, so drift hits both alike
            with tempfile.TemporaryDirectory() as tmp:
                wall, busy = _campaign(Path(tmp), problem, n_init, budget, name == "CampaignLoop")
            walls[name].append(wall)
            inside[name].append(busy)
    for name in walls:
        own = statistics.median(1000 * (w - b) / (n_init + budget) for w, b in zip(walls[name], inside[name]))
        lines.append(f"| {name} | {statistics.median(walls[name]):.2f} | {statistics.median(inside[name]):.2f} | "
                     f"{own:.2f} |")
    ratio = statistics.median(walls["CampaignLoop"]) / statistics.median(walls["plain ask/tell"])
    lines += ["", f"CampaignLoop / plain: {ratio:.3f}x wall time", ""]
    with tempfile.TemporaryDirectory() as tmp:
        resumed, plain = _restart(Path(tmp), problem, in_flight)
    lines += [f"restart with {in_flight} runs in flight: reopen + re-attach {1000 * resumed:.1f} ms "
              f"(reopening the journal alone {1000 * plain:.1f} ms)", "",
              "| csv results rows | one poll ms |", "|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for rows in csv_rows:
            lines.append(f"| {rows} | {1000 * _csv_poll(Path(tmp), rows, 5):.2f} |")
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    print("labfbo bench site-loop " + " ".join(sys.argv[3:]) + "\n")
    print(report(args.problem, args.n_init, args.budget, args.repeats, args.in_flight, tuple(args.csv_rows)))
    return 0


BENCH_ORDER = 100  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench site-loop``."""
    sl = bsub.add_parser("site-loop", help="labfbo site run's loop against a plain ask/tell loop; restart; csv polls")
    sl.add_argument("--problem", default="branin")
    sl.add_argument("--n-init", type=int, default=5)
    sl.add_argument("--budget", type=int, default=20)
    sl.add_argument("--repeats", type=int, default=3)
    sl.add_argument("--in-flight", type=int, default=8)
    sl.add_argument("--csv-rows", type=int, nargs="+", default=[100, 1000, 10000])
    sl.set_defaults(func=_cmd)
