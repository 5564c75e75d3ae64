"""The closed lab loop: a site's campaign on an instrument adapter (``labfbo site run``)."""

from labfbo.lab.config import AdapterSpec, SiteConfig, StopRule
from labfbo.lab.loop import CampaignLoop, LoopReport
from labfbo.lab.run import format_report, open_optimizer, run_site

__all__ = ["AdapterSpec", "CampaignLoop", "LoopReport", "SiteConfig", "StopRule", "format_report",
           "open_optimizer", "run_site"]
