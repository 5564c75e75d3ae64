"""``gradient``: PACD-BO's federated meta-learning of a GP prior by shared score gradients.

``protocol`` (site logic and aggregation), ``messages``, ``wire`` (the gradient frames).
"""

from labfbo.protocols.gradient.protocol import Gradient

__all__ = ["Gradient"]
