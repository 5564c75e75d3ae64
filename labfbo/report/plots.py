"""The report's figures (matplotlib): legends sit outside the axes, never on data; :func:`png` encodes one."""

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

from labfbo.progress import human_bytes  # noqa: E402,F401 - the page's filter too
from labfbo.report.campaign import Campaign, Experiment  # noqa: E402
from labfbo.report.insight import Dependence  # noqa: E402

DPI = 110
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
    scatter([e for e in done if e.feasible and e.source == "historical"], "earlier data", marker="s", color="#777777", s=24)
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
    front = spec.pareto_front(done)
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


def importance_figure(campaign: Campaign, shares: dict[str, float]) -> "plt.Figure":
    names = sorted(shares, key=lambda n: shares[n])
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(names) + 1.2))
    ax.barh([param_label(campaign, n) for n in names], [100 * shares[n] for n in names], color=GOOD)
    ax.set_xlabel("share of the predicted variation (%)")
    ax.set_xlim(0, 100)
    ax.grid(axis="x", alpha=0.3)
    return fig


def dependence_figure(campaign: Campaign, deps: Sequence[Dependence], ylabel: str) -> "plt.Figure":
    fig, axes = plt.subplots(1, len(deps), figsize=(4.2 * len(deps), 3.6), squeeze=False, sharey=True)
    for ax, dep in zip(axes[0], deps):
        if dep.categorical:
            labels = [str(v) for v in dep.values]
            if len(set(labels)) < len(labels):  # e.g. the choices "1" and 1: show them as Python writes them
                labels = [repr(v) for v in dep.values]
            ax.bar(labels, dep.mean, yerr=dep.std, color=GOOD, alpha=0.85, capsize=3,
                   label="mean prediction ± model uncertainty")
            ax.tick_params(axis="x", rotation=30 if max(len(s) for s in labels) > 6 else 0)
            lo = float(np.min(dep.mean - dep.std))
            hi = float(np.max(dep.mean + dep.std))
            ax.set_ylim(lo - 0.1 * (hi - lo + 1e-12), hi + 0.1 * (hi - lo + 1e-12))
        else:
            x = np.asarray(dep.values, dtype=np.float64)
            ax.fill_between(x, dep.mean - dep.std, dep.mean + dep.std, color=GOOD, alpha=0.2,
                            label="model uncertainty (± 1 sd)")
            ax.plot(x, dep.mean, color=GOOD, lw=2, label="mean prediction")
        ax.set_xlabel(param_label(campaign, dep.name))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    _legend_below(axes[0][0], ncol=2)
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
