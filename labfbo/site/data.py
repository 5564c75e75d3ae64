"""A site's local data in model coordinates, and the checks on data a lab adds.

:class:`LocalData` is the site's data as its protocol sees it (historical and completed
observations, their variances, the pending and failed points), cached until the next
journal record; :func:`build_site_data` computes it at any journal position (a round's
answers use the data the site had when it asked for that round).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from labfbo.core.exceptions import LabFBOError, ValidationError
from labfbo.core.objectives import OutcomeSpec
from labfbo.core.trial import Observation, TrialRecord, parse_value
from labfbo.models.gp import tamed
from labfbo.protocols.base import SiteData
from labfbo.site.state import SiteState
from labfbo.space.search import SearchSpace


class LocalData:
    """The site's data of :class:`SiteState` ``state`` (``sign`` makes the objective a maximization).

    :meth:`now` is cached per journal position (a gradient round reads it once per SVGD
    step); its arrays are shared, so callers must not modify them in place.
    """

    def __init__(self, space: SearchSpace, sign: float, state: SiteState, outcomes: OutcomeSpec | None) -> None:
        self.space, self.sign, self.state, self.outcomes = space, sign, state, outcomes
        self._cache: tuple[int, SiteData] | None = None

    def now(self, extra_pending: np.ndarray | None = None) -> SiteData:
        """The data now; ``extra_pending``: points of the batch being proposed, treated as pending."""
        st = self.state
        if self._cache is None or self._cache[0] != st.position:
            self._cache = (st.position, self.upto(None))
        data = self._cache[1]
        if extra_pending is None or not len(extra_pending):
            return data
        return replace(data, pending=np.vstack([data.pending, extra_pending]))

    def upto(self, position: int | None) -> SiteData:
        """The data as of journal position ``position`` (None: now, uncached)."""
        st = self.state
        if position is not None and position >= st.position:
            return self.now()
        return build_site_data(self.space, self.sign, st.hist_x, st.historical, list(st.trials.values()),
                               st.hist_at, position, spec=self.outcomes)

    def for_round(self, data: SiteData, seed: int, round: int) -> SiteData:
        """Several objectives: ``data`` with ``y`` the ParEGO target of BO round ``round``."""
        return round_target(self.outcomes, data, seed, round)


def build_site_data(space: SearchSpace, sign: float, hist_x: list[np.ndarray], historical: list[Observation],
                    trials: list[TrialRecord], hist_at: list[int] | None = None,
                    upto: int | None = None, spec: OutcomeSpec | None = None) -> SiteData:
    """A site's data in model coordinates: historical then completed trials (``sign`` makes every
    objective a maximization), their variances when every one has a standard error, and the
    pending points — as of journal position ``upto`` (None: now; ``hist_at`` gives the
    historical observations' positions)."""
    if upto is not None:
        keep = [p <= upto for p in (hist_at or [0] * len(historical))]
        hist_x = [x for x, k in zip(hist_x, keep) if k]
        historical = [o for o, k in zip(historical, keep) if k]
        trials = [t for t in trials if t.asked_at <= upto]
    states = [t.state_at(upto) for t in trials]
    done = [t for t, s in zip(trials, states) if s == "complete"]
    X = np.array(hist_x + [t.x for t in done]).reshape(-1, space.dim)
    values = [o.value for o in historical] + [t.value for t in done]
    sems = [o.sem for o in historical] + [t.sem for t in done]
    y = tamed(sign * np.asarray(values, dtype=np.float64))  # a finite extreme cannot flatten the rest
    yvar = None if not sems or any(s is None for s in sems) else np.square(np.asarray(sems, dtype=np.float64))
    pending = np.array([t.x for t, s in zip(trials, states) if s == "pending"]).reshape(-1, space.dim)
    failed = np.array([t.x for t, s in zip(trials, states) if s == "failed"]).reshape(-1, space.dim)
    Y = Yvar = None
    if spec is not None:
        rows = [o.outcomes for o in historical] + [{k: v[0] for k, v in (t.outcomes or {}).items()} for t in done]
        Y = spec.outcome_matrix(rows)  # type: ignore[arg-type]
        Y = np.apply_along_axis(tamed, 0, Y) if Y.size else Y
        sem_rows = [o.outcome_sems or {} for o in historical] + [{k: v[1] for k, v in (t.outcomes or {}).items()}
                                                                 for t in done]
        Yvar = spec.variance_matrix(sem_rows)
    return SiteData(space=space, X=X, y=y, yvar=yvar, pending=pending, failed=failed, Y=Y, Yvar=Yvar)


def dedupe(space: SearchSpace, X: np.ndarray, pending: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """Replace proposals that repeat a pending point (or each other) by random points from ``gen``."""
    taken = [p for p in pending]
    for i in range(len(X)):
        for _ in range(100):
            if not any(np.max(np.abs(X[i] - p)) < 1e-9 for p in taken):
                break
            X[i] = space.snap(gen.random((1, space.dim)))[0]
        taken.append(X[i])
    return X


def history_record(space: SearchSpace, params_list: Any, values: Any,
                   spec: OutcomeSpec | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The journal record of historical observations (None if there are none) and the rows
    outside the bounds (kept as given; the model clips them). Anything else invalid raises.
    With ``spec`` each value is a dict of every outcome (the record's value: the first objective)."""
    if isinstance(params_list, dict) or len(params_list) != len(values):
        raise ValidationError("add_observations needs a list of params dicts and a list of values of the same length")
    clean, sems, vals, oob_rows, outcomes = [], [], [], [], []
    for i, (params, value) in enumerate(zip(params_list, values)):
        try:
            c, oob = space.validate_params(params, strict=False)
            if spec is not None:
                outcomes.append(spec.parse(value))
                v, s = outcomes[-1][spec.objectives[0].name]
            else:
                v, s = parse_value(value)
        except LabFBOError as exc:
            raise type(exc)(f"observation {i}: {exc}") from None
        if oob:
            oob_rows.append(f"{i} ({', '.join(oob)})")
        plain = {k: params[k].item() if isinstance(params[k], np.generic) else params[k] for k in oob}
        clean.append({k: plain[k] if k in oob else c[k] for k in space.names})
        vals.append(v)
        sems.append(s)
    record = {"op": "hist", "params": clean, "values": vals, "sems": sems}
    if spec is not None:
        record["outcomes"] = outcomes
    return (record if clean else None), oob_rows


def round_target(outcomes: OutcomeSpec | None, data: SiteData, seed: int, round: int) -> SiteData:
    """Several objectives: ``data`` with ``y`` the ParEGO (Chebyshev) target of BO round ``round``
    (:meth:`labfbo.core.objectives.OutcomeSpec.chebyshev`, weights drawn from ``seed``); else ``data``."""
    if outcomes is None or not outcomes.multi or data.Y is None or not data.n:
        return data
    return replace(data, y=outcomes.chebyshev(data.Y[:, :len(outcomes.objectives)], seed, round), yvar=None)
