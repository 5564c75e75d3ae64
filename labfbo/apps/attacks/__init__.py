"""The attacks ``labfbo privacy audit`` runs against simulated campaigns.

* :mod:`labfbo.apps.attacks.gradient` — the coordinator's gradient-inversion attack on a
  ``gradient`` site (PACD-BO §V), with and without DP, cached and resumable;
* :mod:`labfbo.apps.attacks.votes` — what the coordinator and a peer learn of a ``vote``
  site's optimum from its votes;
* :mod:`labfbo.apps.attacks.surface` — the combinations a ``surface`` lab ran and its
  standardized results, reconstructed by the coordinator, a peer, or a coordinator that sees
  only the cohort's secure sum; :mod:`labfbo.apps.attacks.surface_audit` runs it on
  Buchwald–Hartwig labs (``labfbo privacy audit --protocol surface``).
"""
