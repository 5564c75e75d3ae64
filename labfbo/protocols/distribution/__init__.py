"""``distribution``: GUIDE-FBO's shared belief over where the optimum lies.

``protocol`` (site logic and aggregation), ``messages``.
"""

from labfbo.protocols.distribution.protocol import Distribution

__all__ = ["Distribution"]
