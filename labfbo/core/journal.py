"""Append-only, durable storage of a site's history: one JSON record per line.

Every record has ``"v"`` (schema version) and ``"op"``. The first record is the header
(the study's space, objective, protocol, seed, site). Then, in order, one record per
event: ``hist`` (a batch of historical observations), ``ask`` (a batch of trials),
``enqueue``, ``tell``, ``fail``, ``note`` (JSON metadata on a pending trial, such as an
instrument run's handle), ``join``. A record is written, flushed and ``fsync``-ed
before the call that produced it returns, so a crash loses at most the call in progress.
Replaying the records in order rebuilds the optimizer exactly (its random streams are
keyed by counters that replay restores). A torn final line — the trace of a crash while
writing — is dropped on open (and cut from the file, with a warning); any other
unreadable line, a non-finite number, a second header (two journals concatenated) and a
record that does not replay (a trial id twice, a result for an unknown or finished trial)
is a :class:`~labfbo.core.exceptions.JournalError` naming the file and line, never silently
skipped. A snapshot (:func:`write_snapshot`) is read with :func:`read_records` and never
modified.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Protocol, runtime_checkable

from labfbo.core.exceptions import ConfigurationError, JournalError, LabFBOError
from labfbo.core.records import JOURNAL_VERSION, Header


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _is_json(line: bytes) -> bool:
    """Whether ``line`` is complete JSON (a hand-edited NaN is complete; a torn write is not)."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def read_records(path: str | os.PathLike[str], *, repair: bool,
                 torn: Literal["refuse", "skip"] = "refuse") -> tuple[list[dict[str, Any]], list[int]]:
    """The records of the journal at ``path`` and the line number of each.

    A torn last line (a crash while writing) is cut from the file with a warning when
    ``repair`` (a live journal), left out when ``torn="skip"`` (a reader of a journal another
    process writes: the file is not modified), and refused otherwise (a snapshot is written
    atomically and never modified). Any other unreadable line, ``NaN``/``Infinity``, a record without an
    ``op``, a first record that is not a header and a second header (two journals
    concatenated) raise :class:`JournalError` naming the file and line.
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    numbers: list[int] = []
    good_bytes = 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if not line.strip():
            good_bytes += len(line) + (0 if last else 1)
            continue
        try:
            rec = json.loads(line, parse_constant=_refuse_constant)
            if not isinstance(rec, dict) or not isinstance(rec.get("op"), str):
                raise ValueError("not a journal record")
        except ValueError as exc:
            torn_line = not _is_json(line) and (last or all(not rest.strip() for rest in lines[i + 1:]))
            if torn_line and torn == "skip" and not repair:
                break
            if torn_line and repair:
                warnings.warn(f"{path}: dropping a torn last record (crash during a write)", stacklevel=4)
                with open(path, "r+b") as fh:
                    fh.truncate(good_bytes)
                    fh.flush()
                    os.fsync(fh.fileno())
                break
            if torn_line:
                raise JournalError(f"{path}:{i + 1}: the last record is cut off ({exc}); a snapshot is written "
                                   "whole, so this file was damaged or is still being copied") from None
            raise JournalError(f"{path}:{i + 1}: unreadable journal record ({exc})") from None
        good_bytes += len(line) + (0 if last else 1)
        if isinstance(rec.get("v"), bool) or not isinstance(rec.get("v", 0), int):
            raise JournalError(f"{path}:{i + 1}: record version {rec.get('v')!r} is not an integer")
        if rec.get("v", 0) > JOURNAL_VERSION:
            raise JournalError(f"{path}:{i + 1}: record version {rec.get('v')} is newer than "
                               f"this labfbo ({JOURNAL_VERSION})")
        if (rec["op"] == "header") != (not records):
            what = "a second header (another journal appended to this one?)" if records else \
                f"a {rec['op']!r} record before the header"
            raise JournalError(f"{path}:{i + 1}: {what}")
        records.append(rec)
        numbers.append(i + 1)
    return records, numbers


class MemoryJournal:
    """The journal of an optimizer without ``storage=``: same interface, in memory."""

    path: Path | None = None

    def __init__(self) -> None:
        self._records: list[dict[str, Any]] = []
        self._lines: list[int] = []

    def append(self, record: dict[str, Any]) -> None:
        self._records.append({"v": JOURNAL_VERSION, **record})

    def records(self) -> Iterator[dict[str, Any]]:
        yield from list(self._records)

    def where(self, index: int) -> str:
        """Where record ``index`` (0 = header) is, for error messages: ``file:line``."""
        if self.path is not None and index < len(self._lines):
            return f"{self.path}:{self._lines[index]}"
        return f"journal record {index + 1}"

    def close(self) -> None:
        pass


def open_private(path: str | os.PathLike[str], flags: int,
                 error: type[LabFBOError] = JournalError) -> int:
    """A descriptor of ``path`` opened with ``flags``: created 0600 whatever the umask, never through
    a symbolic link (one at ``path`` is refused with ``error``), and an existing file of this user's
    is made 0600. For the files that hold a site's secrets or a study's state and tokens."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise error(f"{path} is a symbolic link: refused (labfbo writes this file itself, readable by its "
                        "owner only, never through a link; remove the link or give the real path)") from None
        raise error(f"{path} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path} is not a regular file")
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # an existing file keeps its mode on open (and umask may strip bits): set it
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileJournal(MemoryJournal):
    """A JSON-lines journal on disk, 0600 (it holds the site's secret, key seed and raw data); each
    append is fsync-ed before it returns. A symbolic link at its path is refused."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        if not os.path.lexists(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = os.fdopen(open_private(self.path, os.O_WRONLY | os.O_APPEND), "ab")
        try:
            try:  # one live optimizer per journal: a second writer would corrupt the history
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise JournalError(f"{self.path} is in use by another live Optimizer (close it first)") from None
            if os.fstat(self._fh.fileno()).st_size:
                self._records, self._lines = read_records(self.path, repair=True)
            if os.fstat(self._fh.fileno()).st_size and not self.path.read_bytes().endswith(b"\n"):
                self._fh.write(b"\n")  # a complete last record whose newline was lost
        except BaseException:
            self._fh.close()
            raise

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
    """Write ``records`` as a new journal atomically (temp file, fsync, rename), 0600; a symbolic
    link at ``path`` (or at its temp file) is refused."""
    path = Path(path)
    if path.is_symlink():
        raise JournalError(f"{path} is a symbolic link: refused (a snapshot holds the site's secret and raw "
                           "data; give the real path)")
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":"), allow_nan=False).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


HEADER_KEYS = ("space_hash", "objective", "protocol", "seed", "site", "n_init", "outcomes")


def check_header(header: Header, ours: Header) -> None:
    """Refuse a journal whose header belongs to another study than ``ours`` (an optimizer's header)."""
    for key in HEADER_KEYS:
        if getattr(header, key) != getattr(ours, key):
            raise JournalError(f"journal belongs to another study: {key} is {getattr(header, key)!r}, "
                               f"this optimizer has {getattr(ours, key)!r}")
    for key in ("privacy", "n_particles"):  # releases of journals before version 2 are declared from them
        old, new = header.options.get(key), ours.options.get(key)
        if old != new:
            raise JournalError(f"the journal's DP releases were made with {key}={old!r}; "
                               f"resume with the same setting (got {new!r})")


def read_header(path: str | os.PathLike[str]) -> Header | None:
    """The header of the journal at ``path`` (None if there is no readable one yet)."""
    from labfbo.core.records import parse_record

    try:
        with open(path, "rb") as fh:
            head = parse_record(json.loads(fh.readline()), f"{path}:1")
    except (OSError, ValueError, JournalError):
        return None
    return head if isinstance(head, Header) else None


@runtime_checkable
class JournalBackend(Protocol):
    """Where a site's journal lives: records (JSON-able dicts) are appended durably and read back
    in order. :class:`FileJournal` and :class:`MemoryJournal` are the built-in backends; any object
    with these methods can be passed as ``Optimizer(storage=...)``."""

    def append(self, record: dict[str, Any]) -> None: ...

    def records(self) -> Iterable[dict[str, Any]]: ...

    def close(self) -> None: ...


def open_journal(storage: "str | os.PathLike[str] | JournalBackend | None") -> JournalBackend:
    """The journal backend of ``storage=``: a path (a :class:`FileJournal`), a backend object, or
    None (a :class:`MemoryJournal`)."""
    if storage is None:
        return MemoryJournal()
    if isinstance(storage, (str, os.PathLike)):
        return FileJournal(storage)
    if isinstance(storage, JournalBackend):
        return storage
    raise ConfigurationError(f"storage must be a path or a journal backend (append, records, close), "
                             f"got {type(storage).__name__}")
