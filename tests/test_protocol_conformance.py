"""Every registered protocol passes the conformance test case labfbo ships (labfbo.testing)."""

from __future__ import annotations

import pytest

import labfbo
from labfbo.protocols import Protocol, available_protocols, get_protocol
from labfbo.testing import (
    KeepsItsBudget,
    ProtocolConformance,
    RestoresItsAggregator,
    ResumesFromItsJournal,
    SameOnEveryTransport,
)

FAST = {"num_restarts": 2, "raw_samples": 32}


def quick(name: str) -> Protocol:
    """The protocol with its quick options; with DP where it has a mechanism (its releases are then checked)."""
    cls = get_protocol(name)
    extra = {**(FAST if cls.takes_acquisition() else {}),
             **({"privacy": labfbo.DP(noise_multiplier=2.0)} if cls.supports_privacy() else {})}
    return cls(**cls.quick_options, **extra)


@pytest.mark.parametrize("name", available_protocols())
class TestEveryProtocol(ProtocolConformance):
    @pytest.fixture
    def protocol(self, name: str) -> Protocol:
        return quick(name)

    @pytest.mark.integration  # a second multi-site campaign per protocol (make test runs it; test-fast does not)
    def test_the_same_seed_gives_the_same_proposals(self, campaign, protocol: Protocol,
                                                    space: labfbo.SearchSpace) -> None:
        super().test_the_same_seed_gives_the_same_proposals(campaign, protocol, space)


@pytest.mark.integration  # two or more multi-site campaigns per protocol and promise
@pytest.mark.parametrize("name", available_protocols())
class TestEveryProtocolKeepsThePromises(ResumesFromItsJournal, RestoresItsAggregator, KeepsItsBudget,
                                        SameOnEveryTransport):
    @pytest.fixture
    def protocol(self, name: str) -> Protocol:
        return quick(name)
