"""Benchmark suites (the seed papers' tables, the engine panel, the reaction data), simulation
metrics and reports, and micro-benchmarks (``labfbo bench ...``).

The problems they run live in :mod:`labfbo.problems`; ``get_problem``, ``list_problems``
and ``FederatedProblem`` are re-exported here for existing code.
"""

from labfbo.problems import FederatedProblem, get_problem, list_problems

__all__ = ["FederatedProblem", "get_problem", "list_problems"]
