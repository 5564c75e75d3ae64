"""labfbo bench coordinator: light sites against a real coordinator process; the server reports its CPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration  # a coordinator subprocess and client processes


@pytest.mark.parametrize("protocol", ["distribution", "surface"])
def test_light_sites_complete_rounds_and_the_server_reports_its_cpu(protocol: str) -> None:
    from labfbo_bench.coordinator_scale import coordinator_rounds

    r = coordinator_rounds(protocol, 4, rounds=2, processes=2)
    assert r["sites"] == 4 and r["latency_median"] > 0
    assert 0 < r["cpu_per_site_round"] < 1.0 and r["site_rounds_per_cpu_s"] > 1
