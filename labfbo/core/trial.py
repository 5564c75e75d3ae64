"""Trials, observations and measured values (the records an Optimizer keeps)."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from labfbo.core.exceptions import ValidationError

TrialState = Literal["pending", "complete", "failed", "retracted"]
Source = Literal["design", "model", "model-alone", "model-last-guidance", "model-local", "enqueued", "random",
                 "historical"]


class Trial(BaseModel):
    """A proposed experiment: its id and its params in user units.

    ``metadata`` says where it came from (``source``: design / model / enqueued /
    random, or ``model-last-guidance`` / ``model-local`` when ``ask(timeout=...)`` got no
    guidance in time, ``model-alone`` when the round's guidance arrived but carried nothing from the
    partners, e.g. no secure sum formed; ``round``: the BO round).
    """

    model_config = ConfigDict(frozen=True)
    id: int
    params: dict[str, Any]
    metadata: dict[str, Any] = {}


class Observation(BaseModel):
    """A completed measurement: raw params as given, value and optional standard error."""

    model_config = ConfigDict(frozen=True)
    params: dict[str, Any]
    value: float
    sem: float | None = None
    trial_id: int | None = None
    source: str = "historical"
    outcomes: dict[str, float] | None = None  # with named outcomes: every outcome's mean (value: the first objective's)
    outcome_sems: dict[str, float | None] | None = None  # ... and its standard error, where one was given


@dataclass
class TrialRecord:
    """Mutable bookkeeping of one trial inside the optimizer."""

    id: int
    params: dict[str, Any]
    x: np.ndarray
    source: str
    round: int
    state: TrialState = "pending"
    value: float | None = None
    sem: float | None = None
    outcomes: dict[str, tuple[float, float | None]] | None = None
    reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    asked_at: int = 0                 # journal position of its ask
    finished_at: int | None = None    # journal position of its tell or fail
    retracted_at: int | None = None   # journal position of its retraction (state "retracted" from there)

    def state_at(self, position: int | None) -> TrialState:
        """Its state as of journal ``position`` (None: now)."""
        if position is None or (self.retracted_at is not None and self.retracted_at <= position):
            return self.state
        if self.finished_at is not None and self.finished_at <= position:
            return "complete" if self.retracted_at is not None else self.state
        return "pending"

    def trial(self) -> Trial:
        return Trial(id=self.id, params=dict(self.params),
                     metadata={"source": self.source, "round": self.round, **self.metadata})


def _number(v: Any, what: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise ValidationError(f"{what} must be a real number, got {type(v).__name__} {v!r}")
    try:
        f = float(v)
    except OverflowError:
        raise ValidationError(f"{what} must be finite, got a number beyond the float range (±1.8e308)") from None
    if not math.isfinite(f):
        raise ValidationError(f"{what} must be finite, got {f}")
    return f


def parse_value(value: Any) -> tuple[float, float | None]:
    """A measurement as ``float`` or ``(mean, sem)`` -> ``(mean, sem or None)``.

    Raises :class:`ValidationError` on NaN/inf, non-numbers and negative ``sem``.
    """
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValidationError(f"a measurement is a number or (mean, sem), got {value!r}")
        mean = _number(value[0], "measured mean")
        sem = _number(value[1], "standard error")
        if sem < 0:
            raise ValidationError(f"standard error must be >= 0, got {sem}")
        return mean, sem
    if isinstance(value, np.ndarray):
        if value.ndim > 0:
            raise ValidationError(f"a measurement is a number or a (mean, sem) tuple, got an array of shape "
                                  f"{value.shape}: tell one value per trial (value.item() if it holds one)")
        value = value.item()
    return _number(value, "measured value"), None


def metadata_record(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """``{"metadata": ...}`` for a journal record, checked to be JSON (``{}`` when empty)."""
    if not metadata:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise ValidationError("metadata must be a dict with string keys")
    if {"source", "round"} & set(metadata):
        raise ValidationError("metadata keys 'source' and 'round' are labfbo's own")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"metadata must be JSON-serializable ({exc})") from None
    return {"metadata": metadata}
