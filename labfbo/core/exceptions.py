"""Every error labfbo raises on purpose derives from :class:`LabFBOError`.

Bad input is refused *before* anything changes: an exception from the public API
means the optimizer, its journal and its observations are exactly as they were.
"""

from __future__ import annotations


class LabFBOError(Exception):
    """Base class of all labfbo errors."""


class ValidationError(LabFBOError, ValueError):
    """A value, a parameter dict or a configuration is invalid (the message names it)."""


class SearchSpaceError(ValidationError):
    """A search-space definition is invalid, or params do not fit the space."""


class ConstraintError(ValidationError):
    """Params break a constraint of the space (a linear, forbidden or nonlinear constraint)."""


class TrialError(LabFBOError, KeyError):
    """A trial id is unknown, or the trial is in the wrong state for the call."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text
        return str(self.args[0]) if self.args else ""


class ConfigurationError(LabFBOError, ValueError):
    """An Optimizer / Coordinator / simulate configuration cannot work."""


class ProtocolError(LabFBOError):
    """A protocol received a message it cannot handle, or refused a search space."""


class Inadmissible(ProtocolError):
    """A site's contribution lies outside what its protocol can receive (a wrong shape for the
    round, a value out of the protocol's range): the coordinator leaves it out of the round, which
    goes on without that site, and names the site and the reason."""


class FederationError(LabFBOError):
    """A site was refused by the coordinator (space or protocol mismatch, unknown site)."""


class RoundError(LabFBOError):
    """A coordination round could not complete (quorum not reached)."""


class JournalError(LabFBOError):
    """A journal file is unreadable, from another schema, or belongs to another study."""
