"""Releases the coordinator may reuse: a site's last upload sent with ``release_every = k > 1``.

A site on a schedule (``release_every=k``, for a privacy budget) uploads only in rounds
``t % k == 0`` and states ``k`` in the upload. The coordinator keeps it and uses it again in the
rounds :math:`r < t < r + k` the site sends nothing — post-processing of an earlier release, so
free — and drops it after that window or when the site uploads again. Sites are visited in
roster order, so the merged uploads are the same bits on every transport.
"""

from __future__ import annotations

from typing import Any, Generic, Mapping, TypeVar

from labfbo.core.messages import Message, parse

M = TypeVar("M", bound=Message)


class HeldReleases(Generic[M]):
    """``held[site] = (round, upload)`` of the uploads made with a ``release_every`` above 1."""

    def __init__(self, sites: list[str], kind: type[M], name: str) -> None:
        self.sites, self.kind, self.name = sites, kind, name
        self.held: dict[str, tuple[int, M]] = {}

    def merge(self, t: int, fresh: Mapping[str, M]) -> dict[str, M]:
        """``fresh`` and, for the sites that sent none, their held upload while it stands (roster order)."""
        out: dict[str, M] = {}
        for s in self.sites:
            if s in fresh:
                out[s] = fresh[s]
                every = getattr(fresh[s], "release_every", None)
                if every is not None and every > 1:
                    self.held[s] = (t, fresh[s])
                else:
                    self.held.pop(s, None)
            elif s in self.held:
                r, m = self.held[s]
                if r < t < r + (getattr(m, "release_every", None) or 1):
                    out[s] = m
                else:
                    del self.held[s]
        return out

    def state(self) -> dict[str, Any]:
        """JSON-able (empty when nothing is held, so a snapshot reads as before schedules existed)."""
        if not self.held:
            return {}
        return {"held": {s: {"round": r, self.name: m.model_dump(mode="json")} for s, (r, m) in self.held.items()}}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.held = {}
        for s, h in state.get("held", {}).items():
            m = parse(h[self.name])
            if isinstance(m, self.kind):
                self.held[s] = (int(h["round"]), m)


class ReusesReleases:
    """An aggregator's side of :class:`HeldReleases`: ``self.reuse`` persisted as its state."""

    reuse: HeldReleases[Any]

    @property
    def held(self) -> dict[str, tuple[int, Any]]:
        """site -> (round, upload) of the uploads the coordinator may still reuse."""
        return self.reuse.held

    def state(self) -> dict[str, Any]:
        return self.reuse.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.reuse.restore(state)
