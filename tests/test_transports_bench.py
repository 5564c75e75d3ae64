"""labfbo bench transports: one campaign, every transport, the same proposals and bytes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from labfbo.cli import main

pytestmark = pytest.mark.integration  # an HTTP server and an mpiexec subprocess


def test_bench_transports_runs_one_campaign_on_every_transport(tmp_path) -> None:
    has_mpi = bool(shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec"))
    transports = ["local", "http"] + (["mpi"] if has_mpi else [])
    assert main(["bench", "transports", "--sites", "2", "--budget", "2", "--option", "warmup_steps=4",
                 "--option", "svgd_steps=2", "--option", "wire=compact", "--transports", *transports,
                 "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "transports.json").read_text())
    assert saved["campaign"]["wire"] == "compact" and saved["campaign"]["warmup_steps"] == 4
    rows = {r["transport"]: r for r in saved["rows"]}
    assert set(rows) == set(transports) and not any("error" in r for r in rows.values())
    for r in rows.values():
        assert r["proposals"] == rows["local"]["proposals"]
        assert r["mb_up"] == rows["local"]["mb_up"] > 0
    table = (tmp_path / "transports.md").read_text()
    assert table.count("| yes |") == len(transports) - 1
