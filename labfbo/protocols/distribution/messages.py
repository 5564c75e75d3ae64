"""The messages of protocol ``distribution`` (GUIDE-FBO): the belief request, a site's belief
about its optimum's location, and the coordinator's guidance packet (:mod:`labfbo.protocols.distribution.protocol`)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_serializer, model_validator

from labfbo.core.exceptions import ProtocolError
from labfbo.core.messages import Array, Message, omit_unset, register
from labfbo.models.figp import GuidanceField
from labfbo.models.optimum_belief import choice_layout
from labfbo.space.search import SearchSpace

NOISE_GUARD = 0.25
"""The largest DP noise std per coordinate of a component's centre (unit cube) at which a site still
uses that component: beyond it the released centre is mostly noise (clipped to the cube's faces)."""


@register
class BeliefRequest(Message):
    """Coordinator -> site: upload your optimum-location component for this round."""

    kind: Literal["belief_request"] = "belief_request"


def _check_finite(a: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")


def _check_probs(probs: Array | None, ndim: int) -> None:
    if probs is None:
        return
    p = probs.numpy()
    if p.ndim != ndim or not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise ValueError(f"choice probabilities must be a {ndim}-D array of numbers in [0, 1]")


@register
class OptimumBelief(Message):
    """Site -> coordinator: one diagonal Gaussian component and its value score (2d + 2 scalars)."""

    kind: Literal["optimum_belief"] = "optimum_belief"
    weight: float = Field(gt=0.0, le=1.0)
    mean: Array
    variance: Array
    value: float
    probs: Array | None = None  # categorical columns: the choice probabilities, concatenated
    dp_clip: float | None = None  # under DP: the bound of |value|, and the noise multiplier
    dp_noise_multiplier: float | None = None
    dp_noise_sd: float | None = Field(None, ge=0.0, description="under DP: the std of the Gaussian noise on each "
                                      "released coordinate of the centre, unit-cube scale (sigma * Delta; left off "
                                      "the wire without DP)")
    release_every: int | None = Field(None, ge=1, description="the site's schedule: the coordinator may reuse this "
                                      "belief for the next k - 1 rounds (None: 1; left off the wire)")

    @model_serializer(mode="wrap")
    def _no_default_schedule(self, handler: Any) -> Any:
        # the messages of release_every=1 without DP are byte for byte as before
        return omit_unset(handler(self), self, "release_every", "dp_noise_sd")

    @model_validator(mode="after")
    def _shapes(self) -> "OptimumBelief":
        mean, var = self.mean.numpy(), self.variance.numpy()
        if mean.ndim != 1 or var.shape != mean.shape:
            raise ValueError(f"mean and variance must be (d,) vectors, got {mean.shape} and {var.shape}")
        _check_finite(np.r_[mean, var, self.value], "belief")
        if np.any(var <= 0):
            raise ValueError("variances must be positive")
        _check_probs(self.probs, 1)
        return self

    @property
    def n_scalars(self) -> int:
        return (
            2 + self.mean.n_scalars + self.variance.n_scalars + (self.probs.n_scalars if self.probs is not None else 0)
        )


@register
class GuidancePacket(Message):
    """Coordinator -> site: up to P components (global weight, centre, diagonal variance)."""

    kind: Literal["guidance_packet"] = "guidance_packet"
    weights: Array    # (P,)
    means: Array      # (P, d_o) over the ordered (non-categorical) columns
    variances: Array  # (P, d_o)
    probs: Array | None = None  # (P, sum of choice counts) on spaces with categorical columns
    noise_sd: Array | None = Field(None, description="(P,): the std of the DP noise on each coordinate of a "
                                   "component's centre, unit-cube scale (0: none); left off the wire without DP")

    @model_serializer(mode="wrap")
    def _no_noise_without_dp(self, handler: Any) -> Any:
        return omit_unset(handler(self), self, "noise_sd")

    @model_validator(mode="after")
    def _shapes(self) -> "GuidancePacket":
        w, mu, var = self.weights.numpy(), self.means.numpy(), self.variances.numpy()
        if w.ndim != 1 or mu.ndim != 2 or mu.shape[0] != len(w) or var.shape != mu.shape:
            raise ValueError(f"inconsistent packet shapes {w.shape}, {mu.shape}, {var.shape}")
        _check_finite(np.concatenate([w, mu.ravel(), var.ravel()]), "packet")
        if np.any(w < 0) or np.any(var <= 0):
            raise ValueError("weights must be >= 0 and variances > 0")
        _check_probs(self.probs, 2)
        if self.probs is not None and self.probs.shape[0] != len(w):
            raise ValueError(f"{self.probs.shape[0]} probability rows for {len(w)} components")
        if self.noise_sd is not None:
            sd = self.noise_sd.numpy()
            if sd.shape != w.shape or not np.all(np.isfinite(sd)) or np.any(sd < 0):
                raise ValueError(f"noise_sd must be {len(w)} finite numbers >= 0, one per component")
        return self

    @property
    def n_scalars(self) -> int:
        return (self.weights.n_scalars + self.means.n_scalars + self.variances.n_scalars
                + (self.probs.n_scalars if self.probs is not None else 0))

    def field(self, space: SearchSpace | None = None, noise_guard: float = NOISE_GUARD) -> GuidanceField:
        """The guidance field; with categorical columns in ``space``, over its layout.

        Under DP (``noise_sd``) a component's centre is known only up to its noise: its
        variances grow by :math:`s_p^2`, and a component with :math:`s_p` above ``noise_guard``
        (a quarter of the cube: its centre is mostly noise) is left out, so guidance that is
        all noise leaves the site its local GP."""
        w, mu, var = self.weights.numpy(), self.means.numpy(), self.variances.numpy()
        probs = self.probs.numpy() if self.probs is not None else None
        if self.noise_sd is not None:
            sd = self.noise_sd.numpy()
            keep = sd <= noise_guard
            w, mu, var = w[keep], mu[keep], var[keep] + sd[keep, None] ** 2
            probs = None if probs is None else probs[keep]
        if space is None or not space.cat_dims():
            return GuidanceField(w, mu, var)
        ordered, cats = choice_layout(space)
        if probs is None or mu.shape[1] != len(ordered) or probs.shape[1] != sum(k for _, k, _ in cats):
            raise ProtocolError(f"a guidance packet of shape {mu.shape}/{None if probs is None else probs.shape} "
                                "does not fit this space")
        return GuidanceField(w, mu, var, probs=probs, ordered=tuple(ordered), cats=tuple(cats))
