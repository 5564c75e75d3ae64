"""The benchmark campaigns (``labfbo_bench``) stand apart from the library: labfbo never imports
them, ``labfbo bench`` finds them through entry points, and the data the library needs is its own."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

import labfbo

ROOT = Path(labfbo.__file__).resolve().parent
GROUP = "labfbo.bench"


def bench_imports(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, module) of every import of ``labfbo_bench`` in ``source``: top-level or deferred
    (inside a function, a class, a branch), ``import``, ``from ... import`` and
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                names = [node.args[0].value]
        found += [(node.lineno, n) for n in names if n == "labfbo_bench" or n.startswith("labfbo_bench.")]
    return found


def test_the_scan_sees_every_form_of_import() -> None:
    source = ("import os\n"
              "def f():\n    from labfbo_bench.pacd import jobs\n"
              "class C:\n    def g(self):\n        if True:\n            import labfbo_bench\n"
              "importlib.import_module('labfbo_bench.guide')\n"
              "__import__('labfbo_bench')\n"
              "from labfbo.benchmarks import get_problem\n"
              "import labfbo_bench_other\n")
    assert sorted(bench_imports(source)) == [(3, "labfbo_bench.pacd"), (7, "labfbo_bench"),
                                             (8, "labfbo_bench.guide"), (9, "labfbo_bench")]


def test_no_module_of_labfbo_imports_labfbo_bench() -> None:
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 50  # the whole package was scanned
    offenders = [f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
                 for path in files for line, name in bench_imports(path.read_text(), str(path))]
    assert not offenders, "labfbo must not import the benchmark campaigns:\n" + "\n".join(offenders)


def test_every_bench_entry_point_loads_and_adds_its_subcommand() -> None:
    import argparse

    from labfbo.cli import _bench_entry_points

    eps = _bench_entry_points()  # (entry_points(group=...) may see only a stale labfbo.egg-info in the clone)
    names = {ep.name for ep in eps}
    assert {"pmcbo", "pacd", "guide", "engine", "reactions", "latency", "demo-suite"} <= names
    for ep in eps:
        module = ep.load()
        assert module.__name__.startswith("labfbo_bench."), ep
        assert callable(getattr(module, "add_parser", None)), f"{ep.value} has no add_parser"
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="suite")
        module.add_parser(sub)
        assert ep.name in sub.choices, f"{ep.value} does not add `labfbo bench {ep.name}`"
    from labfbo.cli import build_parser

    top = build_parser()
    bench = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    choices = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(choices) == names
    assert list(choices)[:3] == ["demo-suite", "latency", "pmcbo"]  # BENCH_ORDER, as before the split


def test_a_broken_entry_point_is_a_labfbo_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import labfbo.cli
    from labfbo.cli import main

    broken = importlib.metadata.EntryPoint("ghost", "labfbo_bench.no_such_suite", GROUP)
    monkeypatch.setattr(labfbo.cli, "_bench_entry_points", lambda: [broken])
    assert main(["bench", "--help"]) == 2
    err = capsys.readouterr().err
    assert "labfbo: error: benchmark suite 'ghost' (labfbo_bench.no_such_suite" in err and "does not load" in err
    monkeypatch.setattr(labfbo.cli, "_bench_entry_points", lambda: [])
    assert main(["bench", "pmcbo"]) == 2
    assert "no benchmark suites are installed" in capsys.readouterr().err
    assert main(["coordinator", "token"]) == 0  # the other commands do not read the group


def test_the_buchwald_hartwig_data_loads_through_labfbo_datasets() -> None:
    from labfbo.datasets import SHIPPED_SMILES, initial_design, load_reactions, shipped_path

    data = load_reactions()
    assert len(data.labs) == 15 and [len(p.choices) for p in data.space.params] == [3, 4, 23]
    assert sum(len(t) for t in data.tables) == 4132  # the reactions of the screen, one per (lab, combination)
    assert shipped_path().parent == ROOT / "datasets" / "data"
    assert shipped_path(SHIPPED_SMILES).read_text().startswith("component,kind,smiles")
    design = initial_design(data, 0, seed=3, n=3)
    assert design == initial_design(data, 0, seed=3, n=3) and len(set(design)) == 3
    assert all(c in data.combos() for c in design)


def test_the_public_names_that_stay() -> None:
    import labfbo.benchmarks as b

    assert sorted(b.__all__) == ["FederatedProblem", "get_problem", "list_problems"]
    assert b.get_problem("branin", n_sites=2, seed=0).n_sites == 2
    for loose in ("engine_reactions", "surface_bytes", "wire"):  # the scripts of benchmarks/ are modules too
        assert importlib.util.find_spec(f"labfbo_bench.{loose}") is not None
