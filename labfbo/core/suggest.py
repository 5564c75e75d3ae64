""""Did you mean": the valid name nearest to a misspelt one (:mod:`difflib`)."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name nearest to ``name`` (difflib's ratio >= 0.6), or None."""
    found = difflib.get_close_matches(name, sorted(set(valid)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest valid name, or ``""``."""
    near = closest(name, valid)
    return "" if near is None else f"; did you mean {near!r}?"
