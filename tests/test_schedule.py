"""The order ``make test`` hands modules to its processes (tests/schedule.py)."""

from __future__ import annotations

from schedule import LONG, WAITERS, WaitersFirst, module_of


def test_the_flower_modules_are_one_unit_handed_out_first_then_the_long_ones_then_by_size() -> None:
    split = WaitersFirst._split_scope
    scopes = {split(None, f"tests/{m}.py::t[x]") for m in WAITERS}  # type: ignore[arg-type]
    assert scopes == {"waiters"}
    assert split(None, "tests/test_http.py::test_a[b]") == "tests/test_http.py"  # type: ignore[arg-type]
    assert module_of("tests/test_flower.py::test_x[consensus]") == "test_flower"
    units = {"tests/test_space.py": 40, "tests/test_journal.py": 31, "waiters": 6, f"tests/{LONG[0]}.py": 15,
             f"tests/{LONG[1]}.py": 12, "tests/test_wire.py": 3}
    order = sorted(units, key=lambda s: WaitersFirst._rank(s, units[s]))
    assert order == ["waiters", f"tests/{LONG[0]}.py", f"tests/{LONG[1]}.py", "tests/test_space.py",
                     "tests/test_journal.py", "tests/test_wire.py"]


def test_every_module_the_order_names_exists() -> None:
    from pathlib import Path

    here = Path(__file__).parent
    assert [m for m in (*WAITERS, *LONG) if not (here / f"{m}.py").exists()] == []
