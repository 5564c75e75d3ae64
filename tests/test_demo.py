"""`make demo`: a reagent screen of labs on the shipped Buchwald–Hartwig data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labfbo.benchmarks.reactions_data import load_reactions
from labfbo.cli import build_parser
from labfbo.demo import CITATION, DemoConfig, DemoResult, pick_labs, related_labs, run_demo
from labfbo.demo_runs import METHODS
from labfbo.exceptions import ConfigurationError
from tests.browser import chromium, console_errors

LABS = ("2-bromopyridine", "2-chloropyridine")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """2 labs, 3 shared first experiments and 3 more, every method."""
    return run_demo(DemoConfig(labs=list(LABS), budget=3, seed=0, out=str(tmp_path_factory.mktemp("demo"))))


def _md_rows(summary: str) -> list[list[str]]:
    lines = [ln for ln in summary.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]  # after the header row


def test_the_demo_writes_the_table_the_plot_and_every_labs_report(tiny: DemoResult) -> None:
    out = tiny.out
    assert out.name.startswith("demo-") and tiny.labs == LABS
    assert tiny.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = tiny.summary.read_text()
    assert CITATION in summary and tiny.plot.name in summary
    assert "After 5 experiments per lab, working together found a higher best yield than going alone in" in summary
    rows = _md_rows(summary)
    # every lab by name, with the three methods, and its best in the data
    assert [(r[0], r[2]) for r in rows] == [(lab, m) for lab in LABS for m in METHODS.values()]
    assert rows[0][:2] == ["2-bromopyridine", "97.3"] and rows[3][:2] == ["2-chloropyridine", "91.4"]
    assert [len(r) for r in rows] == [5] * 6  # after 5 experiments and after all 6
    # every lab journaled its `surface` campaign and has its report, linked from the summary
    assert sorted(tiny.reports) == sorted(LABS)
    for lab, html in tiny.reports.items():
        assert html == out / f"report-{lab}.html" and html.stat().st_size > 10_000
        assert (out / "journals" / f"{lab}.journal").exists() and f"]({html.name})" in summary


def test_the_table_holds_real_yields_of_the_data(tiny: DemoResult) -> None:
    data = load_reactions().subset(LABS)
    results = json.loads((tiny.out / "results.json").read_text())
    names = data.space.names
    for i, lab in enumerate(LABS):
        assert tiny.best_in_data[lab] == data.best(i) == results["best_in_data"][lab]
        runs = {m: results["experiments"][m][lab] for m in METHODS}
        assert {len(r) for r in runs.values()} == {6}
        firsts = [[e["params"] for e in r[:3]] for r in runs.values()]
        assert firsts[0] == firsts[1] == firsts[2]  # the same 3 first experiments under every method
        for m, r in runs.items():
            for e in r:  # each experiment's yield is the data's at its combination (None: not in the data)
                assert e["yield"] == data.tables[i].get(tuple(e["params"][n] for n in names))
    for row in _md_rows(tiny.summary.read_text()):
        lab, best, method, *after = row
        i, m = LABS.index(lab), next(k for k, v in METHODS.items() if v == method)
        real = {f"{y:.1f}" for y in data.tables[i].values()}
        assert best == f"{data.best(i):.1f}"
        for n, cell in zip((5, 6), after):
            shown = cell.rstrip("*")
            assert shown in real and float(shown) == round(tiny.best_after(m, i, n), 1)
            assert cell.endswith("*") == (tiny.best_after(m, i, n) == data.best(i))


@pytest.mark.integration
def test_the_demos_report_and_plot_render_in_chromium(tiny: DemoResult, tmp_path: Path) -> None:
    with chromium(1200, 2000) as browser:
        browser.get(tiny.plot.as_uri())
        size = browser.execute_script("const i = document.images[0]; return [i.naturalWidth, i.naturalHeight];")
        assert size[0] > 800 and size[1] > 300
        lab = LABS[1]
        browser.get(tiny.reports[lab].as_uri())
        errors = console_errors(browser)
        page = browser.execute_script("""return {title: document.title,
            images: Array.from(document.images).map(i => i.naturalWidth)};""")
    assert errors == []
    assert page["title"] == f"Campaign report: {lab}"
    assert page["images"] and all(w > 300 for w in page["images"])


def test_the_demo_picks_related_labs_and_refuses_unknown_ones() -> None:
    data = load_reactions()
    three = related_labs(data, 3)
    assert len(set(three)) == 3 and pick_labs(data, 3) == three
    assert pick_labs(data, list(LABS)) == LABS
    with pytest.raises(ConfigurationError, match="unknown: 2-iodotoluene"):
        pick_labs(data, ["2-bromopyridine", "2-iodotoluene"])
    with pytest.raises(ConfigurationError, match="2 to 5"):
        related_labs(data, 9)
    with pytest.raises(ConfigurationError, match="budget"):
        run_demo(DemoConfig(budget=0))


def test_the_demo_command_line() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.labs, args.budget, args.seed, args.no_optuna, args.out) == (["3"], 17, 0, False, "runs")
    args = build_parser().parse_args(["demo", "--labs", *LABS, "--budget", "5", "--no-optuna"])
    assert args.labs == list(LABS) and args.budget == 5 and args.no_optuna
    suite = build_parser().parse_args(["bench", "demo-suite", "--sites", "2"])  # the former demo, kept as a suite
    assert suite.sites == 2 and suite.problem == "wing_weight"
