r"""`labfbo bench privacy-bound`: the most a release protecting one experiment could give a reaction lab.

Why no private setting of ``labfbo bench privacy-utility --suite reactions`` keeps the gain at
``DP(epsilon=2, unit="experiment")``: this computes what an *idealized* release of the partners'
reagent effects would still carry, on the real Buchwald–Hartwig labs of a scenario
(:func:`labfbo.datasets.scenarios`), with no BO loop in between.

**The release.** Every lab but the target has run ``n`` experiments, drawn at random from its data
(as in the first rounds of a campaign). Its results become centred ranks :math:`z \in [-1, 1]`
(:func:`labfbo.models.surface.rank_scores`, the values of ``unit="experiment"``), and the labs' main
effects — per categorical choice :math:`k`, :math:`h_k = \sum z` over the experiments that used it —
are summed over the labs (the secure sum) and released once with the Gaussian mechanism at
:math:`(\varepsilon, \delta)`: noise :math:`\mathcal N(0, (\sigma\Delta)^2)` per entry, :math:`\sigma`
the multiplier of one release (:func:`labfbo.privacy.budget.calibrate`) and :math:`\Delta = 2\sqrt B`
(:math:`B` categorical parameters; one experiment's result replaced moves one entry per parameter
by at most 2). This release is more generous than any protocol can be, so what it keeps bounds
what they keep:

* it is made once, after all ``n`` experiments (a campaign releases before, with less data, and
  composes its releases);
* the counts per choice :math:`n_k` come exact (a real release must noise them too: they reveal
  the settings, which the unit protects);
* the rank coupling is ignored (replacing one result moves the others' ranks, which doubles the
  moment's sensitivity: :func:`labfbo.models.surface.experiment_sensitivity`).

**What the lab gets.** It ranks its combinations by the summed estimates
:math:`\hat w_k = h_k / (n_k + \lambda)`, :math:`\lambda = 2`, and runs the top ``top`` (5); its
regret is its best yield in the data minus the best of those. *Information kept* =
(regret at random − regret private) / (regret at random − regret without noise): the share of what
the partners' noise-free effects tell the lab that survives the noise, each target lab and draw
paired across the three. Pure numpy; a few seconds.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import numpy as np

from labfbo.seeding import rng as seeded_rng

BENCH_ORDER = 96  # where `labfbo bench --help` lists it (after privacy-units)
RIDGE = 2.0


def one_hot(combos: Sequence[tuple]) -> tuple[np.ndarray, int]:
    """The combinations' one-hot main-effect rows ``(n_combos, sum of choices)`` and the number of parameters B."""
    levels = [sorted({c[j] for c in combos}, key=str) for j in range(len(combos[0]))]
    offsets = np.cumsum([0, *(len(v) for v in levels)])
    X = np.zeros((len(combos), int(offsets[-1])))
    for j, vals in enumerate(levels):
        index = {v: k for k, v in enumerate(vals)}
        for i, c in enumerate(combos):
            X[i, offsets[j] + index[c[j]]] = 1.0
    return X, len(levels)


def centred_ranks(y: np.ndarray) -> np.ndarray:
    """Mid-ranks scaled to [-1, 1] (as :func:`labfbo.models.surface.rank_scores` with C = 1)."""
    from labfbo.models.surface import rank_scores

    return rank_scores(y, 1.0)


