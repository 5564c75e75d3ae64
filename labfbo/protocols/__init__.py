"""The protocol registry. Adding a protocol = one module + one line in ``_BUILTIN``.

A protocol class is also its configured object: ``labfbo.protocols.Surface(privacy=labfbo.DP())``
is a :class:`Protocol` with its validated options (:attr:`Protocol.options`). The classes load
when first named (``labfbo.protocols.Vote``, :func:`get_protocol`), from ``_BUILTIN``.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from pydantic import BaseModel

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.suggest import did_you_mean
from labfbo.protocols.base import (
    Aggregator,
    Exchange,
    Finish,
    Protocol,
    SiteContext,
    SiteData,
    SiteLogic,
    Step,
    parse_options,
)

#: name -> "module:Class", one line per protocol (imported when first asked for)
_BUILTIN: dict[str, str] = {
    "independent": "labfbo.protocols.independent:Independent",
    "consensus": "labfbo.protocols.consensus:Consensus",
    "gradient": "labfbo.protocols.gradient.protocol:Gradient",
    "distribution": "labfbo.protocols.distribution.protocol:Distribution",
    "centralized": "labfbo.protocols.centralized:Centralized",
    "pooled": "labfbo.protocols.pooled:Pooled",
    "surface": "labfbo.protocols.surface.protocol:Surface",
    "vote": "labfbo.protocols.vote.protocol:Vote",
}
_REGISTRY: dict[str, type[Protocol]] = {}


def register_protocol(cls: type[Protocol]) -> type[Protocol]:
    """Register a protocol class under ``cls.name`` (usable as a decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def available_protocols() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def get_protocol(name: str) -> type[Protocol]:
    """The protocol class registered under ``name``."""
    if name not in _REGISTRY:
        target = _BUILTIN.get(name)
        if target is None:
            raise ConfigurationError(f"unknown protocol {name!r}{did_you_mean(str(name), available_protocols())} "
                                     f"(available: {', '.join(available_protocols())})")
        module, attr = target.split(":")
        _REGISTRY[name] = getattr(importlib.import_module(module), attr)
    return _REGISTRY[name]


def configure(protocol: "str | Protocol", options: Mapping[str, Any] | None = None) -> Protocol:
    """The configured protocol from either form: a :class:`Protocol` object (``options`` must then
    be empty: they are set on the object), or a registered name plus its keywords."""
    options = dict(options or {})
    if isinstance(protocol, Protocol):
        if options:
            raise ConfigurationError(f"the options of {protocol!r} are set on the object; do not repeat them as "
                                     f"keywords ({', '.join(sorted(options))})")
        return protocol
    if isinstance(protocol, str):
        return get_protocol(protocol)(**options)
    hint = (f" (call it: labfbo.protocols.{protocol.__name__}(...))"
            if isinstance(protocol, type) and issubclass(protocol, Protocol) else "")
    raise ConfigurationError(f"protocol must be a name or a configured protocol such as "
                             f"labfbo.protocols.Gradient(...), got {type(protocol).__name__}{hint}")


def resolve(protocol: "str | Protocol", options: dict[str, Any]) -> tuple[str, BaseModel]:
    """The protocol's name and options from either form (an object, or a name plus keywords)."""
    configured = configure(protocol, options)
    return configured.name, configured.options


def as_keywords(protocol: "str | Protocol", options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Either form as the shorthand: the name and the options given (for code that forwards keywords)."""
    if not isinstance(protocol, Protocol):
        return protocol, options
    configure(protocol, options)  # refuses options given twice
    return protocol.name, protocol.keywords()


def shared_of(protocol: type[Protocol], options: BaseModel) -> dict[str, Any]:
    """:attr:`Protocol.shared` of ``protocol`` configured with ``options``."""
    return protocol.from_options(options).shared


def __getattr__(attr: str) -> type[Protocol]:
    """``labfbo.protocols.Surface``: the class a ``_BUILTIN`` line names, loaded when first asked for."""
    for name, target in _BUILTIN.items():
        if target.rsplit(":", 1)[1] == attr:
            return get_protocol(name)
    raise AttributeError(f"module 'labfbo.protocols' has no attribute {attr!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {t.rsplit(":", 1)[1] for t in _BUILTIN.values()})


__all__ = ["Aggregator", "Centralized", "Consensus", "Distribution", "Exchange", "Finish",
           "Gradient", "Independent", "Pooled", "Protocol", "SiteContext", "SiteData", "SiteLogic", "Step",
           "Surface", "Vote", "as_keywords", "available_protocols", "configure", "get_protocol", "parse_options",
           "register_protocol", "resolve", "shared_of"]
