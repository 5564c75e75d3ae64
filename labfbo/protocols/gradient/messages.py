"""The messages of protocol ``gradient`` (PACD-BO): the particles request, a site's scores and the
coordinator's particles (:mod:`labfbo.protocols.gradient.protocol`)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_serializer, model_validator

from labfbo.core.messages import Array, Message, omit_unset, register
from labfbo.protocols.gradient.wire import check_codes, dequantize, without_unset_scale
from labfbo.protocols.secure_sum import digest


@register
class ParticlesRequest(Message):
    """Coordinator -> site: the current particles; answer with your scores on them."""

    kind: Literal["particles_request"] = "particles_request"
    step: int
    particles: Array
    cohort: dict[str, str] | None = Field(None, description="secure aggregation: member -> public key")

    @property
    def dp_query(self) -> str:
        """What this request asks about, for the DP noise stream (:func:`dp_query`)."""
        return dp_query(self.particles)


def dp_purpose(step: int) -> str:
    """The DP noise streams of one step (:meth:`labfbo.protocols.SiteLogic.noise_rng`)."""
    return f"dp-noise/{step}"


def dp_query(particles: Array) -> str:
    """The particles a step asks about (as the site holds them), by digest: an answer to other
    particles at the same step draws a fresh stream (their difference would cancel reused noise)."""
    return digest(particles)[:32]


@register
class ScoreResponse(Message):
    """Site -> coordinator: per-particle scores ``A_ik`` (K, P) and the site's data count.

    With ``wire="compact"``, ``scores`` holds int8 codes and ``scale`` their block scales
    (:mod:`labfbo.protocols.gradient.wire`); :meth:`values` reads either."""

    kind: Literal["score"] = "score"
    step: int
    scores: Array
    n_obs: int
    dp_clip: float | None = None
    dp_noise_multiplier: float | None = None
    scale: Array | None = None

    @model_serializer(mode="wrap")
    def _lossless_as_before(self, handler: Any) -> Any:
        return without_unset_scale(handler(self), self.scale)

    @model_validator(mode="after")
    def _codes_fit_their_scales(self) -> "ScoreResponse":
        if self.scale is not None:
            check_codes(self.scores, self.scale)
        return self

    def values(self) -> np.ndarray:
        """The scores, float64 (decoded from the compact wire's codes if they came so)."""
        return self.scores.numpy() if self.scale is None else dequantize(self.scores, self.scale)


@register
class ParticlesReply(Message):
    """Coordinator -> site: the round's meta-learned particles (the guidance)."""

    kind: Literal["particles"] = "particles"
    particles: Array
    dp_noise_ratio: float | None = Field(
        None, ge=0.0, description="under DP: how large the noise in the score sums that trained these particles "
        "was against their signal (the noise's l2 norm per particle over the largest norm the clipped scores can "
        "sum to); above 1 the particles are mostly noise (left off the wire without DP)")

    @model_serializer(mode="wrap")
    def _no_ratio_without_dp(self, handler: Any) -> Any:
        return omit_unset(handler(self), self, "dp_noise_ratio")
