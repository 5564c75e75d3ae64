"""What a site's campaign shows beyond the ask/tell loop: its history as a table and its
privacy budget's state (read from its state; nothing here changes an experiment)."""

from __future__ import annotations

import csv
import json
from typing import Any

from labfbo.core.objectives import OutcomeSpec
from labfbo.core.records import Withheld
from labfbo.core.release import Release
from labfbo.privacy.budget import Budget
from labfbo.site.state import SiteState
from labfbo.space.search import SearchSpace

_BOOK_KEEPING = ("trial_id", "source", "state", "value", "sem", "reason")


def _param_columns(params: dict[str, Any]) -> dict[str, Any]:
    """Params as columns; a name that clashes with a bookkeeping column gets ``params_``."""
    return {(f"params_{k}" if k in _BOOK_KEEPING else k): v for k, v in params.items()}


def history_rows(space: SearchSpace, outcomes: OutcomeSpec | None, state: SiteState) -> list[dict[str, Any]]:
    """One row per historical observation and per trial (any state), params flattened."""
    rows: list[dict[str, Any]] = []
    names = outcomes.names if outcomes is not None else []

    taken = set(space.names) | set(_BOOK_KEEPING)

    def columns(means: dict[str, float] | None) -> dict[str, Any]:  # a column per named outcome
        return {(f"outcome_{n}" if n in taken else n): None if means is None else means.get(n) for n in names}

    for o in state.historical:
        rows.append({"trial_id": None, "source": "historical", "state": "complete", **_param_columns(o.params),
                     "value": o.value, "sem": o.sem, **columns(o.outcomes), "reason": None})
    for t in state.trials.values():
        means = None if t.outcomes is None else {k: v[0] for k, v in t.outcomes.items()}
        rows.append({"trial_id": t.id, "source": t.source, "state": t.state, **_param_columns(t.params),
                     "value": t.value, "sem": t.sem, **columns(means), "reason": t.reason})
    return rows


def write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    fields = ["trial_id", "source", "state"]
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()})




def budget_summary(budget: Budget | None, releases: list[Release], withheld: list[Withheld]) -> dict[str, Any] | None:
    """The state of a ``DP(epsilon=...)`` budget (None without one), with the ``unit`` it protects; see
    :meth:`labfbo.Optimizer.privacy_budget`."""
    if budget is None:
        return None
    spent = budget.spent(releases)
    return {"epsilon": budget.epsilon, "delta": budget.dp.delta, "unit": budget.dp.unit,
            "noise_multiplier": budget.dp.sigma,
            "effective_noise_multiplier": budget.weakest,
            "planned_releases": budget.planned, "releases": len(releases), "spent": spent,
            "remaining": max(budget.epsilon - spent, 0.0), "exhausted": bool(withheld),
            "exhausted_at_round": withheld[0].round if withheld else None, "withheld": len(withheld)}
