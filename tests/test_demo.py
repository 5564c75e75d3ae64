"""`make demo`: a reagent screen of labs on the shipped Buchwald–Hartwig data."""

from __future__ import annotations

import json
import re
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Iterator

import pytest

from labfbo.apps.demo.runs import METHODS, SeedJob, run_seeds
from labfbo.apps.demo.screen import (
    CITATION,
    DemoConfig,
    DemoResult,
    curves,
    pick_labs,
    plot_title,
    reading,
    related_labs,
    run_demo,
    seeds_text,
    wins,
)
from labfbo.cli import build_parser
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.journal import read_records
from labfbo.datasets import load_reactions
from tests.browser import chromium, console_errors

LABS = ("2-bromopyridine", "2-chloropyridine")
SEEDS = (0, 1)
CELL = re.compile(r"^(\d+\.\d) \((\d+\.\d)–(\d+\.\d)\)$")  # mean (min–max) over seeds


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoResult]:
    """2 labs, 3 shared first experiments and 3 more, 2 seeds in 2 worker processes, every method."""
    yield run_demo(DemoConfig(labs=list(LABS), budget=3, seeds=SEEDS, workers=2,
                              out=str(tmp_path_factory.mktemp("demo"))))
    # the spawn context's resource tracker lives as long as this process; stop it with the module
    resource_tracker._resource_tracker._stop()


def _md_rows(summary: str) -> list[list[str]]:
    lines = [ln for ln in summary.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]  # after the header row


def _best(runs: list[dict], n: int) -> float:
    return max((e["yield"] for e in runs[:n] if e["yield"] is not None), default=0.0)


@pytest.mark.integration  # the demo's campaigns (module fixture)
def test_the_demo_writes_the_table_the_plot_and_every_labs_report(tiny: DemoResult) -> None:
    out = tiny.out
    assert out.name.startswith("demo-") and tiny.labs == LABS and tiny.seeds == SEEDS
    assert tiny.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = tiny.summary.read_text()
    assert CITATION in summary and tiny.plot.name in summary
    assert "## Best yield found (%), mean (range) over seeds 0–1" in summary
    assert ("After 5 experiments per lab (mean over seeds 0–1, 2 labs), against alone, together was ahead by more "
            "than 1 point in") in summary
    rows = _md_rows(summary)
    # every lab by name, with the three methods, and its best in the data
    assert [(r[0], r[2]) for r in rows] == [(lab, m) for lab in LABS for m in METHODS.values()]
    assert rows[0][:2] == ["2-bromopyridine", "97.3"] and rows[3][:2] == ["2-chloropyridine", "91.4"]
    assert [len(r) for r in rows] == [6] * 6  # after 5 experiments, after all 6, seeds together beat alone
    # every lab journaled its `surface` campaign of the first seed and has its report, linked from the summary
    assert sorted(tiny.reports) == sorted(LABS)
    for _i, (lab, html) in enumerate(tiny.reports.items()):
        assert html == out / f"report-{lab}.html" and html.stat().st_size > 10_000
        assert f"]({html.name})" in summary
        records, _ = read_records(out / "journals" / f"{lab}.journal", repair=False)
        journaled = [t["params"] for r in records if r["op"] in ("enqueue", "ask") for t in r["trials"]]
        assert journaled == [e.params for e in tiny.experiments[SEEDS[0]]["surface"][LABS.index(lab)]]
    assert "the same 3 first experiments, then 3 more; mean over 2 seeds (0–1)" in plot_title(
        tiny, DemoConfig(budget=3), load_reactions().subset(LABS))


