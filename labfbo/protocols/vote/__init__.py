"""``vote``: the labs' votes for promising regions as a prior (our own protocol).

``protocol`` (site logic and aggregation), ``messages``, ``sealed`` (sealed votes).
"""

from labfbo.protocols.vote.protocol import Vote

__all__ = ["Vote"]
