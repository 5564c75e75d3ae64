"""`CampaignLoop`: the closed lab loop — ask, run on the instrument, tell — that survives a crash.

Every trial's way through the instrument is journaled on the trial itself
(``trial.metadata["dispatch"]``, an ``Optimizer.annotate`` record) *before* the step it
describes happens:

1. ``{"state": "submitting"}`` — written before the adapter is called;
2. ``{"state": "submitted", "handle": ...}`` — written once an asynchronous adapter has
   accepted the run (the handle is what ``poll`` needs);
3. then ``tell`` or ``tell_failed``.

A restarted loop reads the pending trials: a *submitted* one is re-polled; a
*submitting* one may or may not have started, so the adapter is asked to find it
(``recover``); if it cannot, the trial is marked failed with the reason — an experiment
is never run twice behind the scientist's back. A pending trial without a dispatch
record was proposed but never sent, and is sent now.

Exceptions from the instrument become failed trials with the exception as the reason;
:class:`~labfbo.adapters.InstrumentBusy` means "try again later".
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from labfbo.adapters import Adapter, AdapterContext, Handle, InstrumentBusy, Measurement
from labfbo.exceptions import ConfigurationError
from labfbo.lab.config import StopRule
from labfbo.optimizer import Optimizer
from labfbo.trial import Observation, Trial

INTERRUPTED = ("interrupted: the site stopped while this run was being started and the instrument "
               "cannot tell whether it ran; not re-run automatically")


@dataclass
class LoopReport:
    """What a (resumed) campaign did: counts are over this site's whole journal unless noted."""

    stopped: str
    experiments: int
    completed: int
    failed: int
    recovered: int = 0  # runs re-attached after a restart (this invocation)
    abandoned: int = 0  # runs marked failed because their state was unknown after a restart (this invocation)
    best: Observation | None = None
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def _failure_reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class CampaignLoop:
    """Runs ``opt``'s campaign on ``adapter`` until the budget is spent or a stop rule fires.

    Args:
        opt: the site's optimizer (with ``storage=``, so the loop can be resumed).
        adapter: the instrument.
        budget: BO experiments after the initial design; the campaign runs
            ``max(n_init - historical, 0) + budget`` experiments in all, failed ones included.
        max_in_flight: runs in progress at once (asynchronous adapters only).
        stop: early-stopping rules.
        poll_interval: seconds between polls (default: the adapter's).
        ask_timeout: passed to ``opt.ask(timeout=...)``.
        on_progress: called after every finished run with the report so far.
    """

    def __init__(self, opt: Optimizer, adapter: Adapter, budget: int, max_in_flight: int = 1,
                 stop: StopRule | None = None, poll_interval: float | None = None, ask_timeout: float | None = None,
                 on_progress: Callable[[LoopReport], None] | None = None) -> None:
        self.opt, self.adapter = opt, adapter
        n_historical = sum(o.source == "historical" for o in opt.observations)
        self.total = max(opt.n_init - n_historical, 0) + int(budget)
        self.slots = max_in_flight if adapter.asynchronous else 1
        self.stop = stop or StopRule()
        self.poll_interval = poll_interval if poll_interval is not None else adapter.poll_interval
        self.ask_timeout = ask_timeout
        self.on_progress = on_progress
        self._in_flight: dict[int, Handle] = {}
        self._unsent: dict[int, tuple[Trial, float]] = {}  # proposed, not yet accepted: (trial, retry time)
        self._streak = 0  # consecutive failures
        self._since_best = 0  # completed runs since the best improved
        self._interrupted = threading.Event()
        self._started = time.monotonic()
        self.report = LoopReport(stopped="", experiments=self.total, completed=0, failed=0)

    # -- bookkeeping ---------------------------------------------------------------------
    def counts(self) -> tuple[int, int]:
        """(completed, failed) trials of this site (historical observations excluded)."""
        completed = sum(o.trial_id is not None for o in self.opt.observations)
        return completed, len(self.opt.trials) - len(self.opt.pending) - completed

    @property
    def in_flight(self) -> int:
        """Runs started on the instrument and not yet finished."""
        return len(self._in_flight)

    def _done(self) -> int:
        return sum(self.counts())

    def _refresh(self) -> None:
        r = self.report
        r.completed, r.failed = self.counts()
        r.best, r.seconds = self.opt.best, time.monotonic() - self._started

    def _stop_reason(self) -> str:
        if self._interrupted.is_set():
            return "interrupted"
        if self._done() + len(self._in_flight) + len(self._unsent) >= self.total:
            return "budget"
        rule, best = self.stop, self.opt.best
        if rule.target is not None and best is not None:
            if (best.value <= rule.target) if self.opt.objective == "minimize" else (best.value >= rule.target):
                return "target"
        if rule.patience is not None and self._since_best >= rule.patience:
            return "patience"
        if rule.max_consecutive_failures is not None and self._streak >= rule.max_consecutive_failures:
            return "failures"
        if rule.max_hours is not None and time.monotonic() - self._started >= 3600 * rule.max_hours:
            return "max_hours"
        return ""

    # -- one trial's way through the instrument --------------------------------------------
    def _dispatch(self, trial: Trial) -> None:
        self.opt.annotate(trial, dispatch={"state": "submitting", "adapter": self.adapter.name, "at": time.time()})
        if not self.adapter.asynchronous:
            try:
                result: Any = self.adapter.run(trial)
            except InstrumentBusy as exc:  # it did not start: try again later
                self._later(trial, exc)
                return
            except Exception as exc:  # noqa: BLE001 — an instrument error is a failed trial, not a crash
                result = Measurement.failure(_failure_reason(exc))
            self._finish(trial.id, result)
            return
        try:
            handle = self.adapter.submit(trial)
        except InstrumentBusy as exc:
            self._later(trial, exc)
            return
        except Exception as exc:  # noqa: BLE001
            self._finish(trial.id, Measurement.failure(_failure_reason(exc)))
            return
        self._submitted(trial, handle)

    def _later(self, trial: Trial, exc: BaseException) -> None:
        warnings.warn(f"trial {trial.id}: {exc}; retrying in {self.poll_interval:g} s", stacklevel=3)
        self._unsent[trial.id] = (trial, time.monotonic() + self.poll_interval)

    def _submitted(self, trial: Trial, handle: Handle) -> None:
        self.opt.annotate(trial, dispatch={"state": "submitted", "adapter": self.adapter.name, "handle": handle,
                                           "at": time.time()})
        self._in_flight[trial.id] = handle

    def _finish(self, trial_id: int, result: Any) -> None:
        self._in_flight.pop(trial_id, None)
        try:
            m = Measurement.coerce(result)
        except Exception as exc:  # noqa: BLE001 — e.g. NaN from the instrument
            m = Measurement.failure(f"unusable measurement {result!r}: {exc}")
        meta = {"instrument": m.metadata} if m.metadata else None
        if m.failed:
            self.opt.tell_failed(trial_id, m.reason, metadata=meta)
            self._streak += 1
            self.report.failures.append(f"trial {trial_id}: {m.reason}")
        else:
            self.opt.tell(trial_id, m.value if m.sem is None else (m.value, m.sem), metadata=meta)
            self._streak = 0
            best = self.opt.best
            self._since_best = 0 if best is not None and best.trial_id == trial_id else self._since_best + 1
        self._refresh()
        if self.on_progress is not None:
            self.on_progress(self.report)

    def _poll(self) -> bool:
        """Poll every run in flight; True when one finished."""
        finished = False
        for trial_id, handle in list(self._in_flight.items()):
            try:
                result = self.adapter.poll(handle)
            except InstrumentBusy:
                continue
            except Exception as exc:  # noqa: BLE001
                result = Measurement.failure(_failure_reason(exc))
            if result is not None:
                self._finish(trial_id, result)
                finished = True
        return finished

    def _recover(self) -> None:
        """Pick up the pending trials a previous (crashed) run of this campaign left."""
        can_poll = type(self.adapter).poll is not Adapter.poll
        elsewhere = sorted({d["adapter"] for t in self.opt.pending if (d := t.metadata.get("dispatch"))
                            and d.get("adapter") != self.adapter.name})
        if elsewhere:  # refuse before changing anything: those runs belong to another instrument
            raise ConfigurationError(f"the journal has runs in flight on adapter {', '.join(elsewhere)}; "
                                     f"resume with that adapter, not {self.adapter.name!r}")
        for trial in self.opt.pending:
            dispatch = trial.metadata.get("dispatch")
            if dispatch is None:
                self._unsent[trial.id] = (trial, 0.0)
            elif dispatch["state"] == "submitted" and can_poll:
                self._in_flight[trial.id] = dispatch["handle"]
                self.report.recovered += 1
            else:
                try:
                    handle = self.adapter.recover(trial) if can_poll else None
                except Exception as exc:  # noqa: BLE001
                    warnings.warn(f"trial {trial.id}: recovery failed ({exc})", stacklevel=2)
                    handle = None
                if handle is not None:
                    self._submitted(trial, handle)
                    self.report.recovered += 1
                else:
                    self._finish(trial.id, Measurement.failure(INTERRUPTED))
                    self.report.abandoned += 1

    # -- the loop ---------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Stop at the next step; runs in flight stay journaled and are re-polled on restart."""
        self._interrupted.set()

    def run(self) -> LoopReport:
        self.adapter.prepare(AdapterContext(site=self.opt.site, space=self.opt.space, objective=self.opt.objective))
        self._recover()
        self._refresh()
        while True:
            reason = self._stop_reason()
            if reason == "interrupted":
                break
            sending = reason in ("", "budget")  # after target/patience/failures: nothing new goes out
            due = [t for t, when in self._unsent.values() if when <= time.monotonic()]
            if sending and due and len(self._in_flight) < self.slots:
                self._dispatch(self._unsent.pop(due[0].id)[0])
                continue
            free = min(self.slots - len(self._in_flight) - len(self._unsent),
                       self.total - self._done() - len(self._in_flight) - len(self._unsent))
            if not reason and free > 0:
                for trial in self.opt.ask(n=free, timeout=self.ask_timeout):
                    self._unsent[trial.id] = (trial, 0.0)
                continue
            if not self._in_flight and not (sending and self._unsent):
                break
            if not self._poll():
                self._interrupted.wait(self.poll_interval)
        self.report.stopped = reason or "budget"
        self._refresh()
        return self.report


def handle_signals(loop: CampaignLoop) -> Callable[[], None]:
    """Make SIGINT / SIGTERM interrupt ``loop`` cleanly; returns a function restoring the old handlers.

    Off the main thread (where Python cannot install handlers) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def interrupt(signum: int, frame: Any) -> None:
        # the first signal stops at the next step; a second one (say, while ask() waits for
        # the federation) stops at once — the journal already holds everything
        loop.interrupt()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print("labfbo: stopping after the current step (runs in flight stay journaled); "
              "signal again to stop now", file=sys.stderr, flush=True)

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    for s in old:
        signal.signal(s, interrupt)
    return restore
