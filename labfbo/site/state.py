"""`SiteState`: a site's state as a fold over its typed journal records.

Everything an :class:`~labfbo.Optimizer` knows about its campaign — historical and told
observations, trials and their states, the BO round, the federated clock, the coordinator's
join reply, the releases its protocol declared — is ``SiteState.apply`` applied to the
journal's records in order (:mod:`labfbo.core.records`). A live call and a replay go through the
same ``apply``, so a restarted site is the one that crashed. ``apply`` does no I/O and
knows nothing of any protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labfbo.core.exceptions import JournalError
from labfbo.core.messages import JoinReply
from labfbo.core.records import (
    Ask,
    Enqueue,
    Fail,
    GuidanceReceived,
    Header,
    Historical,
    Join,
    LegacyRelease,
    MessageEntry,
    Note,
    Released,
    Retract,
    Tell,
    Traffic,
    TransferEstimate,
    Withheld,
)
from labfbo.core.release import Release
from labfbo.core.trial import Observation, TrialRecord, parse_value
from labfbo.site.clock import SiteClock
from labfbo.space.search import SearchSpace


@dataclass
class SiteState:
    """The replayed state of one site (``federated``: its BO rounds follow the coordinator's clock)."""

    space: SearchSpace
    federated: bool
    trials: dict[int, TrialRecord] = field(default_factory=dict)
    historical: list[Observation] = field(default_factory=list)
    hist_x: list[np.ndarray] = field(default_factory=list)  # unit-cube points of ``historical``
    hist_at: list[int] = field(default_factory=list)  # journal position of each historical observation
    next_id: int = 0
    design_used: int = 0
    round: int = 0  # the BO round of the next proposal (federated: the clock's next round)
    clock: SiteClock = field(default_factory=SiteClock)
    position: int = 0  # journal position of the last applied record (cuts of the site's data)
    releases: list[Release | LegacyRelease] = field(default_factory=list)
    join_reply: JoinReply | None = None
    traffic: list[MessageEntry] = field(default_factory=list)  # every message journaled, in order
    guidance: list[GuidanceReceived] = field(default_factory=list)  # each round's guidance received
    withheld: list[Withheld] = field(default_factory=list)  # answers held back by the privacy budget
    # (round, estimate) per ask that made one
    transfer: list[tuple[int, TransferEstimate]] = field(default_factory=list)

    def last_transfer(self) -> TransferEstimate | None:
        """The transfer estimate of the last model proposal, if that proposal made one."""
        rounds = [t.round for t in self.trials.values() if t.source.startswith("model") and t.round is not None]
        if not rounds or not self.transfer:
            return None
        r, estimate = self.transfer[-1]
        return estimate if r == max(rounds) else None

    def apply(self, rec: Any, replay: bool = False) -> None:
        """Apply one typed record. ``replay``: it comes from storage, so check what a live call
        checked before journaling it (a record that cannot be accounted for is a JournalError)."""
        self.position += 1
        if isinstance(rec, Historical):
            self._historical(rec, replay)
        elif isinstance(rec, (Ask, Enqueue)):
            self._trials(rec, replay)
        elif isinstance(rec, (Tell, Fail, Note)):
            self._result(rec, replay)
        elif isinstance(rec, Retract):
            self._retract(rec)
        elif isinstance(rec, Released):
            self.releases.append(rec.release())
        elif isinstance(rec, LegacyRelease):
            self.releases.append(rec)
        elif isinstance(rec, Traffic):
            self.traffic.extend(rec.messages)
        elif isinstance(rec, GuidanceReceived):
            self.guidance.append(rec)
        elif isinstance(rec, Withheld):
            self.withheld.append(rec)
        elif isinstance(rec, Join):
            self.join_reply = JoinReply.model_validate(rec.reply)
        elif isinstance(rec, Header):
            raise JournalError("a second header (another journal appended to this one?)")
        else:
            raise JournalError(f"unknown journal record {type(rec).__name__}")

    def _historical(self, rec: Historical, replay: bool) -> None:
        if not len(rec.params) == len(rec.values) == len(rec.sems):
            raise JournalError("a 'hist' record whose params, values and sems differ in length")
        if rec.outcomes is not None and len(rec.outcomes) != len(rec.params):
            raise JournalError("a 'hist' record whose outcomes and params differ in length")
        for i, (params, value, sem) in enumerate(zip(rec.params, rec.values, rec.sems)):
            if replay:
                value, sem = parse_value(value if sem is None else (value, sem))
            clean = self.space.validate_params(params, strict=False)[0]
            means = None if rec.outcomes is None else {k: v[0] for k, v in rec.outcomes[i].items()}
            sems = None if rec.outcomes is None else {k: v[1] for k, v in rec.outcomes[i].items()}
            self.historical.append(Observation(params=params, value=value, sem=sem, outcomes=means,
                                               outcome_sems=sems))
            self.hist_x.append(self.space.encode([clean])[0])
            self.hist_at.append(self.position)

    def _trials(self, rec: Ask | Enqueue, replay: bool) -> None:
        for t in rec.trials:
            if replay and t.id in self.trials:
                raise JournalError(f"trial id {t.id!r} appears twice (another journal appended to this one?)")
            if len(t.x) != self.space.dim:
                raise JournalError(f"trial {t.id!r}: its point has {len(t.x)} coordinates, not the space's "
                                   f"{self.space.dim} (a journal of another space?)")
            self.trials[t.id] = TrialRecord(id=t.id, params=dict(t.params), x=np.asarray(t.x), source=t.source,
                                            round=t.round, metadata=dict(t.metadata), asked_at=self.position)
            self.next_id = max(self.next_id, t.id + 1)
            self.design_used += t.source == "design"
        if isinstance(rec, Enqueue):
            return
        if rec.transfer is not None and rec.trials:
            self.transfer.append((int(rec.trials[-1].round), rec.transfer))
        if self.federated:
            self.clock.replay(rec.model_dump(exclude_unset=True))
            self.round = self.clock.next_round
        else:
            self.round += rec.model_round

    def _result(self, rec: Tell | Fail | Note, replay: bool) -> None:
        tr = self.trials.get(rec.id)
        if tr is None:
            raise JournalError(f"a {rec.op!r} for trial {rec.id!r}, which was never asked")
        if replay and tr.state != "pending":
            raise JournalError(f"a {rec.op!r} for trial {rec.id}, which is already {tr.state}")
        if isinstance(rec, Tell) and replay:
            parse_value(rec.value if rec.sem is None else (rec.value, rec.sem))
        tr.metadata.update(rec.metadata)
        if isinstance(rec, Tell):
            tr.state, tr.value, tr.sem, tr.finished_at = "complete", rec.value, rec.sem, self.position
            tr.outcomes = None if rec.outcomes is None else {k: (v[0], v[1]) for k, v in rec.outcomes.items()}
        elif isinstance(rec, Fail):
            tr.state, tr.reason, tr.finished_at = "failed", rec.reason, self.position

    def _retract(self, rec: Retract) -> None:
        tr = self.trials.get(rec.id)
        if tr is None or tr.state != "complete":
            raise JournalError(f"a 'retract' for trial {rec.id!r}, which is "
                               f"{'never asked' if tr is None else tr.state}: only a told result can be retracted")
        tr.state, tr.reason, tr.retracted_at = "retracted", rec.reason, self.position

    # -- derived views ---------------------------------------------------------------------
    def results(self) -> int:
        """Results the site has: historical, told and failed (what makes a new round worth asking)."""
        return len(self.historical) + sum(t.state != "pending" for t in self.trials.values())

    def observations(self) -> tuple[Observation, ...]:
        """Completed records (historical and told), in order; failed and pending excluded."""
        told = [Observation(params=dict(t.params), value=t.value, sem=t.sem, trial_id=t.id, source=t.source,
                            outcomes=None if t.outcomes is None else {k: v[0] for k, v in t.outcomes.items()},
                            outcome_sems=None if t.outcomes is None else {k: v[1] for k, v in t.outcomes.items()})
                for t in self.trials.values() if t.state == "complete"]
        hist = [o.model_copy(update={"params": dict(o.params), "outcomes": o.outcomes and dict(o.outcomes),
                                     "outcome_sems": o.outcome_sems and dict(o.outcome_sems)})
                for o in self.historical]  # no aliasing
        return tuple(hist) + tuple(told)
