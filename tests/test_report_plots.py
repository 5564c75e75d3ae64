"""The report's importance and partial-dependence figures stay readable on a real reagent list:
the 23 additives of the Buchwald-Hartwig data (names up to 47 characters), drawn and measured
(each label's rendered box, against the others, the legend and the figure's edge)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox

import labfbo
from labfbo.datasets import load_reactions
from labfbo.report import Campaign, plots
from labfbo.report.insight import Dependence, SiteModel

N_EXPERIMENTS = 12  # all of them the initial design: no acquisition optimization, a fast journal
LOADING = "catalyst loading relative to the aryl halide"  # a long parameter name, with a unit


@pytest.fixture(scope="module")
def reagent_campaign(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """A single-site `independent` campaign over the real additive and ligand lists, journaled."""
    data = load_reactions()
    names = data.space.names
    additives = list(data.space.params[names.index("additive")].choices)
    ligands = list(data.space.params[names.index("ligand")].choices)
    assert len(additives) == 23
    space = labfbo.SearchSpace([
        labfbo.Categorical("additive", additives),
        labfbo.Categorical("ligand", ligands),
        labfbo.Discrete("base equivalents", [1.0, 1.5, 2.0, 3.0]),
        labfbo.Real(LOADING, 0.5, 5.0, unit="mol%"),
    ])
    table = data.tables[0]

    def measured(p: dict) -> float:
        base = data.space.params[names.index("base")].choices[0]
        key = tuple({"base": base, "ligand": p["ligand"], "additive": p["additive"]}[n] for n in names)
        y = table.get(key, float("nan"))
        return (0.0 if np.isnan(y) else y) + 2.0 * p["base equivalents"] + 1.5 * np.log(p[LOADING])

    path = tmp_path_factory.mktemp("reagents") / "site.journal"
    with labfbo.Optimizer(space, "maximize", seed=3, storage=path, n_init=N_EXPERIMENTS) as opt:
        for _ in range(N_EXPERIMENTS):
            t = opt.ask()
            opt.tell(t, measured(t.params))
    return Campaign.from_journal(path)


def _drawn_tick_labels(fig: Figure) -> list[Text]:
    """The tick labels the canvas drew: visible, non-empty, their tick inside the view."""
    out = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            locs = axis.get_majorticklocs()
            lo, hi = sorted(axis.get_view_interval())
            tol = 1e-9 * max(1.0, abs(hi - lo))
            for tick, loc in zip(axis.get_major_ticks(len(locs)), locs):
                if not lo - tol <= loc <= hi + tol:
                    continue
                out += [t for t in (tick.label1, tick.label2) if t.get_visible() and t.get_text().strip()]
    return out


def _legend_boxes(fig: Figure, renderer: RendererBase) -> list[Bbox]:
    """Every legend's box: an axes', the figure's or a sub-figure's."""
    return [lg.get_window_extent(renderer) for lg in fig.findobj(Legend)]


def assert_readable(fig: Figure, legend: bool = True) -> None:
    """No tick label, axis label or title overlaps another or a legend; each lies inside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks = _drawn_tick_labels(fig)
    assert ticks, "the figure draws tick labels"
    texts = [*ticks, *(t for ax in fig.axes for t in (ax.xaxis.label, ax.yaxis.label, ax.title)
                       if t.get_visible() and t.get_text())]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), f"labels {a!r} and {b!r} overlap"
    legends = _legend_boxes(fig, renderer)
    assert bool(legends) == legend
    page = fig.bbox
    for t in texts:
        box = t.get_window_extent(renderer)
        for lg in legends:
            assert not box.overlaps(lg), f"the legend covers {t.get_text()!r}"
        assert (box.x0 >= page.x0 - 0.5 and box.x1 <= page.x1 + 0.5 and box.y0 >= page.y0 - 0.5
                and box.y1 <= page.y1 + 0.5), f"{t.get_text()!r} lies outside the figure ({box} vs {page})"
    for lg in legends:
        assert page.x0 - 0.5 <= lg.x0 and lg.x1 <= page.x1 + 0.5 and page.y0 - 0.5 <= lg.y0 and lg.y1 <= page.y1 + 0.5


def _shown(label: str) -> str:
    """A drawn label as the name it stands for (a wrapped name's lines joined)."""
    return label.replace("\n", "")


