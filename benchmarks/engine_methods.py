r"""The methods ``labfbo bench engine`` compares, each an ask/tell loop on one problem.

* ``labfbo`` variants: :class:`labfbo.Optimizer` (``independent``) with options.
* ``optuna``: Optuna's ``GPSampler`` (the ``bench`` extra pins Optuna), its own defaults,
  ``n_startup_trials`` = the design size so the GP starts right after the shared design.
* ``optuna-tpe``: Optuna's ``TPESampler``, its defaults, ``n_startup_trials`` = the design size.
* ``botorch``: a hand-written BoTorch loop with the tutorial's defaults — ``SingleTaskGP``
  (``MixedSingleTaskGP`` with categoricals) on the unit cube, ``Standardize``, analytic
  ``LogExpectedImprovement`` with :math:`f^* = \max_j y_j`, ``optimize_acqf`` with 10
  restarts and 512 raw samples (``optimize_acqf_mixed_alternating`` on mixed spaces).
* ``random``: uniform random search.

Every method gets the same initial design and the same noise draws (common random
numbers), and evaluates ``budget`` points after the design.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import numpy as np

from labfbo.core.exceptions import ConfigurationError
from labfbo.space.search import Categorical, Integer, Real, SearchSpace
from labfbo_bench.engine_panel import EngineProblem

#: labfbo's engine defaults before 2026-12-05 (qLogNEI, RBF, BoTorch's noise prior, winsorized outputs):
#: every ``labfbo-*`` variant of the engine suites changes these, so a variant keeps its meaning
FORMER: dict[str, Any] = {"acquisition": "nei", "kernel": "rbf", "noise_prior": "lognormal",
                          "output_transform": "winsorize", "lengthscale_prior": "dim_scaled"}

Evaluate = Callable[[dict[str, Any]], float]  # returns the noisy observation, records the truth


def run_labfbo(problem: EngineProblem, design: list[dict[str, Any]], observe: Evaluate, seed: int,
               options: dict[str, Any]) -> list[float]:
    """``independent`` with ``options``; returns the seconds of each ``ask()``."""
    import labfbo

    options = dict(options)
    encoding = options.pop("encoding", None)  # reagents by structure: a reaction lab's encoded space
    space = problem.space
    if encoding is not None:
        if problem.encoded is None:
            raise ConfigurationError(f"{problem.name} has no structures to encode")
        space = problem.encoded(encoding)
    opt = labfbo.Optimizer(space, objective="minimize", seed=seed, n_init=len(design), **options)
    opt.add_observations(design, [observe(p) for p in design])
    times = []
    for _ in range(problem.budget):
        t0 = time.perf_counter()
        trial = opt.ask()
        times.append(time.perf_counter() - t0)
        opt.tell(trial, observe(trial.params))
    return times


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise ConfigurationError("the optuna method needs Optuna: pip install 'labfbo[bench]'") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _optuna_distributions(space: SearchSpace) -> dict[str, Any]:
    optuna = _optuna()

    dists: dict[str, Any] = {}
    for p in space.params:
        if isinstance(p, Real):
            dists[p.name] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.log)
        elif isinstance(p, Integer):
            dists[p.name] = optuna.distributions.IntDistribution(p.low, p.high)
        elif isinstance(p, Categorical):
            dists[p.name] = optuna.distributions.CategoricalDistribution(list(p.choices))
    return dists


def run_optuna(problem: EngineProblem, design: list[dict[str, Any]], observe: Evaluate, seed: int,
               options: dict[str, Any]) -> list[float]:
    """An Optuna sampler (``options["sampler"]``: ``"gp"``, the default, or ``"tpe"``) after the
    shared design (added as completed trials)."""
    optuna = _optuna()
    dists = _optuna_distributions(problem.space)
    options = dict(options)
    kind = options.pop("sampler", "gp")
    cls = {"gp": optuna.samplers.GPSampler, "tpe": optuna.samplers.TPESampler}[kind]
    sampler = cls(seed=seed, n_startup_trials=len(design), **options)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for p in design:
        study.add_trial(optuna.trial.create_trial(params=p, distributions=dists, value=observe(p)))
    times = []
    for _ in range(problem.budget):
        t0 = time.perf_counter()
        trial = study.ask(dists)
        times.append(time.perf_counter() - t0)
        study.tell(trial, observe(dict(trial.params)))
    return times


def botorch_tutorial_step(space: SearchSpace, X: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """One step of the tutorial loop: unit-cube ``X (n, d)``, ``y`` maximized; returns ``(d,)``."""
    import torch
    from botorch.acquisition import LogExpectedImprovement
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import MixedSingleTaskGP, SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.optim import optimize_acqf
    from botorch.optim.optimize_mixed import optimize_acqf_mixed_alternating
    from gpytorch.mlls import ExactMarginalLogLikelihood

    train_X = torch.as_tensor(X, dtype=torch.float64)
    train_Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    d = space.dim
    bounds = torch.stack([torch.zeros(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64)])
    cat = list(space.cat_dims())
    model = (MixedSingleTaskGP(train_X, train_Y, cat_dims=cat, outcome_transform=Standardize(m=1)) if cat
             else SingleTaskGP(train_X, train_Y, outcome_transform=Standardize(m=1)))
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        acqf = LogExpectedImprovement(model, best_f=train_Y.max())
        if space.is_continuous:
            cand, _ = optimize_acqf(acqf, bounds=bounds, q=1, num_restarts=10, raw_samples=512,
                                    options={"seed": seed})
        else:
            cand, _ = optimize_acqf_mixed_alternating(
                acqf, bounds=bounds, discrete_dims=space.discrete_dims() or None,
                cat_dims=space.cat_dims() or None, q=1, num_restarts=10, raw_samples=512)
    return space.snap(cand.detach().numpy().reshape(1, d))[0]


def run_botorch(problem: EngineProblem, design: list[dict[str, Any]], observe: Evaluate, seed: int,
                options: dict[str, Any]) -> list[float]:
    """The hand-written BoTorch tutorial loop (:func:`botorch_tutorial_step`)."""
    space = problem.space
    X = list(space.encode(design))
    y = [-observe(p) for p in design]
    times = []
    for t in range(problem.budget):
        t0 = time.perf_counter()
        x = botorch_tutorial_step(space, np.array(X), np.array(y), seed * 10_000 + t)
        params = space.decode(x[None])[0]
        times.append(time.perf_counter() - t0)
        X.append(space.encode([params])[0])
        y.append(-observe(params))
    return times


def run_random(problem: EngineProblem, design: list[dict[str, Any]], observe: Evaluate, seed: int,
               options: dict[str, Any]) -> list[float]:
    """Uniform random search (iid points in the unit cube, decoded)."""
    for p in design:
        observe(p)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7919]))
    times = []
    for _ in range(problem.budget):
        t0 = time.perf_counter()
        params = problem.space.decode(problem.space.snap(rng.random((1, problem.space.dim))))[0]
        times.append(time.perf_counter() - t0)
        observe(params)
    return times


RUNNERS: dict[str, Callable[..., list[float]]] = {
    "labfbo": run_labfbo, "optuna": run_optuna, "botorch": run_botorch, "random": run_random}
