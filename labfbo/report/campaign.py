"""`Campaign`: a site's campaign as its journal tells it — experiments, model data, traffic.

A report is built from the journal alone, after the fact: the header names the space,
the objective and the protocol; the records replay into a :class:`~labfbo.site.state.SiteState`
through :func:`labfbo.site.store.replay` (the same fold a resumed optimizer runs). Nothing
here writes to the journal or takes its lock, so a report can be made while the campaign runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

from labfbo.core.exceptions import JournalError, LabFBOError
from labfbo.core.journal import read_records
from labfbo.core.objectives import OutcomeSpec
from labfbo.core.records import Header
from labfbo.protocols.base import SiteData
from labfbo.site.data import build_site_data
from labfbo.site.state import SiteState
from labfbo.site.store import read_header, replay
from labfbo.space.search import SearchSpace

State = Literal["complete", "failed", "pending", "retracted"]


@dataclass(frozen=True)
class Experiment:
    """One row of the campaign, numbered in the order the lab got it (historical ones first)."""

    number: int
    params: dict[str, Any]
    state: State
    source: str  # "historical", "design", "model", "enqueued", ...
    round: int | None
    value: float | None = None  # the (first) objective, in the lab's units
    outcomes: dict[str, float] | None = None
    feasible: bool = True  # meets every outcome constraint (True without any)
    reason: str | None = None  # why it failed, or why its result was retracted

    @property
    def initial(self) -> bool:
        """Part of the initial design (space-filling points before the model leads)."""
        return self.source == "design"


@dataclass
class Campaign:
    """What one site's journal holds, ready for a report."""

    header: Header
    space: SearchSpace
    spec: OutcomeSpec | None
    state: SiteState
    experiments: list[Experiment]
    # its protocol sends the site's observations (a non-private reference); None: a protocol this
    # installation does not have, so what its messages carried cannot be told
    shares_raw_data: bool | None = False

    @classmethod
    def from_journal(cls, path: str | os.PathLike[str], space: SearchSpace | None = None) -> "Campaign":
        """Read the journal at ``path`` without modifying it (a torn last line — a write in
        progress — is left out)."""
        if not os.path.exists(path):
            raise JournalError(f"{path}: no such journal")
        records, _ = read_records(path, repair=False, torn="skip")
        return cls.from_records(records, space=space, where=str(path))

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]], space: SearchSpace | None = None,
                     where: str = "journal") -> "Campaign":
        """The campaign of a journal's records (``space``: the site's own space object, to bring
        back its nonlinear constraints, whose code is not journaled)."""
        header = read_header(records, where)
        if header.space is None:
            if space is None:
                raise JournalError(f"{where}: this journal predates journaled spaces; make its report with "
                                   "labfbo.report.write_report(journal, path, space=<the site's SearchSpace>)")
        else:
            journaled = SearchSpace.model_validate(header.space)
            if space is not None and space.fingerprint() != journaled.fingerprint():
                raise JournalError(f"{where}: the space given differs from the journal's "
                                   f"({journaled.difference(space)})")
            space = space or journaled
        assert space is not None
        spec = None if header.outcomes is None else OutcomeSpec.model_validate(header.outcomes)
        from labfbo.protocols import get_protocol

        try:
            proto = get_protocol(header.protocol)
            federated, shares_raw = proto.federated, bool(proto.shares_raw_data)
        except LabFBOError:  # a protocol this installation does not have
            federated, shares_raw = header.protocol != "independent", None
        state = SiteState(space, federated)
        replay(state, records[1:], lambda i: f"{where}: record {i + 2}")
        return cls(header=header, space=space, spec=spec, state=state, experiments=_experiments(state, spec),
                   shares_raw_data=shares_raw)

    # -- views -----------------------------------------------------------------------------
    @property
    def maximize(self) -> bool:
        return self.header.objective == "maximize"

    @property
    def objective_name(self) -> str:
        """The (first) objective's name: the lab's outcome name, or ``"objective"`` when unnamed."""
        return self.spec.objectives[0].name if self.spec is not None else "objective"

    @property
    def federated(self) -> bool:
        return self.state.federated

    def completed(self) -> list[Experiment]:
        return [e for e in self.experiments if e.state == "complete"]

    def best(self) -> Experiment | None:
        """The best feasible completed experiment (by the first objective)."""
        done = [e for e in self.completed() if e.feasible]
        if not done:
            return None
        sign = 1.0 if self.maximize else -1.0
        return max(done, key=lambda e: sign * float(e.value))  # type: ignore[arg-type]

    def site_data(self) -> SiteData:
        """The site's data in model coordinates (maximized first objective), as its optimizer sees it."""
        st = self.state
        return build_site_data(self.space, 1.0 if self.maximize else -1.0, st.hist_x, st.historical,
                               list(st.trials.values()), st.hist_at)


def _experiments(state: SiteState, spec: OutcomeSpec | None) -> list[Experiment]:
    def feasible(means: dict[str, float] | None) -> bool:
        return spec is None or means is None or spec.feasible(means)

    rows: list[Experiment] = []
    for o in state.historical:
        rows.append(Experiment(number=len(rows) + 1, params=dict(o.params), state="complete", source="historical",
                               round=None, value=o.value, outcomes=o.outcomes, feasible=feasible(o.outcomes)))
    for t in sorted(state.trials.values(), key=lambda t: t.id):
        means = None if t.outcomes is None else {k: float(v[0]) for k, v in t.outcomes.items()}
        rows.append(Experiment(number=len(rows) + 1, params=dict(t.params), state=t.state, source=t.source,
                               round=t.round, value=t.value, outcomes=means,
                               feasible=t.state != "complete" or feasible(means), reason=t.reason))
    return rows


def decode_points(space: SearchSpace, value: Any) -> list[dict[str, Any]] | None:
    """Unit-cube points in a guidance summary (``{"shape": [n, d], "values": ...}``) as the
    lab's parameter settings, or None when they are not points of this space."""
    if not isinstance(value, dict) or "values" not in value:
        return None
    X = np.asarray(value["values"], dtype=np.float64)
    if X.ndim == 1 and X.size == space.dim:
        X = X[None, :]
    if X.ndim != 2 or X.shape[1] != space.dim or not len(X):
        return None
    return space.decode(space.snap(X, restrict=False))
