"""`labfbo bench privacy-utility`: what DP costs each protocol, side by side with the non-private runs.

* `gradient` (PACD-BO, the `pacd` quick setting: Branin and Wing Weight, 5 sites, T = 30):
  Independent and PACD-BO without DP, and DP-PACD-BO with C = 1 and each noise multiplier.
* `distribution` (GUIDE-FBO, the `guide` quick setting at level 2: N = 8, 20 initial
  points, T = 25): UCB and GUIDE-UCB without DP, and GUIDE-UCB with the Gaussian
  mechanism on the uplink (:mod:`labfbo.privacy.belief_dp`, value bound C = 3) for each
  noise multiplier.

Runs share the `pacd` and `guide` suites' caches (same paths), so non-private runs
already made there are reused. The table gives each method's final normalized regret and
AUC (mean ± std over seeds) and each site's cumulative epsilon at delta = 1e-5.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from labfbo.apps.harness import Job
from labfbo.apps.simulation import SimulationResult
from labfbo.privacy import DP
from labfbo_bench import guide, pacd

GRADIENT_FUNCTIONS = ("branin", "wing_weight")
DISTRIBUTION_FUNCTIONS = ("ackley", "zakharov")


def jobs(pacd_out: str, guide_out: str, seeds: Sequence[int], gradient_sigmas: Sequence[float] = (2.0, 8.0),
         distribution_sigmas: Sequence[float] = (1.0, 4.0), value_clip: float = 3.0) -> list[Job]:
    result = pacd.jobs(pacd_out, GRADIENT_FUNCTIONS, list(seeds), budget=30, methods=("Independent", "PACD-BO"))
    for fn in GRADIENT_FUNCTIONS:
        for sigma in gradient_sigmas:
            label = f"DP-PACD-BO σ={sigma:g}"
            for s in seeds:
                result.append(Job(path=str(Path(pacd_out) / fn / f"DP-PACD-BO-sigma{sigma:g}" / f"seed{s}.json"),
                                  label=label, problem=fn, problem_kwargs={"n_sites": 5}, protocol="gradient", seed=s,
                                  n_init=pacd.N_INIT[fn], budget=30,
                                  options={"privacy": DP(clip=1.0, noise_multiplier=sigma)}))
    plain = guide.jobs(guide_out, DISTRIBUTION_FUNCTIONS, (2,), ("UCB", "GUIDE-UCB"), seeds, n_sites=8, n_init=20,
                       budget=25)
    result += plain
    for job in [j for j in plain if j.label == "GUIDE-UCB"]:
        for sigma in distribution_sigmas:
            path = Path(job.path)
            result.append(Job(path=str(path.parent.parent / f"GUIDE-UCB-DP-sigma{sigma:g}" / path.name),
                              label=f"GUIDE-UCB DP σ={sigma:g}", problem=job.problem,
                              problem_kwargs=job.problem_kwargs, protocol=job.protocol, seed=job.seed,
                              n_init=job.n_init, budget=job.budget,
                              options={**job.options, "privacy": DP(clip=value_clip, noise_multiplier=sigma)}))
    return result


def table(results: Sequence[SimulationResult], jobs_: Sequence[Job]) -> str:
    """Markdown: per function and method, final normalized regret, AUC and epsilon (mean ± std over seeds)."""
    label_of = {j.path: j.label for j in jobs_}
    by: dict[tuple[str, str], list[SimulationResult]] = {}
    for job, r in zip(jobs_, results):
        by.setdefault((r.problem, label_of[job.path]), []).append(r)
    lines = ["| protocol | function | method | seeds | final normalized regret | AUC | ε per site (δ = 1e-5) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (fn, label), rs in by.items():
        proto = "gradient" if fn in GRADIENT_FUNCTIONS else "distribution"
        nr = np.array([r.final_regret().mean() for r in rs])
        auc = np.array([r.auc.mean() for r in rs])
        eps = [e for r in rs for e in (r.epsilon or [])]
        eps_s = f"{np.mean(eps):.3g}" if eps else "— (no DP)"
        lines.append(f"| {proto} | {fn} | {label} | {len(rs)} | {nr.mean():.4g} ± {nr.std():.2g} | "
                     f"{auc.mean():.4g} ± {auc.std():.2g} | {eps_s} |")
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    from labfbo_bench.suite_cli import run_cached

    if args.gradient_sigmas is None and args.distribution_sigmas is None:  # campaign budgets DP(epsilon=...)
        from labfbo_bench.privacy_grid_cli import run

        return run(args)
    args.gradient_sigmas = args.gradient_sigmas or [2.0, 8.0]
    args.distribution_sigmas = args.distribution_sigmas or [1.0, 4.0]
    todo = jobs(args.pacd_out, args.guide_out, range(args.seeds), tuple(args.gradient_sigmas),
                tuple(args.distribution_sigmas))
    _, results = run_cached("privacy-utility", todo, args.workers, f"{args.pacd_out}, {args.guide_out}")
    print(table(results, todo))
    return 0


BENCH_ORDER = 90  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench privacy-utility``."""
    pu = bsub.add_parser("privacy-utility", help="regret against the campaign budget DP(epsilon=...) for every "
                         "protocol with DP, beside no DP and independent (cached)")
    pu.add_argument("--suite", choices=["pacd", "reactions"], default="pacd")
    pu.add_argument("--scenario", choices=["a", "c"], default="a", help="reactions suite: the labs (a: 5 alike, "
                    "the default; c: all 15)")
    pu.add_argument("--epsilons", type=float, nargs="+", help="budgets per site (default 0.5 1 2 4 8 16; "
                    "--quick: 0.5 2 8)")
    pu.add_argument("--protocols", nargs="+", help="protocols and mechanism variants (default: gradient "
                    "distribution surface)")
    pu.add_argument("--functions", nargs="+", help="pacd suite: families (default branin wing_weight)")
    pu.add_argument("--sites", type=int, default=5, help="pacd suite: sites of each family (default 5)")
    pu.add_argument("--initial", type=int, default=None, help="pacd suite: initial points per site (default: "
                    "the suite's, 5 in 2-D, else 10)")
    pu.add_argument("--budget", type=int, default=None, help="pacd suite: rounds after the initial points (30)")
    pu.add_argument("--quick", action="store_true", help="three budgets, 3 seeds")
    pu.add_argument("--report-only", action="store_true", help="tabulate the cached runs, run nothing")
    pu.add_argument("--seeds", type=int, default=3)
    pu.add_argument("--gradient-sigmas", type=float, nargs="+", default=None,
                    help="the older fixed-noise comparison (with --distribution-sigmas): noise multipliers")
    pu.add_argument("--distribution-sigmas", type=float, nargs="+", default=None)
    pu.add_argument("--pacd-out", default="runs/bench/pacd")
    pu.add_argument("--reactions-out", default="runs/bench/reactions-privacy")
    pu.add_argument("--guide-out", default="runs/bench/guide")
    pu.add_argument("--workers", type=int, default=2)
    pu.set_defaults(func=_cmd)
