"""Instrument adapters: turn a Trial into an instrument run and return its measurement.

Adapters are discovered through the ``labfbo.adapters`` entry-point group, so a lab can
ship its own in a separate package::

    [project.entry-points."labfbo.adapters"]
    my_reactor = "my_lab.reactor:ReactorAdapter"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from typing import Any

from labfbo.exceptions import ConfigurationError
from labfbo.trial import Trial

ENTRY_POINT_GROUP = "labfbo.adapters"


class InstrumentAdapter(ABC):
    """Runs one experiment. Return a float or ``(mean, sem)``; raise to mark it failed."""

    name: str = "adapter"

    @abstractmethod
    def run(self, trial: Trial) -> float | tuple[float, float]:
        """Run ``trial.params`` on the instrument and return the measurement."""

    def close(self) -> None:
        """Release the instrument."""


def discover_adapters() -> dict[str, Any]:
    """Entry points (name -> ``EntryPoint``) registered under ``labfbo.adapters``."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_adapter(name: str, **config: Any) -> InstrumentAdapter:
    """Instantiate the adapter registered as ``name`` with ``config``."""
    eps = discover_adapters()
    if name not in eps:
        raise ConfigurationError(f"no adapter {name!r}; installed: {sorted(eps) or 'none'}")
    cls = eps[name].load()
    adapter = cls(**config)
    if not isinstance(adapter, InstrumentAdapter):
        raise ConfigurationError(f"adapter {name!r} does not implement labfbo.adapter.InstrumentAdapter")
    return adapter
