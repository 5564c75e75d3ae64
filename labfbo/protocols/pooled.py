r"""Protocol ``pooled``: one multi-task GP on every site's raw data (a non-private reference).

**Not private**: each round every site sends its raw observations to the coordinator,
which hands each site the other sites' (unnamed). The site fits BoTorch's
``MultiTaskGP`` — its dimension-scaled ARD kernel on the inputs times a full-rank positive
index kernel over sites with a Beta(2.5, 1.5) prior on their correlations, so how much one
site's data says about another's is learned from the data — with its own data as task 0 and each other
site's values first rescaled to its own mean and spread, and maximizes the configured
acquisition (qLogNEI by default) on its own task. This is the "pooled-data transfer
learning" upper reference of the transfer efficiency
:math:`(R_\text{alone} - R)/(R_\text{alone} - R_\text{pooled})` on continuous families
(``labfbo bench pacd``); the reaction suite has its own one-hot version. Use it to measure
what privacy costs, never with real partners.
"""

from __future__ import annotations

from typing import Literal, Mapping

import numpy as np
from botorch.fit import fit_gpytorch_mll
from botorch.models import MultiTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from gpytorch.constraints import GreaterThan
from gpytorch.mlls import ExactMarginalLogLikelihood
from pydantic import model_validator

from labfbo.core.messages import Array, Message, register
from labfbo.models.gp import as_tensor, seeded_torch
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.centralized import DataRequest, RawData
from labfbo.protocols.independent import LocalGPSite, ModelOptions


@register
class PooledData(Message):
    """Coordinator -> site: the other sites' raw observations (pooled baseline only)."""

    kind: Literal["pooled_data"] = "pooled_data"
    X: list[Array]
    y: list[Array]

    @model_validator(mode="after")
    def _pairs(self) -> "PooledData":
        if len(self.X) != len(self.y):
            raise ValueError(f"{len(self.X)} input arrays for {len(self.y)} value arrays")
        for X, y in zip(self.X, self.y):
            if len(X.shape) != 2 or y.shape != (X.shape[0],):
                raise ValueError(f"inputs (n, d) and values (n,) expected, got {X.shape} and {y.shape}")
        return self


class PooledOptions(ModelOptions):
    """The shared acquisition and surrogate options (the kernel is ``MultiTaskGP``'s).

    The outputs are standardized per task as they are (``output_transform`` stays ``"standardize"``).
    """

    output_transform: Literal["standardize", "winsorize"] = "standardize"
    kernel: Literal["rbf", "matern52"] = "rbf"
    noise_prior: Literal["lognormal", "gamma", "auto"] = "lognormal"

    @model_validator(mode="after")
    def _multitask_kernel_only(self) -> "PooledOptions":
        if self.prior:
            raise ValueError("the pooled baseline takes no expert prior")
        changed = [k for k, now, v in (("kernel", self.kernel, "rbf"), ("input_warping", self.input_warping, False),
                                       ("noise_prior", self.noise_prior, "lognormal"),
                                       ("output_transform", self.output_transform, "standardize")) if now != v]
        if changed:
            raise ValueError(f"the pooled baseline uses MultiTaskGP's own kernel and noise prior; "
                             f"{', '.join(changed)} cannot be set")
        return self


