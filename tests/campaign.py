"""A lock-step federated campaign for protocol tests (initial design, then ``rounds`` BO rounds)."""

from __future__ import annotations

from typing import Any, Callable, Sequence


def run_campaign(opts: Sequence[Any], f: Callable[[int, dict], float], n_init: int, rounds: int) -> list[list[dict]]:
    """Every site evaluates its design, then each round every site asks before any tells.

    Returns the proposed params per round and site.
    """
    for i, o in enumerate(opts):
        for t in o.ask(n=n_init):
            o.tell(t, f(i, t.params))
    proposals = []
    for _ in range(rounds):
        trials = [o.ask() for o in opts]
        proposals.append([t.params for t in trials])
        for i, (o, t) in enumerate(zip(opts, trials)):
            o.tell(t, f(i, t.params))
    return proposals
