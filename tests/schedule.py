"""The order in which ``make test`` hands test modules to its pytest-xdist processes.

pytest-xdist's module scheduler (``--dist loadfile``) starts the modules with the most tests
first. On two cores that leaves the suite's longest module, a one-test Flower drill that mostly
waits on SuperNodes (they pull every 3 s), to the very end, where it runs alone on idle cores.
:class:`WaitersFirst` instead

* runs the Flower modules and the Flower example (:data:`WAITERS`) as one unit, first and one
  after another on one process, while the other processes keep both cores busy with the
  CPU-bound modules;
* then hands out the known long modules (:data:`LONG`), longest first;
* then the rest, the modules with the most tests first (pytest-xdist's own rule).

Each module still runs whole in one process (its module fixtures once).
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

WAITERS = ("test_flower_dropout", "test_flower_gradient_vote", "test_flower", "test_flower_restart",
           "test_flower_example")
"""Modules that spend most of their time waiting on other processes: one unit, run in this order."""

LONG = ("test_constraints", "test_surface", "test_examples", "test_http", "test_outcomes", "test_mpi", "test_site_run",
        "test_chaos", "test_protocol_conformance", "test_vote", "test_distribution", "test_report",
        "test_report_privacy_truth", "test_engine_bench", "test_privacy_budget", "test_golden")
"""The CPU-bound modules that take longest, longest first (``make test``'s durations)."""


def module_of(nodeid: str) -> str:
    """``tests/test_x.py::test_y[z]`` -> ``test_x``."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


class WaitersFirst(LoadScopeScheduling):
    """pytest-xdist's module scheduler with the waiting modules first, then the long ones."""

    def _split_scope(self, nodeid: str) -> str:
        return "waiters" if module_of(nodeid) in WAITERS else nodeid.split("::", 1)[0]

    def schedule(self) -> None:
        """pytest-xdist's first distribution, with the work queue in the order above."""
        if self.collection is not None or not self.collection_is_completed:
            return super().schedule()
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return None
        self.collection = list(next(iter(self.registered_collections.values())))
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for scope in sorted(units, key=lambda s: self._rank(s, len(units[s]))):
            unit = units[scope]
            if scope == "waiters":  # the longest waiter first: it overlaps the most CPU-bound work
                unit = dict(sorted(unit.items(), key=lambda kv: WAITERS.index(module_of(kv[0]))))
            self.workqueue[scope] = unit
        for _ in range(len(self.nodes) - len(self.workqueue)):  # more processes than modules
            node, _assigned = self.assigned_work.popitem()
            node.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()
        return None

    @staticmethod
    def _rank(scope: str, size: int) -> tuple[int, int]:
        order = ("waiters", *LONG)
        name = "waiters" if scope == "waiters" else module_of(scope)
        return (order.index(name), 0) if name in order else (len(order), -size)


def make_scheduler(config: Any, log: Any) -> LoadScopeScheduling | None:
    """The scheduler for ``--dist loadfile`` (None otherwise: pytest-xdist's own)."""
    if config.getvalue("dist") != "loadfile":
        return None
    return WaitersFirst(config, log)
