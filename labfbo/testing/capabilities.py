"""The house's promises, as test classes a protocol author inherits beside :class:`ProtocolConformance`.

::

    class TestMyProtocol(ProtocolConformance, ResumesFromItsJournal, RestoresItsAggregator,
                         KeepsItsBudget, SameOnEveryTransport):
        @pytest.fixture
        def protocol(self):
            return MyProtocol(**FAST)

Each class checks one promise on the short campaign of :func:`run_campaign` (three sites, two
model rounds after a design of three), against the same campaign run straight through:

* :class:`ResumesFromItsJournal`: every site closed after the first model round and reopened
  from its journal proposes what it would have proposed.
* :class:`RestoresItsAggregator`: a coordinator rebuilt from the snapshots of its completed
  rounds (JSON, as a durable coordinator keeps them) gives the sites the same guidance.
* :class:`KeepsItsBudget`: under ``DP(epsilon=1)`` with a horizon of two rounds, a campaign of
  four never takes a site past its budget, as the site accounts it nor as the coordinator does.
* :class:`SameOnEveryTransport`: the campaign over HTTP (a server on 127.0.0.1) proposes exactly
  what it proposes in one process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from labfbo.core.dp import DP
from labfbo.problems import FederatedProblem
from labfbo.protocols import Protocol
from labfbo.space.search import SearchSpace
from labfbo.testing.protocol_conformance import ROUNDS, CampaignRun, ConformanceFixtures, objective, run_campaign

#: the budget :class:`KeepsItsBudget` gives each site, and the rounds it runs past the planned horizon
BUDGET, OVERRUN = 1.0, 2


def _federated(protocol: Protocol) -> None:
    if not protocol.federated:
        pytest.skip(f"{protocol.name!r} has no coordinator rounds")


class ResumesFromItsJournal(ConformanceFixtures):
    """Sites reopened from their journals mid-campaign continue as if never closed."""

    def test_sites_reopened_from_their_journals_propose_what_they_would_have(
            self, campaign: CampaignRun, protocol: Protocol, space: SearchSpace, tmp_path: Path) -> None:
        resumed = run_campaign(protocol, space, journals=tmp_path, reopen_after=1)
        assert resumed.proposals == campaign.proposals


class RestoresItsAggregator(ConformanceFixtures):
    """A coordinator restored from its rounds' snapshots gives the guidance it would have given."""

    def test_a_coordinator_restored_from_its_snapshots_gives_the_same_guidance(
            self, campaign: CampaignRun, protocol: Protocol, space: SearchSpace, tmp_path: Path) -> None:
        _federated(protocol)
        restored = run_campaign(protocol, space, journals=tmp_path, reopen_after=1, restore_coordinator=True)
        assert restored.proposals == campaign.proposals


class KeepsItsBudget(ConformanceFixtures):
    """No site spends more than its ``DP(epsilon=...)``, even past the horizon it planned for."""

    def test_no_site_spends_more_than_its_budget(self, protocol: Protocol, space: SearchSpace) -> None:
        _federated(protocol)
        if not protocol.supports_privacy():
            pytest.skip(f"{protocol.name!r} has no DP mechanism")
        dp = DP(epsilon=BUDGET, clip=protocol.privacy.clip if protocol.privacy is not None else 1.0)
        budgeted = type(protocol).from_options(protocol.options.model_copy(update={"privacy": dp}))
        spent: list[float] = []

        def after_round(sites: list[Any], coordinator: Any) -> None:
            for opt in sites:
                spent.append(opt.epsilon())
            spent.extend(coordinator.ledger.epsilon(s) for s in coordinator.members)

        run_campaign(budgeted, space, rounds=ROUNDS + OVERRUN, horizon=ROUNDS, after_round=after_round)
        assert spent and None not in spent, "a site's spending is not known"
        assert max(spent) > 0, "nothing was released under the budget: the check would hold trivially"
        assert max(spent) <= BUDGET * (1 + 1e-9), max(spent)


class SameOnEveryTransport(ConformanceFixtures):
    """The same proposals over every transport this process can run (MPI needs ``mpiexec``: its
    contract is ``tests/test_mpi.py``)."""

    transports: tuple[str, ...] = ("http",)

    def test_the_same_proposals_on_every_transport(self, protocol: Protocol, space: SearchSpace) -> None:
        _federated(protocol)
        pytest.importorskip("fastapi")
        sites = 3
        problem = FederatedProblem(space=space, objectives=[_Site(space, i) for i in range(sites)],
                                   optima=[0.0] * sites, site_names=[f"site-{c}" for c in "abc"])
        from labfbo.apps.simulation import simulate

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            local = simulate(problem, protocol, n_init=3, budget=ROUNDS, seed=4)
            for transport in self.transports:
                other = simulate(problem, protocol, n_init=3, budget=ROUNDS, seed=4, transport=transport)
                np.testing.assert_array_equal(other.proposals, local.proposals, err_msg=transport)
                np.testing.assert_array_equal(other.bytes_up, local.bytes_up, err_msg=transport)


class _Site:
    """Site ``i``'s objective of the conformance campaign, as a picklable callable."""

    def __init__(self, space: SearchSpace, i: int) -> None:
        self.space, self.i = space, i

    def __call__(self, params: dict[str, Any]) -> float:
        return objective(self.space, self.i, params)
