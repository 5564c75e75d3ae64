"""A coordinator outage longer than the HTTP client's retries: labs that ``ask(timeout=300)`` wait it
out and propose exactly what the same study proposes without it (``tests/outage/study.py``; the
12 s + 60 s run of four labs over nine rounds is in ``docs/benchmarks/``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "outage"))

from study import LABS, reference, run  # noqa: E402

pytestmark = pytest.mark.integration  # a coordinator subprocess, SIGKILLed and restarted


@pytest.mark.timeout(900, method="signal")
def test_labs_ride_out_a_coordinator_outage_and_propose_what_they_would_have(tmp_path: Path) -> None:
    # 20 s: beyond the 6 tries' longest backoff (0.5 + 1 + 2 + 4 + 8 s), so only the ask's deadline keeps them
    got = run(tmp_path, rounds=5, outages={2: 20.0, 3: 2.0})
    assert got["errors"] == [] and got["killed"] == [2, 3]
    want = reference(5)
    for lab in LABS:
        assert len(got["proposals"][lab]) == 5  # none lost, none repeated
        assert got["proposals"][lab] == want[lab], lab  # every one from the round's guidance, as without the outage
