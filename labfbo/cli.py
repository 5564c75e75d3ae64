"""The ``labfbo`` command line: ``demo``, ``report``, ``bench``, ``coordinator``, ``site``, ``privacy``."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence


GUIDE_FUNCTIONS = ("ackley", "levy", "griewank", "rastrigin", "weierstrass", "ellipsoid", "sphere",
                   "zakharov", "rosenbrock", "michalewicz", "powell", "styblinski_tang")


def _one_thread() -> None:
    """One torch thread per process: oversubscribed threads make GP fits ~10x slower."""
    import torch

    torch.set_num_threads(int(os.environ.get("LABFBO_THREADS", "1")))


def _cmd_bench_demo_suite(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.demo_suite import SuiteConfig, run_suite

    cfg = SuiteConfig(problem=args.problem, n_sites=args.sites, n_init=args.n_init, budget=args.budget,
                      seeds=args.seeds, protocols=args.protocols, out=args.out, workers=args.workers)
    run_suite(cfg)
    return 0


def _cmd_bench_latency(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.latency import cli_run

    return cli_run(args)


def _run_cached(name: str, jobs: list, workers: int, cache: str) -> tuple[str, list]:
    """Run (or resume) cached benchmark jobs with a progress bar; returns (command line, results)."""
    from tqdm.auto import tqdm

    from labfbo.benchmarks.runner import run_jobs

    cmd = f"labfbo bench {name} " + " ".join(sys.argv[3:])
    paths = {j.path for j in jobs}
    print(f"{cmd}\n{len(paths)} runs ({sum(not Path(p).exists() for p in paths)} to do), cache: {cache}")
    bar = tqdm(total=len(paths), desc=name, unit="run")

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    results = run_jobs(jobs, workers=workers, progress=progress)
    bar.close()
    return cmd, results


def _run_suite(name: str, module: Any, jobs: list, out: "Path", functions: tuple[str, ...], workers: int) -> int:
    """Run (or resume) a suite's cached jobs, then print and save its table and plots."""
    cmd, results = _run_cached(name, jobs, workers, str(out))
    table = module.table(results, functions)
    plots = module.plot(results, out, functions)
    (out / "summary.md").write_text(f"# {name} suite\n\n`{cmd}`\n\n{table}\n")
    print(table)
    print("\nplots: " + ", ".join(map(str, plots)))
    return 0


def _cmd_bench_pmcbo(args: argparse.Namespace) -> int:
    from labfbo.benchmarks import pmcbo

    if args.quick:
        functions, acqs, seeds = ("branin",), tuple(args.acquisitions or ("ucb",)), list(range(3))
    else:
        functions, acqs, seeds = tuple(args.functions), tuple(args.acquisitions or ("ei", "ucb")), list(range(args.seeds))
    out = Path(args.out)
    jobs = pmcbo.jobs(str(out), functions, acqs, seeds, budget=args.budget, n_init=args.n_init,
                      only=tuple(args.methods) if args.methods else None)
    return _run_suite("pmcbo", pmcbo, jobs, out, functions, args.workers)


def _cmd_bench_pacd(args: argparse.Namespace) -> int:
    from labfbo.benchmarks import pacd

    if args.quick:
        functions, seeds, budget = ("branin", "wing_weight"), list(range(3)), 30
    else:
        functions, seeds, budget = tuple(args.functions), list(range(args.seeds)), args.budget
    out = Path(args.out)
    jobs = pacd.jobs(str(out), functions, seeds, budget=budget, dp=args.dp, n_sites=args.sites,
                     methods=tuple(args.methods) if args.methods else None, initial=args.n_init)
    return _run_suite("pacd", pacd, jobs, out, functions, args.workers)


