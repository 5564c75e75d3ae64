"""The demo's figure: mean best yield so far over seeds, per lab, against the number of experiments."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from labfbo.apps.demo.runs import METHODS

STYLE = {"surface": {"color": "#1f6fb4", "lw": 2.6, "zorder": 4},  # on top where the lines coincide
         "independent": {"color": "#e07b1a", "lw": 1.8, "zorder": 3},
         "optuna": {"color": "#5a9e3a", "lw": 1.8, "ls": (0, (4, 2)), "zorder": 5}}


def _ext(v: np.ndarray) -> list[float]:
    """A step curve's values with its last one repeated (the last step drawn half an experiment wide)."""
    return [*v, v[-1]]


def plot_best_so_far(labs: Sequence[str], best_in_data: Mapping[str, float],
                     curves: Mapping[str, Sequence[np.ndarray]], path: Path, title: str, citation: str,
                     n_init: int) -> Path:
    """One panel per lab (titled with its name), one line per method: the mean over seeds of the
    best yield so far, with a light band for the range over seeds (``curves``: method -> per lab,
    an array seeds × experiments of the best yield after 1, 2, ... experiments); the lab's best
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
            runs = np.atleast_2d(np.asarray(per_lab[i], dtype=float))  # seeds × experiments
            k = runs.shape[1]
            total = max(total, k)
            x = [*range(1, k + 1), k + 0.5]
            mean = runs.mean(axis=0)
            ax.step(x, _ext(mean), where="post", label=METHODS[m], **STYLE[m])
            if len(runs) > 1:
                ax.fill_between(x, _ext(runs.min(axis=0)), _ext(runs.max(axis=0)), step="post", alpha=0.12,
                                color=STYLE[m]["color"], lw=0, zorder=1)
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
    axes[0][0].set_ylabel("best yield so far (%), mean over seeds")
    axes[0][0].legend(loc="lower right", fontsize=8, framealpha=0.9)
    width = int(4.3 * n * 11)  # characters of an 11-point line across the figure
    fig.suptitle("\n".join(textwrap.wrap(title, width)), fontsize=11)
    fig.text(0.5, 0.01, "\n".join(textwrap.wrap(citation, int(width * 1.5))), ha="center", va="bottom", fontsize=7,
             color="0.35")
    fig.tight_layout(rect=(0, 0.05 if len(citation) > width * 1.5 else 0.035, 1, 0.95 if len(title) < width else 0.91))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

