"""The package list in pyproject.toml covers every sub-package; entry points resolve."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "labfbo").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml packages: {sorted(found - listed)}"
    # a folder of modules without __init__.py would be a namespace package the wheel leaves out
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "labfbo").rglob("*.py")}
    assert folders <= found, f"add an __init__.py to: {sorted(folders - found)}"
    assert "labfbo_adapters" in listed
    # the benchmark campaigns: top-level folder benchmarks/, installed as labfbo_bench (no sub-packages)
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["labfbo_bench"] == "benchmarks" and "labfbo_bench" in listed
    assert (ROOT / "benchmarks" / "__init__.py").exists()
    assert not [p for p in (ROOT / "benchmarks").rglob("*.py") if p.parent != ROOT / "benchmarks"]


def test_shipped_data_is_package_data() -> None:
    """The reaction data and the suites' reference tables are in the wheel (package-data patterns match)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p.name for pattern in data["labfbo"] for p in (ROOT / "labfbo").glob(pattern)}
    assert {"buchwald_hartwig.csv", "buchwald_hartwig_smiles.csv", "README.md"} <= shipped
    assert {p.name for pattern in data["labfbo_bench"] for p in (ROOT / "benchmarks").glob(pattern)} == \
        {"reference_tables.json"}


def test_bundled_adapter_entry_point_loads() -> None:
    eps = {ep.name: ep for ep in entry_points(group="labfbo.adapters")}
    assert "simulated" in eps
    cls = eps["simulated"].load()
    assert cls.__module__ == "labfbo_adapters.simulated"
