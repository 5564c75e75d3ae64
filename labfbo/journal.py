"""Append-only, durable storage of a site's history: one JSON record per line.

Every record has ``"v"`` (schema version) and ``"op"``. The first record is the header
(the study's space, objective, protocol, seed, site). Then, in order, one record per
event: ``hist`` (a batch of historical observations), ``ask`` (a batch of trials),
``enqueue``, ``tell``, ``fail``, ``note`` (JSON metadata on a pending trial, such as an
instrument run's handle), ``join``. A record is written, flushed and ``fsync``-ed
before the call that produced it returns, so a crash loses at most the call in progress.
Replaying the records in order rebuilds the optimizer exactly (its random streams are
keyed by counters that replay restores). A torn final line — the trace of a crash while
writing — is dropped on open (and cut from the file); any other unreadable line is an
error, never silently skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

from labfbo.exceptions import JournalError

JOURNAL_VERSION = 1


class MemoryJournal:
    """The journal of an optimizer without ``storage=``: same interface, in memory."""

    path: Path | None = None

    def __init__(self) -> None:
        self._records: list[dict[str, Any]] = []

    def append(self, record: dict[str, Any]) -> None:
        self._records.append({"v": JOURNAL_VERSION, **record})

    def records(self) -> Iterator[dict[str, Any]]:
        yield from list(self._records)

    def close(self) -> None:
        pass


class FileJournal(MemoryJournal):
    """A JSON-lines journal on disk; each append is fsync-ed before it returns."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        if self.path.exists():
            self._records = self._read()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab")
        try:  # one live optimizer per journal: a second writer would corrupt the history
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._fh.close()
            raise JournalError(f"{self.path} is in use by another live Optimizer (close it first)") from None
        if self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n"):
            self._fh.write(b"\n")  # a complete last record whose newline was lost

    def _read(self) -> list[dict[str, Any]]:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        records: list[dict[str, Any]] = []
        good_bytes = 0
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if not line.strip():
                good_bytes += len(line) + (0 if last else 1)
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or "op" not in rec:
                    raise ValueError("not a journal record")
                if not last:
                    good_bytes += len(line) + 1
            except ValueError as exc:
                if last or all(not rest.strip() for rest in lines[i + 1:]):
                    warnings.warn(f"{self.path}: dropping a torn last record (crash during a write)",
                                  stacklevel=3)
                    with open(self.path, "r+b") as fh:
                        fh.truncate(good_bytes)
                        fh.flush()
                        os.fsync(fh.fileno())
                    break
                raise JournalError(f"{self.path}:{i + 1}: unreadable journal record ({exc})") from None
            if int(rec.get("v", 0)) > JOURNAL_VERSION:
                raise JournalError(f"{self.path}: record version {rec.get('v')} is newer than "
                                   f"this labfbo ({JOURNAL_VERSION})")
            records.append(rec)
        return records

    def append(self, record: dict[str, Any]) -> None:
        rec = {"v": JOURNAL_VERSION, **record}
        line = json.dumps(rec, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._records.append(rec)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def write_snapshot(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> None:
    """Write ``records`` as a new journal atomically (temp file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":"), allow_nan=False).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
