"""Parameters, the search space and its constraints, the space diff, designs and chemistry.

``from labfbo.space import SearchSpace`` keeps working: the public names are re-exported.
"""

from labfbo.space.constraints import Forbidden, LinearConstraint, NonlinearConstraint
from labfbo.space.search import Categorical, Choice, Discrete, Integer, Param, Real, SearchSpace

__all__ = ["Categorical", "Choice", "Discrete", "Forbidden", "Integer", "LinearConstraint", "NonlinearConstraint",
           "Param", "Real", "SearchSpace"]
