"""The report's figures (matplotlib): legends sit outside the axes, never on data or labels; names are
written in full (wrapped), a categorical's choices one per row, sorted; :func:`png` encodes one."""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # no display: figures go to files
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from labfbo.core.progress import human_bytes  # noqa: E402,F401 - the page's filter too
from labfbo.models.outcomes import pareto_front  # noqa: E402
from labfbo.report.campaign import Campaign, Experiment  # noqa: E402
from labfbo.report.insight import Dependence  # noqa: E402

DPI = 110
FIG_WIDTH = 8.5  # inches: the report's column at DPI, shown unscaled
TICK_FONT = 9
LABEL_CHARS = 48  # a choice's tick label wraps past this many characters (most reagent names fit one line)
LABEL_LINES = 2  # and loses its middle past this many lines
IMPORTANCE_CHARS = 40
CHARS_PER_INCH = 11  # axis-label characters an inch holds (10 pt)
ROW_PITCH, LINE_HEIGHT = 0.24, 0.16  # inches per row of a one-line label; per extra line
NUMERIC_HEIGHT, LEGEND_HEIGHT = 3.4, 0.4
MIN_HEIGHT = 2.6  # inches: the importance figure of a few parameters
NUMERIC_PER_ROW = 3
_BREAKS = "-,;)] /"  # a long name breaks after one of these
GOOD, BEST, BAD, PALE = "#1f77b4", "#d62728", "#b2182b", "#dddddd"


def png(fig: "plt.Figure | None") -> bytes | None:
    """The figure as PNG bytes (and closed); None for None."""
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _legend_below(ax: "plt.Axes", ncol: int = 4) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(ncol, len(handles)),
                  frameon=False, fontsize=9)


def param_label(campaign: Campaign, name: str) -> str:
    unit = campaign.space.params[campaign.space.names.index(name)].unit
    return f"{name} [{unit}]" if unit else name


