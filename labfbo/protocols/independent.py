"""Protocol ``independent``: plain single-site BO. Sends nothing, needs no coordinator.

The site fits its local GP (:mod:`labfbo.models.gp`) and maximizes the configured
acquisition (:mod:`labfbo.models.acquisition`). Other protocols reuse :class:`LocalGPSite` for
their local model.
"""

from __future__ import annotations

import numpy as np
from botorch.models.model import Model
from pydantic import model_validator

from labfbo.core.messages import Message
from labfbo.models.acquisition import (
    AcquisitionData,
    AcquisitionOptions,
    optimize_acquisition,
    propose_with_model,
    tried_points,
)
from labfbo.models.gp import SurrogateOptions, fit_local_gp, predict, seeded_torch
from labfbo.models.outcomes import FeasibilityWeighted, outcome_acquisition
from labfbo.models.priors import LocationPrior, PriorOptions, prior_exponent, site_prior
from labfbo.protocols.base import Protocol, SiteData, SiteLogic


class ModelOptions(AcquisitionOptions, SurrogateOptions, PriorOptions):
    """Acquisition, surrogate and expert-prior options shared by local-GP protocols."""

    @model_validator(mode="after")
    def _prior_needs_deterministic_acquisition(self) -> "ModelOptions":
        if self.prior and self.acquisition == "ts":
            raise ValueError("an expert prior weights ucb, ei or nei; not Thompson sampling")
        return self


class IndependentOptions(ModelOptions):
    """``independent``: the shared acquisition, surrogate and prior options.

    The defaults, shared by every protocol, are LogEI (``"ei"``) on a Matérn-5/2 GP with
    the Gamma noise prior and plain standardization, chosen on ``labfbo bench engine``
    against LogNEI, UCB, the RBF kernel, BoTorch's noise prior and winsorizing, Optuna's
    ``GPSampler`` and a BoTorch tutorial loop (``docs/benchmarks/engine.md``).
    """


class LocalGPSite(SiteLogic):
    """A site with a local GP, refit only when its observations change."""

    _cache_key: bytes | None = None
    _cache_model: Model | None = None
    _outcome_key: bytes | None = None
    _outcome_models: dict[int, Model] = {}

    def __init__(self, space, options, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(space, options, context)
        self._prior = site_prior(space, options) if isinstance(options, PriorOptions) else None

    def location_prior(self) -> LocationPrior | None:
        return self._prior

    def local_model(self, data: SiteData) -> Model:
        key = data.key()
        if self._cache_key != key or self._cache_model is None:
            self._cache_model = fit_local_gp(
                data.X, data.y, data.yvar, space=self.space,
                seed=self.context.seed_for(data.n, "gp-fit"),
                options=self.options if isinstance(self.options, SurrogateOptions) else None)
            self._cache_key = key
        return self._cache_model

    def predict(self, data: SiteData, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return predict(self.local_model(data), X)

    def prior_weight(self, data: SiteData, round: int) -> tuple[LocationPrior, float] | None:
        """``(prior, exponent)`` for this round, or None without a prior."""
        prior = self.location_prior()
        if prior is None:
            return None
        return prior, prior_exponent(self.options, prior, round, data.X, data.y)

    def propose_with(self, model: Model, data: SiteData, n: int, round: int) -> np.ndarray:
        """Maximize the (prior-weighted) acquisition of ``model`` (pending-aware); with outcome
        constraints weighted by the site's local probability of meeting them."""
        acq_data = AcquisitionData(X=data.X, y=data.y, pending=data.pending, failed=data.failed)
        spec = self.context.outcomes
        weigh = None
        if spec is not None and spec.constraints:
            m = len(spec.objectives)
            cons = [self.outcome_model(data, m + j) for j in range(len(spec.constraints))]
            weigh = lambda acqf: FeasibilityWeighted(acqf, cons, spec)  # noqa: E731
        return propose_with_model(model, self.space, acq_data, n, self.context.seed_for(round, "acquisition"),
                                  self.options, prior=self.prior_weight(data, round), round=round, weigh=weigh)

    def propose_local(self, data: SiteData, n: int, round: int) -> np.ndarray:
        """Maximize the acquisition of the local GP (pending-aware); with named outcomes, the
        feasibility-weighted qLogNEI or qLogNEHVI of the site's outcome models."""
        spec = self.context.outcomes
        if spec is None or data.Y is None or not (spec.constraints or spec.multi):
            return self.propose_with(self.local_model(data), data, n, round)
        seed = self.context.seed_for(round, "acquisition")
        with seeded_torch(seed):  # qLogNEI prunes its baseline with posterior draws from torch's RNG
            acqf = outcome_acquisition(self.outcome_models(data), spec, data.X, data.Y, data.pending,
                                       self.options.mc_samples, seed)
        return optimize_acquisition(acqf, self.space, n, seed, self.options, observed=tried_points(data))

    def outcome_models(self, data: SiteData) -> list[Model]:
        """One local GP per column of ``data.Y`` (objectives, then constrained outcomes)."""
        assert data.Y is not None
        return [self.outcome_model(data, j) for j in range(data.Y.shape[1])]

    def outcome_model(self, data: SiteData, j: int) -> Model:
        """The local GP of column ``j`` of ``data.Y``, fitted when the data change."""
        assert data.Y is not None
        key = data.X.tobytes() + data.Y.tobytes() + (b"" if data.Yvar is None else data.Yvar.tobytes())
        if self._outcome_key != key:
            self._outcome_models, self._outcome_key = {}, key
        if j not in self._outcome_models:
            opts = self.options if isinstance(self.options, SurrogateOptions) else None
            var = None if data.Yvar is None or np.isnan(data.Yvar[:, j]).any() else data.Yvar[:, j]
            self._outcome_models[j] = fit_local_gp(data.X, data.Y[:, j], var, space=self.space, options=opts,
                                                   seed=self.context.seed_for(data.n, f"gp-fit/{j}"),
                                                   objective=False)
        return self._outcome_models[j]

    def predict_outcomes(self, data: SiteData, X: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``outcome -> (mean, std)`` in the lab's units, from the site's own model of each."""
        spec = self.context.outcomes
        assert spec is not None and data.Y is not None
        models = self.outcome_models(data)
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for j, o in enumerate(spec.objectives):
            mean, std = predict(models[j], X)
            out[o.name] = (o.sign * mean, std)
        for j, c in enumerate(spec.constraints):
            if c.name not in out:
                out[c.name] = predict(models[len(spec.objectives) + j], X)
        return out


class IndependentSite(LocalGPSite):
    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        return self.propose_local(data, n, round)


class Independent(Protocol):
    """Single-site BO: the local GP, no coordinator (:doc:`protocols/independent`)."""

    name = "independent"
    federated = False
    Options = IndependentOptions
    site_logic = IndependentSite
    aggregator = None
