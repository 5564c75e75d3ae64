"""A site's privacy report: every release of data-derived information, its mechanism and guarantee.

A *release* is a message computed from the site's observations (scores, masked scores, an
optimum belief, a proposed point). The Optimizer journals one record per release before it
leaves the site, so the report covers every process the site ever ran in. The cumulative
(epsilon, delta) is the PLD accountant's over the DP releases so far; it is infinite as
soon as one release carried no DP noise (such a release has no finite guarantee).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from labfbo.privacy.belief_dp import sensitivity as belief_sensitivity
from labfbo.privacy.dp import DP, gaussian_epsilon

NEIGHBOURING = "task level: two datasets of this site differ in every observation"

_MECHANISMS = {
    "score": "Gaussian on K per-particle scores, each clipped to l2 norm C (PACD-BO Eqs. 12-13)",
    "masked_score": "Gaussian on K per-particle scores, each clipped to l2 norm C (PACD-BO Eqs. 12-13)",
    "optimum_belief": "Gaussian on the belief (pi, mu, sd, v) normalized to the unit cube (labfbo.privacy.belief_dp)",
    "surface_stats": "Gaussian on the averaged ridge statistics (G/n, h/n), values clipped to [-C, C] "
                     "(labfbo.models.surface); the count n is released exactly",
}


def release_record(message: Any) -> dict[str, Any]:
    """The journal record of one release (``op: release``)."""
    return {"op": "release", "round": message.round, "steps": 1, "kind": message.kind,
            "step": getattr(message, "step", None), "dp": getattr(message, "dp_noise_multiplier", None) is not None,
            "secure_aggregation": message.kind == "masked_score",
            **({"sensitivity": message.dp_sensitivity} if getattr(message, "dp_sensitivity", None) else {})}


def _mechanism(kind: str, dp: DP, n_particles: int, dim: int, sensitivity: float | None = None) -> dict[str, Any]:
    """The Gaussian mechanism of one release: its description, parameters and l2 sensitivity
    (``sensitivity``: as the release recorded it, for mechanisms whose bound depends on the space)."""
    if kind in ("optimum_belief", "surface_stats"):
        delta_l2 = belief_sensitivity(dim) if sensitivity is None else sensitivity
        return {"mechanism": _MECHANISMS[kind], "noise_multiplier": dp.noise_multiplier, "clip": dp.clip,
                "sensitivity": delta_l2, "noise_std": dp.noise_multiplier * delta_l2,
                "effective_noise_multiplier": dp.noise_multiplier}
    return {"mechanism": _MECHANISMS.get(kind, "Gaussian"), "noise_multiplier": dp.noise_multiplier, "clip": dp.clip,
            "sensitivity": dp.sensitivity * math.sqrt(n_particles), "noise_std": dp.noise_std,
            "effective_noise_multiplier": dp.noise_multiplier / math.sqrt(n_particles)}


def report(releases: Sequence[dict[str, Any]], dp: DP | None, n_particles: int, dim: int) -> list[dict[str, Any]]:
    """One row per release: round, message, mechanism and its parameters, its l2 sensitivity
    (per release, all K rows of a step together), the neighbouring relation, whether secure
    aggregation protected it, and the cumulative (epsilon, delta).

    ``epsilon`` is the cumulative epsilon at the end of the release's round (so an upper bound
    for the round's earlier releases): one accountant call per round, not per release — a
    30-round `gradient` campaign has over a thousand releases, ~25 ms of PLD each.
    ``n_particles`` is K for `gradient` (one SVGD step releases K rows) and 1 otherwise.
    """
    rows, private, exposed = [], 0, False
    round_end: dict[int, int] = {}  # round -> private releases up to its last release
    for rec in releases:
        kind = rec.get("kind", "score")  # records written before kinds were journaled were DP scores
        row: dict[str, Any] = {"round": rec["round"], "message": kind, "step": rec.get("step"),
                               "secure_aggregation": bool(rec.get("secure_aggregation", False)),
                               "neighbouring": NEIGHBOURING}
        if rec.get("dp", True) and dp is not None:
            private += 1
            row.update(_mechanism(kind, dp, n_particles, dim, rec.get("sensitivity")))
        else:
            exposed = True
            row.update(mechanism="none: not differentially private", noise_multiplier=None, clip=None,
                       sensitivity=None, noise_std=None, effective_noise_multiplier=None)
        row["_exposed"] = exposed
        round_end[rec["round"]] = private
        rows.append(row)
    for row in rows:
        if row.pop("_exposed"):
            eps = math.inf
        elif dp is None:
            eps = 0.0
        else:
            eps = gaussian_epsilon(dp.noise_multiplier / math.sqrt(n_particles), round_end[row["round"]], dp.delta)
        row.update(epsilon=eps, delta=None if dp is None else dp.delta)
    return rows
