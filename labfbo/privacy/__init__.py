"""Differential privacy of what a site sends: the Gaussian mechanism and its accounting."""

from labfbo.privacy.dp import DP, PLD_DISCRETIZATION, LedgerEntry, PrivacyLedger, clip_rows, gaussian_epsilon, privatize

__all__ = ["DP", "PLD_DISCRETIZATION", "LedgerEntry", "PrivacyLedger", "clip_rows",
           "gaussian_epsilon", "privatize"]
