r"""`simulate`: run a federated campaign on a benchmark problem, in lock-step rounds.

Every site runs a real :class:`~labfbo.Optimizer` connected to one
:class:`~labfbo.Coordinator`; only the objective evaluation is simulated. Metrics:

* ``best_values[i, t]``: best *noiseless* value among the points site ``i`` evaluated
  up to BO iteration ``t`` (initial design included);
* ``simple_regret = sign * (best_values - f*_i)`` (>= 0);
* ``normalized_regret = simple_regret / R_i`` with the problem's objective range
  :math:`R_i` (see :mod:`labfbo.problems.problem`);
* ``auc[i]``: mean normalized regret over the first :math:`\lceil 0.1\,T \rceil`
  iterations (PACD-BO's early-convergence AUC);
* ``proposals[i, t]``: the evaluated point in user units, in the space's parameter
  order (categoricals as their choice index);
* ``bytes_up`` / ``bytes_down``: bytes (wire frames) the site sent / received in round ``t``.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from labfbo.coordinator import Coordinator
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.seeding import int_seed, rng
from labfbo.optimizer import Optimizer
from labfbo.problems import FederatedProblem
from labfbo.protocols import Protocol, as_keywords
from labfbo.space.search import Categorical


@dataclass
class SimulationResult:
    """Per-site, per-iteration results of :func:`simulate` (site is the first axis)."""

    problem: str
    protocol: str
    seed: int
    n_init: int
    budget: int
    site_names: list[str]
    best_values: np.ndarray
    simple_regret: np.ndarray
    normalized_regret: np.ndarray
    auc: np.ndarray
    proposals: np.ndarray
    bytes_up: np.ndarray
    bytes_down: np.ndarray
    ask_seconds: np.ndarray
    wall_time: float
    epsilon: list[float] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def n_sites(self) -> int:
        return len(self.site_names)

    def final_regret(self) -> np.ndarray:
        """Normalized regret at the last iteration, per site."""
        return self.normalized_regret[:, -1] if self.budget else np.zeros(self.n_sites)

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in asdict(self).items()}

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps(self.to_dict())
        if path is not None:
            with open(path, "w") as fh:
                fh.write(text)
        return text

    @classmethod
    def from_json(cls, text: str) -> "SimulationResult":
        data = json.loads(text)
        arrays = {"best_values", "simple_regret", "normalized_regret", "auc", "proposals",
                  "bytes_up", "bytes_down", "ask_seconds"}
        return cls(**{k: (np.asarray(v, dtype=np.float64) if k in arrays else v) for k, v in data.items()})


def _problem(problem: FederatedProblem | str, n_sites: int | None, seed: int,
             heterogeneity: Any) -> FederatedProblem:
    if isinstance(problem, FederatedProblem):
        return problem
    if isinstance(problem, str):
        from labfbo.problems.families import get_problem

        kw: dict[str, Any] = {"n_sites": n_sites or 5, "seed": seed}
        if heterogeneity is not None:
            kw["heterogeneity"] = heterogeneity
        return get_problem(problem, **kw)
    raise ConfigurationError("problem must be a FederatedProblem or a built-in problem name")


def _user_vector(problem: FederatedProblem, params: dict[str, Any]) -> list[float]:
    return [float(p.index(params[p.name])) if isinstance(p, Categorical) else float(params[p.name])
            for p in problem.space.params]


class _SiteRun:
    """One site's side of a simulated campaign: evaluates, tells, records."""

    def __init__(self, prob: FederatedProblem, i: int, opt: Optimizer, seed: int, budget: int) -> None:
        self.prob, self.i, self.opt, self.seed = prob, i, opt, seed
        self.best = np.inf  # best loss (sign * value) so far, noiseless
        self.best_values = np.zeros(budget)
        self.proposals = np.zeros((budget, prob.space.dim))
        self.ask_seconds = np.zeros(budget)

    def evaluate(self, trial: Any, t: int) -> None:
        prob, i = self.prob, self.i
        f = prob.evaluate(i, trial.params)
        noise = (
            prob.noise_std * rng(self.seed, i, t + 1, "observation-noise").standard_normal() if prob.noise_std else 0.0
        )
        self.opt.tell(trial, f + noise)
        self.best = min(self.best, prob.loss_sign * f)

    def initial_design(self) -> None:
        todo = max(0, self.opt.n_init - len(self.opt.observations))  # historical data counts towards it
        if todo:
            for trial in self.opt.ask(n=todo):
                self.evaluate(trial, -1)

    def ask(self, t: int) -> Any:
        t0 = time.perf_counter()
        trial = self.opt.ask()
        self.ask_seconds[t] = time.perf_counter() - t0
        return trial

    def finish_round(self, trial: Any, t: int) -> None:
        self.evaluate(trial, t)
        self.proposals[t] = _user_vector(self.prob, trial.params)
        self.best_values[t] = self.prob.loss_sign * self.best

    def record(self) -> dict[str, Any]:
        """What the site reports at the end (picklable)."""
        budget = len(self.best_values)
        ledger = self.opt.ledger
        return {"best_values": self.best_values, "proposals": self.proposals, "ask_seconds": self.ask_seconds,
                "bytes_up": np.array([ledger.round_bytes(t)[0] for t in range(budget)], dtype=np.float64),
                "bytes_down": np.array([ledger.round_bytes(t)[1] for t in range(budget)], dtype=np.float64),
                "epsilon": self.opt.epsilon(), "n_init": self.opt.n_init}


