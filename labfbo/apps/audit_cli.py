"""``labfbo privacy audit``: the command-line front of :mod:`labfbo.apps.attacks`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def run_vote(args: argparse.Namespace) -> int:
    """The ``vote`` audit: the coordinator's and a peer's guess of each site's optimum from its votes."""
    from labfbo.apps.attacks import votes as vote_leakage

    seeds = [0] if args.quick else list(range(args.seeds))
    epsilons = [None, *(args.epsilons or [2.0])]
    budget = 10 if args.quick else max(args.iterations)
    cmd = "labfbo privacy audit " + " ".join(sys.argv[3:])
    results = vote_leakage.audit_votes(args.problem, epsilons, seeds, n_sites=args.sites, n_init=args.n_init,
                                       budget=budget, sealed=not args.unsealed)
    text = vote_leakage.table(results)
    out = Path(args.out) / args.problem
    out.mkdir(parents=True, exist_ok=True)
    (out / "vote_report.md").write_text(f"# Vote audit: {args.problem}, {budget} rounds\n\n`{cmd}`\n\n{text}\n")
    print(f"{cmd}\n{text}\n\nreport: {out / 'vote_report.md'}")
    return 0


def run_surface(args: argparse.Namespace) -> int:
    """The ``surface`` audit: the coordinator's, a peer's, the secure sum's and the sealed sum's reconstruction of each
    lab's
    combinations and standardized results (Buchwald–Hartwig labs), with and without DP; cached, resumable."""
    import json

    from tqdm.auto import tqdm

    from labfbo.apps.attacks import surface_audit
    from labfbo.core.exceptions import ConfigurationError

    labs = tuple(args.labs) if args.labs else surface_audit.default_labs(args.sites or 3)
    seeds = [0] if args.quick else list(range(args.seeds))
    budget = 10 if args.quick else max(args.iterations or [10])
    epsilons = [None, *(args.epsilons or [2.0, 8.0])]
    jobs = surface_audit.jobs(args.out, labs, epsilons, seeds, budget, n_init=args.n_init or 3, unit=args.unit)
    cmd = "labfbo privacy audit " + " ".join(sys.argv[3:])
    out = Path(args.out) / "surface"
    print(f"{cmd}\n{len(jobs)} campaigns ({sum(not Path(j.path).exists() for j in jobs)} to do), cache: {out}")
    bar = tqdm(total=len(jobs), desc="audit", unit="campaign")

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    try:
        results = surface_audit.run_jobs(jobs, progress)
    except ConfigurationError as exc:
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar.close()
    same = [r["same_proposals"] for r in results if "same_proposals" in r]
    text = surface_audit.table(results) + (f"\n\nThe campaigns at the defaults (sums sealed to the members) proposed "
                                           f"what the clear ones did in {sum(same)} of {len(same)}." if same else "")
    png = surface_audit.plot(results, out)
    head = (f"# Surface audit: {len(labs)} Buchwald–Hartwig labs ({', '.join(labs)}), {budget} rounds, "
            f"seeds {', '.join(map(str, seeds))}\n\n`{cmd}`\n\n")
    (out / "surface_report.md").write_text(head + text + f"\n\n![leakage]({png.name})\n")
    (out / "surface_audit.json").write_text(json.dumps({"command": cmd, "labs": labs, "budget": budget,
                                                        "results": results}))
    print(f"{text}\n\nreport: {out / 'surface_report.md'}; plot: {png}; JSON: {out / 'surface_audit.json'}")
    return 0


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    if args.protocol == "surface":
        return run_surface(args)
    args.iterations = args.iterations or [1, 20, 60, 99]
    args.sites = args.sites or 5
    args.n_init = args.n_init or 5
    if args.protocol == "vote":
        return run_vote(args)

    from labfbo.apps.attacks import gradient as leakage

    if args.quick:
        sigmas, seeds, iterations = (0.0, 8.0), [0], (1, 10)
    else:
        sigmas, seeds, iterations = tuple(args.sigmas), list(range(args.seeds)), tuple(args.iterations)
    out = Path(args.out)
    jobs = leakage.jobs(
        str(out),
        args.problem,
        sigmas,
        seeds,
        iterations,
        epsilons=tuple(args.epsilons or ()),
        n_sites=args.sites,
        n_particles=args.particles,
        n_init=args.n_init,
        clip=args.clip,
        restarts=args.restarts,
        steps=args.steps,
        tol=args.tol,
        sparse_start=not args.paper_attack,
        acquisition=args.acquisition,
        sequential=not (args.single_round or args.paper_attack),
    )
    cmd = "labfbo privacy audit " + " ".join(sys.argv[3:])
    print(f"{cmd}\n{len(jobs)} campaigns ({sum(not Path(j.path).exists() for j in jobs)} to do), cache: {out}")
    bar = tqdm(total=len(jobs), desc="audit", unit="campaign")

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    results = leakage.run_jobs(jobs, args.workers, progress)
    bar.close()
    table = leakage.table(results)
    plots = leakage.plot(results, out / args.problem)
    (out / args.problem / "report.md").write_text(
        f"# Gradient-leakage audit: {args.problem}\n\n`{cmd}`\n\n{table}\n\n"
        + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n")
    print(table)
    print("\nreport: " + str(out / args.problem / "report.md") + "; plots: " + ", ".join(map(str, plots)))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    pv = sub.add_parser("privacy", help="privacy tools")
    pvsub = pv.add_subparsers(dest="privacy_cmd", required=True)
    au = pvsub.add_parser("audit", help="the coordinator's gradient-leakage attack (PACD-BO §V-A), with and "
                          "without DP (cached, resumable)")
    au.add_argument(
        "--protocol",
        choices=["gradient", "vote", "surface"],
        default="gradient",
        help="gradient: the "
        "gradient-inversion attack; vote: the coordinator's and a peer's guess of each site's optimum from its votes "
        "(no DP and --epsilons, default 2; rounds: the largest --iterations); surface: the coordinator's, "
        "a peer's and the secure sum's reconstruction of each lab's combinations and results on "
        "Buchwald-Hartwig labs (no DP and --epsilons, default 2 8; rounds: the largest --iterations, "
        "default 10; --sites labs, default 3, or --labs)",
    )
    au.add_argument("--problem", default="sphere", help="a 2-D problem (GUIDE functions run at dim 2)")
    au.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 2.0, 8.0], help="DP noise multipliers; 0 = no DP")
    au.add_argument("--epsilons", type=float, nargs="+", help="campaign budgets DP(epsilon=...) audited too (the "
                    "table shows the noise multiplier each calibrated)")
    au.add_argument("--unit", choices=["site", "experiment"], default="site", help="surface: the DP unit of "
                    "--epsilons (experiment: ranked statistics; the secure sum holds moment and feature sums)")
    au.add_argument("--iterations", type=int, nargs="+", help="BO iterations attacked (default 1 20 60 99)")
    au.add_argument("--seeds", type=int, default=3)
    au.add_argument("--sites", type=int, help="sites (default 5; surface: labs, default 3)")
    au.add_argument("--labs", nargs="+", help="surface: the aryl halides (labs) of the Buchwald-Hartwig data "
                    "(default: the demo's --sites most related)")
    au.add_argument("--particles", type=int, default=5, help="K")
    au.add_argument("--n-init", type=int, help="initial experiments per site (default 5; surface: 3)")
    au.add_argument("--clip", type=float, default=1.0, help="DP clip C")
    au.add_argument("--restarts", type=int, default=5, help="attack starts (the first is the sparse start)")
    au.add_argument("--steps", type=int, default=5, help="exchange steps of a round the attacker matches")
    au.add_argument("--tol", type=float, default=0.05, help="a query counts as recovered within this distance")
    au.add_argument("--paper-attack", action="store_true", help="random starts only (PACD-BO's attack), "
                    "no sparse start, each round alone; use another --out")
    au.add_argument("--single-round", action="store_true", help="attack each audited round alone (the "
                    "default carries the reconstruction from round to round); use another --out")
    au.add_argument("--acquisition", default="ucb", help="the sites' acquisition (ucb: kappa 2; ei converges "
                    "faster); use another --out")
    au.add_argument("--unsealed", action="store_true", help="vote: the coordinator counts the votes in the clear "
                    "(sealed=False) instead of relaying sealed ones")
    au.add_argument("--out", default="runs/audit")
    au.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)))
    au.add_argument("--quick", action="store_true", help="sigma 0 and 8, t 1 and 10, one seed (minutes)")
    au.set_defaults(func=run)
