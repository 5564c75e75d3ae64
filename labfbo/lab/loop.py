"""`CampaignLoop`: the closed lab loop — ask, run on the instrument, tell — that survives a crash.

Every trial's way through the instrument is journaled on the trial itself
(``trial.metadata["dispatch"]``, an ``Optimizer.annotate`` record) *before* the step it
describes happens:

1. ``{"state": "submitting"}`` — written before the adapter is called;
2. ``{"state": "submitted", "handle": ...}`` — written once an asynchronous adapter has
   accepted the run (the handle is what ``poll`` needs), or ``{"state": "deferred"}``
   when the instrument answered :class:`~labfbo.adapters.InstrumentBusy` (not started);
3. then ``tell`` or ``tell_failed``.

A restarted loop reads the pending trials: a *submitted* one is re-polled; a
*submitting* one may or may not have started, so the adapter is asked to find it
(``recover``; an ``InstrumentBusy`` answer is retried, never guessed); if it cannot, the
trial is marked failed with the reason — an experiment is never run twice behind the
scientist's back. A pending trial without a dispatch record, or *deferred*, never
reached the instrument and is sent now. The stop rules' counters (failures in a row,
runs since the best, time since the first dispatch) are rebuilt from the journal.

Exceptions from the instrument become failed trials with the exception as the reason;
:class:`~labfbo.adapters.InstrumentBusy` means "try again later".
"""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from labfbo.adapters import Adapter, AdapterContext, Handle, InstrumentBusy, Measurement
from labfbo.core.exceptions import ConfigurationError, ValidationError
from labfbo.core.trial import Observation, Trial, metadata_record
from labfbo.lab.config import StopRule
from labfbo.optimizer import Optimizer

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
        self._recovering: dict[int, tuple[Trial, float]] = {}  # to look for on the instrument: (trial, retry time)
        self._attempts: collections.Counter[int] = collections.Counter()  # "busy" answers per trial (back-off)
        self._interrupted = False
        self._clock = time.monotonic()
        self._streak, self._since_best, self._first_dispatch = self._history()
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

    def _history(self) -> tuple[int, int, float]:
        """The stop rules' state rebuilt from the journal, so restarts do not reset them:
        (trailing failures, completed runs since the best, wall time of the first dispatch)."""
        complete = {o.trial_id for o in self.opt.observations if o.trial_id is not None}
        pending = {t.id for t in self.opt.pending}
        best = self.opt.best
        streak = since_best = 0
        for t in sorted(self.opt.trials, key=lambda t: t.id):
            if t.id in pending:
                continue
            if t.id in complete:
                streak = 0
                since_best = 0 if best is not None and t.id == best.trial_id else since_best + 1
            else:
                streak += 1
        times = [d["at"] for t in self.opt.trials if (d := t.metadata.get("dispatch")) and "at" in d]
        return streak, since_best, min(times, default=time.time())

    def _launched(self) -> int:
        """Runs that count against the budget: finished, in flight, or being looked for after a restart."""
        return sum(self.counts()) + len(self._in_flight) + len(self._recovering)

    def _refresh(self) -> None:
        r = self.report
        r.completed, r.failed = self.counts()
        r.best, r.seconds = self.opt.best, time.monotonic() - self._clock

    def _stop_rule(self) -> str:
        """Why no new run may start ("" if none): an interruption or a stop rule (the budget is apart)."""
        if self._interrupted:
            return "interrupted"
        rule, best = self.stop, self.opt.best
        if rule.target is not None and best is not None:
            if (best.value <= rule.target) if self.opt.objective == "minimize" else (best.value >= rule.target):
                return "target"  # with named outcomes: the first objective's value, as ``best``
        if rule.patience is not None and self._since_best >= rule.patience:
            return "patience"
        if rule.max_consecutive_failures is not None and self._streak >= rule.max_consecutive_failures:
            return "failures"
        if rule.max_hours is not None and time.time() - self._first_dispatch >= 3600 * rule.max_hours:
            return "max_hours"
        return ""

    # -- one trial's way through the instrument --------------------------------------------
    def _note(self, trial: Trial, state: str, **extra: Any) -> None:
        self.opt.annotate(trial, dispatch={"state": state, "adapter": self.adapter.name, "at": time.time(), **extra})

    def _dispatch(self, trial: Trial) -> None:
        self._note(trial, "submitting")  # before the instrument hears of it: a crash now is detectable
        try:
            if self.adapter.asynchronous:
                self._submitted(trial, self.adapter.submit(trial))
                return
            result: Any = self.adapter.run(trial)
        except InstrumentBusy as exc:  # by contract the run did not start: try again later
            self._later(trial, exc)
            return
        except Exception as exc:  # noqa: BLE001 — an instrument error is a failed trial, not a crash
            result = Measurement.failure(_failure_reason(exc))
        self._finish(trial.id, result)

    def _backoff(self, trial_id: int) -> float:
        self._attempts[trial_id] += 1
        return time.monotonic() + min(max(self.poll_interval, 0.05) * 2 ** (self._attempts[trial_id] - 1), 60.0)

    def _later(self, trial: Trial, exc: BaseException) -> None:
        when = self._backoff(trial.id)
        if self._attempts[trial.id] == 1:
            warnings.warn(f"trial {trial.id}: {exc}; retrying with back-off", stacklevel=3)
        self._note(trial, "deferred", reason=str(exc))  # not started: a restart sends it again
        self._unsent[trial.id] = (trial, when)

    def _submitted(self, trial: Trial, handle: Handle) -> None:
        self._note(trial, "submitted", handle=handle)
        self._in_flight[trial.id] = handle
        if self.on_progress is not None:
            self.on_progress(self.report)

    def _finish(self, trial_id: int, result: Any) -> None:
        self._in_flight.pop(trial_id, None)
        self._recovering.pop(trial_id, None)
        try:
            m = Measurement.coerce(result)
        except Exception as exc:  # noqa: BLE001 — e.g. NaN from the instrument
            m = Measurement.failure(f"unusable measurement {result!r}: {exc}")
        meta = {"instrument": m.metadata} if m.metadata else None
        try:
            metadata_record(meta)
        except ValidationError as exc:  # never lose a measurement over its metadata
            warnings.warn(f"trial {trial_id}: instrument metadata dropped ({exc})", stacklevel=2)
            meta = None
        if m.failed:
            self.opt.tell_failed(trial_id, m.reason, metadata=meta)
            self._streak += 1
            self.report.failures.append(f"trial {trial_id}: {m.reason}")
        else:
            try:
                self.opt.tell(trial_id, m.told(), metadata=meta)
            except ValidationError as exc:  # e.g. an outcome missing: the run failed, the campaign goes on
                self.opt.tell_failed(trial_id, f"unusable measurement: {exc}", metadata=meta)
                self._streak += 1
                self.report.failures.append(f"trial {trial_id}: {exc}")
                self._refresh()
                return
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

    def _look_for(self, trial: Trial) -> None:
        """After a crash mid-submission: re-attach the run if the instrument has it, else fail the trial."""
        try:
            handle = self.adapter.recover(trial) if type(self.adapter).poll is not Adapter.poll else None
        except InstrumentBusy:  # cannot tell yet: ask again later, never guess
            self._recovering[trial.id] = (trial, self._backoff(trial.id))
            return
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"trial {trial.id}: recovery failed ({_failure_reason(exc)})", stacklevel=2)
            handle = None
        self._recovering.pop(trial.id, None)
        if handle is not None:
            self._submitted(trial, handle)
            self.report.recovered += 1
        else:
            self._finish(trial.id, Measurement.failure(INTERRUPTED))
            self.report.abandoned += 1

    def _recover(self) -> None:
        """Pick up the pending trials a previous (crashed) run of this campaign left."""
        elsewhere = sorted({d["adapter"] for t in self.opt.pending if (d := t.metadata.get("dispatch"))
                            and d.get("adapter") != self.adapter.name})
        if elsewhere:  # refuse before changing anything: those runs belong to another instrument
            raise ConfigurationError(f"the journal has runs in flight on adapter {', '.join(elsewhere)}; "
                                     f"resume with that adapter, not {self.adapter.name!r}")
        for trial in self.opt.pending:
            dispatch = trial.metadata.get("dispatch") or {"state": "proposed"}
            if dispatch["state"] in ("proposed", "deferred"):  # never reached the instrument
                self._unsent[trial.id] = (trial, 0.0)
            elif dispatch["state"] == "submitted" and type(self.adapter).poll is not Adapter.poll:
                self._in_flight[trial.id] = dispatch["handle"]
                self.report.recovered += 1
            else:
                self._look_for(trial)

    # -- the loop ---------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Stop at the next step; runs in flight stay journaled and are re-polled on restart."""
        self._interrupted = True

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._interrupted and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def run(self, prepare: bool = True) -> LoopReport:
        """Run until the budget is spent, a stop rule fires or :meth:`interrupt`; ``prepare=False``
        when the caller has already called ``adapter.prepare``."""
        if prepare:
            self.adapter.prepare(AdapterContext(site=self.opt.site, space=self.opt.space, objective=self.opt.objective,
                                                outcomes=[] if self.opt.outcomes is None else self.opt.outcomes.names,
                                                campaign=self.opt.campaign_id))
        self._recover()
        self._refresh()
        while True:
            rule = self._stop_rule()
            if rule == "interrupted":
                break
            now = time.monotonic()
            looking = [t for t, when in self._recovering.values() if when <= now]
            if looking:
                self._look_for(looking[0])
                continue
            room = not rule and self._launched() < self.total and len(self._in_flight) < self.slots
            due = [t for t, when in self._unsent.values() if when <= now]
            if room and due:
                self._dispatch(self._unsent.pop(due[0].id)[0])
                continue
            if room and not self._unsent:
                n = min(self.slots - len(self._in_flight), self.total - self._launched())
                for trial in self.opt.ask(n=n, timeout=self.ask_timeout):
                    self._unsent[trial.id] = (trial, 0.0)
                continue
            if not self._in_flight and not self._recovering and (rule or self._launched() >= self.total):
                break  # trials proposed but not sent stay pending: a later run sends them
            if not self._poll():  # wait for the next due retry, or the next poll; never spin
                waits = [when - now for _, when in self._recovering.values()]
                if room:
                    waits += [when - now for _, when in self._unsent.values()]
                if self._in_flight:
                    waits.append(self.poll_interval)
                self._sleep(max(min(waits, default=self.poll_interval), 0.01))
        self.report.stopped = rule or "budget"
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
