"""`SiteLedger`: every message that crossed a site's boundary, and the bytes per round."""

from __future__ import annotations

import os
import threading
from collections import defaultdict

from labfbo.core.journal import open_private
from labfbo.core.messages import Message
from labfbo.core.records import MessageEntry


class SiteLedger:
    """Every message a site sent and received (in order) and the bytes up/down per BO round.

    Setup messages (join) are listed under round ``-1``. Each message's direction, kind,
    round and size also wait in :attr:`unjournaled` until the optimizer journals them (a
    ``traffic`` record, :meth:`take`).
    """

    def __init__(self, log_path: str | None = None) -> None:
        self.sent: list[Message] = []
        self.received: list[Message] = []
        self.bytes_up: dict[int, int] = defaultdict(int)
        self.bytes_down: dict[int, int] = defaultdict(int)
        self.log_path = log_path
        self.unjournaled: list[MessageEntry] = []
        self._guard = threading.Lock()  # an HTTP site answers requests from its agent's thread

    def record_sent(self, msg: Message, nbytes: int | None = None) -> int:
        """Record an outgoing message (``nbytes``: its frame's size, if the caller has the frame); its size."""
        self.sent.append(msg)
        n = msg.nbytes() if nbytes is None else nbytes
        self.bytes_up[msg.round] += n
        with self._guard:
            self.unjournaled.append(MessageEntry(direction="sent", kind=msg.kind, round=msg.round, nbytes=n))
        if self.log_path:
            with os.fdopen(open_private(self.log_path, os.O_WRONLY | os.O_APPEND), "a") as fh:  # 0600, no link
                fh.write(msg.model_dump_json() + "\n")
        return n

    def record_received(self, msg: Message, nbytes: int | None = None) -> int:
        """Record an incoming message (``nbytes``: as :meth:`record_sent`); its size in bytes."""
        self.received.append(msg)
        n = msg.nbytes() if nbytes is None else nbytes
        self.bytes_down[msg.round] += n
        with self._guard:
            self.unjournaled.append(MessageEntry(direction="received", kind=msg.kind, round=msg.round, nbytes=n))
        return n

    def take(self) -> list[MessageEntry]:
        """The entries not journaled yet (and forget them)."""
        with self._guard:
            out, self.unjournaled = self.unjournaled, []
        return out

    def round_bytes(self, round: int) -> tuple[int, int]:
        return self.bytes_up.get(round, 0), self.bytes_down.get(round, 0)
