"""Protocols as configured objects: ``labfbo.protocols.Gradient(n_particles=10, privacy=labfbo.DP())``.

A configured protocol is a protocol's name with its validated options model. The same
object is given to every site's :class:`~labfbo.Optimizer` and to the
:class:`~labfbo.Coordinator`; the string-plus-keywords form
(``Optimizer(space, protocol="gradient", n_particles=10)``) is the shorthand for it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from labfbo.exceptions import ConfigurationError


class ConfiguredProtocol:
    """A protocol with its options (``options``: the protocol's options model, validated)."""

    name: ClassVar[str]

    def __init__(self, **options: Any) -> None:
        from labfbo.protocols import get_protocol, parse_options

        self.options: BaseModel = parse_options(get_protocol(self.name), options)

    def __repr__(self) -> str:
        given = self.options.model_dump(exclude_unset=True)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in given.items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfiguredProtocol) and other.name == self.name and other.options == self.options

    def __hash__(self) -> int:
        return hash((self.name, self.options.model_dump_json()))


def as_keywords(protocol: "str | ConfiguredProtocol", options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Either form as the shorthand: the name and the options given (for code that forwards keywords)."""
    if not isinstance(protocol, ConfiguredProtocol):
        return protocol, options
    if options:
        raise ConfigurationError(f"the options of {protocol!r} are set on the object; do not repeat them as "
                                 f"keywords ({', '.join(sorted(options))})")
    return protocol.name, {k: getattr(protocol.options, k) for k in protocol.options.model_fields_set}


def resolve(protocol: "str | ConfiguredProtocol", options: dict[str, Any]) -> tuple[str, BaseModel]:
    """The protocol's name and options from either form (an object, or a name plus keywords)."""
    from labfbo.protocols import get_protocol, parse_options

    if isinstance(protocol, ConfiguredProtocol):
        as_keywords(protocol, options)  # refuses options given twice
        return protocol.name, protocol.options
    if not isinstance(protocol, str):
        raise ConfigurationError(f"protocol must be a name or a configured protocol such as "
                                 f"labfbo.protocols.Gradient(...), got {type(protocol).__name__}")
    return protocol, parse_options(get_protocol(protocol), options)


class Independent(ConfiguredProtocol):
    """Single-site BO: the local GP, no coordinator (:doc:`protocols/independent`)."""

    name = "independent"


class Gradient(ConfiguredProtocol):
    """PACD-BO: a meta-learned GP prior from the sites' SVGD score gradients (:class:`GradientOptions`)."""

    name = "gradient"


class Distribution(ConfiguredProtocol):
    """GUIDE-FBO: the sites' beliefs about the optimum's location guide each local GP."""

    name = "distribution"


class Consensus(ConfiguredProtocol):
    """PMCBO / CBOC: a consensus of proposed points as an expert prior (ordered spaces)."""

    name = "consensus"


class Surface(ConfiguredProtocol):
    """A shared response surface from the sites' ridge statistics as each local GP's prior mean."""

    name = "surface"


class Pooled(ConfiguredProtocol):
    """Reference, not private: a multi-task GP on every site's raw data."""

    name = "pooled"


class Centralized(ConfiguredProtocol):
    """Reference, not private: PACOH meta-learning on every site's raw data."""

    name = "centralized"
