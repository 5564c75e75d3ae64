"""labfbo: federated ask/tell Bayesian optimization for lab automation.

No raw measurement leaves its site: a :class:`Coordinator` exchanges only model
information between the sites' :class:`Optimizer` objects.
"""

import warnings as _warnings

from labfbo.exceptions import (ConfigurationError, ConstraintError, FederationError, JournalError, LabFBOError,
                               ProtocolError, RoundError, SearchSpaceError, TrialError,
                               ValidationError)
from labfbo.constraints import Forbidden, LinearConstraint, NonlinearConstraint
from labfbo.space import Categorical, Discrete, Integer, Real, SearchSpace
from labfbo.objectives import Objective, Outcome
from labfbo.trial import Observation, Trial
from labfbo.optimizer import Optimizer
from labfbo.coordinator import Coordinator
from labfbo.problems import FederatedProblem
from labfbo.simulation import SimulationResult, simulate
from labfbo.protocols import available_protocols
from labfbo.privacy import DP
from labfbo.privacy.budget import PrivacyFloor
from labfbo import priors

# A Cholesky that needed jitter is routine in BO (near-duplicate points, a long campaign);
# GPyTorch handles it and warns each time, which floods a lab's console with nothing to
# act on. Only that notice is silenced; every other warning still reaches the user.
_warnings.filterwarnings("ignore", message=r"A not p\.d\., added jitter")

from labfbo.version import __version__  # noqa: E402,F401 - the package's version

__all__ = [
    "Categorical", "ConfigurationError", "ConstraintError", "Coordinator", "DP", "Discrete", "FederatedProblem", "PrivacyFloor",
    "FederationError", "Forbidden", "Integer", "JournalError", "LabFBOError", "LinearConstraint",
    "NonlinearConstraint", "Objective", "Observation", "Outcome", "Optimizer", "ProtocolError", "Real",
    "RoundError", "SearchSpace", "SearchSpaceError", "SimulationResult", "Trial", "TrialError",
    "ValidationError", "available_protocols", "priors", "simulate",
]
