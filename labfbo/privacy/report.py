"""A site's privacy report: every release of data-derived information, its mechanism and guarantee.

The report is a fold over the site's journaled :class:`~labfbo.core.release.Release`
records — what each protocol declared for each message it sent — so it covers every
process the site ever ran in and knows nothing of any protocol. The cumulative
(epsilon, delta) is the PLD accountant's over the private releases so far; it is infinite
as soon as one release carried no DP noise (such a release has no finite guarantee).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from labfbo.core.release import Release
from labfbo.privacy.dp import composed_epsilon


def delta_of(releases: Sequence[Release]) -> float | None:
    """The delta at which the site's private releases are accounted (None: none is private)."""
    return next((r.delta for r in releases if r.private), None)


def cumulative_epsilon(releases: Sequence[Release]) -> float:
    """Epsilon after all ``releases`` (0 for none; infinite once one is not private)."""
    if any(not r.private for r in releases):
        return math.inf
    delta = delta_of(releases)
    return 0.0 if delta is None else composed_epsilon(Counter(r.event for r in releases), delta)


def report(releases: Sequence[Release]) -> list[dict[str, Any]]:
    """One row per release: round, message, step, rows, mechanism and its parameters, its l2
    sensitivity (of the whole release), the unit protected ("site" or "experiment") and the
    neighbouring relation, whether secure aggregation
    protected it, and the cumulative (epsilon, delta).

    ``epsilon`` is the cumulative epsilon at the end of the release's round (so an upper bound
    for the round's earlier releases): one accountant call per round, not per release — a
    30-round `gradient` campaign has over a thousand releases, ~25 ms of PLD each.
    """
    delta = delta_of(releases)
    rows: list[dict[str, Any]] = []
    used: Counter = Counter()
    at_round_end: dict[int, Counter] = {}  # round -> private releases up to its last release
    exposed = False
    for rel in releases:
        exposed = exposed or not rel.private
        if rel.private:
            used[rel.event] += 1
        at_round_end[rel.round] = Counter(used)
        row = rel.model_dump(exclude={"delta", "reported", "streams"})  # not what was said: a sealed vote stays sealed
        row["unit"] = rel.unit  # what is protected, on every row (the record leaves the default unit out)
        row["_exposed"] = exposed
        rows.append(row)
    epsilons = {t: (0.0 if delta is None else composed_epsilon(c, delta)) for t, c in at_round_end.items()}
    for row in rows:
        row["epsilon"] = math.inf if row.pop("_exposed") else epsilons[row["round"]]
        row["delta"] = delta
    return rows
