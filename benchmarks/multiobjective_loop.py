"""The hand-written BoTorch qLogNEHVI loop ``labfbo bench multiobjective`` compares against.

The BoTorch multi-objective tutorial's settings: one ``SingleTaskGP`` per outcome
(``Standardize``; inputs already on the unit cube), MAP-fitted, in a ``ModelListGP``;
``qLogNoisyExpectedHypervolumeImprovement`` with the objectives' thresholds as reference
point, 128 Sobol QMC samples, ``prune_baseline``; outcome constraints as BoTorch
constraint callables; ``optimize_acqf`` with 10 restarts and 512 raw samples.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
from botorch.acquisition.multi_objective.objective import IdentityMCMultiOutputObjective
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.mlls import SumMarginalLogLikelihood

if TYPE_CHECKING:
    from labfbo_bench.multiobjective import MOProblem


def botorch_qlognehvi(problem: "MOProblem", X0: np.ndarray, outcomes: list[dict[str, Any]], budget: int,
                      seed: int) -> list[float]:
    """Run ``budget`` iterations after the design ``X0`` (its outcomes given), appending to
    ``outcomes``; returns the seconds of each ask (fit + acquisition optimization)."""
    torch.manual_seed(seed)
    names = [o.name for o in problem.objectives] + [c.name for c in problem.constraints]
    m = len(problem.objectives)
    ref = torch.tensor([o.sign * o.threshold for o in problem.objectives], dtype=torch.float64)  # type: ignore
    bounds = torch.stack([torch.zeros(problem.dim), torch.ones(problem.dim)]).double()
    constraints = [(lambda Z, j=m + k: -Z[..., j]) for k in range(len(problem.constraints))]  # slack >= 0
    X = torch.as_tensor(X0, dtype=torch.float64)
    times = []
    for _ in range(budget):
        t0 = time.perf_counter()
        Y = torch.tensor([[(problem.objectives[j].sign if j < m else 1.0) * o[n] for j, n in enumerate(names)]
                          for o in outcomes], dtype=torch.float64)
        models = [SingleTaskGP(X, Y[:, j:j + 1], outcome_transform=Standardize(m=1)) for j in range(Y.shape[1])]
        model = ModelListGP(*models)
        fit_gpytorch_mll(SumMarginalLogLikelihood(model.likelihood, model))
        acqf = qLogNoisyExpectedHypervolumeImprovement(
            model, ref_point=ref, X_baseline=X, sampler=SobolQMCNormalSampler(torch.Size([128])),
            objective=IdentityMCMultiOutputObjective(outcomes=list(range(m))), constraints=constraints or None,
            prune_baseline=True)
        cand, _ = optimize_acqf(acqf, bounds=bounds, q=1, num_restarts=10, raw_samples=512,
                                options={"batch_limit": 5, "maxiter": 200})
        times.append(time.perf_counter() - t0)
        x = cand.detach().numpy().reshape(-1)
        outcomes.append(problem.evaluate(x))
        X = torch.cat([X, cand.detach()])
    return times
