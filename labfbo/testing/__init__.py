"""Test cases labfbo ships for code built on it (they need ``pytest``: ``pip install 'labfbo[test]'``).

:class:`ProtocolConformance` is what every protocol must pass; a new protocol's tests subclass
it and override its ``protocol`` fixture.
"""

from labfbo.testing.protocol_conformance import CampaignRun, ProtocolConformance, run_campaign

__all__ = ["CampaignRun", "ProtocolConformance", "run_campaign"]
