"""``surface``: the labs' response surface shared through secure sums (our own protocol).

``protocol`` (site logic and aggregation), ``options``, ``messages``, ``aggregate`` (pure
functions over the uploads), ``secure`` (its secure rounds), ``model`` (the surface GP and
its statistics), ``design_tilt``.
"""

from labfbo.protocols.surface.protocol import Surface

__all__ = ["Surface"]