def _cmd_bench_guide(args: argparse.Namespace) -> int:
    from labfbo.benchmarks import guide

    if args.quick:
        kw = dict(functions=guide.QUICK_FUNCTIONS, levels=(2,), methods=tuple(args.methods or ("UCB", "GUIDE-UCB")),
                  seeds=range(3), n_sites=8, n_init=20, budget=25)
    else:
        kw = dict(functions=tuple(args.functions), levels=tuple(args.levels), methods=tuple(args.methods or guide.METHODS),
                  seeds=range(args.seeds), n_sites=args.sites, n_init=args.n_init, budget=args.budget)
    out = Path(args.out)
    jobs = guide.jobs(str(out), ablation=args.ablation, ablation_functions=tuple(args.ablation_functions),
                      **kw)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    cmd, results = _run_cached("guide", jobs, args.workers, str(out))
    table = guide.tables(results, jobs)
    plots = guide.plot(results, jobs, out)
    cpu = sum(r.wall_time for r in results)
    note = f"{len(jobs)} runs, {cpu / 3600:.2f} CPU-hours of simulation, this invocation {time.perf_counter() - t0:.0f} s"
    (out / "summary.md").write_text(f"# guide suite\n\n`{cmd}`\n\n{note}\n{table}\n")
    print(note)
    print(table)
    print("\nplots: " + ", ".join(map(str, plots)))
    return 0


