"""The campaigns of ``labfbo demo``: each lab's ask/tell loop, for labfbo and for Optuna.

Every lab starts from the same initial experiments under every method (enqueued), then
asks for ``budget`` more. A combination missing from the lab's rows of the data is an
experiment that failed there (``tell_failed`` / Optuna's ``FAIL``) and uses up budget.

labfbo runs each lab's loop in its own thread against one in-process
:class:`~labfbo.Coordinator`, as labs would run their scripts. A lab asks for its next
experiment once every lab has reported its last one (a barrier): the HTTP and MPI
coordinators start a round only when every site has asked for it, the in-process one runs
it at the first ask with the data every site has then, so without the barrier a round
would see whatever the other threads had told by that moment and proposals would depend
on thread timing.

:func:`run_seeds` runs several seeds' campaigns in spawned worker processes (one torch
thread each), one seed's methods per process.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.seeding import int_seed
from labfbo.datasets import ReactionData, initial_design

FAILED = "combination not in this lab's data"
#: method key -> how the demo names it
METHODS = {"surface": "together (labfbo surface)", "independent": "alone (labfbo)",
           "optuna": "alone (Optuna GPSampler)"}


@dataclass(frozen=True)
class Screen:
    """The labs' data (one yield table per lab), the initial experiments and the budget."""

    data: ReactionData
    seed: int = 0
    n_init: int = 3
    budget: int = 17  # experiments per lab after the initial ones

    def initial(self, lab: int) -> list[tuple]:
        return initial_design(self.data, lab, self.seed, self.n_init)

    def params(self, combo: tuple) -> dict[str, Any]:
        return dict(zip(self.data.space.names, combo))

    def key(self, params: dict[str, Any]) -> tuple:
        return tuple(params[n] for n in self.data.space.names)


@dataclass(frozen=True)
class Experiment:
    """One experiment of a lab: the combination run and its yield (None: it failed)."""

    params: dict[str, Any]
    yield_: float | None


def _in_threads(n: int, body: Callable[[int, threading.Barrier], list[Experiment]]) -> list[list[Experiment]]:
    """``body(lab, barrier)`` for every lab, each in its own thread; the first error is raised."""
    barrier = threading.Barrier(n)
    results: list[list[Experiment]] = [[] for _ in range(n)]
    errors: list[BaseException | None] = [None] * n

    def run(i: int) -> None:
        try:
            results[i] = body(i, barrier)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread below
            errors[i] = exc
            barrier.abort()  # the other labs stop waiting for this one

    threads = [threading.Thread(target=run, args=(i,), name=f"lab-{i}", daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    failed = [e for e in errors if e is not None]
    if failed:  # the lab that failed, not one that only saw the barrier break
        raise next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), failed[0])
    return results


