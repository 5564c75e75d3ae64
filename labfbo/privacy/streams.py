"""Which site-private stream a release's DP noise is drawn from.

A release answers a *query* (the data it protects and, for ``gradient``, the particles it was
asked about). Its noise is drawn from the site-private stream of ``(round, purpose, k)``, where
``k`` is the order in which this site first answered a distinct query for that purpose in that
round:

- the first query of a round draws stream 0, whatever the last bits of the values it answers,
  so the same seed gives the same noise, and the same proposals, on every CPU (a stream named
  by a hash of float values would change entirely when one value moves by a rounding error);
- the same query answered again (a round recomputed after a restart) repeats its bytes;
- another query for the same purpose and round draws a fresh stream (the same draw on two
  queries would reveal their difference).

A query is named by a digest of its exact bytes. The streams a release drew from are kept in the
site's own journal (:attr:`labfbo.core.release.Release.streams`), so a restarted site that
is asked another query never draws a stream it used before.
"""

from __future__ import annotations

from typing import Iterable, Sequence

#: separates a stream's purpose from its query's digest in :attr:`Release.streams` entries
SEP = "#"


class NoiseStreams:
    """The order of first use of each (round, purpose, query), and the draws not yet journaled."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], list[str]] = {}
        self._pending: list[tuple[int, str]] = []

    def index(self, round: int, purpose: str, query: str) -> int:
        """The stream of ``query`` among ``purpose``'s streams of ``round`` (new queries get the next one)."""
        if SEP in purpose or SEP in query:
            raise ValueError(f"a noise stream's purpose and query may not contain {SEP!r}")
        self._pending.append((int(round), f"{purpose}{SEP}{query}"))
        return self._register(round, purpose, query)

    def _register(self, round: int, purpose: str, query: str) -> int:
        seen = self._seen.setdefault((int(round), purpose), [])
        if query not in seen:
            seen.append(query)
        return seen.index(query)

    def drawn(self, round: int) -> list[str]:
        """The streams drawn for ``round`` since the last call (``purpose#query``, in order): what the
        release of that round's answer records. Draws of other rounds (an answer that never left) are dropped."""
        out = [key for r, key in self._pending if r == int(round)]
        self._pending.clear()
        return list(dict.fromkeys(out))

    def resume(self, rounds_and_streams: Iterable[tuple[int, Sequence[str]]]) -> None:
        """Replay the journal's releases (round, streams) in order: the same indices as before the restart."""
        for round, streams in rounds_and_streams:
            for key in streams:
                purpose, _, query = key.rpartition(SEP)
                if purpose:
                    self._register(round, purpose, query)