SITE_OPTIONS = ("prior", "storage")  # each site's own (one value, or a list with one per site); not the coordinator's


def _optimizer(prob: FederatedProblem, protocol: str, coordinator: Any, i: int, seed: int, n_init: int | None,
               budget: int, options: dict[str, Any]) -> Optimizer:
    opts = {k: (v[i] if k in SITE_OPTIONS and isinstance(v, (list, tuple)) else v) for k, v in options.items()}
    return Optimizer(prob.space, objective=prob.objective, protocol=protocol, coordinator=coordinator,
                     site=list(prob.site_names or [])[i], seed=seed, n_init=n_init, horizon=budget,
                     secret=int_seed(seed, i, 0, "site-secret"), **opts)


def _check(prob: FederatedProblem, budget: int, options: dict[str, Any]) -> None:
    if budget < 0:
        raise ConfigurationError("budget must be >= 0")
    priors = options.get("prior")
    if isinstance(priors, (list, tuple)) and len(priors) != prob.n_sites:
        raise ConfigurationError(
            f"prior: got {len(priors)} priors for {prob.n_sites} sites (give one dict, or one per site)"
        )


def _journal_paths(prob: FederatedProblem, storage_dir: "str | os.PathLike[str]") -> list[str]:
    """``<storage_dir>/<site>.journal`` for every site (the folder is created)."""
    os.makedirs(storage_dir, exist_ok=True)
    return [os.path.join(storage_dir, f"{name}.journal") for name in prob.site_names or []]


def _refuse_existing(paths: list[str]) -> None:
    """A simulation starts its campaigns, it does not resume them: refuse journals already there."""
    taken = [p for p in paths if os.path.exists(p) and os.path.getsize(p) > 0]
    if taken:
        raise ConfigurationError(f"storage_dir already holds a journal: {taken[0]} (use a new folder)")


def _coordinator(prob: FederatedProblem, protocol: str, seed: int, budget: int, options: dict[str, Any]) -> Coordinator:
    return Coordinator(protocol, sites=list(prob.site_names or []), space=prob.space, seed=seed, horizon=budget,
                       **{k: v for k, v in options.items() if k not in SITE_OPTIONS})


