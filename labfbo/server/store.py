"""Durable coordinator state (SQLite) and the audit log (append-only JSON lines).

The store keeps every join request (so a restarted coordinator gives every site its
index and design again), every completed round's snapshot (replies, contributors, the
aggregator's carried state), rotated token digests, and each site's privacy account (its
releases as received, written as each answer arrives, before it is used: the budget the
coordinator enforces survives a restart). Each write is one transaction, in the WAL before it
returns (``synchronous=NORMAL``: not fsynced, so it survives a crash of the process, not a power
loss), so a ``kill -9`` loses at most the round in progress, which the sites simply ask for
again. ``retention_rounds`` keeps only the last N round snapshots. It also keeps which
sites have left (a restarted coordinator does not wait for them). The state file, its WAL and
the audit log are created readable by their owner only (0600, whatever the umask); a symbolic
link at their path is refused.

:func:`resume` and :func:`persist_round` are how a server process uses it — the HTTP
server (:mod:`labfbo.server.app`) and the Flower ``ServerApp``
(:mod:`labfbo.transport.flower_server`) alike.

The audit log records, per request: time, site (or ``-``), route, round, SHA-256 and
size of the payload, and the decision (HTTP status). It never contains a token or a
payload.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from labfbo.core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from labfbo.coordinator import Coordinator


class Store:
    """The coordinator's durable state in one SQLite file (``path=None``: in memory)."""

    def __init__(self, path: str | None) -> None:
        self.lock = threading.Lock()
        self.pending_budgets: dict[str, dict[str, Any]] = {}  # accounts without a budget, written with the next round
        if path:
            _private_state(path)
        try:
            self.db = sqlite3.connect(path or ":memory:", check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL" if path else "PRAGMA journal_mode=MEMORY")
            # WAL + NORMAL: a commit is written to the WAL file (the OS has it) before it returns, so it
            # survives a crash or kill -9 of this process; only the last commits before a power loss or
            # an OS crash may be lost (checkpoints fsync). FULL fsynced every answer's ledger write.
            self.db.execute("PRAGMA synchronous=NORMAL" if path else "PRAGMA synchronous=OFF")
            self.db.execute("CREATE TABLE IF NOT EXISTS joins (n INTEGER PRIMARY KEY AUTOINCREMENT, "
                            "site TEXT UNIQUE, request TEXT)")
            self.db.execute("CREATE TABLE IF NOT EXISTS rounds (t INTEGER PRIMARY KEY, snapshot TEXT)")
            self.db.execute("CREATE TABLE IF NOT EXISTS tokens (site TEXT PRIMARY KEY, sha256 TEXT, base TEXT)")
            self.db.execute("CREATE TABLE IF NOT EXISTS budgets (site TEXT PRIMARY KEY, account TEXT)")
            self.db.execute("CREATE TABLE IF NOT EXISTS gone (site TEXT PRIMARY KEY)")
        except sqlite3.Error as exc:  # no such folder, not a database, read-only, ...
            raise ConfigurationError(f"state {path!r} cannot be opened: {exc}") from None

    def _write(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        """The statements in one transaction."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self.db.execute(sql, args)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def add_join(self, site: str, request_json: str) -> None:
        """``site`` joined (its first join request is kept); if it had left, it is back."""
        self._write(("INSERT OR IGNORE INTO joins (site, request) VALUES (?, ?)", (site, request_json)),
                    ("DELETE FROM gone WHERE site = ?", (site,)))

    def joins(self) -> list[str]:
        with self.lock:
            return [r[0] for r in self.db.execute("SELECT request FROM joins ORDER BY n")]

    def add_leave(self, site: str) -> None:
        """``site`` left the study (closed its optimizer); a later :meth:`add_join` brings it back."""
        self._write(("INSERT OR IGNORE INTO gone (site) VALUES (?)", (site,)))

    def gone(self) -> set[str]:
        """The sites that left and have not joined again."""
        with self.lock:
            return {r[0] for r in self.db.execute("SELECT site FROM gone")}

    def add_round(self, t: int, snapshot: dict[str, Any], keep: int | None = None) -> None:
        """Round ``t`` (and the accounts changed since the last round that have no budget), in one transaction."""
        insert = ("INSERT OR REPLACE INTO rounds (t, snapshot) VALUES (?, ?)", (t, json.dumps(snapshot)))
        self._with_pending(insert, *([] if keep is None else [("DELETE FROM rounds WHERE t <= ?", (t - keep,))]))

    def _with_pending(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        """``statements`` and the pending accounts, in one transaction (the accounts stay pending if it fails)."""
        with self.lock:
            pending, self.pending_budgets = self.pending_budgets, {}
        try:
            self._write(*statements, *[("INSERT OR REPLACE INTO budgets (site, account) VALUES (?, ?)",
                                        (site, json.dumps(acc))) for site, acc in pending.items()])
        except BaseException:
            with self.lock:
                self.pending_budgets = {**pending, **self.pending_budgets}
            raise

    def rounds(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(r[0]) for r in self.db.execute("SELECT snapshot FROM rounds ORDER BY t")]

    def set_token(self, site: str, digest: str, base: str) -> None:
        """A rotated token; ``base`` is the config's digest for the site at rotation time."""
        self._write(("INSERT OR REPLACE INTO tokens (site, sha256, base) VALUES (?, ?, ?)", (site, digest, base)))

    def tokens(self) -> dict[str, tuple[str, str]]:
        """site -> (rotated digest, the config digest it replaced)."""
        with self.lock:
            return {r[0]: (r[1], r[2]) for r in self.db.execute("SELECT site, sha256, base FROM tokens")}

    def set_budget(self, site: str, account: dict[str, Any]) -> None:
        """``site``'s privacy account (:class:`labfbo.privacy.accounts.SiteAccount`), as it changes: at once
        when it has a budget (before the release is used: no crash can forget what was spent); without
        one (nothing to enforce, a count for the report) with the next round, not one commit per answer."""
        if account.get("budget") is None:
            with self.lock:
                self.pending_budgets[site] = account
            return
        with self.lock:
            self.pending_budgets.pop(site, None)
        self._write(("INSERT OR REPLACE INTO budgets (site, account) VALUES (?, ?)", (site, json.dumps(account))))

    def budgets(self) -> dict[str, dict[str, Any]]:
        """site -> its privacy account."""
        with self.lock:
            return {r[0]: json.loads(r[1]) for r in self.db.execute("SELECT site, account FROM budgets")}

    def close(self) -> None:
        if self.pending_budgets:
            self._with_pending()
        with self.lock:
            self.db.close()


def _private_state(path: str) -> None:
    """Create the state file 0600 (or make ours 0600) before SQLite opens it: SQLite gives its WAL and
    shared-memory files the database's mode. A symbolic link at it or at a companion is refused."""
    from labfbo.core.journal import open_private

    os.close(open_private(path, os.O_RDWR, ConfigurationError))
    for companion in ("-wal", "-shm", "-journal"):
        if os.path.islink(path + companion):
            raise ConfigurationError(f"{path + companion} is a symbolic link: refused (the coordinator's state "
                                     "writes it itself; remove the link)")


def resume(coordinator: "Coordinator", store: Store) -> set[str]:
    """Continue ``coordinator``'s study from ``store``; return the sites that had left.

    The stored joins are admitted again (the same members at the same indices), the completed
    rounds restored (the round clock, the current guidance, the aggregator's state), each site's
    privacy account restored; from now on every account change is written to ``store``.
    Raises :class:`ConfigurationError` when the stored study is not this configuration's.
    """
    from labfbo.core.messages import JoinRequest, parse

    for text in store.joins():
        request = parse(text)
        if not isinstance(request, JoinRequest):
            raise ConfigurationError(f"the state holds a {request.kind!r} among its joins: not a labfbo state file")
        try:
            coordinator.join(request)
        except Exception as exc:  # noqa: BLE001 - whatever the study refuses now, the operator must hear why
            raise ConfigurationError(f"the state holds the join of site {request.site!r}, which this study "
                                     f"configuration refuses ({type(exc).__name__}: {exc}): is it another "
                                     "study's state file?") from None
    rounds = store.rounds()
    if rounds:
        coordinator.restore(rounds)
    # each site's spent privacy budget, as accounted: written as each answer arrives, before it is used
    coordinator.ledger.restore(store.budgets())
    coordinator.ledger.on_change = store.set_budget
    return store.gone() & set(coordinator.members)


def persist_round(coordinator: "Coordinator", store: Store, t: int, keep: int | None = None) -> None:
    """Write completed round ``t`` to ``store``, before any site sees it; with ``keep``, only the last
    ``keep`` rounds stay, in the store and in ``coordinator.rounds``."""
    store.add_round(t, coordinator.snapshot(t), keep=keep)
    if keep is not None:
        for old in [r for r in coordinator.rounds if r <= t - keep]:
            coordinator.rounds.pop(old, None)


def tokens_in_force(store: Store, digests: Mapping[str, str]) -> dict[str, str]:
    """The sites' token digests: the configuration's ``digests``, with each token rotated at run
    time (HTTP's admin API) that outlived a restart — unless the operator has since changed that
    site's digest in the configuration (the configuration then wins: revocation works)."""
    rotated = {site: d for site, (d, base) in store.tokens().items() if site in digests and digests[site] == base}
    return {**digests, **rotated}


#: the longest route or site name an audit line keeps (a line stays under 1 kB whatever a request sends)
AUDIT_FIELD_CHARS = 200


class AuditLog:
    """Append-only JSON lines; ``retention_days`` prunes older entries when it opens.

    A line is at most about 600 bytes: the route and site name are cut to
    :data:`AUDIT_FIELD_CHARS` characters. When the file reaches ``max_bytes`` it is rotated to
    ``<path>.1`` (replacing the previous one), so the log and its one predecessor stay within
    twice that. ``recent`` keeps the last entries in memory, without digest or size (the dashboard's list).
    """

    def __init__(self, path: str | None, retention_days: float | None = None, keep_recent: int = 200,
                 max_bytes: int = 50 * 2**20) -> None:
        self.path = Path(path) if path else None
        if self.path is not None and not self.path.parent.is_dir():
            raise ConfigurationError(f"audit_log {path!r}: no folder {str(self.path.parent)!r} to write it in")
        self.lock = threading.Lock()
        self.max_bytes = int(max_bytes)
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep_recent)
        self._size: int | None = None  # bytes in the file, read once
        self._fh: Any = None  # the open file (appended to, flushed per line: a kill -9 loses none)
        if self.path is not None and retention_days is not None and self.path.exists():
            cutoff = time.time() - retention_days * 86400
            keep = [ln for ln in self.path.read_text().splitlines() if _time(ln) >= cutoff]
            tmp = self.path.with_suffix(".tmp")
            with os.fdopen(_open_log(tmp, os.O_WRONLY | os.O_TRUNC), "w") as fh:
                fh.write("".join(ln + "\n" for ln in keep))
            tmp.replace(self.path)

    def write(self, site: str | None, route: str, round: int | None, payload: bytes, status: int) -> None:
        """One request; pass ``payload=b""`` for a body that must leave no trace (a login's token)."""
        import hashlib

        now = time.time()
        site, route = (site or "-")[:AUDIT_FIELD_CHARS], route[:AUDIT_FIELD_CHARS]
        with self.lock:
            self.recent.append({"time": now, "site": site, "route": route, "round": round, "decision": status})
        if self.path is None:
            return
        entry = {"time": now, "site": site, "route": route, "round": round,
                 "sha256": hashlib.sha256(payload).hexdigest() if payload else None, "size": len(payload),
                 "decision": status}
        line = json.dumps(entry) + "\n"
        with self.lock:
            if self._size is None:
                self._size = self.path.stat().st_size if self.path.exists() else 0
            if self._size + len(line) > self.max_bytes:
                self._close()
                self.path.replace(self.path.with_name(self.path.name + ".1"))
                self._size = 0
            if self._fh is None or self._fh.closed:
                self._fh = os.fdopen(_open_log(self.path, os.O_WRONLY | os.O_APPEND), "a")
            self._fh.write(line)
            self._fh.flush()
            self._size += len(line.encode())

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def close(self) -> None:
        """Close the file (a later :meth:`write` opens it again)."""
        with self.lock:
            self._close()


def _open_log(path: Path, flags: int) -> int:
    """The audit log's file, 0600 and never through a symbolic link (:func:`labfbo.core.journal.open_private`)."""
    from labfbo.core.journal import open_private

    return open_private(path, flags, ConfigurationError)


def _time(line: str) -> float:
    try:
        return float(json.loads(line)["time"])
    except (ValueError, KeyError, TypeError):
        return 0.0
