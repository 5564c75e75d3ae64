"""The import rules of docs/architecture.md, checked on the source (every import counts:
top-level, deferred inside a function, and under ``if TYPE_CHECKING:``)."""

from __future__ import annotations

import ast
import re
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
            modules = names & MODULES.keys()  # `from labfbo import wire`: the module labfbo.core.wire
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
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labfbo.x import Y\n"
           "def f():\n    import labfbo.z\n")
    probe = tmp_path / "probe.py"
    probe.write_text(src)
    assert {"labfbo.x", "labfbo.z"} <= imported_names("probe", probe)


def test_labfbo_has_no_import_circle() -> None:
    assert circles(module_graph()) == []


DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
PROTOCOL_NAMES = ("independent", "consensus", "gradient", "distribution", "centralized", "pooled", "surface", "vote")


def layer_table() -> list[tuple[str, list[str]]]:
    """The rows of docs/architecture.md's layer table, bottom up: (layer, its folders and modules)."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| layer | folders |"))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int:
    """The row of ``module`` (a dotted name under labfbo): its top folder, or its own file."""
    parts = module.split(".")[1:]
    entry = "__init__.py" if not parts else (parts[0] + ("/" if (ROOT / parts[0]).is_dir() else ".py"))
    found = [i for i, (_, entries) in enumerate(table) if entry in entries]
    assert len(found) == 1, f"{entry} is in {len(found)} rows of the layer table"
    return found[0]


def test_the_layer_table_is_the_folders() -> None:
    """Every entry of labfbo/ is in the table once, and the table names nothing that is not there."""
    listed = [e for _, entries in layer_table() for e in entries]
    assert len(listed) == len(set(listed))
    present = {p.name + "/" for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.name for p in ROOT.glob("*.py")}
    assert set(listed) == present


def test_no_import_points_up_a_layer() -> None:
    table = layer_table()
    up = sorted(f"{m} ({table[layer_of(m, table)][0]}) imports {t} ({table[layer_of(t, table)][0]})"
                for m, targets in module_graph().items() for t in targets if layer_of(t, table) > layer_of(m, table))
    assert up == []


def test_the_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check above can fail: a model importing a protocol is an upward import in the table."""
    table = layer_table()
    assert layer_of("labfbo.protocols.base", table) > layer_of("labfbo.models.gp", table)
    assert (
        layer_of("labfbo.optimizer", table)
        > layer_of("labfbo.site.agent", table)
        > layer_of("labfbo.coordinator", table)
    )
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from labfbo.protocols.base import SiteData\n")
    assert "labfbo.protocols.base" in imported_names("labfbo.models.probe", probe)


def test_at_most_six_modules_at_the_top() -> None:
    assert len(list(ROOT.glob("*.py"))) <= 6


def test_a_module_named_after_a_protocol_is_in_its_package_or_an_application() -> None:
    """Outside ``protocols/<name>/`` and ``apps/`` no module is named after a protocol; a protocol of
    one module is ``protocols/<name>.py``."""
    wrong = []
    for name in MODULES:
        parts = name.split(".")
        if parts[1:2] == ["apps"] or (parts[1:2] == ["protocols"] and len(parts) > 3 and parts[2] in PROTOCOL_NAMES):
            continue
        if parts[1:2] == ["protocols"] and len(parts) == 3 and parts[2] in PROTOCOL_NAMES:
            continue
        if any(parts[-1] == p or parts[-1].startswith(p + "_") for p in PROTOCOL_NAMES):
            wrong.append(name)
    assert wrong == []


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
    ("labfbo.privacy", ("labfbo.protocols", "labfbo.apps")),  # mechanisms and accounting only
    ("labfbo.site", ("labfbo.coordinator",)),  # one site, from its own journal
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


PROTOCOL_OBJECTS = {"logic", "site_logic", "agg", "aggregator", "options", "opts", "protocol", "configured",
                    "protocol_cls"}


def _reads_by_name(tree: ast.AST) -> list[tuple[int, str]]:
    """``getattr``/``hasattr`` calls on an object named like a protocol, its site logic, aggregator or
    options (``options``, ``self.logic``, ...), or on ``self`` inside such a class."""
    found = []

    def visit(node: ast.AST, owner: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            owner = node.name
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            name = (target.id if isinstance(target, ast.Name)
                    else target.attr if isinstance(target, ast.Attribute) else "")
            if name in PROTOCOL_OBJECTS or (name == "self" and owner is not None
                                            and owner.endswith(("Site", "Logic", "Aggregator", "Options", "Protocol"))):
                found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    visit(tree, None)
    return found


def test_no_protocol_object_is_read_by_attribute_name_outside_the_registry() -> None:
    """What the core reads of a protocol is declared on it: no ``getattr``/``hasattr`` on a protocol,
    its site logic, aggregator or options outside ``labfbo.protocols`` (the registry)."""
    reads = {name: found for name, path in MODULES.items() if name != "labfbo.protocols"
             and (found := _reads_by_name(ast.parse(path.read_text())))}
    assert reads == {}


def test_the_attribute_read_check_finds_one() -> None:
    src = "class SurfaceAggregator:\n    def f(self):\n        return hasattr(self, '_p')\n" \
          "def g(opts):\n    return getattr(opts, 'privacy', None)\n"
    assert [line for line, _ in _reads_by_name(ast.parse(src))] == [3, 5]
