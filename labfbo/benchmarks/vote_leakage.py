"""``labfbo privacy audit --protocol vote``: what the coordinator learns of a site's optimum from its votes.

A ``vote`` site sends one codebook index per release (:mod:`labfbo.protocols.vote`) and
nothing about its queries, so there is nothing to reconstruct but the optimum. The
coordinator's best guess of site ``i``'s optimized setting is the codebook point of the last
vote it received from ``i``. Against the site's final best query (the setting the campaign
optimized), per site:

* ``guess``: the distance from that guess to it;
* ``chance``: a random guess's — the mean distance of a uniform point of the cube
  (``chance_uniform``) and of a uniformly drawn codebook point (``chance_codebook``);
* ``others``: the guess the coordinator makes *without* this site's votes — the codebook
  point most of the other sites voted for (ties: the first) — the floor that related sites
  give any attacker, whatever this site does;
* ``hit``: whether the guess is the codebook point nearest the final best (chance ``1/B``).

With ``codebook="design"`` the codebook is the study's collaborative design and site ``i``
names one of the ``n_init`` rows dealt to it, which the coordinator knows: ``chance_codebook``
and ``hit`` are then over those rows (chance ``1/n_init``).

Under ``DP(epsilon=e)`` one vote reports the true index with probability
:math:`e^{e}/(e^{e} + B - 1)` (51 % at :math:`e = 2`, :math:`B = 8`), which bounds ``hit``
(:mod:`labfbo.privacy.randomized_response`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from labfbo.benchmarks.leakage import campaign

COLUMNS = ("guess", "chance_uniform", "chance_codebook", "others", "hit", "hit_chance")


def site_rows(sites: Sequence[Any]) -> list[dict[str, float]]:
    """One row of metrics per site of a finished ``vote`` campaign."""
    from labfbo.protocols.vote import choice_set

    rows = []
    last: dict[int, int] = {}
    for i, o in enumerate(sites):
        votes = [m for m in o.sent_messages() if m.kind == "optimum_vote"]
        if votes:
            last[i] = int(votes[-1].index)
    for i, o in enumerate(sites):
        if i not in last:
            continue
        points, mine = choice_set(o.space, o.options.codebook, o.context)  # what site i could name
        if points is None:
            continue
        best = o.space.encode([o.best.params])[0]
        dist = np.linalg.norm(points - best, axis=1)
        others = Counter(v for j, v in last.items() if j != i)
        other_guess = max(others, key=lambda v: (others[v], -v)) if others else None
        uniform = np.random.default_rng(0).random((4096, best.shape[0]))
        rows.append({"guess": float(dist[last[i]]),
                     "chance_uniform": float(np.linalg.norm(uniform - best, axis=1).mean()),
                     "chance_codebook": float(dist[mine].mean()),
                     "others": float(dist[other_guess]) if other_guess is not None else float("nan"),
                     "hit": float(last[i] == int(mine[np.argmin(dist[mine])])), "hit_chance": 1.0 / len(mine)})
    return rows


def audit_votes(problem: str, epsilons: Sequence[float | None], seeds: Sequence[int], n_sites: int = 5,
                n_init: int = 5, budget: int = 10, **vote_options: Any) -> dict[float | None, list[dict[str, float]]]:
    """Per budget (None: no DP), the rows of every site of every seed's campaign."""
    import warnings

    import labfbo

    out: dict[float | None, list[dict[str, float]]] = {}
    for eps in epsilons:
        options: dict[str, Any] = dict(vote_options) if eps is None else {**vote_options,
                                                                          "privacy": labfbo.DP(epsilon=eps)}
        for seed in seeds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sites = campaign(problem, n_sites, seed, budget, n_init, protocol="vote", **options)
            out.setdefault(eps, []).extend(site_rows(sites))
    return out


def table(results: dict[float | None, list[dict[str, float]]]) -> str:
    lines = ["| ε | site-runs | guess to the site's final best | chance (uniform point) | chance (codebook point) "
             "| others' votes only | guess is the final best's cell | chance |", "|---|---:|" + "---:|" * 6]
    for eps, rows in results.items():
        a = {c: np.array([r[c] for r in rows]) for c in COLUMNS}
        lines.append(f"| {'no DP' if eps is None else f'{eps:g}'} | {len(rows)} | "
                     f"{a['guess'].mean():.3f} ± {a['guess'].std():.3f} | {a['chance_uniform'].mean():.3f} | "
                     f"{a['chance_codebook'].mean():.3f} | {np.nanmean(a['others']):.3f} | {a['hit'].mean():.2f} | "
                     f"{a['hit_chance'].mean():.3f} |")
    return "\n".join(lines)
