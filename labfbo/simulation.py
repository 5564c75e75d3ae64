r"""`simulate`: run a federated campaign on a benchmark problem, in lock-step rounds.

Every site runs a real :class:`~labfbo.Optimizer` connected to one
:class:`~labfbo.Coordinator`; only the objective evaluation is simulated. Metrics:

* ``best_values[i, t]``: best *noiseless* value among the points site ``i`` evaluated
  up to BO iteration ``t`` (initial design included);
* ``simple_regret = sign * (best_values - f*_i)`` (>= 0);
* ``normalized_regret = simple_regret / R_i`` with the problem's objective range
  :math:`R_i` (see :mod:`labfbo.benchmarks.problem`);
* ``auc[i]``: mean normalized regret over the first :math:`\lceil 0.1\,T \rceil`
  iterations (PACD-BO's early-convergence AUC);
* ``proposals[i, t]``: the evaluated point in user units, in the space's parameter
  order (categoricals as their choice index);
* ``bytes_up`` / ``bytes_down``: JSON bytes the site sent / received in round ``t``.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from labfbo.benchmarks.problem import FederatedProblem
from labfbo.coordinator import Coordinator
from labfbo.exceptions import ConfigurationError
from labfbo.optimizer import Optimizer
from labfbo.seeding import int_seed, rng
from labfbo.space import Categorical


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
        from labfbo.benchmarks.problems import get_problem

        kw: dict[str, Any] = {"n_sites": n_sites or 5, "seed": seed}
        if heterogeneity is not None:
            kw["heterogeneity"] = heterogeneity
        return get_problem(problem, **kw)
    raise ConfigurationError("problem must be a FederatedProblem or a built-in problem name")


def _user_vector(problem: FederatedProblem, params: dict[str, Any]) -> list[float]:
    return [float(p.index(params[p.name])) if isinstance(p, Categorical) else float(params[p.name])
            for p in problem.space.params]


def simulate(problem: FederatedProblem | str, protocol: str = "independent", n_sites: int | None = None,
             n_init: int | None = None, budget: int = 20, seed: int = 0, transport: str = "local",
             heterogeneity: Any = None, progress: bool = False,
             on_round: Callable[[int], None] | None = None, **options: Any) -> SimulationResult:
    """Run ``budget`` BO iterations at every site after its initial design.

    ``options`` are forwarded to every site's Optimizer and to the coordinator (protocol
    options such as ``acquisition``); ``prior`` may be one dict or a list with one per site. ``n_sites`` and ``heterogeneity`` apply only when
    ``problem`` is a built-in name. ``progress`` shows a progress bar; ``on_round(t)`` is
    called after every BO iteration.
    """
    if budget < 0:
        raise ConfigurationError("budget must be >= 0")
    if transport != "local":
        raise ConfigurationError(f"transport {transport!r} is not available in this build; use 'local'")
    prob = _problem(problem, n_sites, seed, heterogeneity)
    names = list(prob.site_names or [])
    N, d = prob.n_sites, prob.space.dim
    priors = options.get("prior")
    if isinstance(priors, (list, tuple)) and len(priors) != N:
        raise ConfigurationError(f"prior: got {len(priors)} priors for {N} sites (give one dict, or one per site)")
    coordinator = Coordinator(protocol, sites=names, space=prob.space, seed=seed, horizon=budget,
                              **{k: v for k, v in options.items() if k != "prior"})

    def site_options(i: int) -> dict[str, Any]:
        if isinstance(priors, (list, tuple)):
            return {**options, "prior": priors[i]}
        return options

    start = time.perf_counter()
    opts = [Optimizer(prob.space, objective=prob.objective, protocol=protocol, coordinator=coordinator,
                      site=name, seed=seed, n_init=n_init, horizon=budget,
                      secret=int_seed(seed, i, 0, "site-secret"), **site_options(i))
            for i, name in enumerate(names)]
    n_init_eff = opts[0].n_init
    best = np.full(N, np.inf)  # best loss (sign * value) so far, noiseless

    def evaluate(i: int, trial: Any, t: int) -> None:
        f = prob.evaluate(i, trial.params)
        noise = prob.noise_std * rng(seed, i, t + 1, "observation-noise").standard_normal() if prob.noise_std else 0.0
        opts[i].tell(trial, f + noise)
        best[i] = min(best[i], prob.sign * f)

    for i in range(N):  # initial design (historical data would count towards it)
        todo = max(0, n_init_eff - len(opts[i].observations))
        if todo:
            for trial in opts[i].ask(n=todo):
                evaluate(i, trial, -1)

    best_values = np.zeros((N, budget))
    proposals = np.zeros((N, budget, d))
    ask_seconds = np.zeros((N, budget))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=budget, desc=f"{prob.name}/{protocol}", leave=False)
    for t in range(budget):
        trials = []
        for i in range(N):
            t0 = time.perf_counter()
            trials.append(opts[i].ask())
            ask_seconds[i, t] = time.perf_counter() - t0
        for i, trial in enumerate(trials):
            evaluate(i, trial, t)
            proposals[i, t] = _user_vector(prob, trial.params)
        best_values[:, t] = prob.sign * best
        if bar is not None:
            bar.update(1)
        if on_round is not None:
            on_round(t)
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - start

    simple = np.vstack([prob.regret(i, best_values[i]) for i in range(N)]) if budget else np.zeros((N, 0))
    beaten = simple < -1e-6 * np.maximum(1.0, np.abs(best_values))
    if beaten.any():
        sites = sorted({names[i] for i in np.nonzero(beaten)[0]})
        warnings.warn(f"problem {prob.name!r}: site(s) {sites} found values better than their stated "
                      "optimum; regret is clipped at 0 (check `optima`)", stacklevel=2)
    simple = np.maximum(simple, 0.0)
    normalized = simple / prob.objective_ranges()[:, None]
    window = max(1, math.ceil(0.1 * budget)) if budget else 0
    auc = normalized[:, :window].mean(axis=1) if budget else np.zeros(N)
    bytes_up = np.array([[o.ledger.round_bytes(t)[0] for t in range(budget)] for o in opts], dtype=np.float64)
    bytes_down = np.array([[o.ledger.round_bytes(t)[1] for t in range(budget)] for o in opts], dtype=np.float64)
    eps = [o.epsilon() for o in opts]
    epsilon = [float(e) for e in eps] if any(e is not None for e in eps) else []
    for o in opts:
        o.close()
    return SimulationResult(
        problem=prob.name, protocol=protocol, seed=seed, n_init=n_init_eff, budget=budget, site_names=names,
        best_values=best_values, simple_regret=simple, normalized_regret=normalized, auc=auc,
        proposals=proposals, bytes_up=bytes_up.reshape(N, budget), bytes_down=bytes_down.reshape(N, budget),
        ask_seconds=ask_seconds, wall_time=wall, epsilon=epsilon, options={k: repr(v) for k, v in options.items()})
