"""`labfbo bench demo-suite`: 5 simulated manufacturing sites optimize Wing Weight together.

This was ``make demo`` until the reagent screen of :mod:`labfbo.apps.demo.screen` replaced it. Each site
runs the same wing-design process (6 design variables) under its own operating conditions
(fuel weight, dynamic pressure, load factor, gross weight). Every protocol available in this
build is compared with ``independent`` on the same problem, the same initial designs and the
same seeds; the suite prints a summary table and writes a convergence plot (PNG), the
results (JSON) and the table (Markdown) under ``runs/``, and ends with one site's campaign
report (HTML) from the journals of one federated run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

from labfbo.apps.harness import Job, plot_convergence, run_jobs, summary_table
from labfbo.apps.simulation import SimulationResult
from labfbo.protocols import available_protocols, get_protocol


@dataclass
class SuiteConfig:
    problem: str = "wing_weight"
    n_sites: int = 5
    n_init: int = 10
    budget: int = 30
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    protocols: list[str] | None = None
    out: str = "runs"
    workers: int = 2  # simulations run in parallel processes, one torch thread each


def demo_protocols() -> list[str]:
    """``independent`` first, then every other protocol that runs on a continuous space
    without extra configuration."""
    names = [p for p in available_protocols() if p != "independent"]
    runnable = [p for p in names if getattr(get_protocol(p), "demo", True)]
    return ["independent", *runnable]


def report_protocol(protocols: list[str]) -> str:
    """The protocol whose run the suite journals and reports: a federated one where there is one."""
    federated = [p for p in ("distribution", "consensus", "gradient") if p in protocols]
    return (federated or [p for p in protocols if p != "independent"] or protocols)[0]


def run_suite(cfg: SuiteConfig) -> tuple[list[SimulationResult], Path]:
    from tqdm.auto import tqdm

    protocols = cfg.protocols or demo_protocols()
    out = Path(cfg.out) / time.strftime("demo-suite-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    journaled = report_protocol(protocols)
    journals = out / "journals"  # the journaled run: every site of `journaled`'s first seed, for a report
    jobs = [Job(path=str(out / f"{p}-seed{s}.json"), label=p, problem=cfg.problem,
                problem_kwargs={"n_sites": cfg.n_sites}, protocol=p, seed=s, n_init=cfg.n_init, budget=cfg.budget,
                options={"storage_dir": str(journals)} if (p, s) == (journaled, cfg.seeds[0]) else {})
            for p in protocols for s in cfg.seeds]
    print(f"labfbo bench demo-suite: {cfg.n_sites} sites on {cfg.problem!r}, n_init={cfg.n_init}, "
          f"budget={cfg.budget}, seeds={cfg.seeds}, protocols={protocols}, {cfg.workers} worker(s)")
    with tqdm(total=len(jobs), desc="demo-suite", unit="run") as bar:
        def progress(done: int, total: int) -> None:
            bar.n = done
            bar.refresh()

        results = run_jobs(jobs, workers=cfg.workers, progress=progress)
    table = summary_table(results)
    png = plot_convergence(results, out / "convergence.png",
                           title=f"{cfg.problem}: {cfg.n_sites} sites, mean over sites and {len(cfg.seeds)} seeds")
    (out / "summary.md").write_text(
        f"# labfbo bench demo-suite\n\n{cfg.n_sites} sites, problem `{cfg.problem}`, n_init={cfg.n_init}, "
        f"budget={cfg.budget}, seeds={cfg.seeds}\n\n{table}\n")
    report = None
    sites = sorted(journals.glob("*.journal"))
    if sites:  # one site's campaign report, as a lab would see it after the campaign
        from labfbo.report import write_report

        report = write_report(sites[0], out / f"report-{sites[0].stem}.html").html
    print()
    print(table)
    print(f"\nplot:    {png}\nresults: {out}")
    if report is not None:
        print(f"report:  {report}  (site {sites[0].stem!r}, protocol {journaled!r}, seed {cfg.seeds[0]}; "
              f"open it in a browser)")
    return results, png


def _cmd(args: argparse.Namespace) -> int:
    cfg = SuiteConfig(problem=args.problem, n_sites=args.sites, n_init=args.n_init, budget=args.budget,
                      seeds=args.seeds, protocols=args.protocols, out=args.out, workers=args.workers)
    run_suite(cfg)
    return 0


BENCH_ORDER = 10  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench demo-suite``."""
    ds = bsub.add_parser("demo-suite", help="simulated multi-site campaign (Wing Weight, 5 sites), every protocol "
                         "(the former `labfbo demo`)")
    ds.add_argument("--problem", default="wing_weight")
    ds.add_argument("--sites", type=int, default=5)
    ds.add_argument("--n-init", type=int, default=10)
    ds.add_argument("--budget", type=int, default=30)
    ds.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ds.add_argument("--workers", type=int, default=2, help="simulations run in parallel processes")
    ds.add_argument("--protocols", nargs="+", default=None)
    ds.add_argument("--out", default="runs")
    ds.set_defaults(func=_cmd)
