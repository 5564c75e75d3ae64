"""``ask()`` latency of ``independent`` against hand-written BoTorch loops, same data.

* **Same model and acquisition**: the loop fits ``SingleTaskGP`` (float64, ``Normalize`` +
  ``Standardize``, BoTorch's default kernel, which is labfbo's) with ``fit_gpytorch_mll``
  and maximizes the same acquisition as labfbo (its default ``qLogNoisyExpectedImprovement``,
  or ``--acquisition ei`` / ``ucb``) with ``optimize_acqf`` (10 restarts, 512 raw samples).
* **Tutorial loop**: :func:`~labfbo.benchmarks.engine_methods.botorch_tutorial_step`
  (``LogExpectedImprovement`` with :math:`f^* = \max_j y_j`).

Repetitions rotate which side runs first; the report is the median of the per-repetition
time ratios (labfbo / loop), so machine noise hits every side alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median

import numpy as np
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound, qLogNoisyExpectedImprovement
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import ExactMarginalLogLikelihood
from scipy.stats import qmc

from labfbo.benchmarks.engine_methods import botorch_tutorial_step
from labfbo.benchmarks.problem import FederatedProblem


def botorch_loop_step(X: np.ndarray, y: np.ndarray, bounds: np.ndarray, seed: int,
                      acquisition: str = "nei", beta: float = 4.0) -> np.ndarray:
    """One iteration of a plain BoTorch loop (maximizing ``y``) on raw-domain inputs, with
    labfbo's model and the acquisition ``acquisition`` (``nei``: qLogNEI with 256 Sobol
    samples and a pruned baseline; ``ei``: LogEI, posterior-mean incumbent; ``ucb``:
    analytic UCB)."""
    train_X = torch.as_tensor(X, dtype=torch.float64)
    train_Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    b = torch.as_tensor(bounds.T, dtype=torch.float64)
    model = SingleTaskGP(train_X, train_Y, input_transform=Normalize(d=X.shape[1], bounds=b),
                         outcome_transform=Standardize(m=1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    if acquisition == "ucb":
        acqf = UpperConfidenceBound(model, beta=beta)
    elif acquisition == "nei":
        sampler = SobolQMCNormalSampler(torch.Size([256]), seed=seed)
        acqf = qLogNoisyExpectedImprovement(model, X_baseline=train_X, sampler=sampler, prune_baseline=True)
    else:
        with torch.no_grad():
            acqf = LogExpectedImprovement(model, best_f=model.posterior(train_X).mean.max())
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
            acquisition: str = "nei") -> LatencyRow:
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
                               acquisition=acquisition)
        opt.add_observations(params, values)
        y = -problem.sign * np.asarray(values)
        sides = {"labfbo": lambda: opt.ask(),
                 "same": lambda: botorch_loop_step(X, y, bounds, seed + r + 1, acquisition),
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


def run(problems: list[str], n_obs: list[int], repeats: int, acquisition: str = "nei") -> list[LatencyRow]:
    from labfbo.benchmarks.problems import get_problem

    rows = []
    for name in problems:
        prob = get_problem(name, n_sites=1, seed=0)
        for n in n_obs:
            rows.append(measure(prob, n, repeats, acquisition=acquisition))
    return rows


def format_rows(rows: list[LatencyRow]) -> str:
    lines = ["| problem | n obs | labfbo ask() s | same-model loop s | ratio | tutorial loop s | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.problem} | {r.n_obs} | {r.labfbo_s:.3f} | {r.botorch_s:.3f} | {r.ratio:.2f}x | "
                     f"{r.tutorial_s:.3f} | {r.tutorial_ratio:.2f}x |")
    return "\n".join(lines)
