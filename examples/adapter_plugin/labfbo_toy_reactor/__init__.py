"""An example labfbo instrument adapter package (see ``reactor.py``)."""

from labfbo_toy_reactor.reactor import ToyReactorAdapter

__all__ = ["ToyReactorAdapter"]
