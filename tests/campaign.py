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


def local_proposals(protocol: str, names: Sequence[str], space: Any, seed: int, f: Callable[[int, Any], float],
                    rounds: int, horizon: int, **options: Any) -> list[list[dict]]:
    """The same study in one process (local transport), ``f(i, trial)`` as a remote campaign calls it:
    the proposals per round and site that every other transport must reproduce."""
    from types import SimpleNamespace

    import labfbo

    coord = labfbo.Coordinator(protocol, sites=list(names), space=space, seed=seed, horizon=horizon)
    local = [labfbo.Optimizer(space, protocol=protocol, site=n, seed=seed, n_init=3, coordinator=coord, **options)
             for n in names]
    return run_campaign(local, lambda i, params: f(i, SimpleNamespace(params=params)), 3, rounds)
