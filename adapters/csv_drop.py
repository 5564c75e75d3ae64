"""``csv``: a file drop between labfbo and the people (or software) who run the experiments.

labfbo appends each trial to a **queue** file; the operator or the instrument software
appends each result to a **results** file, and labfbo picks it up::

    queue.csv                                    results.csv
    trial_id,campaign,temperature,solvent        trial_id,value,sem,failed,reason
    7,3f9a0c12b4e1,185.2,ethanol                 7,0.412,,,
    8,3f9a0c12b4e1,201.0,water                   8,,,1,pump blocked

* ``trial_id`` and ``value`` are required columns of the results file; ``sem``,
  ``failed`` (1/true/yes) and ``reason`` are optional. Other columns become metadata.
  With named outcomes (``objective:`` / ``outcome_constraints:`` in ``site.yaml``) the
  results file has a column per outcome instead of ``value`` (e.g. ``yield,impurity``),
  and optionally ``<outcome>_sem``.
* Tolerant of partial writes: a last line without its newline is not read yet (the
  writer is still at it), and a row that does not parse is reported once and skipped
  until a corrected row is appended — the trial stays in flight. A file that cannot be
  read or written at the moment (locked, being replaced) is retried later.
* Never double-counts: a trial takes the first result row with its id that parses;
  later rows with the same id are ignored (with a warning), as are rows of trials
  labfbo did not queue.
* One campaign per queue: the ``campaign`` column holds the campaign's id, and a queue
  file with another campaign's trials is refused, so an old result is never taken for a
  new trial of the same number.
* Submitting is idempotent: a trial already in the queue is not queued twice, and after
  a crash a queued trial is re-attached (``recover``), never re-queued.
* Spreadsheet-friendly: a UTF-8 byte-order mark, CRLF line ends, ``;`` as the separator,
  column names in any case, and extra fields are accepted.
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from pathlib import Path
from typing import Any

from labfbo.adapters import Adapter, AdapterContext, Handle, InstrumentBusy, Measurement
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.trial import Trial

_TRUE = {"1", "true", "yes", "y", "failed"}
_RESERVED = ("trial_id", "campaign")


def _dialect(text: str) -> str:
    """``;`` for a file whose header uses it (a European-locale spreadsheet), else ``,``."""
    header = text.split("\n", 1)[0]
    return ";" if header.count(";") > header.count(",") else ","


def complete_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV file whose lines are complete (a last line without newline is skipped).

    Column names are matched case-insensitively and without surrounding spaces; fields
    beyond the header are ignored. A file being replaced (e.g. saved by a spreadsheet) is
    an :class:`InstrumentBusy`: read it again later.
    """
    try:
        raw = path.read_bytes() if path.exists() else b""
    except OSError as exc:
        raise InstrumentBusy(f"cannot read {path} ({exc})") from exc
    cut = raw.rfind(b"\n")
    text = raw[:cut + 1].decode("utf-8-sig", errors="replace") if cut >= 0 else ""
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=_dialect(text), restkey="_extra")
    return [{(k or "").strip().lower(): v.strip() for k, v in row.items() if isinstance(v, str) and k != "_extra"}
            for row in reader]


