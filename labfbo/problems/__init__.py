"""Federated problems: ``FederatedProblem`` (build your own) and the built-in functions and
related-site families of the seed papers (``get_problem(name, n_sites=, heterogeneity=, seed=)``).

:func:`labfbo.simulate` runs them; the paper suites and micro-benchmarks that measure
protocols on them are the package ``labfbo_bench`` (``labfbo bench ...``).
"""

from __future__ import annotations

from typing import Any

from labfbo.problems.problem import FederatedProblem


def get_problem(name: str, n_sites: int = 5, heterogeneity: Any = None, seed: int = 0,
                **kwargs: Any) -> FederatedProblem:
    """Build a built-in federated problem (see ``docs/problems.md``)."""
    from labfbo.problems.families import get_problem as _get

    return _get(name, n_sites=n_sites, heterogeneity=heterogeneity, seed=seed, **kwargs)


def list_problems() -> list[str]:
    """Names accepted by :func:`get_problem`."""
    from labfbo.problems.families import list_problems as _list

    return _list()


__all__ = ["FederatedProblem", "get_problem", "list_problems"]
