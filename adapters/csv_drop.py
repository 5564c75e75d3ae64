"""``csv``: a file drop between labfbo and the people (or software) who run the experiments.

labfbo appends each trial to a **queue** file; the operator or the instrument software
appends each result to a **results** file, and labfbo picks it up::

    queue.csv                                    results.csv
    trial_id,temperature,solvent                 trial_id,value,sem,failed,reason
    7,185.2,ethanol                              7,0.412,,,
    8,201.0,water                                8,,,1,pump blocked

* ``trial_id`` and ``value`` are required columns of the results file; ``sem``,
  ``failed`` (1/true/yes) and ``reason`` are optional. Other columns become metadata.
* Tolerant of partial writes: a last line without its newline is not read yet (the
  writer is still at it), and a row that does not parse is reported once and skipped
  until it is corrected — the trial stays in flight.
* Never double-counts: a trial takes the first result row with its id; later rows with
  the same id are ignored (with a warning), as are rows of trials labfbo did not queue.
* Submitting is idempotent: a trial already in the queue is not queued twice, and after
  a crash a queued trial is re-attached (``recover``), never re-queued.
* Excel-friendly: a UTF-8 byte-order mark and CRLF line ends are accepted.
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from pathlib import Path
from typing import Any

from labfbo.adapters import Adapter, AdapterContext, Handle, Measurement
from labfbo.exceptions import ConfigurationError
from labfbo.trial import Trial

_TRUE = {"1", "true", "yes", "y", "failed"}


def complete_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV file whose lines are complete (a last line without newline is skipped)."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    cut = raw.rfind(b"\n")
    text = raw[:cut + 1].decode("utf-8-sig", errors="replace") if cut >= 0 else ""
    return [{(k or "").strip(): (v or "").strip() for k, v in row.items()}
            for row in csv.DictReader(io.StringIO(text, newline=""))]


class CsvDropAdapter(Adapter):
    """Args: ``queue`` (file labfbo writes), ``results`` (file the lab writes), ``poll_interval`` (s)."""

    name = "csv"

    def __init__(self, queue: str = "queue.csv", results: str = "results.csv", poll_interval: float = 5.0) -> None:
        self.queue, self.results = Path(queue), Path(results)
        if self.queue.resolve() == self.results.resolve():
            raise ConfigurationError("csv adapter: queue and results must be different files")
        self.poll_interval = float(poll_interval)
        self._names: list[str] = []
        self._warned: set[tuple[str, str]] = set()

    def prepare(self, context: AdapterContext) -> None:
        self._names = list(context.space.names)
        if "trial_id" in self._names:
            raise ConfigurationError("csv adapter: a parameter may not be called 'trial_id'")
        if self.queue.exists() and self.queue.stat().st_size:
            header = next(csv.reader(io.StringIO(self.queue.read_text(encoding="utf-8-sig"))), [])
            if [h.strip() for h in header] != ["trial_id", *self._names]:
                raise ConfigurationError(f"{self.queue} has columns {header}, this campaign writes "
                                         f"{['trial_id', *self._names]}: use another queue file")

    def _queued(self) -> set[str]:
        return {row.get("trial_id", "") for row in complete_rows(self.queue)}

    def submit(self, trial: Trial) -> Handle:
        if str(trial.id) not in self._queued():
            self.queue.parent.mkdir(parents=True, exist_ok=True)
            new = not self.queue.exists() or self.queue.stat().st_size == 0
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            if new:
                writer.writerow(["trial_id", *self._names])
            writer.writerow([trial.id, *(trial.params[n] for n in self._names)])
            with open(self.queue, "a", encoding="utf-8") as fh:
                fh.write(buf.getvalue())
                fh.flush()
                os.fsync(fh.fileno())
        return {"trial_id": trial.id}

    def recover(self, trial: Trial) -> Handle | None:
        return {"trial_id": trial.id} if str(trial.id) in self._queued() else None

    def _warn_once(self, key: tuple[str, str], message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def poll(self, handle: Handle) -> Measurement | None:
        want = str(handle["trial_id"])
        matches = [(i, row) for i, row in enumerate(complete_rows(self.results)) if row.get("trial_id") == want]
        if not matches:
            return None
        if len(matches) > 1:
            self._warn_once(("dup", want), f"{self.results}: {len(matches)} result rows for trial {want}; "
                                           "using the first, ignoring the rest")
        line, row = matches[0]
        try:
            return self._measurement(row)
        except ValueError as exc:
            self._warn_once(("bad", want), f"{self.results}, data row {line + 1} (trial {want}): {exc}; "
                                           "waiting for a corrected row")
            return None

    @staticmethod
    def _measurement(row: dict[str, str]) -> Measurement:
        extra: dict[str, Any] = {k: v for k, v in row.items()
                                 if k not in ("trial_id", "value", "sem", "failed", "reason") and v != ""}
        if row.get("failed", "").lower() in _TRUE:
            return Measurement.failure(row.get("reason") or "marked failed in the results file", **extra)
        if not row.get("value"):
            raise ValueError("no value and not marked failed")
        sem = float(row["sem"]) if row.get("sem") else None
        return Measurement.ok(float(row["value"]), sem, **extra)