def _top_down(ax: Axes) -> list[str]:
    """The y tick labels of ``ax``, from the top, lines joined."""
    return [_shown(t.get_text()) for t in sorted(ax.get_yticklabels(), key=lambda t: -t.get_position()[1])]


def test_the_importance_figure_reads_with_long_names_sorted_by_share(reagent_campaign: Campaign) -> None:
    shares = SiteModel(reagent_campaign).importance()
    fig = plots.importance_figure(reagent_campaign, shares)
    try:
        assert_readable(fig, legend=False)
        ax = fig.axes[0]
        order = _top_down(ax)
        expected = [plots.param_label(reagent_campaign, n) for n in sorted(shares, key=lambda n: -shares[n])]
        assert order == expected  # the largest share on top
        assert f"{LOADING} [mol%]" in order
    finally:
        plots.plt.close(fig)


def test_a_23_choice_partial_dependence_is_readable_and_sorted_by_effect(reagent_campaign: Campaign) -> None:
    model = SiteModel(reagent_campaign)
    deps = [model.dependence(n) for n in ("additive", "base equivalents", LOADING, "ligand")]
    fig = plots.dependence_figure(reagent_campaign, deps, "yield (%)")
    few = plots.dependence_figure(reagent_campaign, deps[1:], "yield (%)")
    try:
        assert_readable(fig)
        assert_readable(few)
        additive = deps[0]
        panel = next(ax for ax in fig.axes if ax.get_ylabel() == "additive")
        best_first = [additive.values[i] for i in np.argsort(-additive.mean, kind="stable")]
        assert _top_down(panel) == best_first  # every name in full, the highest predicted yield on top
        assert panel.get_xlabel() == "yield (%)"
        # the numeric panels keep the lab's units on their x axis
        assert {_shown(ax.get_xlabel()) for ax in fig.axes} >= {"base equivalents", f"{LOADING} [mol%]"}
        assert fig.get_figheight() > few.get_figheight() + 23 * 0.2  # the figure grows with the choices
    finally:
        plots.plt.close(fig)
        plots.plt.close(few)


def test_thirty_choices_with_names_longer_than_a_line_stay_apart(reagent_campaign: Campaign) -> None:
    """SMILES-length names (a ligand's, 73 and 135 characters): wrapped or shortened in the middle,
    never overlapping, each told apart by its end; a minimized objective puts its lowest on top."""
    stem = "CC(C)C1=CC(C(C)C)=CC(C(C)C)=C1C2=C(P(C3CCCCC3)C4CCCCC4)C=CC=C2"
    values = [f"{stem * (1 + k % 2)}-variant-{k:02d}" for k in range(30)]
    rng = np.random.default_rng(0)
    dep = Dependence(name="additive", values=values, mean=rng.normal(50, 10, 30), std=np.full(30, 3.0),
                     categorical=True)
    minimizing = SimpleNamespace(space=reagent_campaign.space, maximize=False)  # all the figure reads
    fig = plots.dependence_figure(minimizing, [dep], "impurity (%)")  # type: ignore[arg-type]
    try:
        assert_readable(fig)
        shown = _top_down(fig.axes[0])
        assert [s[-len("variant-00"):] for s in shown] == [values[i][-len("variant-00"):] for i in np.argsort(dep.mean)]
        assert all(s in values for s in shown if "\u2026" not in s)  # the 73-character names in full
        assert sum("\u2026" in s for s in shown) == 15  # the 135-character ones shortened
        assert all(t.get_text().count("\n") <= 1 for t in fig.axes[0].get_yticklabels())  # two lines at most
    finally:
        plots.plt.close(fig)


def test_twenty_long_parameter_names_in_the_importance_figure_stay_apart() -> None:
    names = [f"reagent {k} concentration in the second addition funnel" for k in range(20)]
    space = labfbo.SearchSpace([labfbo.Real(n, 0.0, 1.0, unit="mmol/L") for n in names])
    campaign = SimpleNamespace(space=space)  # the figure reads the parameters' names and units only
    raw = np.random.default_rng(1).gamma(1.0, size=20)
    shares = dict(zip(names, raw / raw.sum()))
    fig = plots.importance_figure(campaign, shares)  # type: ignore[arg-type]
    try:
        assert_readable(fig, legend=False)
        ax = fig.axes[0]
        order = _top_down(ax)
        assert order == [f"{n} [mmol/L]" for n in sorted(names, key=lambda n: -shares[n])]
    finally:
        plots.plt.close(fig)
