"""Finding adapters: the ``labfbo.adapters`` entry-point group.

A lab ships its adapter in its own package and registers it in that package's
``pyproject.toml``::

    [project.entry-points."labfbo.adapters"]
    my_reactor = "my_lab.reactor:ReactorAdapter"

After ``pip install`` of that package, ``load_adapter("my_reactor", ...)`` and
``labfbo site run --adapter my_reactor`` find it.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from labfbo.adapters.base import Adapter
from labfbo.core.exceptions import ConfigurationError

ENTRY_POINT_GROUP = "labfbo.adapters"


def discover_adapters() -> dict[str, EntryPoint]:
    """Installed adapters: entry-point name -> ``EntryPoint`` (not yet imported)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_adapter(name: str, **config: Any) -> Adapter:
    """Import the adapter registered as ``name`` and construct it with ``config``.

    Raises :class:`ConfigurationError` naming the problem: no such adapter (with the
    installed names), a plugin that fails to import, a bad configuration keyword, or a
    class that is not a working :class:`Adapter`.
    """
    eps = discover_adapters()
    if name not in eps:
        raise ConfigurationError(f"no adapter {name!r}; installed: {', '.join(sorted(eps)) or 'none'}")
    try:
        cls = eps[name].load()
    except Exception as exc:  # a broken plugin must not look like a labfbo crash
        raise ConfigurationError(f"adapter {name!r} ({eps[name].value}) failed to import: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise ConfigurationError(f"adapter {name!r} ({eps[name].value}) is not a labfbo.adapters.Adapter subclass")
    try:
        adapter = cls(**config)
    except TypeError as exc:
        raise ConfigurationError(f"adapter {name!r}: bad configuration ({exc})") from exc
    if not adapter.implemented:
        raise ConfigurationError(f"adapter {name!r} implements neither run() nor submit() + poll()")
    return adapter
