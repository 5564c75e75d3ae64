"""The messages of protocol ``surface`` (:mod:`labfbo.protocols.surface.protocol`): the request, a site's
ridge statistics in the clear, and the totals a site receives (the others' sums, or under secure
aggregation the cohort's sum and its members, :mod:`labfbo.protocols.surface.secure`)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_serializer, model_validator

from labfbo.core.messages import Array, Message, omit_unset, register
from labfbo.protocols.surface.model import packed_size


def _left_off(out: Any, model: Any, defaults: dict[str, Any]) -> Any:
    """``out`` without the fields still at their default (so the clear protocol's messages read as before)."""
    if isinstance(out, dict):
        for name, default in defaults.items():
            if getattr(model, name) == default:
                out.pop(name, None)
    return out


# -- messages ----------------------------------------------------------------------------
@register
class SurfaceRequest(Message):
    """Coordinator -> site: upload your response-surface statistics for this round."""

    kind: Literal["surface_request"] = "surface_request"
    cohort: dict[str, str] | None = Field(None, description="secure aggregation: member -> public key (upload "
                                          "masked, into this cohort's sum); None: statistics in the clear")
    recipients: dict[str, str] | None = Field(None, description="a sum only the members open: the sites outside "
                                              "the cohort (-> public key) that receive it too (the leader seals "
                                              "the group key for them as well)")

    @model_serializer(mode="wrap")
    def _no_cohort(self, handler: Any) -> Any:  # the clear protocol's request as before
        return _left_off(handler(self), self, {"cohort": None, "recipients": None})


def _finite(*arrays: Array) -> None:
    for a in arrays:
        if not np.all(np.isfinite(a.numpy())):
            raise ValueError("statistics must be finite")


MAX_OBJECTIVES = 16  # moments per message: one per objective (several objectives, multi_objective="hypervolume")


def _check_shapes(gram: Array, moment: Array, bound: float) -> None:
    shape = moment.shape
    if not (len(shape) == 1 or (len(shape) == 2 and 2 <= shape[0] <= MAX_OBJECTIVES)) \
            or gram.shape != (packed_size(shape[-1]),):
        raise ValueError(f"moment must be a (p,) vector (or (m, p), one per objective, 2 <= m <= {MAX_OBJECTIVES}) "
                         f"and gram its (p(p+1)/2,) upper triangle, got {shape} and {gram.shape}")
    _finite(gram, moment)
    if max(float(np.abs(gram.numpy()).max(initial=0.0)), float(np.abs(moment.numpy()).max(initial=0.0))) > bound:
        raise ValueError(f"statistics must be at most {bound:g} in absolute value")


MAX_COUNT = 10**7  # observations per site
MAX_AVERAGE = 1e9  # |entry| of an average: <= 1 without DP, DP noise far below this



@register
class SurfaceStats(Message):
    r"""Site -> coordinator: :math:`\bar G` (upper triangle), :math:`\bar h` and :math:`n`
    (``p(p+1)/2 + p + 1`` scalars); with several objectives one :math:`\bar h_j` per objective
    (``moment`` of shape ``(m, p)``)."""

    kind: Literal["surface_stats"] = "surface_stats"
    count: int = Field(ge=2, le=MAX_COUNT)
    gram: Array
    moment: Array
    dp_clip: float | None = None  # under DP: the bound of |z|, the noise multiplier and the l2 sensitivity
    dp_noise_multiplier: float | None = None
    dp_sensitivity: float | None = None
    release_every: int | None = Field(None, ge=1, description="the site's schedule: the coordinator may reuse these "
                                      "statistics for the next k - 1 rounds (None: 1; left off the wire)")
    agreement: float | None = Field(None, allow_inf_nan=False, description="only if the lab opts in "
                                    "(share_agreement): its agreement with the partners' surface (left off the wire)")

    @model_serializer(mode="wrap")
    def _no_default_schedule(self, handler: Any) -> Any:
        # the messages of release_every=1 without a shared agreement are byte for byte as before
        return omit_unset(handler(self), self, "release_every", "agreement")

    @model_validator(mode="after")
    def _shapes(self) -> "SurfaceStats":
        _check_shapes(self.gram, self.moment, MAX_AVERAGE)
        return self

    @property
    def p(self) -> int:
        return int(self.moment.shape[-1])


@register
class SurfaceTotals(Message):
    """Coordinator -> site: the other contributors' count-weighted statistics, summed.

    Under secure aggregation (``members`` set) the coordinator knows no single site's statistics:
    the message holds the sum over the cohort ``members`` of round ``summed_round`` (``sites`` of
    them, ``count`` observations), every site's own upload included; each site subtracts its own
    (:mod:`labfbo.protocols.surface.secure`). ``averages``: the members summed their noised
    averages with weight 1 (under DP), not count-weighted statistics."""

    kind: Literal["surface_totals"] = "surface_totals"
    sites: int = Field(ge=0)
    count: int = Field(ge=0)
    gram: Array
    moment: Array
    noise_sd: float | None = Field(None, ge=0, allow_inf_nan=False, description="the DP noise std per entry of the "
                                   "sums, from what the contributors stated: sqrt(sum_j (n_j sigma_j Delta_j)^2)")

    members: list[str] | None = Field(None, description="secure aggregation: the cohort whose sum this is")
    summed_round: int | None = Field(None, ge=0, description="secure aggregation: the round of the sum (earlier "
                                     "than this one when the coordinator reuses it, release_every)")
    averages: bool = Field(False, description="secure aggregation under DP: a sum of averages (weight 1)")
    ranked: bool = Field(False, description="secure aggregation under DP(unit='experiment'): the members' moment "
                         "sums of centred ranks and, as the Gram's constant row (its other entries 0), their count and "
                         "features' sums, with their shares of the noise (labfbo.protocols.surface.secure)")

    @model_serializer(mode="wrap")
    def _no_unset_noise(self, handler: Any) -> Any:
        # totals without DP noise (and without secure aggregation) are byte for byte as before
        return _left_off(handler(self), self, {"noise_sd": None, "members": None, "summed_round": None,
                                               "averages": False, "ranked": False})

    @model_validator(mode="after")
    def _shapes(self) -> "SurfaceTotals":
        _check_shapes(self.gram, self.moment, MAX_AVERAGE * MAX_COUNT * 10**4)
        return self


@register
class SealedTotals(Message):
    """Coordinator -> site: the cohort's sum as the coordinator holds it, behind the group mask of the
    cohort's leader (uniform in Z_{2^64}: it cannot read it), with the group key the leader sealed for
    this site (:func:`~labfbo.protocols.secure_sum.upload_sealed`). The site opens it
    (:func:`~labfbo.protocols.surface.secure.open_totals`): the sum of :class:`SurfaceTotals` with ``members``."""

    kind: Literal["surface_sealed_totals"] = "surface_sealed_totals"
    masked: Array
    members: list[str] = Field(description="the members whose sum this is (their names: the release's context)")
    leader_key: str = Field(description="the public key of the cohort's leader (its first member), which sealed "
                            "the group key")
    sealed: dict[str, str] = Field(description="the cohort's leader -> the group key it sealed for this site "
                                   "(empty for the leader itself)")
    summed_round: int = Field(ge=0, description="the round of the sum (earlier than this one when the "
                              "coordinator reuses it, release_every)")
    averages: bool = Field(False, description="under DP: a sum of averages (weight 1)")
    ranked: bool = Field(False, description="under DP(unit='experiment'): sums of centred ranks' moments and "
                         "feature sums (as SurfaceTotals.ranked)")

    @model_serializer(mode="wrap")
    def _no_unset_ranked(self, handler: Any) -> Any:
        return _left_off(handler(self), self, {"ranked": False})

    @model_validator(mode="before")
    @classmethod
    def _from_cohort(cls, data: Any) -> Any:
        """A journal written before: the whole cohort's public keys (``cohort``), of which a member
        needs only the names and the leader's key (O(1) bytes per member instead of O(n))."""
        if isinstance(data, dict) and isinstance(data.get("cohort"), dict) and data["cohort"]:
            cohort = data["cohort"]
            data = {**{k: v for k, v in data.items() if k != "cohort"}, "members": sorted(cohort),
                    "leader_key": cohort[min(cohort)]}
        return data

    @model_validator(mode="after")
    def _words(self) -> "SealedTotals":
        if self.masked.dtype != "uint64" or len(self.masked.shape) != 1:
            raise ValueError("a sealed sum is a vector of uint64 words")
        return self


def why_no_surface(received: Message | None, totals: Message | None) -> str:
    """Why a round's guidance gave a lab no surface (``received``: as it arrived; ``totals``: the others' part)."""
    if not isinstance(received, (SurfaceTotals, SealedTotals)):
        return "no sum of the partners' statistics reached this lab (a secure sum needs 3 labs that answer the round)"
    if not isinstance(totals, SurfaceTotals):
        return f"this lab could not take its own upload out of round {received.round}'s secure sum"
    if totals.sites == 0:
        members = received.members if isinstance(received, SurfaceTotals) else None
        return ("no secure sum formed" + ("" if not members else f" ({len(members)} member(s); a sum needs 3)")
                + " and no partner's statistics reached this lab")
    return f"the sum of its {totals.sites} partners did not pass the noise guard (DP noise would mislead the lab)"
