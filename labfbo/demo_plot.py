"""The demo's figure: best yield so far per lab against the number of experiments."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Mapping, Sequence

from labfbo.demo_runs import METHODS

STYLE = {"surface": {"color": "#1f6fb4", "lw": 2.6, "zorder": 4},  # on top where the lines coincide
         "independent": {"color": "#e07b1a", "lw": 1.8, "zorder": 3},
         "optuna": {"color": "#5a9e3a", "lw": 1.8, "ls": (0, (4, 2)), "zorder": 5}}


def plot_best_so_far(labs: Sequence[str], best_in_data: Mapping[str, float],
                     curves: Mapping[str, Sequence[Sequence[float | None]]], path: Path, title: str, citation: str,
                     n_init: int) -> Path:
    """One panel per lab (titled with its name), one line per method (``curves``: method -> per
    lab, the best yield after 1, 2, ... experiments; None before any succeeded), the lab's best
    in the data dashed, the ``n_init`` shared first experiments shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = len(labs)
    fig, axes = plt.subplots(1, n, figsize=(4.3 * n, 4.1), sharey=True, squeeze=False)
    for i, (lab, ax) in enumerate(zip(labs, axes[0])):
        total = 0
        for m, per_lab in curves.items():
            y = per_lab[i]
            total = max(total, len(y))
            shown = [float("nan") if v is None else v for v in y]
            ax.step([*range(1, len(y) + 1), len(y) + 0.5], [*shown, shown[-1]], where="post",
                    label=METHODS[m], **STYLE[m])
        ax.axvspan(0.5, n_init + 0.5, color="0.92", zorder=0)
        ax.axhline(best_in_data[lab], color="0.35", ls="--", lw=1.0)
        ax.annotate(f"best in the data: {best_in_data[lab]:.1f} %", (total, best_in_data[lab]),
                    xytext=(0, 4), textcoords="offset points", ha="right", fontsize=8, color="0.3")
        ax.set_title(lab, fontsize=11)
        ax.set_xlabel("experiments in this lab")
        ax.set_xlim(0.5, total + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.text(0.5 + n_init / 2, 3, "same start", ha="center", fontsize=7, color="0.4")
    axes[0][0].set_ylabel("best yield so far (%)")
    axes[0][0].legend(loc="lower right", fontsize=8, framealpha=0.9)
    width = int(4.3 * n * 13)  # characters of an 11-point line across the figure
    fig.suptitle("\n".join(textwrap.wrap(title, width)), fontsize=11)
    fig.text(0.5, 0.01, "\n".join(textwrap.wrap(citation, int(width * 1.5))), ha="center", va="bottom", fontsize=7,
             color="0.35")
    fig.tight_layout(rect=(0, 0.05 if len(citation) > width * 1.5 else 0.035, 1, 0.95 if len(title) < width else 0.91))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