@pytest.mark.integration  # the demo's campaigns (module fixture)
def test_the_table_holds_means_over_seeds_of_real_yields(tiny: DemoResult) -> None:
    data = load_reactions().subset(LABS)
    results = json.loads((tiny.out / "results.json").read_text())
    assert results["config"]["seeds"] == list(SEEDS)
    names = data.space.names
    runs = {s: {m: results["experiments"][str(s)][m] for m in METHODS} for s in SEEDS}
    for i, lab in enumerate(LABS):
        assert tiny.best_in_data[lab] == data.best(i) == results["best_in_data"][lab]
        for s in SEEDS:
            per_method = [runs[s][m][lab] for m in METHODS]
            assert {len(r) for r in per_method} == {6}
            firsts = [[e["params"] for e in r[:3]] for r in per_method]
            assert firsts[0] == firsts[1] == firsts[2]  # the same 3 first experiments under every method
            for r in per_method:
                for e in r:  # each experiment's yield is the data's at its combination (None: not in the data)
                    assert e["yield"] == data.tables[i].get(tuple(e["params"][n] for n in names))
        # each seed draws its own first experiments
        assert runs[0]["surface"][lab][:3] != runs[1]["surface"][lab][:3]
    for row in _md_rows(tiny.summary.read_text()):
        lab, best, method, *after, won = row
        i, m = LABS.index(lab), next(k for k, v in METHODS.items() if v == method)
        real = {f"{y:.1f}" for y in data.tables[i].values()}
        assert best == f"{data.best(i):.1f}"
        for n, cell in zip((5, 6), after):
            ys = [_best(runs[s][m][lab], n) for s in SEEDS]
            mean, lo, hi = CELL.match(cell).groups()  # type: ignore[union-attr]
            assert float(mean) == round(sum(ys) / len(ys), 1) and lo in real and hi in real
            assert (float(lo), float(hi)) == (round(min(ys), 1), round(max(ys), 1))
            assert curves(tiny)[m][i][:, n - 1].tolist() == ys  # the plot's seeds × experiments
        beat = sum(_best(runs[s]["surface"][lab], 5) - _best(runs[s]["independent"][lab], 5) > 1 for s in SEEDS)
        assert won == (f"{beat} of 2" if m == "surface" else "")


@pytest.mark.integration  # the demo's campaigns (module fixture)
def test_the_reading_is_computed_from_the_table(tiny: DemoResult) -> None:
    results = json.loads((tiny.out / "results.json").read_text())["experiments"]

    def diffs(other: str) -> list[float]:  # per seed, mean over labs of together minus other after 5
        return [sum(_best(results[str(s)]["surface"][lab], 5) - _best(results[str(s)][other][lab], 5)
                    for lab in LABS) / len(LABS) for s in SEEDS]

    line = reading(tiny, 3)
    for other, name in (("independent", "alone"), ("optuna", "Optuna alone")):
        d = diffs(other)
        mean = sum(d) / len(d)
        se = abs(d[0] - d[1]) / 2  # the standard error of the mean of two values
        told = abs(mean) > max(1.0, 2 * se)
        expected = (f"against {name}, together was ahead by more than 1 point in "
                    f"{sum(wins(tiny, i, 5, other)[0] for i in range(2))} of 4 campaigns (lab × seed) and behind in "
                    f"{sum(wins(tiny, i, 5, other)[1] for i in range(2))}, a mean difference of {mean:+.1f} points "
                    f"± {se:.1f} (standard error over seeds): "
                    + ("more than two standard errors, together " + ("ahead" if mean > 0 else "behind") if told
                       else "within two standard errors (or a point), not told apart"))
        assert expected in line
    assert "One seed" not in line and "Campaigns that found their lab's best by 6, of 4:" in line


@pytest.mark.integration  # the demo's campaigns (module fixture)
def test_a_seeds_proposals_do_not_depend_on_the_worker_count(tiny: DemoResult) -> None:
    alone = run_seeds([SeedJob(LABS, s, 3, 3) for s in SEEDS], workers=1)  # in this process, one after another
    assert [r.seed for r in alone] == list(SEEDS)
    for r in alone:
        assert r.experiments == tiny.experiments[r.seed]


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
    with pytest.raises(ConfigurationError, match="--seeds 1 1: give one or more distinct seeds"):
        run_demo(DemoConfig(seeds=(1, 1)))
    with pytest.raises(ConfigurationError, match="--workers 0"):
        run_demo(DemoConfig(workers=0))
    assert (seeds_text([3]), seeds_text([0, 1, 2, 3]), seeds_text([0, 2, 5])) == ("seed 3", "seeds 0–3",
                                                                                  "seeds 0, 2, 5")


def test_the_demo_command_line() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.labs, args.budget, args.seeds, args.seed, args.workers, args.no_optuna, args.out) == (
        ["3"], 17, [0, 1, 2, 3], None, 2, False, "runs")
    args = build_parser().parse_args(["demo", "--seed", "5", "--workers", "1"])
    assert args.seed == 5 and args.workers == 1
    assert build_parser().parse_args(["demo", "--seeds", "4", "7"]).seeds == [4, 7]
    with pytest.raises(SystemExit):  # one seed or several, not both
        build_parser().parse_args(["demo", "--seed", "1", "--seeds", "0", "1"])
    args = build_parser().parse_args(["demo", "--labs", *LABS, "--budget", "5", "--no-optuna"])
    assert args.labs == list(LABS) and args.budget == 5 and args.no_optuna
    suite = build_parser().parse_args(["bench", "demo-suite", "--sites", "2"])  # the former demo, kept as a suite
    assert suite.sites == 2 and suite.problem == "wing_weight"