def draw(Y: np.ndarray, X: np.ndarray, target: int, n: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The partners' summed main effects ``h`` and counts ``n_k``: each lab but ``target`` runs ``n``
    random combinations of its data."""
    h = np.zeros(X.shape[1])
    counts = np.zeros(X.shape[1])
    for lab in range(Y.shape[0]):
        if lab == target:
            continue
        ran = gen.choice(np.flatnonzero(~np.isnan(Y[lab])), size=n, replace=False)
        h += X[ran].T @ centred_ranks(Y[lab, ran])
        counts += X[ran].sum(axis=0)
    return h, counts


def top_regret(y: np.ndarray, X: np.ndarray, h: np.ndarray, counts: np.ndarray, top: int) -> float:
    """The target's best yield minus the best of the ``top`` combinations the estimates rank first."""
    score = np.where(np.isnan(y), -np.inf, X @ (h / (counts + RIDGE)))
    return float(np.nanmax(y) - np.nanmax(y[np.argsort(-score, kind="stable")[:top]]))


def information_kept(Y: np.ndarray, X: np.ndarray, n: int, noise: Sequence[float], draws: int,
                     seed: int, top: int = 5) -> dict[str, Any]:
    """Mean regret without noise, at random and at each noise std, and the information kept with its
    standard error (paired over target labs and draws)."""
    plain, chance = [], []
    noisy: dict[float, list[float]] = {s: [] for s in noise}
    for d in range(draws):
        for target in range(Y.shape[0]):
            gen = seeded_rng(seed, target, d, "privacy-bound")
            h, counts = draw(Y, X, target, n, gen)
            plain.append(top_regret(Y[target], X, h, counts, top))
            order = gen.permutation(np.flatnonzero(~np.isnan(Y[target])))[:top]
            chance.append(float(np.nanmax(Y[target]) - np.max(Y[target, order])))
            z = gen.standard_normal(h.shape)   # one draw of the noise for every level: paired across epsilons
            for s in noise:
                noisy[s].append(top_regret(Y[target], X, h + s * z, counts, top))
    p, c = np.array(plain), np.array(chance)
    out: dict[str, Any] = {"plain": float(p.mean()), "chance": float(c.mean()), "kept": {}}
    for s, values in noisy.items():
        v = np.array(values)
        ratio = (c.mean() - v.mean()) / (c.mean() - p.mean())
        # delta method on the ratio of paired means
        grad = (c - v) - ratio * (c - p)
        out["kept"][s] = (float(ratio), float(grad.std(ddof=1) / np.sqrt(len(v)) / abs(c.mean() - p.mean())))
    return out


def table(scenario_names: Sequence[str], ns: Sequence[int], epsilons: Sequence[float], delta: float,
          draws: int, seed: int, top: int) -> str:
    """The information kept per scenario, ``n`` and epsilon, as Markdown."""
    from labfbo.datasets import load_reactions, scenarios
    from labfbo.privacy.budget import calibrate

    data = load_reactions()
    named = scenarios(data)
    rows = [f"| scenario (labs) | n per partner | no noise | at random | "
            + " | ".join(f"eps = {e:g}" for e in epsilons) + " |",
            "|---|---:|---:|---:|" + "---:|" * len(epsilons)]
    for name in scenario_names:
        sub = data.subset(named[name])
        combos = sub.combos()
        Y = np.stack([sub.yields(i) for i in range(len(sub.labs))])
        X, blocks = one_hot(combos)
        sens = 2.0 * np.sqrt(blocks)
        noise = [calibrate({"effects": 1.0}, {"effects": 1}, e, delta) * sens for e in epsilons]
        for n in ns:
            res = information_kept(Y, X, n, noise, draws, seed, top)
            cells = " | ".join(f"{100 * res['kept'][s][0]:.0f} % ± {100 * res['kept'][s][1]:.0f}" for s in noise)
            rows.append(f"| ({name}) ({len(sub.labs)}) | {n} | {res['plain']:.1f} | {res['chance']:.1f} | {cells} |")
    return "\n".join(rows)


def _cmd(args: argparse.Namespace) -> None:
    print(f"top {args.top} combinations by the partners' summed main effects, one release, Delta = 2 sqrt(B), "
          f"delta = {args.delta:g}; regret in yield points; information kept ± s.e. ({args.draws} draws per target lab)")
    print(table(args.scenarios, args.n, args.epsilons, args.delta, args.draws, args.seed, args.top))


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench privacy-bound``."""
    p = bsub.add_parser("privacy-bound", help="what an idealized experiment-level release of the partners' reagent "
                        "effects keeps on the reaction labs (seconds; no BO loop)")
    p.add_argument("--scenarios", nargs="+", default=["a", "c"], choices=["a", "b", "c"])
    p.add_argument("--n", nargs="+", type=int, default=[6, 13, 23], help="experiments per partner lab")
    p.add_argument("--epsilons", nargs="+", type=float, default=[0.5, 2.0, 8.0])
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--draws", type=int, default=100, help="random draws per target lab")
    p.add_argument("--top", type=int, default=5, help="combinations the lab runs from the estimates")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd)
