r"""``ask()`` latency of ``independent`` against hand-written BoTorch loops, same data.

* **Same model and acquisition**: the loop fits ``SingleTaskGP`` (float64, ``Normalize`` +
  ``Standardize``, BoTorch's dimension-scaled ARD kernel, Matérn-5/2 or RBF as labfbo's
  ``kernel``) with ``fit_gpytorch_mll`` and maximizes the same acquisition as labfbo (by
  default labfbo's defaults: LogEI with the posterior-mean incumbent, or ``--acquisition nei``
  / ``ucb``) with ``optimize_acqf`` (10 restarts, 512 raw samples). Its likelihood takes the
  same noise prior (``auto``: both fits, the one with the higher leave-one-out predictive
  density kept, as labfbo's ``noise_prior="auto"`` does) and, with ``--output-transform
  winsorize`` on both sides, its outputs are winsorized (:func:`~labfbo.models.gp.winsorized`).
* **Tutorial loop**: :func:`~labfbo_bench.engine_methods.botorch_tutorial_step`
  (``LogExpectedImprovement`` with :math:`f^* = \max_j y_j`).

Repetitions rotate which side runs first; the report is the median of the per-repetition
time ratios (labfbo / loop), so machine noise hits every side alike.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from statistics import median

import numpy as np
import torch
from botorch.acquisition import (
    AcquisitionFunction,
    LogExpectedImprovement,
    UpperConfidenceBound,
    qLogNoisyExpectedImprovement,
)
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood
from scipy.stats import qmc

from labfbo.models.acquisition import AcquisitionOptions
from labfbo.models.gp import SurrogateOptions, loo_log_density, noise_likelihood, winsorized
from labfbo.models.kernels import kernel_for
from labfbo.problems.problem import FederatedProblem
from labfbo_bench.engine_methods import botorch_tutorial_step

#: labfbo's defaults, which each side of the comparison uses unless told otherwise
DEFAULT_ACQUISITION = AcquisitionOptions().acquisition
DEFAULT_SURROGATE = SurrogateOptions()


def _loop_gp(train_X: torch.Tensor, train_Y: torch.Tensor, b: torch.Tensor | None, noise_prior: str,
             kernel: str, cat_dims: list[int] | None = None) -> SingleTaskGP:
    """The loop's fitted GP: labfbo's default kernel and lengthscale prior (``kernel``: ``matern52`` or
    ``rbf``; with ``cat_dims``, its :class:`HammingKernel`) and the noise prior ``noise_prior``."""
    d = train_X.shape[1]
    covar = kernel_for(d, list(cat_dims or []), kernel == "rbf", prior_kind=DEFAULT_SURROGATE.lengthscale_prior)
    model = SingleTaskGP(train_X, train_Y, likelihood=noise_likelihood(noise_prior), covar_module=covar,
                         input_transform=None if b is None else Normalize(d=d, bounds=b),
                         outcome_transform=Standardize(m=1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    return model.eval()


def _loop_acquisition(model: SingleTaskGP, train_X: torch.Tensor, acquisition: str, seed: int,
                      beta: float = 4.0) -> AcquisitionFunction:
    """``nei``: qLogNEI with 256 Sobol samples and a pruned baseline; ``ei``: LogEI with the
    posterior-mean incumbent; ``ucb``: analytic UCB (labfbo's three, as it builds them)."""
    if acquisition == "ucb":
        return UpperConfidenceBound(model, beta=beta)
    if acquisition == "nei":
        sampler = SobolQMCNormalSampler(torch.Size([256]), seed=seed)
        return qLogNoisyExpectedImprovement(model, X_baseline=train_X, sampler=sampler, prune_baseline=True)
    with torch.no_grad():
        return LogExpectedImprovement(model, best_f=model.posterior(train_X).mean.max())


def botorch_loop_step(X: np.ndarray, y: np.ndarray, bounds: np.ndarray, seed: int,
                      acquisition: str = DEFAULT_ACQUISITION, beta: float = 4.0,
                      noise_prior: str = DEFAULT_SURROGATE.noise_prior,
                      output_transform: str = DEFAULT_SURROGATE.output_transform,
                      kernel: str = DEFAULT_SURROGATE.kernel) -> np.ndarray:
    """One iteration of a plain BoTorch loop (maximizing ``y``) on raw-domain inputs, with
    labfbo's model (``kernel``, ``noise_prior``; ``auto``: both fits, the better by
    leave-one-out; ``output_transform="winsorize"``: the bad tail of ``y`` raised to Tukey's
    fence before ``Standardize``) and the acquisition ``acquisition`` (:func:`_loop_acquisition`)."""
    train_X = torch.as_tensor(X, dtype=torch.float64)
    y = winsorized(y) if output_transform == "winsorize" else y
    train_Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    b = torch.as_tensor(bounds.T, dtype=torch.float64)
    if noise_prior == "auto":
        fits = [_loop_gp(train_X, train_Y, b, "lognormal", kernel), _loop_gp(train_X, train_Y, b, "gamma", kernel)]
        model = max(fits, key=loo_log_density)
    else:
        model = _loop_gp(train_X, train_Y, b, noise_prior, kernel)
    acqf = _loop_acquisition(model, train_X, acquisition, seed, beta)
    torch.manual_seed(seed)
    cand, _ = optimize_acqf(acqf, bounds=b, q=1, num_restarts=10, raw_samples=512,
                            options={"seed": seed})
    return cand.detach().numpy()[0]


@dataclass
class LatencyRow:
    problem: str
    n_obs: int
    labfbo_s: float
    botorch_s: float
    ratio: float
    tutorial_s: float
    tutorial_ratio: float


def measure(problem: FederatedProblem, n_obs: int, repeats: int, seed: int = 0,
            acquisition: str = DEFAULT_ACQUISITION, noise_prior: str = DEFAULT_SURROGATE.noise_prior,
            output_transform: str = DEFAULT_SURROGATE.output_transform,
            kernel: str = DEFAULT_SURROGATE.kernel) -> LatencyRow:
    """Median seconds of labfbo's ``ask()``, the same-model loop and the tutorial loop, and the
    median per-repetition ratios."""
    import labfbo

    space = problem.space
    bounds = np.array([[p.low, p.high] for p in space.params], dtype=np.float64)
    times: dict[str, list[float]] = {"labfbo": [], "same": [], "tutorial": []}
    for r in range(-1, repeats):  # r = -1 warms up every code path and is discarded
        u = qmc.LatinHypercube(space.dim, scramble=True, seed=seed + r + 1).random(n_obs)
        params = space.decode(u)
        values = [problem.evaluate(0, p) for p in params]
        X = np.array([space.vector(p) for p in params], dtype=np.float64)
        opt = labfbo.Optimizer(space, objective=problem.objective, seed=seed + r + 1, n_init=0,
                               acquisition=acquisition, noise_prior=noise_prior, output_transform=output_transform,
                               kernel=kernel)
        opt.add_observations(params, values)
        y = -problem.loss_sign * np.asarray(values)
        sides = {"labfbo": lambda: opt.ask(),
                 "same": lambda: botorch_loop_step(X, y, bounds, seed + r + 1, acquisition, noise_prior=noise_prior,
                                                   output_transform=output_transform, kernel=kernel),
                 "tutorial": lambda: botorch_tutorial_step(space, space.encode(params), y, seed + r + 1)}
        order = list(sides)[(r + 1) % 3:] + list(sides)[:(r + 1) % 3]
        spent = {}
        for name in order:
            t0 = time.perf_counter()
            sides[name]()
            spent[name] = time.perf_counter() - t0
        if r >= 0:
            for name, t in spent.items():
                times[name].append(t)
    ratio = median(a / b for a, b in zip(times["labfbo"], times["same"]))
    tut_ratio = median(a / b for a, b in zip(times["labfbo"], times["tutorial"]))
    return LatencyRow(problem.name, n_obs, median(times["labfbo"]), median(times["same"]), ratio,
                      median(times["tutorial"]), tut_ratio)


def run(problems: list[str], n_obs: list[int], repeats: int, acquisition: str = DEFAULT_ACQUISITION,
        noise_prior: str = DEFAULT_SURROGATE.noise_prior, output_transform: str = DEFAULT_SURROGATE.output_transform,
        kernel: str = DEFAULT_SURROGATE.kernel) -> list[LatencyRow]:
    from labfbo.problems.families import get_problem

    rows = []
    for name in problems:
        prob = get_problem(name, n_sites=1, seed=0)
        for n in n_obs:
            rows.append(measure(prob, n, repeats, acquisition=acquisition, noise_prior=noise_prior,
                                output_transform=output_transform, kernel=kernel))
    return rows


def format_rows(rows: list[LatencyRow]) -> str:
    lines = ["| problem | n obs | labfbo ask() s | same-model loop s | ratio | tutorial loop s | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.problem} | {r.n_obs} | {r.labfbo_s:.3f} | {r.botorch_s:.3f} | {r.ratio:.2f}x | "
                     f"{r.tutorial_s:.3f} | {r.tutorial_ratio:.2f}x |")
    return "\n".join(lines)


# -- categorical spaces ---------------------------------------------------------------------------
def discrete_loop_step(X: np.ndarray, y: np.ndarray, candidates: np.ndarray, seed: int) -> np.ndarray:
    """A hand-written BoTorch loop on an all-categorical space (unit-cube codes): labfbo's default
    model (``SingleTaskGP`` with its kernel on categorical columns, the ``HammingKernel``, its noise
    prior, ``Standardize``), its default acquisition, and every candidate scored by
    ``optimize_acqf_discrete``."""
    from botorch.optim import optimize_acqf_discrete

    train_X = torch.as_tensor(X, dtype=torch.float64)
    train_Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    d = X.shape[1]
    model = _loop_gp(train_X, train_Y, None, DEFAULT_SURROGATE.noise_prior, DEFAULT_SURROGATE.kernel,
                     cat_dims=list(range(d)))
    torch.manual_seed(seed)
    acqf = _loop_acquisition(model, train_X, DEFAULT_ACQUISITION, seed)
    cand, _ = optimize_acqf_discrete(acqf, q=1, choices=torch.as_tensor(candidates, dtype=torch.float64))
    return cand.numpy()[0]


def _timed_asks(make_opt, repeats: int, others: dict | None = None) -> dict[str, list[float]]:
    """Per repetition (after one warm-up), seconds of ``ask()`` on a fresh optimizer and of the
    ``others`` callables, in rotating order."""
    times: dict[str, list[float]] = {}
    for r in range(-1, repeats):
        opt = make_opt(r)
        sides = {"labfbo": lambda: opt.ask(), **{k: (lambda f=f, r=r: f(r)) for k, f in (others or {}).items()}}
        names = list(sides)
        for name in names[(r + 1) % len(names):] + names[:(r + 1) % len(names)]:
            t0 = time.perf_counter()
            sides[name]()
            if r >= 0:
                times.setdefault(name, []).append(time.perf_counter() - t0)
    return times


def categorical_rows(repeats: int, n_obs: int = 30) -> list[str]:
    """Two comparisons in one run: ``ask()`` on the 276-combination reaction space against the
    discrete BoTorch loop (same candidates); and a 4-parameter space with one 5-choice
    ``Categorical`` against the same space with that parameter a ``Real``."""
    import labfbo
    from labfbo.datasets import load_reactions

    data = load_reactions()
    space, combos, table = data.space, data.combos(), data.tables[0]
    grid = space.encode([dict(zip(space.names, c)) for c in combos])

    def obs(r: int) -> tuple[list[int], np.ndarray]:
        pick = np.random.default_rng(r + 1).choice(
            [k for k, c in enumerate(combos) if c in table], n_obs, replace=False
        )
        return list(pick), np.array([table[combos[k]] for k in pick])

    def reaction_opt(r: int) -> "labfbo.Optimizer":
        pick, y = obs(r)
        opt = labfbo.Optimizer(space, objective="maximize", seed=r + 1, n_init=0)
        opt.add_observations([dict(zip(space.names, combos[k])) for k in pick], list(y))
        return opt

    def loop(r: int) -> np.ndarray:
        pick, y = obs(r)
        unseen = np.delete(grid, pick, axis=0)
        return discrete_loop_step(grid[pick], y, unseen, r + 1)

    t = _timed_asks(reaction_opt, repeats, {"loop": loop})
    rows = [f"| reaction space, 3 categoricals (276 combinations) | {n_obs} | {median(t['labfbo']):.3f} | "
            f"discrete BoTorch loop {median(t['loop']):.3f} | "
            f"{median(a / b for a, b in zip(t['labfbo'], t['loop'])):.2f}x |"]

    def f(p: dict) -> float:
        c = p["c"] if isinstance(p["c"], float) else float("abcde".index(p["c"])) / 4
        return -sum((p[k] - 0.3) ** 2 for k in ("x1", "x2", "x3")) + np.sin(5 * c)

    spaces = {"cat": labfbo.SearchSpace([labfbo.Real(k, 0, 1) for k in ("x1", "x2", "x3")]
                                        + [labfbo.Categorical("c", list("abcde"))]),
              "real": labfbo.SearchSpace([labfbo.Real(k, 0, 1) for k in ("x1", "x2", "x3", "c")])}

    def mixed_opt(kind: str):
        def make(r: int) -> "labfbo.Optimizer":
            sp = spaces[kind]
            params = sp.decode(qmc.LatinHypercube(4, scramble=True, seed=r + 1).random(n_obs))
            opt = labfbo.Optimizer(sp, objective="maximize", seed=r + 1, n_init=0)
            opt.add_observations(params, [f(p) for p in params])
            return opt
        return make

    t = {"cat": [], "real": []}
    for r in range(-1, repeats):
        pair = {kind: mixed_opt(kind)(r) for kind in ("cat", "real")}
        for kind in (("cat", "real") if r % 2 else ("real", "cat")):
            t0 = time.perf_counter()
            pair[kind].ask()
            if r >= 0:
                t[kind].append(time.perf_counter() - t0)
    t["labfbo"] = t["cat"]
    rows.append(f"| 3 reals + 1 categorical (5 choices) | {n_obs} | {median(t['labfbo']):.3f} | "
                f"same space, 4 reals {median(t['real']):.3f} | "
                f"{median(a / b for a, b in zip(t['labfbo'], t['real'])):.2f}x |")
    return ["| space | n obs | labfbo ask() s | baseline s | ratio |", "|---|---:|---:|---|---:|", *rows]


def cli_run(args: "argparse.Namespace") -> int:
    """``labfbo bench latency``: the continuous rows, then (unless ``--no-categorical``) the categorical ones."""
    import sys

    rows = run(args.problems, args.n_obs, args.repeats, args.acquisition, args.noise_prior, args.output_transform,
               args.kernel)
    print("labfbo bench latency " + " ".join(sys.argv[3:]) + "\n")
    print(format_rows(rows))
    print(f"\nworst median ratio labfbo / same-model loop: {max(r.ratio for r in rows):.2f}x (defect > 1.5x); "
          f"/ tutorial loop: {max(r.tutorial_ratio for r in rows):.2f}x")
    if not args.no_categorical:
        print(f"\ncategorical spaces (labfbo's defaults, {DEFAULT_ACQUISITION}; median of per-repetition ratios):\n")
        print("\n".join(categorical_rows(args.repeats)))
    return 0


BENCH_ORDER = 20  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench latency``."""
    lat = bsub.add_parser("latency", help="ask() latency of `independent` vs a plain BoTorch loop")
    lat.add_argument("--problems", nargs="+", default=["branin", "hartmann6"])
    lat.add_argument("--n-obs", type=int, nargs="+", default=[10, 30, 100])
    lat.add_argument("--acquisition", default=DEFAULT_ACQUISITION, choices=["nei", "ei", "ucb"], help="labfbo's and "
                     "the same-model loop's acquisition (default: independent's)")
    lat.add_argument("--noise-prior", default=DEFAULT_SURROGATE.noise_prior, choices=["lognormal", "gamma", "auto"],
                     help="labfbo's and the same-model loop's noise prior (default: independent's)")
    lat.add_argument("--kernel", default=DEFAULT_SURROGATE.kernel, choices=["matern52", "rbf"],
                     help="labfbo's and the same-model loop's kernel (default: independent's)")
    lat.add_argument("--output-transform", default=DEFAULT_SURROGATE.output_transform,
                     choices=["winsorize", "standardize"],
                     help="labfbo's and the same-model loop's output transform (default: independent's)")
    lat.add_argument("--repeats", type=int, default=7)
    lat.add_argument("--no-categorical", action="store_true", help="skip the 276-combination and one-categorical rows")
    lat.set_defaults(func=cli_run)