def simulate(problem: FederatedProblem | str, protocol: "str | Protocol" = "independent",
             n_sites: int | None = None,
             n_init: int | None = None, budget: int = 20, seed: int = 0, transport: str = "local",
             heterogeneity: Any = None, progress: bool = False,
             on_round: Callable[[int], None] | None = None, storage_dir: "str | os.PathLike[str] | None" = None,
             **options: Any) -> SimulationResult | None:
    """Run ``budget`` BO iterations at every site after its initial design.

    ``options`` are forwarded to every site's Optimizer and to the coordinator (protocol
    options such as ``acquisition``); ``prior`` may be one dict or a list with one per site.
    ``n_sites`` and ``heterogeneity`` apply only when ``problem`` is a built-in name.
    ``progress`` shows a progress bar; ``on_round(t)`` is called after every BO iteration.
    ``storage_dir``: journal every site to ``<storage_dir>/<site>.journal`` (a new folder or
    one without those journals), e.g. for ``labfbo report``.

    ``transport="mpi"``: run under ``mpiexec -n N+1 python -m mpi4py ...``; rank 0 runs
    the coordinator and returns the result, site ``i`` runs at rank ``i + 1`` and gets None.
    ``transport="http"``: starts a coordinator server on 127.0.0.1 (ephemeral port) and
    runs the sites as real HTTP clients in this process, each in its own thread.
    ``transport="flower"``: the same over a real Flower deployment on 127.0.0.1 (a
    SuperLink, one SuperNode per site, labfbo's ServerApp via ``flwr run``; pass
    ``flower_deployment=`` a started :class:`~labfbo.transport.flower_deploy.LocalFlowerDeployment`
    to reuse one). Every Flower exchange takes seconds: keep such runs small.
    """
    if transport not in ("local", "mpi", "http", "flower"):
        raise ConfigurationError(f"transport must be 'local', 'mpi', 'http' or 'flower', got {transport!r}")
    deployment = options.pop("flower_deployment", None)
    protocol, options = as_keywords(protocol, options)  # every site and the coordinator get its options
    prob = _problem(problem, n_sites, seed, heterogeneity)
    _check(prob, budget, options)
    journals = None if storage_dir is None else _journal_paths(prob, storage_dir)
    if journals is not None:
        options = {**options, "storage": journals}
    if transport == "mpi":  # rank 0 checks the folder, before any site opens its journal
        return _simulate_mpi(prob, protocol, n_init, budget, seed, options, journals)
    if journals is not None:
        _refuse_existing(journals)
    if transport == "http":
        return _simulate_http(prob, protocol, n_init, budget, seed, progress, on_round, options)
    if transport == "flower":
        return _simulate_flower(prob, protocol, n_init, budget, seed, progress, on_round, options, deployment)
    coordinator = _coordinator(prob, protocol, seed, budget, options)
    return _lockstep(prob, protocol, [coordinator] * prob.n_sites, n_init, budget, seed, progress, on_round, options)


def _lockstep(prob: FederatedProblem, protocol: str, coordinators: list[Any], n_init: int | None, budget: int,
              seed: int, progress: bool, on_round: Callable[[int], None] | None,
              options: dict[str, Any]) -> SimulationResult:
    """All sites in this process: each round, every site asks, then every site evaluates."""
    start = time.perf_counter()
    runs = [
        _SiteRun(prob, i, _optimizer(prob, protocol, coordinators[i], i, seed, n_init, budget, options), seed, budget)
        for i in range(prob.n_sites)
    ]
    for run in runs:
        run.initial_design()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=budget, desc=f"{prob.name}/{protocol}", leave=False)
    for t in range(budget):
        trials = [run.ask(t) for run in runs]
        for run, trial in zip(runs, trials):
            run.finish_round(trial, t)
        if bar is not None:
            bar.update(1)
        if on_round is not None:
            on_round(t)
    if bar is not None:
        bar.close()
    records = [run.record() for run in runs]
    for run in runs:
        run.opt.close()
    return _assemble(prob, protocol, seed, budget, records, time.perf_counter() - start, options)


def _consortium(prob: FederatedProblem, protocol: str, seed: int, budget: int, options: dict[str, Any],
                digests: dict[str, str]) -> Any:
    """The consortium.yaml of a simulated study (HTTP server or Flower ServerApp)."""
    from labfbo.server.config import ServerConfig

    return ServerConfig(protocol=protocol, seed=seed, horizon=budget, sites=digests,
                        space=prob.space.model_dump(mode="json"),
                        options={k: v for k, v in options.items() if k not in SITE_OPTIONS})


