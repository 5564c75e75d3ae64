r"""Leave-one-family-out choice of the engine's defaults (``labfbo bench engine --lofo``).

Groups: each shipped reaction family lab by lab (:mod:`labfbo_bench.engine_chem`), the synthetic
pairing screens (``--pairing``) and the synthetic continuous related-site families of the panel
(``continuous``: every site of each :data:`~labfbo_bench.engine_panel.FAMILIES` entry given). A
method's *score* on a group is its worst regret relative to Optuna's ``GPSampler`` on the same
campaigns over the checkpoints after 5, after 10 and at the end (experiments past the first ones):
:math:`s = \max_c \bar r_c(\text{method}) / \bar r_c(\text{optuna})` — below 1: ahead of Optuna at
every checkpoint; the goal is a default that is never behind. For each group, the candidate whose
worst score over the *other* groups is lowest is picked and reported on the held-out one; the
setting that ships is the pick over all groups. Regret is in yield points on the reaction families
and the pairing screens, and normalized by the function's range on the continuous ones.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from labfbo_bench.engine import regret_curve

CHECKPOINTS = (5, 10)  # and the end
YARDSTICK = "optuna"


def group_of(problem: str) -> str:
    """``buchwald_hartwig#03`` -> ``buchwald_hartwig``; a continuous family's site -> ``continuous``."""
    from labfbo.datasets.families import FAMILIES as REACTIONS

    head = problem.split("#")[0]
    return head if head in REACTIONS or head == "pairing" else "continuous"


def at_checkpoints(curve: np.ndarray) -> np.ndarray:
    """The regret after 5, after 10 and at the end (those within the budget)."""
    return curve[sorted({c - 1 for c in CHECKPOINTS if c < len(curve)} | {len(curve) - 1})]


def curves(records: list[dict[str, Any]], group: str, method: str) -> dict[int, np.ndarray]:
    """Seed -> regret at the checkpoints (:func:`at_checkpoints`), mean over the group's problems
    (yield points on a reaction family, normalized elsewhere)."""
    by: dict[int, list[np.ndarray]] = {}
    for r in records:
        if r["label"] == method and group_of(r["problem"]) == group:
            c = regret_curve(r) * (r["f_range"] if group != "continuous" else 1.0)
            by.setdefault(r["seed"], []).append(at_checkpoints(c))
    return {s: np.mean(cs, axis=0) for s, cs in by.items() if len({len(c) for c in cs}) == 1}


def paired(records: list[dict[str, Any]], group: str, method: str,
           peer: str = YARDSTICK) -> list[tuple[float, float, float]]:
    """Per checkpoint: the method's mean regret, the peer's, and the s.e. of the seed-paired difference."""
    a, b = curves(records, group, method), curves(records, group, peer)
    common = sorted(set(a) & set(b))
    if not common:
        return []
    out = []
    for c in range(len(a[common[0]])):
        d = np.array([a[s][c] - b[s][c] for s in common])
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
        out.append((float(np.mean([a[s][c] for s in common])), float(np.mean([b[s][c] for s in common])), se))
    return out


def score(records: list[dict[str, Any]], group: str, method: str) -> float:
    """The worst (largest) ratio of the method's regret to Optuna's over the checkpoints (NaN if not run)."""
    rows = paired(records, group, method)
    if not rows:
        return float("nan")
    return float(max(m / max(o, 1e-9) for m, o, _ in rows))


def lofo(records: list[dict[str, Any]], groups: Sequence[str], candidates: Sequence[str]) -> str:
    """Markdown: every candidate's score per group, then the leave-one-family-out picks."""
    S = {(g, m): score(records, g, m) for g in groups for m in candidates}
    lines = ["| candidate | " + " | ".join(groups) + " | worst |", "|---|" + "---:|" * (len(groups) + 1)]
    for m in candidates:
        vals = [S[(g, m)] for g in groups]
        lines.append(f"| {m} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {max(vals):.2f} |")
    lines += ["", "| held out | picked on the others | its score there | held-out score | "
              "regret after 5 / 10 / end (picked) | Optuna |", "|---|---|---:|---:|---|---|"]
    def worst(m: str, over: Sequence[str]) -> float:  # over the groups; not run on one: never picked
        v = float(max(S[(h, m)] for h in over))
        return v if np.isfinite(v) else float("inf")

    for g in groups:
        rest = [h for h in groups if h != g]
        pick = min(candidates, key=lambda m: (worst(m, rest), m))
        rows = paired(records, g, pick)
        fmt = " / ".join(f"{m:.2f} ± {se:.2f}" for m, _, se in rows)
        opt = " / ".join(f"{o:.2f}" for _, o, _ in rows)
        lines.append(f"| {g} | {pick} | {worst(pick, rest):.2f} | {S[(g, pick)]:.2f} | "
                     f"{fmt} | {opt} |")
    overall = min(candidates, key=lambda m: (worst(m, groups), m))
    lines += ["", f"Picked on every group: **{overall}** (± is the s.e. of the seed-paired difference to Optuna)."]
    return "\n".join(lines)
