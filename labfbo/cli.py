"""The ``labfbo`` command line: ``demo``, ``report``, ``bench``, ``coordinator``, ``site``, ``privacy``."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import Any, Sequence

BENCH_GROUP = "labfbo.bench"  # the entry-point group of the `labfbo bench` suites


def _one_thread() -> None:
    """One torch thread per process: oversubscribed threads make GP fits ~10x slower."""
    import torch

    torch.set_num_threads(int(os.environ.get("LABFBO_THREADS", "1")))


def _cmd_coordinator_serve(args: argparse.Namespace) -> int:
    if args.mpi:
        return _serve_mpi(args.config)
    import ipaddress

    import uvicorn

    from labfbo.core.exceptions import ConfigurationError
    from labfbo.server.app import CoordinatorServer, settle_heap
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
    settle_heap()
    uvicorn.run(server.app, host=args.host, port=args.port, log_level=args.log_level, lifespan="off",
                ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, backlog=4096, **server.uvicorn_limits())
    server.close()
    return 0


def _serve_mpi(config: str) -> int:
    """The coordinator as rank 0 of an MPI job whose other ranks run sites (``coordinator: mpi``)."""
    from labfbo.core.exceptions import ConfigurationError
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

    from labfbo.core.exceptions import ConfigurationError
    from labfbo.lab import SiteConfig, format_report, run_site

    cfg = SiteConfig.load(args.config)
    start = os.getcwd()  # --verify is relative to where the command runs
    # a site works in its config's folder: the adapter's files, commands and modules are found there
    os.chdir(cfg.base_dir)
    sys.path.insert(0, str(cfg.base_dir))
    _quiet_warnings(warnings)
    if args.budget is not None:
        if args.budget < 0:
            raise ConfigurationError(f"--budget must be >= 0, got {args.budget}")
        cfg = cfg.model_copy(update={"budget": args.budget})
    if args.verify is not None:
        flag = {"false": False, "true": True}.get(args.verify.lower())
        verify = os.path.abspath(os.path.join(start, args.verify)) if flag is None else flag
        cfg = cfg.model_copy(update={"verify": verify})
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


def _bench_entry_points() -> list[Any]:
    """The ``labfbo.bench`` entry points of every installed distribution, the first of a name winning.

    Read per distribution (not ``entry_points(group=...)``, which keeps one distribution of a name):
    a stale ``labfbo.egg-info`` left in the working folder by a build must not hide the installed suites."""
    from importlib.metadata import distributions

    found: dict[str, Any] = {}
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group == BENCH_GROUP:
                found.setdefault(ep.name, ep)
    return list(found.values())


def _add_bench_suites(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Each suite of the ``labfbo.bench`` entry-point group adds its ``labfbo bench`` subcommand(s).

    A suite is a module with ``add_parser(subparsers)`` (and, optionally, ``BENCH_ORDER``: its place
    in ``labfbo bench --help``); labfbo's own suites are the ``labfbo_bench`` package."""
    from labfbo.core.exceptions import ConfigurationError

    suites = []
    for ep in _bench_entry_points():
        try:
            module = ep.load()
        except Exception as exc:  # an uninstalled dependency, a renamed module: name the entry point
            raise ConfigurationError(f"benchmark suite {ep.name!r} ({ep.value}, entry point group "
                                     f"{BENCH_GROUP!r}) does not load: {type(exc).__name__}: {exc}") from exc
        if not callable(getattr(module, "add_parser", None)):
            raise ConfigurationError(f"benchmark suite {ep.name!r} ({ep.value}, entry point group {BENCH_GROUP!r}) "
                                     "has no add_parser(subparsers)")
        suites.append((getattr(module, "BENCH_ORDER", 10_000), ep.name, module))
    if not suites:
        raise ConfigurationError(f"no benchmark suites are installed (entry point group {BENCH_GROUP!r} is empty): "
                                 "install labfbo with its metadata, e.g. `pip install labfbo` or `pip install -e .`")
    for _, _, module in sorted(suites, key=lambda s: s[:2]):
        module.add_parser(bsub)


def build_parser(with_bench: bool = True) -> argparse.ArgumentParser:
    """The command line; ``with_bench=False`` leaves out the benchmark suites (nothing of them is imported)."""
    parser = argparse.ArgumentParser(prog="labfbo", description="Federated Bayesian optimization for labs.")
    sub = parser.add_subparsers(dest="command", required=True)

    importlib.import_module("labfbo.apps.demo.cli").add_parser(sub)
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
    serve.add_argument(
        "--mpi",
        action="store_true",
        help="serve over MPI as rank 0 (mpiexec -n 1 labfbo coordinator serve --mpi ... : -n N labfbo site run ...)",
    )
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
    run.add_argument("--verify", default=None, metavar="CA_PEM|false",
                     help="an https:// coordinator's certificate check: a CA bundle (the consortium's own CA), or "
                          "false for none (overrides `verify:` in the config)")
    run.set_defaults(func=_cmd_site_run)
    lst = ssub.add_parser("adapters", help="list the installed instrument adapters")
    lst.set_defaults(func=_cmd_site_adapters)
    importlib.import_module("labfbo.apps.audit_cli").add_parser(sub)
    bench = sub.add_parser("bench", help="benchmark suites")
    bsub = bench.add_subparsers(dest="suite", required=True)
    if with_bench:
        _add_bench_suites(bsub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from labfbo.core.exceptions import LabFBOError

    words = sys.argv[1:] if argv is None else list(argv)
    try:  # the benchmark suites load only for `labfbo bench ...`
        parser = build_parser(with_bench=words[:1] == ["bench"])
    except LabFBOError as exc:
        print(f"labfbo: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
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
