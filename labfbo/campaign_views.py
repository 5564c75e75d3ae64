"""What a site's campaign shows beyond the ask/tell loop: its history as a table, the
messages that crossed its boundary, its privacy accounting, its report and its snapshot.

A mixin of :class:`labfbo.Optimizer` (these read the site's journal and state; none
proposes or changes an experiment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from labfbo.journal import write_snapshot
from labfbo.messages import Message
from labfbo.privacy.release import Release
from labfbo.privacy.report import cumulative_epsilon
from labfbo.privacy.report import report as privacy_report
from labfbo.records import Traffic
from labfbo.seeding import campaign_id
from labfbo.site import history_rows, write_csv

if TYPE_CHECKING:
    from labfbo.optimizer import Optimizer
    from labfbo.site import SiteLedger
    from labfbo.site_state import SiteState
    from labfbo.space import SearchSpace


class CampaignViews:
    """The Optimizer's exports and accounting (see the module docstring)."""

    site: str
    space: "SearchSpace"
    options: Any
    ledger: "SiteLedger"
    _state: "SiteState"
    _secret: int
    _logic: Any
    _budget: Any  # labfbo.privacy.budget.Budget | None
    _lock: Any
    _journal: Any
    _unwritten: Any

    @property
    def campaign_id(self) -> str:
        """A stable id of this site's campaign (its journal): a hash of the site and its private secret."""
        return campaign_id(self.site, self._secret)

    def sent_messages(self) -> list[Message]:
        """Exactly what this site has sent across its boundary, in order."""
        return list(self.ledger.sent)

    def received_messages(self) -> list[Message]:
        """Everything this site received from the coordinator (requests and guidance), in order."""
        return list(self.ledger.received)

    def __enter__(self) -> "Optimizer":
        return self  # type: ignore[return-value]

    def __exit__(self, *exc: Any) -> None:
        self.close()  # type: ignore[attr-defined]

    def releases(self) -> list[Release]:
        """Every release of data-derived information this site made, as its protocol declared it
        (journaled before the message left, so across restarts)."""
        return self._journaled_releases(self._logic)

    def _journaled_releases(self, logic: Any) -> list[Release]:
        """The journal's releases, version-1 records declared by ``logic`` (the site's protocol logic)."""
        return [r for r in (rel if isinstance(rel, Release) else logic.legacy_release(rel.model_dump())
                            for rel in self._state.releases) if r is not None]

    def epsilon(self) -> float | None:
        """Cumulative epsilon of this site's releases at the configured delta (None without DP;
        infinite once a release carried no DP noise)."""
        return None if getattr(self.options, "privacy", None) is None else cumulative_epsilon(self.releases())

    def privacy_report(self) -> list[dict[str, Any]]:
        """One row per release (:meth:`releases`): round, message, mechanism and parameters,
        sensitivity, neighbouring relation, secure aggregation, and the cumulative
        (epsilon, delta) — infinite once a release carried no DP noise."""
        return privacy_report(self.releases())

    def privacy_budget(self) -> dict[str, Any] | None:
        """The campaign's privacy budget (None without ``DP(epsilon=...)``): ``epsilon`` and
        ``delta`` (the budget), the ``noise_multiplier`` calibrated to it (and the plan's smallest
        ``effective_noise_multiplier``: a release's noise std over its sensitivity), ``planned_releases``,
        ``releases`` made, ``spent`` and ``remaining`` epsilon, and once a release was withheld
        ``exhausted`` with the round it happened (``exhausted_at_round``) and how many messages
        were withheld (one count per round and message kind)."""
        budget = self._budget
        if budget is None:
            return None
        releases, held = self.releases(), self._state.withheld
        spent = budget.spent(releases)
        return {"epsilon": budget.epsilon, "delta": budget.dp.delta, "noise_multiplier": budget.dp.sigma,
                "effective_noise_multiplier": budget.weakest,
                "planned_releases": budget.planned, "releases": len(releases), "spent": spent,
                "remaining": max(budget.epsilon - spent, 0.0), "exhausted": bool(held),
                "exhausted_at_round": held[0].round if held else None, "withheld": len(held)}

    def to_dataframe(self) -> Any:
        """The history as a pandas DataFrame (needs ``labfbo[dataframe]``)."""
        import pandas as pd

        return pd.DataFrame(history_rows(self))

    def to_csv(self, path: str) -> None:
        """Export the history (historical, told, failed and pending trials) as CSV."""
        write_csv(path, history_rows(self))

    def journal_records(self) -> list[dict[str, Any]]:
        """The journal's records as written (JSON objects), header first."""
        with self._lock:
            if self._unwritten is not None:
                return []
            traffic = self.ledger.take()
            if traffic:  # the messages not journaled yet
                self._commit(Traffic(messages=traffic))
            return list(self._journal.records())

    def report(self, path: str = "report.html", objective_label: str | None = None) -> Any:
        """Write this site's campaign report (:func:`labfbo.report.write_report`)."""
        from labfbo.report import write_report

        return write_report(self, path, objective_label=objective_label)

    def save(self, path: str) -> None:
        """Write a snapshot (a complete journal) that :meth:`load` restores."""
        write_snapshot(path, list(self._journal.records()))

    @classmethod
    def load(cls, path: str, coordinator: Any = None, storage: str | None = None, **options: Any) -> "Optimizer":
        """Restore an optimizer from :meth:`save` (``storage`` journals what follows). Pass ``space=``
        (the same space) to bring back its nonlinear constraints: their code is not in the snapshot."""
        from labfbo.snapshot import load_snapshot

        return load_snapshot(cls, path, coordinator, storage, options)

