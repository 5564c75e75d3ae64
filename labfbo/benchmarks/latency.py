"""``ask()`` latency of ``independent`` against a hand-written BoTorch loop, same data.

Both sides fit a ``SingleTaskGP`` (float64, ``Normalize`` + ``Standardize``) with
``fit_gpytorch_mll`` and maximize analytic UCB (beta = 4) with ``optimize_acqf``
(10 restarts, 512 raw samples) on exactly the same observations. Repetitions alternate
which side runs first; the report is the median of the per-repetition time ratios
(labfbo / BoTorch), so machine noise hits both sides alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median

import numpy as np
import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from gpytorch.mlls import ExactMarginalLogLikelihood
from scipy.stats import qmc

from labfbo.benchmarks.problem import FederatedProblem


def botorch_loop_step(X: np.ndarray, y: np.ndarray, bounds: np.ndarray, seed: int) -> np.ndarray:
    """One iteration of a plain BoTorch loop (maximizing ``y``) on raw-domain inputs."""
    train_X = torch.as_tensor(X, dtype=torch.float64)
    train_Y = torch.as_tensor(y, dtype=torch.float64).reshape(-1, 1)
    b = torch.as_tensor(bounds.T, dtype=torch.float64)
    model = SingleTaskGP(train_X, train_Y, input_transform=Normalize(d=X.shape[1], bounds=b),
                         outcome_transform=Standardize(m=1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    acqf = UpperConfidenceBound(model, beta=4.0)
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


def measure(problem: FederatedProblem, n_obs: int, repeats: int, seed: int = 0) -> LatencyRow:
    """Median ask() time of both sides and the median per-repetition ratio."""
    import labfbo

    space = problem.space
    bounds = np.array([[p.low, p.high] for p in space.params], dtype=np.float64)
    t_lab, t_bo, ratios = [], [], []
    for r in range(-1, repeats):  # r = -1 warms up both code paths and is discarded
        u = qmc.LatinHypercube(space.dim, scramble=True, seed=seed + r + 1).random(n_obs)
        params = space.decode(u)
        values = [problem.evaluate(0, p) for p in params]
        X = np.array([space.vector(p) for p in params], dtype=np.float64)
        opt = labfbo.Optimizer(space, objective=problem.objective, seed=seed + r + 1, n_init=0)
        opt.add_observations(params, values)
        y = -problem.sign * np.asarray(values)

        def run_labfbo() -> float:
            t0 = time.perf_counter()
            opt.ask()
            return time.perf_counter() - t0

        def run_botorch() -> float:
            t0 = time.perf_counter()
            botorch_loop_step(X, y, bounds, seed + r + 1)
            return time.perf_counter() - t0

        if r % 2 == 0:
            a, b = run_labfbo(), run_botorch()
        else:
            b, a = run_botorch(), run_labfbo()
        if r < 0:
            continue
        t_lab.append(a)
        t_bo.append(b)
        ratios.append(a / b)
    return LatencyRow(problem.name, n_obs, median(t_lab), median(t_bo), median(ratios))


def run(problems: list[str], n_obs: list[int], repeats: int) -> list[LatencyRow]:
    from labfbo.benchmarks.problems import get_problem

    rows = []
    for name in problems:
        prob = get_problem(name, n_sites=1, seed=0)
        for n in n_obs:
            rows.append(measure(prob, n, repeats))
    return rows


def format_rows(rows: list[LatencyRow]) -> str:
    lines = ["| problem | n obs | labfbo ask() median s | BoTorch loop median s | ratio (median) |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.problem} | {r.n_obs} | {r.labfbo_s:.3f} | {r.botorch_s:.3f} | {r.ratio:.2f}x |")
    return "\n".join(lines)
