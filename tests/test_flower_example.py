"""The Flower example: the HTTP example's lab script behind Flower SuperNodes.

A module of its own so that ``make test`` runs it with the other Flower modules (it mostly
waits on SuperNodes), not beside the CPU-bound examples (``tests/schedule.py``).
"""

from __future__ import annotations

import re

import pytest
from test_examples import _run_alone

pytestmark = pytest.mark.integration  # the example runs as a script


def test_flower_consortium(tmp_path) -> None:
    """The lab script of the HTTP example, unchanged, behind Flower SuperNodes (TLS, node auth)."""
    pytest.importorskip("flwr")
    stdout = _run_alone("flower_consortium.py", tmp_path)
    assert "(TLS, SuperNode authentication)" in stdout
    for site in ("lab-a", "lab-b"):
        assert re.search(rf"^{site}: best yield \d+\.\d+ at .*sent \['join', 'optimum_belief'\]", stdout, re.M), stdout
        assert (tmp_path / f"{site}.journal").exists()
    assert re.search(r'^labfbo: round 1 done in [0-9.]+ s; contributions \[\["lab-a", "lab-b"\]\]$', stdout, re.M), (
        stdout
    )
    assert re.search(r"^labfbo: study example-consortium done: 2 rounds", stdout, re.M), stdout
