"""A site's campaign report: built from the journal alone, rendered in a real browser (headless
Chromium through chromedriver), its PNGs readable, its importance measure right."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

import labfbo
from labfbo.cli import main as cli
from labfbo.privacy import DP
from labfbo.report import Campaign, plots, write_report
from labfbo.report.insight import SiteModel
from tests.browser import chromium, console_errors

FAST = {"num_restarts": 2, "raw_samples": 64}  # cheap acquisition optimization (as conftest.FAST)

N_EXPERIMENTS, FAIL_EVERY = 30, 7
LAB_SPACE = labfbo.SearchSpace([
    labfbo.Real("temperature", 20.0, 120.0, unit="degC"),
    labfbo.Real("time", 1.0, 60.0, unit="min"),
    labfbo.Integer("equivalents", 1, 5),
    labfbo.Categorical("solvent", ["DMF", "THF", "MeCN"]),
])


def lab_yield(p: dict) -> float:
    return (80 - 10 * ((p["temperature"] - 85) / 20) ** 2 - 5 * ((p["time"] - 30) / 15) ** 2 + 3 * p["equivalents"]
            + {"DMF": 5.0, "THF": 0.0, "MeCN": -4.0}[p["solvent"]])


@pytest.fixture(scope="module")
def lab_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real-shaped campaign: mixed space with units, failed runs, 30 experiments."""
    path = tmp_path_factory.mktemp("lab") / "site.journal"
    rng = np.random.default_rng(0)
    with labfbo.Optimizer(LAB_SPACE, "maximize", seed=1, storage=path, n_init=16, **FAST) as opt:
        for i in range(N_EXPERIMENTS):
            t = opt.ask()
            if i % FAIL_EVERY == 3:
                opt.tell_failed(t, "pump blocked")
            else:
                opt.tell(t, lab_yield(t.params) + float(rng.normal(0, 1)))
    return path


@pytest.fixture(scope="module")
def federated_journals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, labfbo.SimulationResult]:
    """Three sites of a DP `distribution` campaign, every site journaled."""
    folder = tmp_path_factory.mktemp("fed")
    proto = labfbo.protocols.Distribution(privacy=DP(noise_multiplier=4.0), **FAST)
    res = labfbo.simulate("branin", protocol=proto, n_sites=3, n_init=4, budget=4, seed=0, storage_dir=folder)
    return folder, res


def _page(url: str, shot: Path) -> tuple[list[str], dict]:
    """Load ``url`` in headless Chromium: console errors, a screenshot, and what the test reads."""
    with chromium(1200, 2400) as browser:
        browser.get(url)
        errors = console_errors(browser)
        browser.save_screenshot(str(shot))
        read = browser.execute_script("""
            const text = id => { const e = document.getElementById(id); return e ? e.innerText : null; };
            const rows = id => { const e = document.getElementById(id); return e ? e.querySelectorAll('tr').length : -1;
            };
            const images = Array.from(document.images).map(i => ({id: i.id, w: i.naturalWidth, h: i.naturalHeight}));
            return {title: document.title, summary: text('summary'), predicted: text('predicted-best'),
                    left: text('improvement-left'), failed: text('n-failed'), experiments: rows('experiments-table'),
                    importance: rows('importance-table'), federation: text('federation'), epsilon: text('epsilon'),
                    guidance: rows('guidance-table'), contribution: text('contribution'), images: images};""")
    return errors, read


@pytest.mark.integration
def test_the_report_of_a_real_shaped_campaign_renders_in_chromium(lab_journal: Path, tmp_path: Path) -> None:
    before = lab_journal.read_bytes()
    rep = write_report(lab_journal, tmp_path / "report.html", objective_label="yield (%)")
    assert lab_journal.read_bytes() == before  # the report only reads the journal
    errors, page = _page(rep.html.as_uri(), tmp_path / "report.png")
    assert errors == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert page["title"] == "Campaign report: site-0"
    n_failed = sum(i % FAIL_EVERY == 3 for i in range(N_EXPERIMENTS))
    assert page["failed"] == str(n_failed)
    assert page["experiments"] == N_EXPERIMENTS + 1  # a header row and one per experiment
    assert page["importance"] == len(LAB_SPACE.names) + 1
    assert "temperature [degC]" in page["predicted"] and "solvent" in page["predicted"]
    assert "Expected improvement left" in page["left"]
    assert page["federation"] is None  # a single-site campaign claims nothing about a federation
    shown = {i["id"]: i for i in page["images"]}
    assert {"img-progress", "img-importance", "img-dependence"} <= set(shown)
    assert all(i["w"] > 300 and i["h"] > 150 for i in shown.values())  # every embedded plot decoded


