"""labfbo: federated ask/tell Bayesian optimization for lab automation.

No raw measurement leaves its site: a :class:`Coordinator` exchanges only model
information between the sites' :class:`Optimizer` objects.
"""

import warnings as _warnings

from labfbo.apps.simulation import SimulationResult, simulate
from labfbo.coordinator import Coordinator
from labfbo.core import moved as _moved
from labfbo.core.exceptions import (
    ConfigurationError,
    ConstraintError,
    FederationError,
    JournalError,
    LabFBOError,
    ProtocolError,
    RoundError,
    SearchSpaceError,
    TrialError,
    ValidationError,
)
from labfbo.core.objectives import Objective, Outcome
from labfbo.core.trial import Observation, Trial
from labfbo.models import priors
from labfbo.optimizer import Optimizer
from labfbo.privacy import DP
from labfbo.privacy.budget import PrivacyFloor
from labfbo.problems import FederatedProblem
from labfbo.protocols import available_protocols
from labfbo.space.constraints import Forbidden, LinearConstraint, NonlinearConstraint
from labfbo.space.search import Categorical, Discrete, Integer, Real, SearchSpace
from labfbo.version import __version__ as __version__  # the package's version

_moved.install()  # the module paths of earlier releases stay importable

# A Cholesky that needed jitter is routine in BO (near-duplicate points, a long campaign);
# GPyTorch handles it and warns each time, which floods a lab's console with nothing to
# act on. Only that notice is silenced; every other warning still reaches the user.
_warnings.filterwarnings("ignore", message=r"A not p\.d\., added jitter")

__all__ = [
    "Categorical",
    "ConfigurationError",
    "ConstraintError",
    "Coordinator",
    "DP",
    "Discrete",
    "FederatedProblem",
    "PrivacyFloor",
    "FederationError",
    "Forbidden",
    "Integer",
    "JournalError",
    "LabFBOError",
    "LinearConstraint",
    "NonlinearConstraint",
    "Objective",
    "Observation",
    "Outcome",
    "Optimizer",
    "ProtocolError",
    "Real",
    "RoundError",
    "SearchSpace",
    "SearchSpaceError",
    "SimulationResult",
    "Trial",
    "TrialError",
    "ValidationError",
    "available_protocols",
    "priors",
    "simulate",
]
