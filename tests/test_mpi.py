"""The MPI transport: the same campaign gives the same proposals as the in-process one,
also while the machine is loaded.

Runs ``mpiexec -n 4 python -m mpi4py tests/mpi/same_proposals.py`` once (coordinator + 3
sites, every protocol) with a timeout, and checks each protocol's result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from labfbo.protocols import available_protocols, get_protocol

#: every registered protocol but the raw-data references, then the variants tests/mpi/same_proposals.py runs
PROTOCOLS = [p for p in available_protocols() if not get_protocol(p).shares_raw_data] + \
    ["gradient-sa", "gradient-compact", "surface-budget", "vote-budget"]
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
pytestmark = [pytest.mark.integration,  # mpiexec subprocesses
              pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not installed (pip install 'labfbo[mpi]')")]


@pytest.fixture(scope="module")
def mpi_results(cpu_load) -> dict:
    """Run while both cores are busy with another process: proposals must not depend on timing."""
    script = Path(__file__).parent / "mpi" / "same_proposals.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([MPIEXEC, "-n", "4", sys.executable, "-m", "mpi4py", str(script), *PROTOCOLS],
                          capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"mpiexec failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mpi_gives_the_same_proposals_as_local(mpi_results: dict, protocol: str) -> None:
    r = mpi_results[protocol]
    np.testing.assert_array_equal(np.array(r["mpi"]), np.array(r["local"]))
    np.testing.assert_array_equal(np.array(r["bytes_mpi"]), np.array(r["bytes_local"]))
    assert r["regret_equal"]
    assert r["epsilon_mpi"] == r["epsilon_local"]
    if protocol.endswith("-budget"):  # DP(epsilon=1.0): calibrated and accounted the same over MPI
        assert r["epsilon_mpi"] and max(r["epsilon_mpi"]) <= 1.0


def test_simulate_refuses_a_wrong_number_of_ranks() -> None:
    import labfbo

    with pytest.raises(labfbo.ConfigurationError, match="needs 4 ranks"):
        labfbo.simulate("branin", n_sites=3, n_init=2, budget=1, transport="mpi")
