r"""Models and acquisitions of several outcomes: outcome constraints and several objectives.

The site models every outcome with its own local GP (:func:`labfbo.models.gp.fit_local_gp`,
same priors and transforms), gathered in a ``ModelListGP`` (columns as
:meth:`labfbo.core.objectives.OutcomeSpec.outcome_matrix`: objectives in the maximization
orientation, then the constrained outcomes as measured).

* One objective with outcome constraints: BoTorch's ``qLogNoisyExpectedImprovement`` with
  ``constraints`` — the improvement of each posterior sample weighted by a sigmoid of each
  constraint's slack (Gardner et al. 2014's feasibility weighting, in its MC form).
* Several objectives: ``qLogNoisyExpectedHypervolumeImprovement`` (Daulton et al. 2021), the
  reference point from the objectives' thresholds, or else inferred from the observed
  front (BoTorch's ``infer_reference_point``: the nadir less 10 % of the range).
* A federated protocol's own model of the objective: :class:`FeasibilityWeighted` adds
  :math:`\sum_c \log P(c \text{ met})` from the site's local constraint GPs (analytic,
  :math:`\Phi` of the standardized slack) to the protocol's log-acquisition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch
from botorch.acquisition import AcquisitionFunction, qLogNoisyExpectedImprovement
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
from botorch.acquisition.multi_objective.objective import IdentityMCMultiOutputObjective
from botorch.acquisition.objective import GenericMCObjective
from botorch.models import ModelListGP
from botorch.models.model import Model
from botorch.sampling import SobolQMCNormalSampler
from botorch.utils.multi_objective.hypervolume import infer_reference_point
from botorch.utils.multi_objective.pareto import is_non_dominated

from labfbo.models.acquisition import WrappedAcquisition
from labfbo.models.gp import as_tensor

if TYPE_CHECKING:
    from labfbo.core.objectives import OutcomeSpec


def non_dominated(Y: np.ndarray) -> np.ndarray:
    """Which rows of ``Y (n, m)`` (maximization) no other row dominates."""
    return is_non_dominated(as_tensor(Y), deduplicate=False).numpy()


def pareto_front(spec: "OutcomeSpec", observations: Sequence[Any]) -> list[Any]:
    """The feasible observations no other feasible one dominates on every objective, in order."""
    obs = spec.feasible_only(observations)
    if not obs:
        return []
    keep = non_dominated(spec.objective_matrix([o.outcomes for o in obs]))
    return [o for o, k in zip(obs, keep) if k]


def constraint_callables(spec: "OutcomeSpec") -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """BoTorch's outcome constraints (feasible where ``c(Z) <= 0``) on the model's columns."""
    m = len(spec.objectives)
    out = []
    for j, c in enumerate(spec.constraints):
        col, b = m + j, float(c.bound)
        out.append((lambda Z, col=col, b=b: Z[..., col] - b) if c.op == "<=" else
                   (lambda Z, col=col, b=b: b - Z[..., col]))
    return out


def outcome_acquisition(models: list[Model], spec: "OutcomeSpec", X: np.ndarray, Y: np.ndarray,
                        pending: np.ndarray, mc_samples: int, seed: int) -> AcquisitionFunction:
    """The feasibility-weighted qLogNEI (one objective) or qLogNEHVI (several) of the site's
    outcome models, with the observed ``X`` as baseline and ``pending`` points integrated over."""
    model = ModelListGP(*models)
    sampler = SobolQMCNormalSampler(torch.Size([mc_samples]), seed=seed % (2**31))
    X_pending = as_tensor(pending) if len(pending) else None
    m = len(spec.objectives)
    constraints = constraint_callables(spec) or None
    if m == 1:
        return qLogNoisyExpectedImprovement(model, X_baseline=as_tensor(X), sampler=sampler,
                                            objective=GenericMCObjective(lambda Z, X=None: Z[..., 0]),
                                            constraints=constraints, X_pending=X_pending, prune_baseline=True)
    return qLogNoisyExpectedHypervolumeImprovement(
        model, ref_point=reference_point(spec, Y), X_baseline=as_tensor(X), sampler=sampler,
        objective=IdentityMCMultiOutputObjective(outcomes=list(range(m))), constraints=constraints,
        X_pending=X_pending, prune_baseline=True)


def reference_point(spec: "OutcomeSpec", Y: np.ndarray) -> list[float]:
    """The hypervolume's reference point (maximization): the thresholds, or else inferred from
    the front of the feasible observations (all of them while none is feasible)."""
    given = spec.reference_point()
    if given is not None:
        return given
    m = len(spec.objectives)
    feas = np.ones(len(Y), dtype=bool)
    for j, c in enumerate(spec.constraints):
        feas &= (Y[:, m + j] <= c.bound) if c.op == "<=" else (Y[:, m + j] >= c.bound)
    obj = Y[feas, :m] if feas.any() else Y[:, :m]
    front = obj[non_dominated(obj)]
    return infer_reference_point(as_tensor(front)).tolist()


class FeasibilityWeighted(WrappedAcquisition):
    r"""``log alpha(X) + sum_q sum_c log P(c(x_q) met)``: a protocol's log-acquisition (``nei``,
    ``ei``) weighted by the site's local probability of feasibility,
    :math:`P = \Phi(\pm(b - \mu_c(x))/\sigma_c(x))` from its GP of each constrained outcome."""

    def __init__(self, base: AcquisitionFunction, models: list[Model], spec: "OutcomeSpec") -> None:
        super().__init__(base)
        self.constraint_models, self.spec = models, spec

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        out = self.base(X)
        for model, c in zip(self.constraint_models, self.spec.constraints):
            post = model.posterior(X)
            mu, sd = post.mean.squeeze(-1), post.variance.clamp_min(1e-12).sqrt().squeeze(-1)
            z = (c.bound - mu) / sd if c.op == "<=" else (mu - c.bound) / sd
            out = out + torch.special.log_ndtr(z).sum(-1)
        return out