@pytest.mark.integration
def test_the_report_of_a_federated_site_shows_what_left_it(federated_journals, tmp_path: Path) -> None:
    folder, res = federated_journals
    rep = write_report(folder / "site-0.journal", tmp_path / "site-0.html")
    errors, page = _page(rep.html.as_uri(), tmp_path / "site-0.png")
    assert errors == []
    assert "distribution" in page["summary"] and page["federation"] is not None
    assert "messages" in page["federation"]
    # the epsilon the report computes from the journal is the site's own accounting
    shown = float(page["epsilon"].split("ε = ")[1].split()[0])
    assert shown == pytest.approx(res.epsilon[0], rel=1e-3)
    assert page["guidance"] == 4 + 1  # one row per round's guidance (budget 4) and a header
    assert "Not estimated" in page["contribution"]  # nothing claimed that one journal cannot show
    assert "img-traffic" in {i["id"] for i in page["images"]}


@pytest.mark.integration  # a three-site surface campaign and Chromium
def test_a_surface_sites_report_estimates_what_its_partners_surface_was_worth(tmp_path: Path) -> None:
    res = labfbo.simulate("branin", protocol="surface", n_sites=3, n_init=4, budget=4, seed=0,
                          storage_dir=tmp_path / "fed", **FAST)
    campaign = Campaign.from_journal(tmp_path / "fed" / "site-1.journal")
    marks = campaign.state.transfer
    assert [r for r, _ in marks] == [0, 1, 2, 3], marks  # every proposal on the partners' surface
    for _, e in marks:
        assert e.alone > 0 and e.shared > 0 and e.gain == pytest.approx(1 - e.shared / e.alone)
        assert e.n >= 4 and e.scale is not None and e.agreement is not None
    rep = write_report(tmp_path / "fed" / "site-1.journal", tmp_path / "site-1.html")
    errors, page = _page(rep.html.as_uri(), tmp_path / "site-1.png")
    assert errors == [] and res is not None
    last = marks[-1][1]
    said = f"{'removed' if last.gain >= 0 else 'added'} {abs(100 * last.gain):.0f} %"
    assert said in page["contribution"] and "held-out prediction error" in page["contribution"]
    assert "Not estimated" not in page["contribution"] and f"weight {last.agreement:.2f}" in page["contribution"]


def test_every_png_is_readable_with_labels_and_legends_off_the_data(lab_journal: Path, tmp_path: Path) -> None:
    rep = write_report(lab_journal, tmp_path / "r.html", objective_label="yield (%)")
    assert set(rep.plots) == {"progress", "importance", "dependence"}
    for path in rep.plots.values():
        img = mpimg.imread(path)
        assert img.shape[0] >= 250 and img.shape[1] >= 400, path
    campaign = Campaign.from_journal(lab_journal)
    model = SiteModel(campaign)
    figures = [plots.progress_figure(campaign, "yield (%)"),
               plots.dependence_figure(campaign, [model.dependence("temperature"), model.dependence("solvent")],
                                       "yield (%)")]
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            assert ax.get_xlabel(), "every axis is labelled"
            legend = ax.get_legend()
            if legend is not None:
                assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
        plots.plt.close(fig)
    assert figures[0].axes[0].get_ylabel() == "yield (%)"
    assert figures[1].axes[0].get_xlabel() == "temperature [degC]"  # the lab's units


def test_importance_ranks_the_parameters_without_effect_last() -> None:
    space = labfbo.SearchSpace([labfbo.Real(n, 0.0, 1.0) for n in "abcdef"])
    rng = np.random.default_rng(3)
    X = rng.random((60, 6))

    def f(x: np.ndarray) -> float:  # c and f have no effect
        return float(np.sin(3 * x[0]) + 2 * x[1] ** 2 + 0.8 * x[3] + 0.5 * np.cos(4 * x[4]) + rng.normal(0, 0.01))

    opt = labfbo.Optimizer(space, "minimize", seed=0, **FAST)
    opt.add_observations([dict(zip(space.names, row)) for row in X], [f(row) for row in X])
    shares = SiteModel(Campaign.from_records(opt.journal_records())).importance()
    assert math.isclose(sum(shares.values()), 1.0)
    ranked = sorted(shares, key=shares.get)
    assert set(ranked[:2]) == {"c", "f"}, shares
    assert max(shares["c"], shares["f"]) < 0.05


