"""`Release`: what one outgoing message discloses about a site's data, declared by its protocol.

A protocol's site side computes every message it sends, so it is the one that knows what
the message releases: which mechanism protected it, its l2 sensitivity under its neighbouring
relation (``unit``: the site's whole dataset, the default, or one experiment; :class:`~labfbo.privacy.DP`),
the noise it carries and whether secure aggregation hid it from the coordinator
(:meth:`labfbo.protocols.SiteLogic.release`). The optimizer journals the declaration before the
message leaves the site; the privacy report and the accountant fold over those records and know
nothing of any protocol.

A release is *private* when it carries Gaussian noise — then ``effective_noise_multiplier``
``= noise_std / sensitivity`` is the multiplier of one unit-sensitivity Gaussian mechanism
on the whole release (all its ``rows`` together) — or is a randomized response (``buckets``
options at ``pure_epsilon``, :mod:`labfbo.privacy.randomized_response`). :attr:`Release.event`
is what the PLD accountant composes (:func:`labfbo.privacy.dp.composed_epsilon`).
"""

from __future__ import annotations

import math
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from labfbo.core.dp import DP, Unit

NEIGHBOURING = "task level: two datasets of this site differ in every observation"
EXPERIMENT_NEIGHBOURING = ("experiment level: two datasets of this site differ in one experiment, its setting and "
                           "result (replaced; the count n is public)")
WHOLE_RELEASE = ("; one experiment can change this release entirely, so its sensitivity is the task level's "
                 "(the same noise as unit='site')")
"""Appended to :data:`EXPERIMENT_NEIGHBOURING` by a protocol whose release is a choice or a location
(a vote, a belief), which one experiment may move anywhere."""


def neighbouring(unit: Unit, whole: bool = False) -> str:
    """The neighbouring relation of ``unit`` as a release states it (``whole``: one experiment can change
    the whole release, so the experiment-level sensitivity is the site level's)."""
    if unit == "site":
        return NEIGHBOURING
    return EXPERIMENT_NEIGHBOURING + (WHOLE_RELEASE if whole else "")
NOT_PRIVATE = "none: not differentially private"

Event = Union[float, tuple[int, float]]
"""What the accountant composes for one release: a Gaussian's effective noise multiplier, or
``(buckets, epsilon)`` of a randomized response."""