class CsvDropAdapter(Adapter):
    """Args: ``queue`` (file labfbo writes), ``results`` (file the lab writes), ``poll_interval`` (s)."""

    name = "csv"

    def __init__(self, queue: str = "queue.csv", results: str = "results.csv", poll_interval: float = 5.0) -> None:
        self.queue, self.results = Path(queue), Path(results)
        if self.queue.resolve() == self.results.resolve():
            raise ConfigurationError("csv adapter: queue and results must be different files")
        self.poll_interval = float(poll_interval)
        self._names: list[str] = []
        self._outcomes: list[str] = []  # named outcomes: a results column each (lower case, as read)
        self._declared: list[str] = []
        self._campaign = ""
        self._warned: set[tuple[str, str]] = set()

    def prepare(self, context: AdapterContext) -> None:
        self._names, self._campaign = list(context.space.names), context.campaign
        self._declared = list(context.outcomes)  # the names tell expects
        self._outcomes = [n.strip().lower() for n in context.outcomes]
        if {n.lower() for n in self._names} & set(_RESERVED):
            raise ConfigurationError(f"csv adapter: a parameter may not be called {' or '.join(_RESERVED)}")
        if not (self.queue.exists() and self.queue.stat().st_size):
            return
        text = self.queue.read_text(encoding="utf-8-sig")
        header = [h.strip() for h in next(csv.reader(io.StringIO(text), delimiter=_dialect(text)), [])]
        if header != [*_RESERVED, *self._names]:
            raise ConfigurationError(f"{self.queue} has columns {header}, this campaign writes "
                                     f"{[*_RESERVED, *self._names]}: use another queue file")
        others = {row.get("campaign") for row in complete_rows(self.queue)} - {self._campaign}
        if others:
            raise ConfigurationError(
                f"{self.queue} holds trials of another campaign ({', '.join(sorted(others))}; "
                f"this one is {self._campaign!r}): give this campaign new queue and results files, "
                "so an old result is never taken for a new trial"
            )

    def _queued(self) -> set[str]:
        return {row.get("trial_id", "") for row in complete_rows(self.queue)}

    def submit(self, trial: Trial) -> Handle:
        if str(trial.id) not in self._queued():
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            try:
                self.queue.parent.mkdir(parents=True, exist_ok=True)
                size = self.queue.stat().st_size if self.queue.exists() else 0
                if size == 0:
                    writer.writerow([*_RESERVED, *self._names])
                elif not self.queue.read_bytes().endswith(b"\n"):
                    buf.write("\n")  # someone saved the file without a final newline: keep rows apart
                writer.writerow([trial.id, self._campaign, *(trial.params[n] for n in self._names)])
                with open(self.queue, "a", encoding="utf-8") as fh:
                    fh.write(buf.getvalue())
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:  # e.g. the file is open and locked in a spreadsheet: nothing was written
                raise InstrumentBusy(f"cannot append to {self.queue} ({exc})") from exc
        return {"trial_id": trial.id}

    def recover(self, trial: Trial) -> Handle | None:
        return {"trial_id": trial.id} if str(trial.id) in self._queued() else None

    def _warn_once(self, key: tuple[str, str], message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def poll(self, handle: Handle) -> Measurement | None:
        want = str(handle["trial_id"])
        rows = complete_rows(self.results)
        if rows and "trial_id" not in rows[0]:
            self._warn_once(("header", ""), f"{self.results} has no trial_id column (columns: {sorted(rows[0])}); "
                                            "expected trial_id,value[,sem,failed,reason]")
            return None
        matches = [(i, row) for i, row in enumerate(rows) if row.get("trial_id") == want]
        if len(matches) > 1:
            self._warn_once(("dup", want), f"{self.results}: {len(matches)} result rows for trial {want}; "
                                           "using the first that parses, ignoring the rest")
        for line, row in matches:  # the first row that parses counts; later ones never add to it
            try:
                return self._measurement(row)
            except ValueError as exc:
                self._warn_once(("bad", f"{want}/{line}"), f"{self.results}, data row {line + 1} (trial {want}): "
                                                           f"{exc}; waiting for a corrected row")
        return None

    def _measurement(self, row: dict[str, str]) -> Measurement:
        names = self._outcomes
        own = {"trial_id", "value", "sem", "failed", "reason", *names, *(f"{n}_sem" for n in names)}
        extra: dict[str, Any] = {k: v for k, v in row.items() if k not in own and v != ""}
        if row.get("failed", "").lower() in _TRUE:
            return Measurement.failure(row.get("reason") or "marked failed in the results file", **extra)
        if names:  # named outcomes: a column each, and optionally <name>_sem
            missing = [n for n in names if not row.get(n)]
            if missing:
                raise ValueError(f"no value for outcome(s) {missing} and not marked failed")
            by_name = dict(zip(names, self._declared))
            return Measurement.of({by_name[n]: (float(row[n]), float(row[f"{n}_sem"])) if row.get(f"{n}_sem")
                                   else float(row[n]) for n in names}, **extra)
        if not row.get("value"):
            raise ValueError("no value and not marked failed")
        sem = float(row["sem"]) if row.get("sem") else None
        return Measurement.ok(float(row["value"]), sem, **extra)
