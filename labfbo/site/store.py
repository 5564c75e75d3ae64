"""`SiteStore`: a site's journal — its backend, its header, its replay, and its snapshots.

The journal is append-only: a header record, then one typed record per change
(:mod:`labfbo.core.records`). :func:`replay` folds records into a :class:`SiteState`; it is
the one place a journal is replayed (a resumed optimizer, a snapshot being loaded, a
report read from a file all go through it). :meth:`SiteStore.commit` journals a record
*before* applying it, so an exception changes nothing and a restarted site is the one
that crashed.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

from labfbo.core.exceptions import JournalError, LabFBOError
from labfbo.core.journal import JournalBackend, check_header, open_journal, read_records, write_snapshot
from labfbo.core.records import Header, Released, Traffic, dump_record, parse_record
from labfbo.site.ledger import SiteLedger
from labfbo.site.state import SiteState

TRAFFIC_BATCH = 256  # messages that may wait before their `traffic` record is written


def replay(state: SiteState, records: Sequence[dict[str, Any]], where: Callable[[int], str]) -> None:
    """Apply journaled records (the header excluded) to ``state``; one that cannot be accounted
    for is a JournalError at ``where(i)`` (its file and line)."""
    for i, rec in enumerate(records):
        typed = parse_record(rec, where(i))
        try:
            state.apply(typed, replay=True)
        except JournalError as exc:
            raise JournalError(f"{where(i)}: {exc}") from None
        except (KeyError, ValueError, TypeError, IndexError, AttributeError, LabFBOError) as exc:
            raise JournalError(f"{where(i)}: {rec.get('op')!r} record does not replay "
                               f"({type(exc).__name__}: {exc})") from None


def read_header(records: Sequence[dict[str, Any]], where: str) -> Header:
    """The header record that opens a journal's ``records``."""
    if not records:
        raise JournalError(f"{where}: the journal is empty (no experiment yet)")
    head = parse_record(records[0], f"{where}: record 1")
    if not isinstance(head, Header):
        raise JournalError(f"{where}: the journal does not start with a header record")
    return head