class Release(BaseModel):
    """One release of data-derived information (a journal record and a privacy-report row)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    round: int = Field(ge=0)
    message: str = Field(min_length=1, description="the kind of the message that carried it")
    step: int | None = None
    mechanism: str = NOT_PRIVATE
    rows: int = Field(1, ge=1, description="rows released together as one mechanism (e.g. K particles)")
    noise_multiplier: float | None = Field(None, ge=0, description="sigma as configured")
    clip: float | None = Field(None, gt=0)
    sensitivity: float | None = Field(None, ge=0, description="l2 sensitivity of the whole release")
    noise_std: float | None = Field(None, ge=0, description="std of the Gaussian noise per coordinate")
    effective_noise_multiplier: float | None = Field(None, ge=0, description="noise_std / sensitivity")
    delta: float | None = Field(None, gt=0, lt=1)
    buckets: int | None = Field(None, ge=2, description="randomized response: the number of options")
    pure_epsilon: float | None = Field(None, gt=0, description="randomized response: its epsilon (pure DP)")
    reported: int | None = Field(None, ge=0, description="a choice: the option this site reported (what left, "
                                 "kept in its own journal so that a restarted site can repeat it)")
    streams: tuple[str, ...] = Field((), description="the site-private noise streams it drew from, "
                                     "'purpose#query digest' (kept in its own journal so that a restarted site "
                                     "never draws a used stream for another query; labfbo.privacy.streams)")
    secure_aggregation: bool = False
    neighbouring: str = NEIGHBOURING
    unit: Unit = Field("site", description="what is protected: the site's whole dataset or one experiment")

    @model_serializer(mode="wrap")
    def _no_unset_response(self, handler: Any) -> Any:
        out = handler(self)
        if self.unit == "site" and isinstance(out, dict):  # site-level records read as before units existed
            out.pop("unit", None)
        if self.buckets is None and isinstance(out, dict):  # Gaussian and unprotected records read as before
            out.pop("buckets", None)
            out.pop("pure_epsilon", None)
        if self.reported is None and isinstance(out, dict):
            out.pop("reported", None)
        if not self.streams and isinstance(out, dict):
            out.pop("streams", None)
        return out

    @model_validator(mode="after")
    def _consistent(self) -> "Release":
        noised = (self.sensitivity, self.noise_std, self.effective_noise_multiplier)
        if any(v is not None for v in noised) and (any(v is None for v in noised) or self.delta is None):
            raise ValueError("a private release declares its sensitivity, noise_std, effective_noise_multiplier "
                             "and delta together")
        if self.effective_noise_multiplier is not None and math.isnan(self.effective_noise_multiplier):
            raise ValueError("effective_noise_multiplier must be a number")
        if self.delta is not None and self.effective_noise_multiplier is None and self.pure_epsilon is None:
            raise ValueError("a release with a delta declares its mechanism: Gaussian noise or randomized response")
        if (self.buckets is None) != (self.pure_epsilon is None):
            raise ValueError("a randomized response declares its buckets and pure_epsilon together")
        if self.buckets is not None and (self.effective_noise_multiplier is not None or self.delta is None
                                         or not math.isfinite(self.pure_epsilon)):  # type: ignore[arg-type]
            raise ValueError("a randomized response declares a finite pure_epsilon and the site's delta, "
                             "and no Gaussian noise")
        return self

    @property
    def private(self) -> bool:
        """Whether it carries DP noise the accountant can compose (Gaussian or randomized response)."""
        return self.effective_noise_multiplier is not None or self.pure_epsilon is not None

    @property
    def event(self) -> Event:
        """What the accountant composes: the Gaussian's effective multiplier or ``(buckets, epsilon)``."""
        if self.pure_epsilon is not None:
            return (int(self.buckets), float(self.pure_epsilon))  # type: ignore[arg-type]
        if self.effective_noise_multiplier is None:
            raise ValueError(f"release {self.message!r} of round {self.round} is not private")
        return float(self.effective_noise_multiplier)

    @classmethod
    def unprotected(cls, message: str, round: int, step: int | None = None, secure_aggregation: bool = False,
                    rows: int = 1) -> "Release":
        """A release with no DP noise: no finite (epsilon, delta) from here on."""
        return cls(round=round, message=message, step=step, rows=rows, secure_aggregation=secure_aggregation)

    @classmethod
    def gaussian(cls, message: str, round: int, dp: DP, mechanism: str, sensitivity: float, noise_std: float,
                 step: int | None = None, rows: int = 1, secure_aggregation: bool = False,
                 whole: bool = False) -> "Release":
        """A Gaussian-mechanism release under the site's :class:`~labfbo.privacy.DP` settings
        (``noise_multiplier = 0``: clipped only, so an infinite epsilon), in ``dp.unit``; ``sensitivity``
        is the one under that unit (``whole``: one experiment can change the whole release, so it is the
        site level's, :func:`neighbouring`)."""
        if not sensitivity > 0:
            raise ValueError(f"a Gaussian release needs a positive l2 sensitivity, got {sensitivity!r} "
                             "(a message that cannot depend on the data is no release: declare None)")
        return cls(round=round, message=message, step=step, rows=rows, secure_aggregation=secure_aggregation,
                   mechanism=mechanism, noise_multiplier=dp.sigma, clip=dp.clip,
                   sensitivity=sensitivity, noise_std=noise_std,
                   effective_noise_multiplier=noise_std / sensitivity,
                   delta=dp.delta, unit=dp.unit, neighbouring=neighbouring(dp.unit, whole))

    @classmethod
    def randomized_response(cls, message: str, round: int, dp: DP, mechanism: str, buckets: int, epsilon: float,
                            step: int | None = None) -> "Release":
        """One choice among ``buckets`` options reported by randomized response at ``epsilon``
        (infinite: reported as it is, so no guarantee). One experiment can change the choice, so under
        ``unit="experiment"`` the same response gives the same epsilon (:func:`neighbouring`)."""
        if math.isinf(epsilon):
            return cls.unprotected(message, round, step)
        return cls(round=round, message=message, step=step, mechanism=mechanism, noise_multiplier=dp.sigma,
                   buckets=buckets, pure_epsilon=epsilon, delta=dp.delta, unit=dp.unit,
                   neighbouring=neighbouring(dp.unit, whole=True))
