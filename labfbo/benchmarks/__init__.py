"""Benchmark problems, simulation metrics, reports and benchmark suites.

``get_problem(name, n_sites=, heterogeneity=, seed=)`` builds the seed papers' problems;
``FederatedProblem`` lets users build their own.
"""

from labfbo.benchmarks.problem import FederatedProblem


def get_problem(name: str, n_sites: int = 5, heterogeneity=None, seed: int = 0, **kwargs):
    """Build a built-in federated benchmark problem (see ``docs/problems.md``)."""
    from labfbo.benchmarks.problems import get_problem as _get

    return _get(name, n_sites=n_sites, heterogeneity=heterogeneity, seed=seed, **kwargs)


def list_problems() -> list[str]:
    """Names accepted by :func:`get_problem`."""
    from labfbo.benchmarks.problems import list_problems as _list

    return _list()


__all__ = ["FederatedProblem", "get_problem", "list_problems"]