class SiteStore:
    """The journal of one site, replayed into ``state``.

    Args:
        storage: a path, a journal backend object or None (in memory).
        header: the header this site would write; an existing journal's must match it
            (:func:`labfbo.core.journal.check_header`), and its secret and key material are kept.
        state: the (empty) state the journal is replayed into.
        ledger: the site's message ledger, whose unjournaled entries go into ``traffic`` records.
        secret_given: the ``secret=`` the caller passed (None: none), checked against the journal's.
    """

    def __init__(self, storage: str | os.PathLike[str] | JournalBackend | None, header: Header, state: SiteState,
                 ledger: SiteLedger, secret_given: int | None = None) -> None:
        self.state, self.ledger = state, ledger
        self.lock = threading.RLock()  # the transport's thread journals the site's answers
        self._path = storage if isinstance(storage, (str, os.PathLike)) else None
        self._existed = self._path is not None and os.path.exists(self._path)
        self.backend: JournalBackend = open_journal(storage)
        raw = list(self.backend.records())
        self._was_empty = not raw
        self.header = header
        self._unwritten: Header | None = None  # a new journal's header: written with its first record
        try:
            if raw:
                head = parse_record(raw[0], self.where(0))
                if not isinstance(head, Header):
                    raise JournalError(f"{self.where(0)}: the journal does not start with a header record")
                check_header(head, header)
                if secret_given is not None and head.secret not in (None, secret_given):
                    raise JournalError("secret= differs from the one in the journal")
                self.header = header.model_copy(update={"secret": header.secret if head.secret is None
                                                         else head.secret,
                                                         "key_seed": header.key_seed if head.key_seed is None
                                                         else head.key_seed})
            else:
                self._unwritten = header  # a refused join leaves a new journal empty
            replay(state, raw[1:], lambda i: self.where(i + 1))
        except BaseException:
            self.discard()
            raise

    def where(self, index: int) -> str:
        """Where record ``index`` is (file and line, for a file journal)."""
        where = getattr(self.backend, "where", None)  # an optional method of a user's backend
        return where(index) if where is not None else f"journal record {index + 1}"

    @property
    def written(self) -> bool:
        """Whether the journal holds anything (its header is written with the first record)."""
        return self._unwritten is None

    def commit(self, record: Any) -> None:
        """Journal a typed record, then apply it (an exception before the append changes nothing);
        the messages that crossed the site's boundary since the last record go first."""
        with self.lock:
            self._write_header()
            # a DP release per step (gradient): its messages wait for a later record (one fsync, not two)
            busy = isinstance(record, Released) and len(self.ledger.unjournaled) < TRAFFIC_BATCH
            traffic = [] if busy else self.ledger.take()
            if traffic:
                self.backend.append(dump_record(Traffic(messages=traffic)))
                self.state.apply(Traffic(messages=traffic))
            self.backend.append(dump_record(record))
            self.state.apply(record)

    def flush_traffic(self, at_least: int = 1) -> None:
        """Journal the messages not journaled yet, when there are ``at_least`` of them."""
        with self.lock:
            if self.written or self.state.position:
                if len(self.ledger.unjournaled) >= at_least:
                    self.commit(Traffic(messages=self.ledger.take()))

    def records(self) -> list[dict[str, Any]]:
        """The journal's records as written (JSON objects), header first; the messages not
        journaled yet are journaled first."""
        with self.lock:
            if not self.written:
                return []
            self.flush_traffic()
            return list(self.backend.records())

    def _write_header(self) -> None:
        if self._unwritten is not None:
            self.backend.append(dump_record(self._unwritten))
            self._unwritten = None

    def write_header(self) -> None:
        """Write a new journal's header now (once the site has joined)."""
        with self.lock:
            self._write_header()

    def close(self) -> None:
        """Journal the messages still waiting, and close the backend."""
        if self.ledger.unjournaled and (self.written or self.state.position):
            self.commit(Traffic(messages=self.ledger.take()))
        self.backend.close()

    def discard(self) -> None:
        """Close without a trace: a new journal is removed (a file that existed empty stays empty);
        an existing one is left as it was."""
        self.backend.close()
        if self._path is not None and self._was_empty:
            if self._existed:
                os.truncate(self._path, 0)
            elif os.path.exists(self._path):
                os.unlink(self._path)

    # -- snapshots ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a snapshot: the complete journal, which :meth:`import_snapshot` restores."""
        write_snapshot(path, self.records())

    def import_snapshot(self, path: str, records: Sequence[tuple[dict[str, Any], int]]) -> None:
        """Replay a snapshot's ``(record, line)`` pairs (its header excluded) into this site, then
        journal them here at the current version. The snapshot is never modified; this journal
        must hold no history yet."""
        head = read_snapshot(path)[0]
        check_header(parse_record(head, f"{path}: record 1"), self.header)
        if any(r["op"] not in ("header", "join", "traffic") for r in self.backend.records()):
            raise JournalError("load() into a storage that already has history")
        kept = [(rec, line) for rec, line in records if rec["op"] != "join"]
        replay(self.state, [rec for rec, _ in kept], lambda i: f"{path}:{kept[i][1]}")
        with self.lock:
            self._write_header()
            for rec, line in kept:  # all of it replayed: now journal it, at the current version
                self.backend.append(dump_record(parse_record(rec, f"{path}:{line}")))


def read_snapshot(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[tuple[dict[str, Any], int]]]:
    """A snapshot's header record and its other records with their line numbers (read, never modified)."""
    if not os.path.isfile(path):
        raise JournalError(f"{path}: no such snapshot")
    records, lines = read_records(path, repair=False)
    if not records:
        raise JournalError(f"{path} is not a labfbo snapshot (it is empty)")
    return records[0], list(zip(records[1:], lines[1:]))