def test_a_live_optimizer_writes_its_report_and_the_cli_reads_a_journal(lab_journal: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", str(lab_journal), "-o", str(tmp_path / "cli.html")]) == 0  # its model in a forked process
    assert (tmp_path / "cli.html").exists() and (tmp_path / "cli_plots" / "progress.png").exists()
    here = write_report(lab_journal, tmp_path / "here.html").html.read_text()  # ... and in this one: the same numbers
    for element in ("predicted-best", "improvement-left", "importance-table"):
        pattern = rf'id="{element}".*?</(p|table)>'
        assert re.search(pattern, here, re.S).group(0) == re.search(pattern, (tmp_path / "cli.html").read_text(),
                                                                      re.S).group(0)
    assert "report:" in capsys.readouterr().out
    assert cli(["report", str(tmp_path / "missing.journal")]) == 2
    assert "no such journal" in capsys.readouterr().err
    opt = labfbo.Optimizer(LAB_SPACE, "maximize", seed=0, n_init=3, **FAST)
    for _ in range(3):
        t = opt.ask()
        opt.tell(t, lab_yield(t.params))
    rep = opt.report(str(tmp_path / "live.html"))
    assert "Campaign report" in rep.html.read_text()
    with pytest.raises(labfbo.LabFBOError, match=r"\.html"):
        opt.report(str(tmp_path / "live.pdf"))


def test_one_experiment_gives_a_report_without_a_model(tmp_path: Path) -> None:
    opt = labfbo.Optimizer(LAB_SPACE, "maximize", seed=0, n_init=3, **FAST)
    t = opt.ask()
    opt.tell(t, 10.0)
    html = opt.report(str(tmp_path / "one.html")).html.read_text()
    assert "No model yet" in html and "at least two completed experiments" in html


def test_traffic_and_guidance_are_journaled_and_replayed(federated_journals) -> None:
    folder, res = federated_journals
    campaign = Campaign.from_journal(folder / "site-1.journal")
    sent = [m for m in campaign.state.traffic if m.direction == "sent"]
    assert sent[0].kind == "join" and {m.kind for m in sent[1:]} == {"optimum_belief"}
    assert sum(m.nbytes for m in sent if m.round >= 0) == pytest.approx(res.bytes_up[1].sum())
    assert [g.round for g in campaign.state.guidance] == [0, 1, 2, 3]
    assert campaign.state.guidance[0].summary["weights"]["shape"]  # shapes (and small arrays) only


def test_simulate_refuses_a_folder_that_already_holds_journals(federated_journals) -> None:
    folder, _ = federated_journals
    with pytest.raises(labfbo.ConfigurationError, match="already holds a journal"):
        labfbo.simulate("branin", n_sites=3, budget=1, n_init=2, seed=0, storage_dir=folder, **FAST)


def test_several_objectives_show_the_pareto_front_and_infeasible_points(tmp_path: Path) -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])
    opt = labfbo.Optimizer(space, [labfbo.Objective("yield", "maximize"), labfbo.Objective("cost", "minimize")],
                           outcome_constraints=[labfbo.Outcome("impurity", "<=", 0.5)], seed=0, **FAST)
    rng = np.random.default_rng(0)
    X = rng.random((12, 2))
    values = [{"yield": float(a + b), "cost": float(a * 2 + 0.1), "impurity": float(b)} for a, b in X]
    opt.add_observations([{"x": a, "y": b} for a, b in X], values)
    rep = opt.report(str(tmp_path / "mo.html"))
    assert {"progress", "pareto"} <= set(rep.plots)
    html = rep.html.read_text()
    n_bad = sum(v["impurity"] > 0.5 for v in values)
    assert n_bad and f"<b>{n_bad}</b>infeasible" in html and 'id="img-pareto"' in html
    best = max((v for v in values if v["impurity"] <= 0.5), key=lambda v: v["yield"])
    assert f'<b id="best-value">{best["yield"]:.4g}</b>' in html  # the best *feasible* value, by the first objective


def test_partial_dependence_keeps_its_values_in_a_constrained_space_and_caps_wide_integers() -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0.0, 1.0), labfbo.Real("b", 0.0, 1.0), labfbo.Real("c", 0.0, 1.0),
                                labfbo.Integer("rpm", 0, 100_000)],
                               constraints=[labfbo.LinearConstraint({"a": 1, "b": 1, "c": 1}, "<=", 1.0)])
    opt = labfbo.Optimizer(space, "maximize", seed=0, **FAST)
    rng = np.random.default_rng(1)
    rows = space.decode(space.sample(20, 0))
    opt.add_observations(rows, [2 * r["a"] + r["rpm"] / 1e5 + float(rng.normal(0, 0.01)) for r in rows])
    model = SiteModel(Campaign.from_records(opt.journal_records()))
    dep = model.dependence("a")
    assert dep.values == pytest.approx(list(np.linspace(0, 1, 25)))  # not projected back onto a + b + c <= 1
    seen = np.asarray(dep.values) <= max(r["a"] for r in rows)  # beyond the data the GP reverts to its mean
    assert seen.sum() >= 8 and np.all(np.diff(np.asarray(dep.mean)[seen]) > 0)  # it rises with a, as the data do
    wide = model.dependence("rpm")
    assert len(wide.values) == 25 and wide.values[0] == 0 and wide.values[-1] == 100_000


def test_a_resumed_site_journals_each_rounds_guidance_once(tmp_path: Path) -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])
    coord = labfbo.Coordinator("distribution", sites=["a"], space=space, seed=0, **FAST)
    kw = dict(protocol="distribution", coordinator=coord, site="a", seed=0, n_init=3, storage=tmp_path / "a.journal",
              secret=1, **FAST)
    opt = labfbo.Optimizer(space, "minimize", **kw)
    for _ in range(3):
        t = opt.ask()
        opt.tell(t, float(t.params["x"]))
    opt.ask()  # round 0's guidance, then the site stops before telling
    opt.close()
    again = labfbo.Optimizer(space, "minimize", **kw)
    again.ask()  # asks round 0 again (the guidance is not kept across a restart)
    again.close()
    assert [g.round for g in Campaign.from_journal(tmp_path / "a.journal").state.guidance] == [0]
