"""A notice on the console while something slow runs (a large ``ask(n)`` batch), and sizes as
people read them (:func:`human_bytes`, for the report and the dashboard).

The work itself gives no fraction done — BoTorch optimizes a batch jointly — so the
notice shows what runs and for how long: a tqdm line on stderr, refreshed every second,
that appears only once the work has taken ``after`` seconds and only on a terminal
(tqdm's ``disable=None``), so scripts and logs stay quiet.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import IO, Iterator

NOTICE_AFTER = 5.0
"""Seconds before the notice appears."""


@contextmanager
def slow_notice(what: str, after: float | None = None, stream: IO[str] | None = None,
                force: bool = False) -> Iterator[None]:
    """Show ``what`` and the elapsed time while the block runs longer than ``after`` seconds
    (``force``: also when ``stream`` is not a terminal)."""
    done = threading.Event()
    wait = NOTICE_AFTER if after is None else after

    def show() -> None:
        if done.wait(wait):
            return
        from tqdm.auto import tqdm

        with tqdm(desc=what, bar_format="{desc}: {elapsed}", file=stream or sys.stderr,
                  disable=False if force else None, leave=False) as bar:
            while not done.wait(1.0):
                bar.refresh()

    thread = threading.Thread(target=show, name="labfbo-notice", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def human_bytes(n: float) -> str:
    """``1234567`` -> ``"1.23 MB"`` (decimal units; whole bytes below 1 kB)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n} B"  # unreachable