def _simulate_http(prob: FederatedProblem, protocol: str, n_init: int | None, budget: int, seed: int, progress: bool,
                   on_round: Callable[[int], None] | None, options: dict[str, Any]) -> SimulationResult:
    """A real coordinator server on 127.0.0.1 (ephemeral port); the sites are real HTTP clients."""
    from labfbo.server.app import CoordinatorServer, ServerThread
    from labfbo.server.config import new_token
    from labfbo.transport.http import HTTPCoordinator

    names = list(prob.site_names or [])
    tokens = {n: new_token() for n in names}
    cfg = _consortium(prob, protocol, seed, budget, options, {n: h for n, (_, h) in tokens.items()})
    with ServerThread(CoordinatorServer(cfg)) as srv:
        links = [HTTPCoordinator(srv.url, tokens[n][0]) for n in names]
        return _threaded(prob, protocol, links, n_init, budget, seed, progress, on_round, options)


def _simulate_flower(prob: FederatedProblem, protocol: str, n_init: int | None, budget: int, seed: int,
                     progress: bool, on_round: Callable[[int], None] | None, options: dict[str, Any],
                     deployment: Any = None) -> SimulationResult:
    """A real Flower deployment on 127.0.0.1; the sites' Optimizers bridge to their SuperNodes."""
    import tempfile
    import threading

    import yaml

    from labfbo.server.config import hash_token
    from labfbo.transport.flower import FlowerCoordinator
    from labfbo.transport.flower_deploy import LocalFlowerDeployment

    names = list(prob.site_names or [])
    with tempfile.TemporaryDirectory(prefix="labfbo-flower-") as tmp:
        own = deployment is None
        fl = LocalFlowerDeployment(len(names), tmp) if own else deployment
        try:
            if own:
                fl.start()
            if len(fl.sites) != len(names):
                raise ConfigurationError(f"the Flower deployment has {len(fl.sites)} SuperNodes, the study "
                                         f"{len(names)} sites")
            cfg = _consortium(prob, protocol, seed, budget, options,
                              {n: hash_token(s.token) for n, s in zip(names, fl.sites)})
            path = Path(tmp) / "consortium.yaml"
            path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
            run = fl.run(path)
            links = [FlowerCoordinator(s.coordinator, s.token) for s in fl.sites]
            finished = threading.Event()

            def watch() -> None:  # a ServerApp that ends (or fails) early must not leave the sites waiting
                while not finished.is_set() and run.poll() is None:
                    time.sleep(0.5)
                if not finished.is_set():
                    for link in links:
                        link.abort(f"the Flower run ended (flwr run exited {run.returncode}; log {run.log})")

            threading.Thread(target=watch, name="labfbo-flower-run", daemon=True).start()
            try:
                result = _threaded(prob, protocol, links, n_init, budget, seed, progress, on_round, options)
            except BaseException:
                fl.cancel(run)
                raise
            finally:
                finished.set()
            fl.wait(run)
            return result
        finally:
            if own:
                fl.stop()


def _threaded(prob: FederatedProblem, protocol: str, coordinators: list[Any], n_init: int | None, budget: int,
              seed: int, progress: bool, on_round: Callable[[int], None] | None,
              options: dict[str, Any]) -> SimulationResult:
    """Every site in its own thread running its own loop, as separate labs would (MPI ranks
    do the same); the coordinator starts each round once every site has asked for it.
    ``on_round(t)`` and the progress bar follow the first site."""
    import threading

    start = time.perf_counter()
    records: list[dict[str, Any] | None] = [None] * prob.n_sites
    errors: list[BaseException] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=budget, desc=f"{prob.name}/{protocol}", leave=False)

    def site(i: int) -> None:
        try:
            run = _SiteRun(prob, i, _optimizer(prob, protocol, coordinators[i], i, seed, n_init, budget, options),
                           seed, budget)
            try:
                run.initial_design()
                for t in range(budget):
                    run.finish_round(run.ask(t), t)
                    if i == 0 and bar is not None:
                        bar.update(1)
                    if i == 0 and on_round is not None:
                        on_round(t)
                records[i] = run.record()
            finally:
                run.opt.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=site, args=(i,), name=f"labfbo-sim-{i}", daemon=True)
               for i in range(prob.n_sites)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if bar is not None:
        bar.close()
    if errors:
        raise errors[0]
    return _assemble(prob, protocol, seed, budget, records, time.perf_counter() - start, options)  # type: ignore[arg-type]


