"""A site's campaign report: one self-contained HTML page and its plots, from the journal alone.

``labfbo report site.journal -o report.html`` or ``opt.report("report.html")``: progress
(every measurement, the best so far, failures, the initial design; the Pareto front with
several objectives), what the site's model believes now (predicted best setting, the
improvement left), which parameters matter (Sobol importance, partial dependence), what
left the site — every statement taken from the journal's facts: which messages, whether
they were the measurements themselves, which carried DP noise and the cumulative ε at its δ
(:mod:`labfbo.report.disclosure`) — and, for a federated site, the guidance it received.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labfbo.report.build import Report
    from labfbo.report.campaign import Campaign
    from labfbo.space.search import SearchSpace

__all__ = ["Campaign", "Report", "write_report"]


def __getattr__(name: str) -> Any:  # matplotlib and the model load only when a report is made
    if name == "Campaign":
        from labfbo.report.campaign import Campaign

        return Campaign
    if name == "Report":
        from labfbo.report.build import Report

        return Report
    raise AttributeError(f"module 'labfbo.report' has no attribute {name!r}")


def write_report(source: Any, path: str | os.PathLike[str] = "report.html", *, space: "SearchSpace | None" = None,
                 objective_label: str | None = None, fork: bool = False) -> "Report":
    """Write the campaign report of ``source`` — a journal's path, or an :class:`~labfbo.Optimizer`
    — to ``path`` (HTML, plots embedded; PNGs in ``<stem>_plots/``). ``objective_label``: how to
    name the objective on axes, e.g. ``"yield (%)"`` (default: its outcome name). ``fork``: fit the
    model in a forked process while this one draws (two cores; only from a single-threaded
    process, as ``labfbo report`` is)."""
    from labfbo.report.build import build
    from labfbo.report.campaign import Campaign

    if isinstance(source, (str, os.PathLike)):
        campaign = Campaign.from_journal(source, space=space)
    else:  # an Optimizer: its journal's records, as written
        campaign = Campaign.from_records(source.journal_records(), space=space or source.space,
                                         where=f"site {source.site!r}")
    return build(campaign, path, objective_label=objective_label, fork=fork)