def _cmd_bench_guide_cost(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.guide_cost import report

    print("labfbo bench guide-cost " + " ".join(sys.argv[3:]) + "\n")
    print(report(tuple(args.n_obs), tuple(args.sites), args.repeats, args.comm_sites))
    return 0


def _cmd_bench_http_rounds(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.transport import report_http

    print("labfbo bench http-rounds " + " ".join(sys.argv[3:]) + "\n")
    print(report_http(tuple(args.sites), args.rounds))
    return 0


def _cmd_bench_http_join(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.join_flood import report

    print("labfbo bench http-join " + " ".join(sys.argv[3:]) + "\n")
    print(report(tuple(args.params), args.seconds))
    return 0


def _cmd_bench_privacy_utility(args: argparse.Namespace) -> int:
    from labfbo.benchmarks import privacy_utility

    if args.gradient_sigmas is None and args.distribution_sigmas is None:  # campaign budgets DP(epsilon=...)
        from labfbo.benchmarks.privacy_grid_cli import run

        return run(args)
    args.gradient_sigmas = args.gradient_sigmas or [2.0, 8.0]
    args.distribution_sigmas = args.distribution_sigmas or [1.0, 4.0]
    jobs = privacy_utility.jobs(args.pacd_out, args.guide_out, range(args.seeds), tuple(args.gradient_sigmas),
                                tuple(args.distribution_sigmas))
    _, results = _run_cached("privacy-utility", jobs, args.workers, f"{args.pacd_out}, {args.guide_out}")
    print(privacy_utility.table(results, jobs))
    return 0


def _cmd_bench_site_loop(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.site_loop import report

    print("labfbo bench site-loop " + " ".join(sys.argv[3:]) + "\n")
    print(report(args.problem, args.n_init, args.budget, args.repeats, args.in_flight, tuple(args.csv_rows)))
    return 0


def _cmd_bench_meta_fit(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.meta_fit import format_rows, run
    from labfbo.exceptions import ConfigurationError

    def parse(text: str) -> dict[str, str]:     # values stay strings: PacohConfig validates them
        pairs = [item.partition("=") for item in filter(None, text.split(","))]
        if any(not sep for _, sep, _ in pairs):
            raise ConfigurationError(f"--settings wants key=value pairs separated by commas, got {text!r}")
        return {key: value for key, _, value in pairs}

    print("labfbo bench meta-fit " + " ".join(sys.argv[3:]) + "\n")
    base, rows = run(args.problem, args.sites, args.n, args.steps, [parse(s) for s in args.settings], args.seed)
    print(format_rows(base, rows))
    return 0


def _cmd_bench_round_time(args: argparse.Namespace) -> int:
    from labfbo.benchmarks.round_time import format_rows, measure

    import statistics

    print("labfbo bench round-time " + " ".join(sys.argv[3:]) + "\n")
    rows = measure(args.sites, args.particles, args.n_obs, args.steps, args.repeats, args.dim)
    print(format_rows(rows))
    if args.secure_aggregation:  # the same rounds with masked uploads, measured in the same run
        masked = measure(args.sites, args.particles, args.n_obs, args.steps, args.repeats, args.dim, True)
        print("\nwith secure_aggregation=True:\n\n" + format_rows(masked))
        ratio = (statistics.median(r.meta_update_s for r in masked[1:])
                 / statistics.median(r.meta_update_s for r in rows[1:]))
        print(f"\nmeta-update with / without secure aggregation: {ratio:.2f}x (median over rounds >= 1)")
    return 0


def _cmd_coordinator_serve(args: argparse.Namespace) -> int:
    if args.mpi:
        return _serve_mpi(args.config)
    import ipaddress

    import uvicorn

    from labfbo.exceptions import ConfigurationError
    from labfbo.server.app import CoordinatorServer
    from labfbo.server.config import ServerConfig

    tls = bool(args.ssl_certfile and args.ssl_keyfile)
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not tls and not args.insecure:
        raise ConfigurationError(f"refusing to serve on {args.host} without TLS: give --ssl-certfile and "
                                 "--ssl-keyfile, or --insecure if a TLS proxy sits in front")
    server = CoordinatorServer(ServerConfig.load(args.config))
    print(f"labfbo coordinator: study {server.config.study!r}, protocol {server.config.protocol!r}, "
          f"{len(server.config.sites)} sites, on {'https' if tls else 'http'}://{args.host}:{args.port}", flush=True)
    if server.config.space is None:
        print("labfbo coordinator: note: the config pins no `space:`, so the first lab to join sets the study's "
              "space (`labfbo coordinator init --space` pins it)", flush=True)
    # keep-alive longer than a long poll (30 s), so idle site connections are not cut mid-reuse
    uvicorn.run(server.app, host=args.host, port=args.port, log_level=args.log_level, lifespan="off",
                ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, backlog=4096, **server.uvicorn_limits())
    server.close()
    return 0


def _serve_mpi(config: str) -> int:
    """The coordinator as rank 0 of an MPI job whose other ranks run sites (``coordinator: mpi``)."""
    from labfbo.exceptions import ConfigurationError
    from labfbo.server.config import ServerConfig
    from labfbo.transport.mpi import serve, world

    cfg = ServerConfig.load(config)
    rank, size = world()
    if rank != 0:
        raise ConfigurationError(f"`coordinator serve --mpi` must run at rank 0, not {rank}")
    print(f"labfbo coordinator: study {cfg.study!r}, protocol {cfg.protocol!r}, {len(cfg.sites)} sites, "
          f"MPI ranks 1..{size - 1}", flush=True)
    serve(cfg.coordinator())
    return 0


def _cmd_site_run(args: argparse.Namespace) -> int:
    import warnings

    from labfbo.exceptions import ConfigurationError
    from labfbo.lab import SiteConfig, format_report, run_site

    cfg = SiteConfig.load(args.config)
    # a site works in its config's folder: the adapter's files, commands and modules are found there
    os.chdir(cfg.base_dir)
    sys.path.insert(0, str(cfg.base_dir))
    _quiet_warnings(warnings)
    if args.budget is not None:
        if args.budget < 0:
            raise ConfigurationError(f"--budget must be >= 0, got {args.budget}")
        cfg = cfg.model_copy(update={"budget": args.budget})
    report = run_site(cfg, args.adapter, progress=not args.no_progress)
    print(format_report(report, cfg), flush=True)
    return {"interrupted": 130, "failures": 3}.get(report.stopped, 0)


def _quiet_warnings(warnings: Any) -> None:
    """A lab console shows labfbo's warnings as one line each, without the model libraries' numerics."""
    for category in ("linear_operator.utils.warnings.NumericalWarning", "botorch.exceptions.warnings.InputDataWarning",
                     "botorch.exceptions.warnings.BadInitialCandidatesWarning",
                     "botorch.exceptions.warnings.OptimizationWarning", "gpytorch.utils.warnings.GPInputWarning"):
        module, _, name = category.rpartition(".")
        try:
            warnings.filterwarnings("ignore", category=getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    warnings.filterwarnings("ignore", message=".*[Nn]egative variance.*")
    warnings.formatwarning = lambda message, *args, **kw: f"labfbo: warning: {message}\n"


def _cmd_site_adapters(args: argparse.Namespace) -> int:
    from labfbo.adapters import discover_adapters

    for name, ep in sorted(discover_adapters().items()):
        print(f"{name:<16} {ep.value}")
    return 0


def _cmd_coordinator_token(args: argparse.Namespace) -> int:
    from labfbo.server.config import new_token

    token, digest = new_token()
    print(f"token (give it to the site, keep it secret): {token}\nsha256 (put it in consortium.yaml): {digest}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labfbo", description="Federated Bayesian optimization for labs.")
    sub = parser.add_subparsers(dest="command", required=True)

    importlib.import_module("labfbo.demo_cli").add_parser(sub)
    importlib.import_module("labfbo.report.cli").add_parser(sub)

    co = sub.add_parser("coordinator", help="the consortium's coordinator server (HTTP)")
    cosub = co.add_subparsers(dest="coordinator_cmd", required=True)
    serve = cosub.add_parser("serve", help="serve a study described by a consortium.yaml")
    serve.add_argument("--config", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8750)
    serve.add_argument("--ssl-certfile", default=None)
    serve.add_argument("--ssl-keyfile", default=None)
    serve.add_argument("--insecure", action="store_true", help="allow a non-loopback address without TLS")
    serve.add_argument("--log-level", default="warning")
    serve.add_argument("--mpi", action="store_true",
                       help="serve over MPI as rank 0 (mpiexec -n 1 labfbo coordinator serve --mpi ... : -n N labfbo site run ...)")
    serve.set_defaults(func=_cmd_coordinator_serve)
    tok = cosub.add_parser("token", help="print a new site/admin token and its SHA-256 for the config")
    tok.set_defaults(func=_cmd_coordinator_token)
    importlib.import_module("labfbo.server.init_cli").add_parser(cosub)  # `coordinator init`
    site = sub.add_parser("site", help="a site's closed loop on an instrument adapter")
    ssub = site.add_subparsers(dest="site_cmd", required=True)
    run = ssub.add_parser("run", help="run (or resume) the campaign described by a site.yaml")
    run.add_argument("--config", required=True, help="the site's YAML configuration")
    run.add_argument("--adapter", default=None, help="adapter name (overrides `adapter.name` in the config)")
    run.add_argument("--budget", type=int, default=None, help="BO experiments after the initial design")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_site_run)
    lst = ssub.add_parser("adapters", help="list the installed instrument adapters")
    lst.set_defaults(func=_cmd_site_adapters)
    importlib.import_module("labfbo.privacy.audit_cli").add_parser(sub)
    bench = sub.add_parser("bench", help="benchmark suites")
    bsub = bench.add_subparsers(dest="suite", required=True)
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
    ds.set_defaults(func=_cmd_bench_demo_suite)
    lat = bsub.add_parser("latency", help="ask() latency of `independent` vs a plain BoTorch loop")
    lat.add_argument("--problems", nargs="+", default=["branin", "hartmann6"])
    lat.add_argument("--n-obs", type=int, nargs="+", default=[10, 30, 100])
    lat.add_argument("--acquisition", default="nei", choices=["nei", "ei", "ucb"], help="labfbo's and the "
                     "same-model loop's acquisition (default: independent's)")
    lat.add_argument("--noise-prior", default="lognormal", choices=["lognormal", "gamma", "auto"],
                     help="labfbo's and the same-model loop's noise prior (default: independent's)")
    lat.add_argument("--output-transform", default="winsorize", choices=["winsorize", "standardize"],
                     help="labfbo's and the same-model loop's output transform (default: independent's)")
    lat.add_argument("--repeats", type=int, default=7)
    lat.add_argument("--no-categorical", action="store_true", help="skip the 276-combination and one-categorical rows")
    lat.set_defaults(func=_cmd_bench_latency)
    pm = bsub.add_parser("pmcbo", help="PMCBO Tables 4-5: priors and consensus (cached, resumable)")
    pm.add_argument("--quick", action="store_true", help="3 seeds, UCB variants on Branin only")
    pm.add_argument("--functions", nargs="+", default=["branin", "hartmann3", "hartmann6"])
    pm.add_argument("--acquisitions", nargs="+", default=None, choices=["ei", "ucb", "nei"],
                    help="the paper's ei and ucb (default; --quick: ucb), or nei (labfbo's default)")
    pm.add_argument("--seeds", type=int, default=10)
    pm.add_argument("--budget", type=int, default=60)
    pm.add_argument("--n-init", type=int, default=5)
    pm.add_argument("--methods", nargs="+", help="only these rows, e.g. EI CBOC-U 'I-PMCBO (labfbo defaults)'")
    pm.add_argument("--workers", type=int, default=2)
    pm.add_argument("--out", default="runs/bench/pmcbo")
    pm.set_defaults(func=_cmd_bench_pmcbo)
    pa = bsub.add_parser("pacd", help="PACD-BO Table I: gradient vs centralized, independent, CBOC")
    pa.add_argument("--quick", action="store_true", help="Branin and Wing Weight, T=30, 3 seeds")
    pa.add_argument("--functions", nargs="+", default=["sinusoid", "branin", "hartmann6", "wing_weight"])
    pa.add_argument("--methods", nargs="+", default=None)
    pa.add_argument("--seeds", type=int, default=10)
    pa.add_argument("--budget", type=int, default=100)
    pa.add_argument("--dp", action="store_true", help="add DP-PACD-BO (sigma=8, C=1)")
    pa.add_argument("--sites", type=int, default=5, help="sites of the family (the paper: 5)")
    pa.add_argument("--n-init", type=int, default=None, help="initial points per site (default: the paper's)")
    pa.add_argument("--workers", type=int, default=2)
    pa.add_argument("--out", default="runs/bench/pacd")
    pa.set_defaults(func=_cmd_bench_pacd)
    gu = bsub.add_parser("guide", help="GUIDE-FBO Tables 1, 3, 8-10: distribution vs local BO (cached, resumable)")
    gu.add_argument("--quick", action="store_true",
                    help="level 2, Ackley/Ellipsoid/Sphere/Zakharov, UCB vs GUIDE-UCB, N=8, 20 init, 25 rounds, 3 seeds")
    gu.add_argument("--functions", nargs="+", default=list(GUIDE_FUNCTIONS), choices=list(GUIDE_FUNCTIONS))
    gu.add_argument("--levels", nargs="+", type=int, default=[1, 2, 3], choices=[1, 2, 3])
    gu.add_argument("--methods", nargs="+", default=None,
                    choices=["UCB", "NEI", "TS", "GUIDE-UCB", "GUIDE-NEI", "GUIDE-TS", "GUIDE-NEI-winsorize"],
                    help="default: the six of the paper (with --quick: UCB and GUIDE-UCB); GUIDE-NEI-winsorize only "
                         "when named")
    gu.add_argument("--ablation", action="store_true", help="add Table 3 (level 2, Ackley/Rastrigin/Zakharov/Michalewicz)")
    gu.add_argument("--ablation-functions", nargs="+", default=["ackley", "rastrigin", "zakharov", "michalewicz"],
                    choices=list(GUIDE_FUNCTIONS))
    gu.add_argument("--seeds", type=int, default=10)
    gu.add_argument("--sites", type=int, default=16)
    gu.add_argument("--n-init", type=int, default=30)
    gu.add_argument("--budget", type=int, default=50)
    gu.add_argument("--workers", type=int, default=2)
    gu.add_argument("--out", default="runs/bench/guide")
    gu.set_defaults(func=_cmd_bench_guide)
    gc = bsub.add_parser("guide-cost", help="distribution protocol: seconds per site-round, server time, message sizes")
    gc.add_argument("--n-obs", nargs="+", type=int, default=[30, 80])
    gc.add_argument("--sites", nargs="+", type=int, default=[16, 256], help="server aggregation sizes")
    gc.add_argument("--comm-sites", type=int, default=16, help="sites of the federation whose messages are read")
    gc.add_argument("--repeats", type=int, default=3)
    gc.set_defaults(func=_cmd_bench_guide_cost)
    hr = bsub.add_parser("http-rounds", help="HTTP round latency and coordinator CPU for many light sites")
    hr.add_argument("--sites", nargs="+", type=int, default=[10, 100, 500])
    hr.add_argument("--rounds", type=int, default=5)
    hr.set_defaults(func=_cmd_bench_http_rounds)
    hj = bsub.add_parser("http-join", help="health latency while huge joins are refused")
    hj.add_argument("--params", type=int, nargs="+", default=[2, 10_000, 40_000])
    hj.add_argument("--seconds", type=float, default=5.0)
    hj.set_defaults(func=_cmd_bench_http_join)
    pu = bsub.add_parser("privacy-utility", help="regret against the campaign budget DP(epsilon=...) for every "
                         "protocol with DP, beside no DP and independent (cached)")
    pu.add_argument("--suite", choices=["pacd", "reactions"], default="pacd")
    pu.add_argument("--epsilons", type=float, nargs="+", help="budgets per site (default 0.5 1 2 4 8 16; "
                    "--quick: 0.5 2 8)")
    pu.add_argument("--protocols", nargs="+", help="protocols and mechanism variants (default: gradient "
                    "distribution surface)")
    pu.add_argument("--functions", nargs="+", help="pacd suite: families (default branin wing_weight)")
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
    pu.set_defaults(func=_cmd_bench_privacy_utility)
    sl = bsub.add_parser("site-loop", help="labfbo site run's loop against a plain ask/tell loop; restart; csv polls")
    sl.add_argument("--problem", default="branin")
    sl.add_argument("--n-init", type=int, default=5)
    sl.add_argument("--budget", type=int, default=20)
    sl.add_argument("--repeats", type=int, default=3)
    sl.add_argument("--in-flight", type=int, default=8)
    sl.add_argument("--csv-rows", type=int, nargs="+", default=[100, 1000, 10000])
    sl.set_defaults(func=_cmd_bench_site_loop)
    rt = bsub.add_parser("round-time", help="seconds per gradient-protocol round: meta-update vs acquisition")
    rt.add_argument("--sites", type=int, default=5)
    rt.add_argument("--particles", type=int, default=10)
    rt.add_argument("--n-obs", type=int, default=100)
    rt.add_argument("--steps", type=int, default=20)
    rt.add_argument("--dim", type=int, default=2)
    rt.add_argument("--repeats", type=int, default=3)
    rt.add_argument("--secure-aggregation", action="store_true", help="also time masked rounds; print the ratio")
    rt.set_defaults(func=_cmd_bench_round_time)
    mf = bsub.add_parser("meta-fit", help="offline PACOH meta-training: test error vs steps, local and pooled GPs")
    mf.add_argument("--problem", default="hartmann6")
    mf.add_argument("--sites", type=int, default=5)
    mf.add_argument("--n", type=int, default=30, help="random points per site")
    mf.add_argument("--steps", type=int, default=2000)
    mf.add_argument("--seed", type=int, default=0)
    mf.add_argument("--settings", nargs="+", default=["meta_optimizer=adam,step_size=0.01",
                                                       "meta_optimizer=sgd,step_size=0.1"],
                    help="PacohConfig overrides to compare, e.g. meta_optimizer=adam,step_size=0.03")
    mf.set_defaults(func=_cmd_bench_meta_fit)
    for suite in ("engine_cli", "reactions_cli", "multiobjective_cli", "report_time", "transports_cli"):  # suites that bring their own parser
        importlib.import_module(f"labfbo.benchmarks.{suite}").add_parser(bsub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from labfbo.exceptions import LabFBOError

    args = build_parser().parse_args(argv)
    _one_thread()
    try:
        return int(args.func(args) or 0)
    except LabFBOError as exc:
        print(f"labfbo: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if argv is None:  # the command line, about to exit: the interpreter's last garbage collection over
            gc.freeze()   # torch's, scipy's and matplotlib's objects takes 1-2 s and frees nothing the OS won't


if __name__ == "__main__":
    sys.exit(main())
