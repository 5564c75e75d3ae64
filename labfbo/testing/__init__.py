"""Test cases labfbo ships for code built on it (they need ``pytest``: ``pip install 'labfbo[test]'``).

:class:`ProtocolConformance` is what every protocol must pass; the promises of the house are
capability classes beside it (:mod:`labfbo.testing.capabilities`): :class:`ResumesFromItsJournal`,
:class:`RestoresItsAggregator`, :class:`KeepsItsBudget`, :class:`SameOnEveryTransport`. A new
protocol's tests subclass them and override the ``protocol`` fixture.
"""

from labfbo.testing.capabilities import (
                                         KeepsItsBudget,
                                         RestoresItsAggregator,
                                         ResumesFromItsJournal,
                                         SameOnEveryTransport,
)
from labfbo.testing.protocol_conformance import CampaignRun, ConformanceFixtures, ProtocolConformance, run_campaign

__all__ = ["CampaignRun", "ConformanceFixtures", "KeepsItsBudget", "ProtocolConformance", "RestoresItsAggregator",
           "ResumesFromItsJournal", "SameOnEveryTransport", "run_campaign"]
