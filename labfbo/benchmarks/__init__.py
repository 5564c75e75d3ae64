"""The benchmark problems, under their older name: ``labfbo.benchmarks.get_problem(name, n_sites=, heterogeneity=,
seed=)``.

They live in :mod:`labfbo.problems`. The benchmark campaigns (``labfbo bench ...``) are the
separate package ``labfbo_bench``, installed with labfbo; the simulation harness is
:mod:`labfbo.apps.harness`, the reaction data :mod:`labfbo.datasets`.
"""

from labfbo.problems import FederatedProblem, get_problem, list_problems

__all__ = ["FederatedProblem", "get_problem", "list_problems"]
