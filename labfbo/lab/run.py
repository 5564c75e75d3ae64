"""`run_site`: what ``labfbo site run`` does — build the adapter and the optimizer, run the loop."""

from __future__ import annotations

import secrets
from typing import Any

from labfbo.adapters import Adapter, AdapterContext, load_adapter
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.journal import read_header
from labfbo.core.objectives import OutcomeSpec
from labfbo.core.seeding import campaign_id
from labfbo.lab.config import SiteConfig
from labfbo.lab.loop import CampaignLoop, LoopReport, handle_signals
from labfbo.optimizer import Optimizer
from labfbo.protocols import get_protocol
from labfbo.transport import require_coordinator


def _journal_secret(path: str) -> int:
    """The site secret of an existing journal (its header), or a new one for a new journal."""
    header = read_header(path)
    if header is None or header.secret is None:
        return secrets.randbits(63)  # no journal yet (a broken one is the Optimizer's to report)
    return header.secret


def campaign_context(config: SiteConfig, adapter: Adapter, secret: int) -> AdapterContext:
    """The campaign as the adapter sees it. The search space (and, for a simulated instrument,
    the objective's direction) come from the config, else from the adapter (``adapter.space``);
    the campaign id is a hash of the site and its journal's secret."""
    space = config.space if config.space is not None else getattr(adapter, "space", None)
    if space is None:
        raise ConfigurationError("site config has no space and the adapter defines none: add `space:`")
    objective = config.objective or getattr(getattr(adapter, "problem", None), "objective", None) or "minimize"
    spec = OutcomeSpec.build(objective, config.outcome_constraints)
    return AdapterContext(site=config.site, space=space, objective=objective if spec is None else spec.direction,
                          outcomes=[] if spec is None else spec.names, campaign=campaign_id(config.site, secret))


def _check_coordinator(config: SiteConfig) -> None:
    """Before the adapter prepares anything: the check the Optimizer makes, with the config's words."""
    require_coordinator(config.protocol, get_protocol(config.protocol).federated, config.coordinator,
                        how="give the site config a `coordinator:`: the consortium's https:// URL, or mpi",
                        alone="protocol: independent")


def open_optimizer(config: SiteConfig, adapter: Adapter, secret: int | None = None) -> Optimizer:
    """The site's Optimizer, resumed from its journal if it exists."""
    _check_coordinator(config)
    secret = _journal_secret(config.storage_path()) if secret is None else secret
    ctx = campaign_context(config, adapter, secret)
    objective = config.objective if ctx.outcomes else ctx.objective
    return Optimizer(ctx.space, objective=objective, outcome_constraints=config.outcome_constraints or None,
                     protocol=config.protocol, coordinator=config.connector(),
                     site=config.site, seed=config.seed, storage=config.storage_path(), n_init=config.n_init,
                     horizon=config.horizon or config.budget or None, token=config.token(), secret=secret,
                     verify=config.tls_verify(), **config.options)


def run_site(config: SiteConfig, adapter_name: str | None = None, progress: bool = True,
             **adapter_overrides: Any) -> LoopReport:
    """Run (or resume) the site's closed-loop campaign; returns its report.

    ``adapter_name`` (``--adapter``) overrides ``config.adapter.name``; the adapter is
    built from ``config.adapter.config`` updated with ``adapter_overrides``.
    """
    name = adapter_name or config.adapter.name
    if not name:
        raise ConfigurationError("no adapter: give --adapter NAME or `adapter: {name: ...}` in the site config")
    adapter = load_adapter(name, **{**config.adapter.config, **adapter_overrides})
    try:
        secret = _journal_secret(config.storage_path())
        _check_coordinator(config)
        adapter.prepare(campaign_context(config, adapter, secret))  # before a journal exists: a refusal leaves nothing
        opt = open_optimizer(config, adapter, secret)
        try:
            loop = CampaignLoop(opt, adapter, config.budget, config.max_in_flight, config.stop,
                                config.poll_interval, config.ask_timeout)
            bar = _progress_bar(loop, opt.site) if progress else None
            restore = handle_signals(loop)
            try:
                return loop.run(prepare=False)
            finally:
                restore()
                if bar is not None:
                    bar.close()
        finally:
            opt.close()
    finally:
        adapter.close()


def _progress_bar(loop: CampaignLoop, site: str) -> Any:
    from tqdm.auto import tqdm

    completed, failed = loop.counts()
    bar = tqdm(total=loop.total, initial=min(completed + failed, loop.total), desc=site, unit="run")

    def update(report: LoopReport) -> None:
        bar.n = min(report.completed + report.failed, bar.total)
        best = "-" if report.best is None else f"{report.best.value:.6g}"
        bar.set_postfix(best=best, failed=report.failed, in_flight=loop.in_flight, refresh=False)
        bar.refresh()

    loop.on_progress = update
    return bar


def format_report(report: LoopReport, config: SiteConfig) -> str:
    """The summary printed at the end of ``labfbo site run``."""
    best = report.best
    rows = [("site", config.site), ("protocol", config.protocol), ("stopped", report.stopped),
            ("experiments", f"{report.completed + report.failed} of {report.experiments} "
                            f"({report.completed} measured, {report.failed} failed)"),
            ("re-attached after restart", str(report.recovered)),
            ("abandoned after restart", str(report.abandoned)),
            ("best value", "-" if best is None else f"{best.value:.6g}"),
            ("best params", "-" if best is None else str(best.params)),
            ("journal", config.storage_path()), ("wall time", f"{report.seconds:.1f} s")]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if report.failures:
        lines += ["", "failed runs (this invocation):"] + [f"  {f}" for f in report.failures[-10:]]
    return "\n".join(lines)
