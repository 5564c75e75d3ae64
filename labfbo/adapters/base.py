"""The instrument adapter interface: a Trial in, a Measurement out.

An adapter is either *synchronous* — it implements :meth:`Adapter.run`, which blocks
until the instrument has measured — or *asynchronous* — it implements
:meth:`Adapter.submit` (start the run, return a JSON handle) and :meth:`Adapter.poll`
(the measurement, or ``None`` while the run is in progress). The closed loop
(:class:`labfbo.lab.CampaignLoop`) journals the handle before it waits, so a site that
crashes re-polls its experiments instead of running them again. An asynchronous adapter
that can find a run it may have started before a crash implements :meth:`Adapter.recover`.
"""

from __future__ import annotations

import math
import time
from abc import ABC
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from labfbo.core.exceptions import LabFBOError
from labfbo.core.trial import Trial, parse_value
from labfbo.space.search import SearchSpace

Handle = dict[str, Any]


class InstrumentBusy(LabFBOError):
    """Raised by an adapter for a transient problem (instrument busy, network blip): ask again later.

    The loop keeps the trial in flight and retries at the next poll; any other exception
    makes the trial a failed one, with the exception as its reason.
    """


class AdapterContext(BaseModel):
    """What an adapter learns about the campaign in :meth:`Adapter.prepare`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    site: str
    space: SearchSpace
    objective: str = "minimize"
    outcomes: list[str] = Field(default_factory=list, description="with named outcomes: every outcome a "
                                "measurement must report (Measurement(outcomes={...}))")
    campaign: str = Field("", description="a stable id of this site's campaign (its journal): tag the runs "
                                          "with it, so files or jobs of an earlier campaign are never taken for ours")


class Measurement(BaseModel):
    """The outcome of one instrument run: a value (and optional standard error), a dict of named
    ``outcomes`` (each a number or ``(mean, sem)``), or a failure."""

    model_config = ConfigDict(frozen=True)
    value: float | None = None
    sem: float | None = None
    outcomes: dict[str, float | tuple[float, float]] | None = None
    failed: bool = False
    reason: str = ""
    metadata: dict[str, Any] = {}

    @model_validator(mode="after")
    def _consistent(self) -> "Measurement":
        if self.failed:
            if self.value is not None or self.outcomes is not None:
                raise ValueError("a failed measurement has no value")
        elif self.outcomes is not None:
            if self.value is not None:
                raise ValueError("a measurement has a value or named outcomes, not both")
            for _name, v in self.outcomes.items():
                parse_value(v)  # finite numbers, sem >= 0: raises naming the problem
        else:
            if self.value is None or not math.isfinite(self.value):
                raise ValueError(f"a measurement needs a finite value (got {self.value!r}); "
                                 "use Measurement.failure(reason) for a failed run")
            if self.sem is not None and not (math.isfinite(self.sem) and self.sem >= 0):
                raise ValueError(f"sem must be finite and >= 0, got {self.sem!r}")
        return self

    @classmethod
    def ok(cls, value: float, sem: float | None = None, **metadata: Any) -> "Measurement":
        return cls(value=value, sem=sem, metadata=metadata)

    @classmethod
    def of(cls, outcomes: dict[str, Any], **metadata: Any) -> "Measurement":
        """Several named outcomes, e.g. ``Measurement.of({"yield": 81.2, "impurity": (0.3, 0.02)})``."""
        return cls(outcomes=outcomes, metadata=metadata)

    def told(self) -> Any:
        """What ``Optimizer.tell`` takes for it: the outcomes dict, ``(value, sem)`` or the value."""
        if self.outcomes is not None:
            return dict(self.outcomes)
        return self.value if self.sem is None else (self.value, self.sem)

    @classmethod
    def failure(cls, reason: str, **metadata: Any) -> "Measurement":
        return cls(failed=True, reason=reason or "failed", metadata=metadata)

    @classmethod
    def coerce(cls, result: Any) -> "Measurement":
        """A Measurement from what an adapter returned: a Measurement, a float or ``(mean, sem)``."""
        if isinstance(result, Measurement):
            return result
        if isinstance(result, dict):
            return cls(outcomes=result)
        value, sem = parse_value(result)
        return cls(value=value, sem=sem)


class Adapter(ABC):  # noqa: B024 - subclasses implement run, or submit and poll
    """Turns a :class:`~labfbo.Trial` into an instrument run. Implement ``run``, or ``submit`` + ``poll``.

    Configuration (addresses, files, calibration) comes as keyword arguments of the
    constructor, which ``load_adapter(name, **config)`` and ``site.yaml`` pass through.
    """

    name: str = "adapter"
    #: seconds between two ``poll`` calls of one run (the loop uses the smallest over runs in flight)
    poll_interval: float = 1.0

    @property
    def asynchronous(self) -> bool:
        """True when the adapter implements ``submit`` / ``poll`` (several runs can be in flight)."""
        return type(self).submit is not Adapter.submit and type(self).poll is not Adapter.poll

    @property
    def implemented(self) -> bool:
        """True when the adapter can measure: it implements ``run``, or ``submit`` and ``poll``."""
        return type(self).run is not Adapter.run or self.asynchronous

    def prepare(self, context: AdapterContext) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Called once before the first run: check the search space, connect to the instrument."""

    def run(self, trial: Trial) -> Measurement | float | tuple[float, float]:
        """Run ``trial.params`` and block until measured. Raise (or return a failure) when it failed.

        The default submits and polls, so an asynchronous adapter can also be used synchronously.
        """
        if not self.asynchronous:
            raise NotImplementedError
        handle = self.submit(trial)
        while (result := self.poll(handle)) is None:
            time.sleep(self.poll_interval)
        return result

    def submit(self, trial: Trial) -> Handle:
        """Start ``trial`` on the instrument and return a JSON-serializable handle to poll."""
        raise NotImplementedError

    def poll(self, handle: Handle) -> Measurement | float | tuple[float, float] | None:
        """The run's measurement, or ``None`` while it is still in progress."""
        raise NotImplementedError

    def recover(self, trial: Trial) -> Handle | None:
        """After a crash between journaling a submission and its handle: the run's handle if
        the instrument has it, else ``None`` (the loop then marks the trial failed, never
        running it twice). The default cannot tell, so it returns ``None``."""
        return None

    def close(self) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Release the instrument."""