def _spans(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs of experiment numbers."""
    runs: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def progress_figure(campaign: Campaign, ylabel: str) -> "plt.Figure":
    """Every measurement against experiment number, the best so far, failures and the initial design."""
    exps = campaign.experiments
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for k, (a, b) in enumerate(_spans([e.number for e in exps if e.initial])):
        ax.axvspan(a - 0.5, b + 0.5, color=PALE, zorder=0, label="initial design" if k == 0 else None)

    def scatter(rows: list[Experiment], label: str, **style: object) -> None:
        if rows:
            ax.scatter([e.number for e in rows], [e.value for e in rows], label=label, zorder=3, **style)  # type: ignore[arg-type]

    done = [e for e in exps if e.state == "complete"]
    scatter(
        [e for e in done if e.feasible and e.source == "historical"], "earlier data", marker="s", color="#777777", s=24
    )
    scatter([e for e in done if e.feasible and e.source != "historical"], "measurement", color=GOOD, s=24)
    scatter([e for e in done if not e.feasible], "infeasible (misses an outcome limit)", facecolors="none",
            edgecolors=BAD, s=36, linewidths=1.3)
    sign = 1.0 if campaign.maximize else -1.0
    xs, best, cur = [], [], None
    for e in exps:
        if e.state == "complete" and e.feasible:
            cur = e.value if cur is None else (cur if sign * cur >= sign * e.value else e.value)  # type: ignore[operator]
        if cur is not None:
            xs.append(e.number)
            best.append(cur)
    if xs:
        ax.step(xs, best, where="post", color=BEST, lw=1.8, label="best so far", zorder=4)
    failed = [e.number for e in exps if e.state == "failed"]
    if failed:
        trans = blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter(failed, [0.03] * len(failed), marker="x", color=BAD, transform=trans, s=40, zorder=5,
                   label="failed run (no value)", clip_on=False)
    ax.set_xlabel("experiment number")
    ax.set_ylabel(ylabel)
    ax.set_xlim(0.5, max([e.number for e in exps] + [1]) + 0.5)
    ax.grid(alpha=0.3)
    _legend_below(ax, ncol=3)
    return fig


def pareto_figure(campaign: Campaign) -> "plt.Figure | None":
    """The first two objectives of every feasible measurement, the Pareto front highlighted."""
    spec = campaign.spec
    if spec is None or not spec.multi:
        return None
    (a, b) = spec.objectives[:2]
    done = [e for e in campaign.completed() if e.outcomes]
    if not done:
        return None
    front = pareto_front(spec, done)
    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    for rows, style in (([e for e in done if e.feasible], dict(color=GOOD, s=22, label="feasible measurement")),
                        ([e for e in done if not e.feasible],
                         dict(facecolors="none", edgecolors=BAD, s=32, label="infeasible"))):
        if rows:
            ax.scatter([e.outcomes[a.name] for e in rows], [e.outcomes[b.name] for e in rows],  # type: ignore[index]
                       zorder=3, **style)  # type: ignore[arg-type]
    pts = sorted((o.outcomes[a.name], o.outcomes[b.name]) for o in front)
    if pts:
        ax.plot(*zip(*pts), "-o", color=BEST, ms=6, lw=1.5, label="Pareto front (best trade-offs)", zorder=4)
    ax.set_xlabel(f"{a.name} ({a.direction})")
    ax.set_ylabel(f"{b.name} ({b.direction})")
    ax.grid(alpha=0.3)
    _legend_below(ax, ncol=3)
    return fig


def _wrap(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters, each broken after a hyphen, comma, bracket or space
    in its second half, else cut."""
    out: list[str] = []
    while len(text) > width:
        cut = max((i + 1 for i, ch in enumerate(text[:width]) if ch in _BREAKS), default=0)
        cut = cut if cut >= width // 2 else width
        out.append(text[:cut])
        text = text[cut:]
    return [*out, text]


def wrap_label(text: str, width: int = LABEL_CHARS, lines: int = LABEL_LINES) -> str:
    """``text`` in at most ``lines`` lines of at most ``width`` characters, every character kept
    (the lines joined give ``text`` back) unless it needs more lines: then its middle gives way to
    an ellipsis (its start and its end, where names differ, kept)."""
    out = _wrap(text, width)
    keep = min(len(text), width * lines) - 1  # characters kept, the ellipsis included
    while len(out) > lines and keep > 2:
        tail = keep // 3
        out = _wrap(text[: keep - 1 - tail] + "\u2026" + text[len(text) - tail:], width)
        keep -= 2
    return "\n".join(out)


def choice_labels(values: Sequence[object], width: int = LABEL_CHARS) -> list[str]:
    """Tick labels of a categorical's choices, wrapped; each one different from the others
    (choices shown as Python writes them if their text is alike, numbered if shortening made two alike)."""
    texts = [str(v) for v in values]
    if len(set(texts)) < len(texts):  # e.g. the choices "1" and 1
        texts = [repr(v) for v in values]
    labels = [wrap_label(t, width) for t in texts]
    if len(set(labels)) < len(labels):
        labels = [wrap_label(f"{k}. {t}", width) for k, t in enumerate(texts, start=1)]
    return labels


def _lines(labels: Sequence[str]) -> int:
    return max((label.count("\n") + 1 for label in labels), default=1)


def _row_pitch(labels: Sequence[str]) -> float:
    """Inches per row of a horizontal panel: the tallest label and a gap."""
    return ROW_PITCH + LINE_HEIGHT * (_lines(labels) - 1)


def importance_figure(campaign: Campaign, shares: dict[str, float]) -> "plt.Figure":
    """Each parameter's share of the predicted variation, the largest on top, names in full (wrapped)."""
    names = sorted(shares, key=lambda n: (-shares[n], n))[::-1]  # drawn bottom-up: the largest on top
    labels = [wrap_label(param_label(campaign, n), IMPORTANCE_CHARS) for n in names]
    values = np.array([100 * shares[n] for n in names], dtype=np.float64)
    height = max(MIN_HEIGHT, 0.9 + (_row_pitch(labels) + 0.08) * len(names))
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, height), layout="constrained")
    y = np.arange(len(names))
    bars = ax.barh(y, values, height=0.65, color=GOOD)
    ax.bar_label(bars, [f"{v:.0f} %" if v >= 1 or v == 0 else "<1 %" for v in values], padding=3, fontsize=TICK_FONT)
    ax.set_yticks(y, labels, fontsize=TICK_FONT)
    ax.set_ylim(-0.6, len(names) - 0.4)
    top = float(values.max()) if len(values) else 0.0
    ax.set_xlim(0, max(10.0, 10 * np.ceil(top * 1.15 / 10)))  # room for the largest bar's number
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([t for t in np.arange(0, 101, 10 if top > 40 else 5)
                                                               if t <= ax.get_xlim()[1]]))
    ax.set_xlabel("share of the predicted variation (%)")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _choice_panel(ax: "plt.Axes", campaign: Campaign, dep: Dependence, xlabel: str) -> None:
    """A categorical's partial dependence: one row per choice, the best predicted on top."""
    sign = 1.0 if campaign.maximize else -1.0
    order = np.argsort(-sign * np.asarray(dep.mean), kind="stable")
    labels = choice_labels(dep.values)
    y = np.arange(len(order))[::-1]  # the first of the order on top
    mean, std = np.asarray(dep.mean)[order], np.asarray(dep.std)[order]
    ax.errorbar(mean, y, xerr=std, fmt="o", color=GOOD, ms=5, elinewidth=1.4, capsize=2.5,
                label="a choice's mean prediction ± model uncertainty (1 sd)")
    ax.set_yticks(y, [labels[i] for i in order], fontsize=TICK_FONT)
    ax.set_ylim(-0.6, len(order) - 0.4)
    lo, hi = float(np.nanmin(mean - std, initial=np.inf)), float(np.nanmax(mean + std, initial=-np.inf))
    if np.isfinite(lo) and np.isfinite(hi):  # else matplotlib's own limits
        ax.set_xlim(lo - 0.05 * (hi - lo + 1e-12), hi + 0.05 * (hi - lo + 1e-12))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(param_label(campaign, dep.name))
    ax.set_title(f"{len(order)} choices, the {'highest' if sign > 0 else 'lowest'} prediction on top",
                 fontsize=TICK_FONT, loc="left")
    ax.grid(alpha=0.3)