def rescaled(y: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``y`` standardized, then given the mean and spread of ``like``."""
    sd = float(np.std(y)) or 1.0
    return (y - np.mean(y)) / sd * (float(np.std(like)) or 1.0) + float(np.mean(like))


def fit_multitask_gp(train_X: np.ndarray, train_Y: np.ndarray, seed: int,
                     output_tasks: list[int] | None = None) -> Model:
    r"""``MultiTaskGP`` (task index in the last column, ``Standardize``d values), MAP-fitted to
    convergence; built and fitted under ``seed``, so the same seed gives the same model.

    The task covariance is :math:`(F F^\top + \mathrm{diag}(v)) / (\cdot)_{00}` with a full-rank
    :math:`F`: the MAP point often has :math:`v \to 0`, which the softplus on :math:`v` only reaches
    at :math:`-\infty`, so L-BFGS crawled along that ray and, stopped at 200 iterations, ended where
    the machine's round-off took it (proposals 1e-2 apart between CPU kernels). :math:`v` is bounded
    at 0 instead (the same model, the boundary reachable), and L-BFGS keeps 50 curvature pairs with
    tolerances tight enough that the optimum, not the stopping rule, decides the fit: 100–450
    iterations, proposals within 1e-8 across CPU kernels.
    """
    with seeded_torch(seed):  # the index kernel's factor is drawn at construction: seeded too
        model = MultiTaskGP(as_tensor(train_X), as_tensor(train_Y).reshape(-1, 1), task_feature=-1,
                            output_tasks=output_tasks, outcome_transform=Standardize(m=1))
        for kernel in model.covar_module.kernels:
            if hasattr(kernel, "raw_var"):  # the task kernel's diagonal: a box, not a softplus
                var = kernel.var.detach().clone()
                kernel.register_constraint("raw_var", GreaterThan(0.0, transform=None))
                kernel.raw_var.data.copy_(var)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model),
                         optimizer_kwargs={"options": {"maxiter": 2000, "maxcor": 50, "ftol": 1e-13, "gtol": 1e-8}})
    model.eval()
    return model


def fit_multitask(X: np.ndarray, y: np.ndarray, others: list[tuple[np.ndarray, np.ndarray]], seed: int) -> Model:
    """The site's model: its data as task 0 (the one output), the others' as tasks 1..J, rescaled."""
    rows = [np.c_[X, np.zeros(len(X))]] + [np.c_[Xo, np.full(len(Xo), j + 1.0)] for j, (Xo, _) in enumerate(others)]
    vals = [y] + [rescaled(yo, y) for _, yo in others]
    return fit_multitask_gp(np.vstack(rows), np.concatenate(vals), seed, output_tasks=[0])


class PooledSite(LocalGPSite):
    """Sends its raw data; proposes with the multi-task GP on everyone's (refit only when
    its own data or the others' change: asking again before telling reuses it)."""

    _pooled_key: bytes | None = None
    _pooled_model: Model | None = None

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if not isinstance(request, DataRequest):
            return super().answer(request, data, round)
        return RawData(X=Array.of(data.X.reshape(-1, self.space.dim)), y=Array.of(data.y))

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        others = ([(X.numpy(), y.numpy()) for X, y in zip(guidance.X, guidance.y) if y.shape[0] >= 2]
                  if isinstance(guidance, PooledData) else [])
        if not others or data.n < 2:
            return self.propose_local(data, n, round)
        key = b"|".join([data.key(), *(X.tobytes() + y.tobytes() for X, y in others)])
        if key != self._pooled_key or self._pooled_model is None:
            self._pooled_model = fit_multitask(data.X, data.y, others, self.context.seed_for(data.n, "pooled-fit"))
            self._pooled_key = key
        return self.propose_with(self._pooled_model, data, n, round)


class PooledAggregator(Aggregator):
    def open_round(self, t: int) -> Step:
        return Exchange({s: DataRequest() for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        got = {s: m for s, m in responses.items() if isinstance(m, RawData)}
        return Finish({s: PooledData(X=[got[o].X for o in self.sites if o != s and o in got],
                                     y=[got[o].y for o in self.sites if o != s and o in got]) for s in self.sites})


class Pooled(Protocol):
    """Reference, not private: a multi-task GP on every site's raw data."""

    name = "pooled"
    federated = True
    demo = False  # not a privacy-preserving protocol: not in `labfbo bench demo-suite`
    shares_raw_data = True
    supported_types = frozenset({"real", "integer", "discrete"})
    Options = PooledOptions
    site_logic = PooledSite
    aggregator = PooledAggregator
