"""The protocol registry. Adding a protocol = one module + one line in ``_BUILTIN``."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from labfbo.exceptions import ConfigurationError
from labfbo.suggest import did_you_mean
from labfbo.protocols.base import (Aggregator, Exchange, Finish, Protocol, SiteContext,
                                   SiteData, SiteLogic, Step)

_BUILTIN: dict[str, str] = {
    "independent": "labfbo.protocols.independent:IndependentProtocol",
    "consensus": "labfbo.protocols.consensus:ConsensusProtocol",
    "gradient": "labfbo.protocols.gradient:GradientProtocol",
    "distribution": "labfbo.protocols.distribution:DistributionProtocol",
    "centralized": "labfbo.protocols.centralized:CentralizedProtocol",
    "pooled": "labfbo.protocols.pooled:PooledProtocol",
    "surface": "labfbo.protocols.surface:SurfaceProtocol",
    "vote": "labfbo.protocols.vote:VoteProtocol",
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


def parse_options(protocol: type[Protocol], options: dict[str, Any]) -> BaseModel:
    """Validate protocol keywords; unknown or invalid ones raise a ConfigurationError."""
    try:
        return protocol.Options(**options)
    except PydanticValidationError as exc:
        fields = list(protocol.Options.model_fields)

        def problem(e: Any) -> str:
            where = ".".join(str(p) for p in e["loc"]) or "options"
            if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:  # a misspelt option name
                return (f"unknown option {where!r}{did_you_mean(where, fields)} (its options: "
                        f"{', '.join(sorted(fields)) or 'none'})")
            return f"{where}: {e['msg']}"
        problems = "; ".join(problem(e) for e in exc.errors())
        raise ConfigurationError(f"invalid options for protocol {protocol.name!r}: {problems}") from None


def shared_of(protocol: type[Protocol], options: BaseModel) -> dict[str, Any]:
    """The options a site sends in its join for the coordinator to compare (``shared_options``;
    a ``later_shared_options`` one only when it is not at its default)."""
    fields = type(options).model_fields
    return {k: v for k, v in options.model_dump(mode="json").items() if k in protocol.shared_options
            and not (k in protocol.later_shared_options and k in fields and v == fields[k].default)}


from labfbo.protocols.configured import (Centralized, ConfiguredProtocol, Consensus, Distribution,  # noqa: E402
                                         Gradient, Independent, Pooled, Surface, resolve)

__all__ = ["Aggregator", "Centralized", "ConfiguredProtocol", "Consensus", "Distribution", "Exchange", "Finish",
           "Gradient", "Independent", "Pooled", "Protocol", "SiteContext", "SiteData", "SiteLogic", "Step",
           "Surface", "available_protocols", "get_protocol", "parse_options", "register_protocol", "resolve", "shared_of"]