def _numeric_panel(ax: "plt.Axes", campaign: Campaign, dep: Dependence, width_in: float) -> None:
    x = np.asarray(dep.values, dtype=np.float64)
    ax.fill_between(x, dep.mean - dep.std, dep.mean + dep.std, color=GOOD, alpha=0.2,
                    label="model uncertainty (± 1 sd)")
    ax.plot(x, dep.mean, color=GOOD, lw=2, label="mean prediction")
    ax.set_xlabel(wrap_label(param_label(campaign, dep.name), max(12, int(width_in * CHARS_PER_INCH)), lines=3))
    ax.grid(alpha=0.3)


def dependence_figure(campaign: Campaign, deps: Sequence[Dependence], ylabel: str) -> "plt.Figure":
    """The partial dependence on each of ``deps``, in their order: numeric parameters side by side
    (at most three a row, one y axis), each categorical one a panel of its own, a row per choice
    (the figure grows with the choices); one legend below every panel."""
    rows: list[list[Dependence]] = []
    for dep in deps:
        if not dep.categorical and rows and not rows[-1][0].categorical and len(rows[-1]) < NUMERIC_PER_ROW:
            rows[-1].append(dep)
        else:
            rows.append([dep])
    heights = [0.95 + _row_pitch(choice_labels(row[0].values)) * len(row[0].values)
               if row[0].categorical else NUMERIC_HEIGHT for row in rows]
    fig = plt.figure(figsize=(FIG_WIDTH, sum(heights) + LEGEND_HEIGHT), layout="constrained")
    subs = fig.subfigures(len(rows) + 1, 1, height_ratios=[*heights, LEGEND_HEIGHT], squeeze=False)[:, 0]
    axes: list["plt.Axes"] = []
    for sub, row in zip(subs, rows):
        if row[0].categorical:
            ax = sub.subplots()
            _choice_panel(ax, campaign, row[0], ylabel)
            axes.append(ax)
            continue
        panels = sub.subplots(1, len(row), squeeze=False, sharey=True)[0]
        for ax, dep in zip(panels, row):
            _numeric_panel(ax, campaign, dep, FIG_WIDTH / len(row))
        panels[0].set_ylabel(ylabel)
        axes.extend(panels)
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        subs[-1].legend(list(seen.values()), list(seen), loc="center", ncol=min(3, len(seen)), frameon=False,
                        fontsize=TICK_FONT)
    return fig


def traffic_figure(campaign: Campaign, epsilons: Sequence[float]) -> "plt.Figure | None":
    """Bytes sent and received per round; with DP, the cumulative epsilon after each release."""
    entries = campaign.state.traffic
    if not entries:
        return None
    up: dict[int, int] = defaultdict(int)
    down: dict[int, int] = defaultdict(int)
    for e in entries:
        (up if e.direction == "sent" else down)[e.round] += e.nbytes
    rounds = sorted(set(up) | set(down))
    epsilons = epsilons if any(np.isfinite(e) for e in epsilons) else []  # no DP noise: no finite curve to draw
    panels = 2 if epsilons else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.6), squeeze=False)
    ax = axes[0][0]
    x = np.arange(len(rounds))
    ax.bar(x - 0.2, [up[r] for r in rounds], 0.4, label="sent", color=BEST)
    ax.bar(x + 0.2, [down[r] for r in rounds], 0.4, label="received", color=GOOD)
    ax.set_xticks(x, ["join" if r < 0 else str(r) for r in rounds])
    if len(rounds) > 15:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(10, integer=True))
    sizes = [v for v in [*up.values(), *down.values()] if v > 0]
    wide = bool(sizes) and max(sizes) > 100 * min(sizes)  # a warm-up 1000x a later round: log scale
    if wide:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: human_bytes(v)))
    ax.set_xlabel("round")
    ax.set_ylabel("size per round" + (" (log scale)" if wide else ""))
    ax.grid(axis="y", alpha=0.3)
    _legend_below(ax, ncol=2)
    if epsilons:
        ax2 = axes[0][1]
        finite = [e if np.isfinite(e) else np.nan for e in epsilons]
        ax2.plot(np.arange(1, len(finite) + 1), finite, color=BEST, lw=2)
        ax2.set_xlabel("release number")
        ax2.set_ylabel("cumulative ε (privacy loss)")
        ax2.grid(alpha=0.3)
    return fig
