"""A toy federated protocol in one module: each site releases a noised mean of its results.

It exists to show that a protocol's releases reach the site's privacy report through its own
declaration alone (``declare_release``): nothing in the optimizer, the coordinator, the
transports or the privacy report knows this protocol.
"""

from __future__ import annotations

from typing import Literal, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict

from labfbo.core.messages import Abstain, Message, register
from labfbo.core.release import Release
from labfbo.privacy import DP
from labfbo.protocols import Aggregator, Exchange, Finish, Protocol, SiteData, SiteLogic

MECHANISM = "Gaussian on the mean of the site's results, each clipped to [-C, C]"


@register
class MeanRequest(Message):
    kind: Literal["toy_mean_request"] = "toy_mean_request"


@register
class NoisedMean(Message):
    kind: Literal["toy_noised_mean"] = "toy_noised_mean"
    mean: float
    dp_noise_multiplier: float | None = None


@register
class GrandMean(Message):
    kind: Literal["toy_grand_mean"] = "toy_grand_mean"
    mean: float


class ToyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    privacy: DP | None = None


class ToySite(SiteLogic):
    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if data.n == 0:
            return Abstain(reason="no results yet")
        dp: DP | None = self.options.privacy
        clip = 1.0 if dp is None else dp.clip
        mean = float(np.mean(np.clip(data.y, -clip, clip)))
        if dp is not None:  # task level: the whole dataset may change, so the mean moves by at most 2C
            mean += float(self.context.private_rng(round, "toy-mean").normal(0.0, dp.noise_multiplier * 2 * clip))
        return NoisedMean(mean=mean, dp_noise_multiplier=None if dp is None else dp.noise_multiplier)

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        dp: DP | None = self.options.privacy
        if kind == "toy_noised_mean" and noised and dp is not None:
            return Release.gaussian(kind, round, dp, MECHANISM, sensitivity=2 * dp.clip,
                                    noise_std=dp.noise_multiplier * 2 * dp.clip)
        return super().declare_release(kind, round, step, noised, sensitivity)

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        return np.random.default_rng(self.context.seed_for(round, "toy")).random((n, self.space.dim))


class ToyAggregator(Aggregator):
    def open_round(self, t: int) -> Exchange:
        return Exchange({s: MeanRequest() for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Finish:
        means = [m.mean for m in responses.values() if isinstance(m, NoisedMean)]
        reply = GrandMean(mean=float(np.mean(means)) if means else 0.0)
        return Finish({s: reply for s in self.sites})


class ToyProtocol(Protocol):
    name = "toy-noised-mean"
    Options = ToyOptions
    site_logic = ToySite
    aggregator = ToyAggregator