def _simulate_mpi(prob: FederatedProblem, protocol: str, n_init: int | None, budget: int, seed: int,
                  options: dict[str, Any], journals: list[str] | None = None) -> SimulationResult | None:
    from labfbo.transport.mpi import MPICoordinator, serve, world

    rank, size = world()
    if size != prob.n_sites + 1:
        raise ConfigurationError(
            f"transport='mpi' needs {prob.n_sites + 1} ranks (coordinator + {prob.n_sites} sites), "
            f"got {size}: mpiexec -n {prob.n_sites + 1} python -m mpi4py ..."
        )
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if journals is not None:  # every rank raises the same refusal, before any journal is opened
        refused = None
        if rank == 0:
            try:
                _refuse_existing(journals)
            except ConfigurationError as exc:
                refused = str(exc)
        refused = comm.bcast(refused, root=0)
        if refused is not None:
            raise ConfigurationError(refused)
    start = time.perf_counter()
    if rank == 0:  # the coordinator (every protocol joins it for the collaborative design)
        serve(_coordinator(prob, protocol, seed, budget, options), comm)
        records = comm.gather(None, root=0)[1:]
        comm.Barrier()  # no site starts another campaign before this coordinator has stopped
        return _assemble(prob, protocol, seed, budget, records, time.perf_counter() - start, options)
    i = rank - 1
    run = _SiteRun(prob, i, _optimizer(prob, protocol, MPICoordinator(comm), i, seed, n_init, budget, options),
                   seed, budget)
    run.initial_design()
    for t in range(budget):
        run.finish_round(run.ask(t), t)
    record = run.record()
    run.opt.close()
    comm.gather(record, root=0)
    comm.Barrier()
    return None


def _assemble(prob: FederatedProblem, protocol: str, seed: int, budget: int, records: list[dict[str, Any]],
              wall: float, options: dict[str, Any]) -> SimulationResult:
    N = prob.n_sites
    names = list(prob.site_names or [])
    best_values = np.stack([r["best_values"] for r in records]).reshape(N, budget)
    simple = np.vstack([prob.regret(i, best_values[i]) for i in range(N)]) if budget else np.zeros((N, 0))
    beaten = simple < -1e-6 * np.maximum(1.0, np.abs(best_values))
    if beaten.any():
        sites = sorted({names[i] for i in np.nonzero(beaten)[0]})
        warnings.warn(f"problem {prob.name!r}: site(s) {sites} found values better than their stated "
                      "optimum; regret is clipped at 0 (check `optima`)", stacklevel=3)
    simple = np.maximum(simple, 0.0)
    normalized = simple / prob.objective_ranges()[:, None]
    window = max(1, math.ceil(0.1 * budget)) if budget else 0
    auc = normalized[:, :window].mean(axis=1) if budget else np.zeros(N)
    eps = [r["epsilon"] for r in records]
    epsilon = [float(e) for e in eps] if any(e is not None for e in eps) else []
    return SimulationResult(
        problem=prob.name, protocol=protocol, seed=seed, n_init=int(records[0]["n_init"]), budget=budget,
        site_names=names, best_values=best_values, simple_regret=simple, normalized_regret=normalized, auc=auc,
        proposals=np.stack([r["proposals"] for r in records]).reshape(N, budget, prob.space.dim),
        bytes_up=np.stack([r["bytes_up"] for r in records]).reshape(N, budget),
        bytes_down=np.stack([r["bytes_down"] for r in records]).reshape(N, budget),
        ask_seconds=np.stack([r["ask_seconds"] for r in records]).reshape(N, budget), wall_time=wall,
        epsilon=epsilon, options={k: repr(v) for k, v in options.items()})