def run_labfbo(screen: Screen, protocol: str, journals: Path | None = None) -> list[list[Experiment]]:
    """Every lab a :class:`labfbo.Optimizer` under ``protocol`` (``independent``: no coordinator),
    one thread per lab; with ``journals`` each lab journals to ``<journals>/<lab>.journal``."""
    from linear_operator.utils.warnings import NumericalWarning

    from labfbo.coordinator import Coordinator
    from labfbo.optimizer import Optimizer

    data = screen.data
    labs = list(data.labs)
    coord = None if protocol == "independent" else Coordinator(
        protocol, sites=labs, space=data.space, seed=screen.seed, horizon=screen.budget)
    if journals is not None:
        journals.mkdir(parents=True, exist_ok=True)
    opts = [Optimizer(data.space, objective="maximize", protocol=protocol, coordinator=coord, site=name,
                      seed=screen.seed, n_init=screen.n_init, horizon=screen.budget,
                      secret=int_seed(screen.seed, i, 0, "site-secret"),
                      storage=None if journals is None else journals / f"{name}.journal")
            for i, name in enumerate(labs)]

    def lab(i: int, barrier: threading.Barrier) -> list[Experiment]:
        opt, table, done = opts[i], data.tables[i], []

        def run(trial: Any) -> None:
            y = table.get(screen.key(trial.params))
            if y is None:
                opt.tell_failed(trial, FAILED)
            else:
                opt.tell(trial, y)
            done.append(Experiment(dict(trial.params), y))

        for combo in screen.initial(i):
            run(opt.enqueue(screen.params(combo)))
        for _ in range(screen.budget):
            barrier.wait()  # every lab has reported its last experiment
            run(opt.ask())
        return done

    try:
        with warnings.catch_warnings():  # jitter notices of near-singular covariances: expected, not news
            warnings.simplefilter("ignore", NumericalWarning)
            return _in_threads(len(labs), lab)
    finally:
        for opt in opts:
            opt.close()


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise ConfigurationError("the demo's Optuna comparison needs Optuna: pip install 'labfbo[bench]' "
                                 "(or run `labfbo demo --no-optuna`)") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def run_optuna(screen: Screen) -> list[list[Experiment]]:
    """Every lab alone with Optuna's ``GPSampler`` (its defaults, seeded per lab; the GP starts
    after the shared initial experiments, which are enqueued), one lab after another."""
    optuna = _optuna()
    data = screen.data
    dists = {p.name: optuna.distributions.CategoricalDistribution(list(p.choices)) for p in data.space.params}
    out = []
    for i in range(len(data.labs)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.GPSampler(seed=int_seed(screen.seed, i, 0, "optuna"),
                                                n_startup_trials=screen.n_init)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        for combo in screen.initial(i):
            study.enqueue_trial(screen.params(combo))
        done = []
        for _ in range(screen.n_init + screen.budget):
            trial = study.ask(dists)
            y = data.tables[i].get(screen.key(trial.params))
            if y is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, y)
            done.append(Experiment(dict(trial.params), y))
        out.append(done)
    return out


@dataclass(frozen=True)
class SeedJob:
    """One seed's campaigns (every method), as a worker process runs them."""

    labs: tuple[str, ...]
    seed: int
    n_init: int
    budget: int
    optuna: bool = True
    journals: str | None = None  # the ``surface`` run journals here (the demo's first seed only)


@dataclass(frozen=True)
class SeedRun:
    """A seed's experiments (method -> per lab, in order) and each method's wall time (s)."""

    seed: int
    experiments: dict[str, list[list[Experiment]]]
    seconds: dict[str, float]


def run_seed(job: SeedJob) -> SeedRun:
    """Every method of ``job``'s seed, one after another, from the shipped data."""
    import time

    from labfbo.datasets import load_reactions

    screen = Screen(load_reactions().subset(job.labs), seed=job.seed, n_init=job.n_init, budget=job.budget)
    methods: list[tuple[str, Callable[[], list[list[Experiment]]]]] = [
        ("surface", lambda: run_labfbo(screen, "surface", None if job.journals is None else Path(job.journals))),
        ("independent", lambda: run_labfbo(screen, "independent"))]
    if job.optuna:
        methods.append(("optuna", lambda: run_optuna(screen)))
    experiments, seconds = {}, {}
    for m, run in methods:
        t0 = time.perf_counter()
        experiments[m] = run()
        seconds[m] = time.perf_counter() - t0
    return SeedRun(job.seed, experiments, seconds)


def _one_torch_thread() -> int:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return before


def run_seeds(jobs: Sequence[SeedJob], workers: int = 2,
              done: Callable[[SeedRun], None] | None = None) -> list[SeedRun]:
    """:func:`run_seed` for every job, in ``workers`` spawned processes (one torch thread each;
    ``workers`` 1: in this process, with one torch thread meanwhile); results in the jobs' order,
    ``done`` called as each seed ends. A seed's proposals do not depend on ``workers``."""
    if workers < 1:
        raise ConfigurationError(f"--workers {workers}: give 1 or more worker processes")
    if workers == 1 or len(jobs) == 1:
        import torch

        before, ran = _one_torch_thread(), []
        try:
            for job in jobs:
                ran.append(run_seed(job))
                if done:
                    done(ran[-1])
        finally:
            torch.set_num_threads(before)
        return ran
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn"),
                             initializer=_one_torch_thread) as pool:
        futures = {pool.submit(run_seed, job): k for k, job in enumerate(jobs)}
        out: list[SeedRun | None] = [None] * len(jobs)
        for fut in as_completed(futures):
            out[futures[fut]] = run = fut.result()
            if done:
                done(run)
    return [r for r in out if r is not None]
