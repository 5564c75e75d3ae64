"""Protocol ``independent``: plain single-site BO. Sends nothing, needs no coordinator.

The site fits its local GP (:mod:`labfbo.models.gp`) and maximizes the configured
acquisition (:mod:`labfbo.acquisition`). Other protocols reuse :class:`LocalGPSite` for
their local model.
"""

from __future__ import annotations

import numpy as np
from botorch.models.model import Model
from pydantic import model_validator

from labfbo.acquisition import AcquisitionData, AcquisitionOptions, propose_with_model
from labfbo.messages import Message
from labfbo.models.gp import SurrogateOptions, fit_local_gp, predict
from labfbo.priors import LocationPrior, PriorOptions, prior_exponent, site_prior
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

    The default acquisition, shared by every protocol, is ``qLogNoisyExpectedImprovement``
    (``"nei"``), chosen on ``labfbo bench engine`` against UCB and LogEI, Optuna's
    ``GPSampler`` and a BoTorch tutorial loop (``docs/benchmarks.md`` §12).
    """


class LocalGPSite(SiteLogic):
    """A site with a local GP, refit only when its observations change."""

    _cache_key: bytes | None = None
    _cache_model: Model | None = None

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
        """Maximize the (prior-weighted) acquisition of ``model`` (pending-aware)."""
        acq_data = AcquisitionData(X=data.X, y=data.y, pending=data.pending, failed=data.failed)
        return propose_with_model(model, self.space, acq_data, n, self.context.seed_for(round, "acquisition"),
                                  self.options, prior=self.prior_weight(data, round), round=round)

    def propose_local(self, data: SiteData, n: int, round: int) -> np.ndarray:
        """Maximize the acquisition of the local GP (pending-aware)."""
        return self.propose_with(self.local_model(data), data, n, round)


class IndependentSite(LocalGPSite):
    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        return self.propose_local(data, n, round)


class IndependentProtocol(Protocol):
    name = "independent"
    federated = False
    Options = IndependentOptions
    site_logic = IndependentSite
    aggregator = None
