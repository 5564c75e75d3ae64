"""Misspelt keywords: name the unknown one and the closest valid one ("did you mean").

``Optimizer(space, protocl="surface")`` passes ``protocl`` on as a protocol option; without
this check the protocol would refuse it as an option of ``'independent'``, the default, and
never mention ``protocol``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from pydantic import BaseModel

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.suggest import did_you_mean
from labfbo.protocols import Protocol, configure, get_protocol, resolve


def own_keywords(function: Callable[..., Any]) -> list[str]:
    """The named parameters of ``function`` (no ``self``, no ``*args``/``**kwargs``)."""
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_keywords(function: Callable[..., Any], protocol: Any, options: Mapping[str, Any]) -> None:
    """Refuse a keyword given to ``function`` (e.g. ``Optimizer.__init__``) that is neither one of
    its parameters nor an option of ``protocol`` (a name, or a configured protocol, whose options
    are set on the object), naming the closest valid keyword."""
    caller = "labfbo." + function.__qualname__.removesuffix(".__init__")
    if not options:
        return
    own = own_keywords(function)
    if isinstance(protocol, Protocol):
        fields, name = list(protocol.Options.model_fields), protocol.name
    elif isinstance(protocol, str):
        fields, name = list(get_protocol(protocol).Options.model_fields), protocol
    else:
        return  # the caller refuses a protocol of another type
    unknown = [k for k in options if k not in fields]
    if not unknown:
        return
    key = unknown[0]
    listed = f"protocol {name!r} takes {', '.join(sorted(fields)) or 'no options'}"
    raise ConfigurationError(f"{caller}() got an unknown keyword {key!r}{did_you_mean(key, own + fields)} "
                             f"({caller}'s own keywords: {', '.join(own)}; {listed})")


def resolve_checked(function: Callable[..., Any], protocol: Any, options: Mapping[str, Any]) -> tuple[str, BaseModel]:
    """:func:`labfbo.protocols.resolve` after :func:`check_keywords`."""
    check_keywords(function, protocol, options)
    return resolve(protocol, dict(options))


def configure_checked(function: Callable[..., Any], protocol: Any, options: Mapping[str, Any]) -> Protocol:
    """:func:`labfbo.protocols.configure` after :func:`check_keywords`."""
    check_keywords(function, protocol, options)
    return configure(protocol, dict(options))
