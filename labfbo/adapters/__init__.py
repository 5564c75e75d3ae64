"""Instrument adapters: the plugin interface, and discovery through entry points.

>>> from labfbo.adapters import load_adapter
>>> adapter = load_adapter("simulated", problem="branin")      # doctest: +SKIP
"""

from labfbo.adapters.base import Adapter, AdapterContext, Handle, InstrumentBusy, Measurement
from labfbo.adapters.registry import ENTRY_POINT_GROUP, discover_adapters, load_adapter

__all__ = ["Adapter", "AdapterContext", "ENTRY_POINT_GROUP", "Handle", "InstrumentBusy", "Measurement",
           "discover_adapters", "load_adapter"]
