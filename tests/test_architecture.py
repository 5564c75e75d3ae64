"""The import rules of docs/architecture.md, checked on the source (every import counts:
top-level, deferred inside a function, and under ``if TYPE_CHECKING:``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "labfbo"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name ``name``'s module imports: ``from a import b`` gives ``a.b`` when that is
    a module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = {f"{base}.{a.name}" for a in node.names}
            modules = names & MODULES.keys()  # `from labfbo import wire`: the module labfbo.wire
            out |= modules if modules else {base}
    return out


def module_graph() -> dict[str, set[str]]:
    """labfbo module -> the labfbo modules it imports."""
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for imp in imported_names(name, path):
            while imp and imp not in MODULES:  # `from labfbo.x import f`: the module labfbo.x
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                targets.add(imp)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_through_a_deferred_or_typing_import(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labfbo.x import Y\ndef f():\n    import labfbo.z\n"
    probe = tmp_path / "probe.py"
    probe.write_text(src)
    assert {"labfbo.x", "labfbo.z"} <= imported_names("probe", probe)


def test_labfbo_has_no_import_circle() -> None:
    assert circles(module_graph()) == []


def _importers(prefix: str, of: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for name, path in MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            bad = sorted(i for i in imported_names(name, path) if any(i == o or i.startswith(o + ".") for o in of))
            if bad:
                out[name] = bad
    return out


@pytest.mark.parametrize("layer, must_not_import", [
    ("labfbo", ("labfbo_bench",)),  # the library never imports its benchmark campaigns
    ("labfbo.transport", ("labfbo.protocols",)),  # a transport only moves messages
    ("labfbo.protocols", ("labfbo.optimizer", "labfbo.site", "labfbo.coordinator", "labfbo.transport",
                          "labfbo.server", "labfbo.report")),  # a protocol is pure functions over messages
    ("labfbo.site", ("labfbo.optimizer", "labfbo.coordinator", "labfbo.server", "labfbo.report")),
    ("labfbo.coordinator", ("labfbo.optimizer", "labfbo.site", "labfbo.transport")),
])
def test_layers_import_only_downwards(layer: str, must_not_import: tuple[str, ...]) -> None:
    assert _importers(layer, must_not_import) == {}


def test_the_journal_is_replayed_in_one_place() -> None:
    """Only :func:`labfbo.site.store.replay` applies journaled records with ``replay=True``."""
    where = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "apply"
                    and any(k.arg == "replay" for k in node.keywords)):
                where.append(name)
    assert where == ["labfbo.site.store"]


def test_no_module_is_over_500_lines() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}
