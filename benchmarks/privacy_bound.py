r"""`labfbo bench privacy-bound`: how much a release protecting one experiment could give a reaction lab.

Why no private setting of ``labfbo bench privacy-utility --suite reactions`` keeps the gain at
``DP(epsilon=2, unit="experiment")``: this computes what a single release of the partners' reagent
effects still carries, on the real Buchwald–Hartwig labs of a scenario
(:func:`labfbo.datasets.scenarios`), with no BO loop in between, used by a lab that knows its noise.

**The release.** Every lab but the target has run ``n`` experiments, drawn at random from its data
(as in the first rounds of a campaign). Its results become centred ranks :math:`z \in [-1, 1]`
(:func:`labfbo.protocols.surface.model.rank_scores`, the values of ``unit="experiment"``), and the labs' main
effects — per categorical choice :math:`k`, :math:`h_k = \sum z` over the experiments that used it —
are summed over the labs (the secure sum) and released once with the Gaussian mechanism at
:math:`(\varepsilon, \delta)`: noise :math:`\mathcal N(0, (\sigma\Delta)^2)` per entry, :math:`\sigma`
the multiplier of the planned releases (:func:`labfbo.privacy.budget.calibrate`). Two releases:

* ``idealized``: :math:`\Delta = 2\sqrt B` (:math:`B` categorical parameters; one experiment's result
  replaced moves one entry per parameter by at most 2), the counts per choice :math:`n_k` exact, the
  rank coupling ignored — more generous than any protocol can be (the counts reveal the settings,
  which the unit protects; replacing one result moves the others' ranks);
* ``surface``: the sensitivity of ``surface``'s experiment-level release,
  :math:`\Delta_\Sigma = 2\sqrt{5B}` (:func:`labfbo.protocols.surface.model.ranked_sum_sensitivity`: the
  rank coupling and the counts), the counts released with the same noise.

Either is made once, after all ``n`` experiments (a campaign releases before, with less data, and
composes its releases: ``--releases``).

**What the lab gets.** It reads the release as a Bayesian would: a choice's effect :math:`w_k \sim
\mathcal N(0, \tau^2)`, :math:`h_k \mid w_k \sim \mathcal N(n_k w_k,\ n_k v + s^2)` (:math:`v` the spread
of one rank about its combination's effect, :math:`s` the noise std), so its posterior mean is

.. math:: \hat w_k = \frac{n_k h_k / (n_k v + s^2)}{1/\tau^2 + n_k^2 / (n_k v + s^2)},

a choice the noise swamps shrinks to 0 instead of taking the noise as signal. It runs the ``top``
(5) combinations that the posterior mean ranks first, or the distinct winners of posterior draws
(Thompson sampling: diverse when uncertain), whichever of these rules and of a grid of
:math:`(\tau, v)` does best at that noise level on average (an oracle's tuning, generous again). Its
regret is its best yield in the data minus the best of those. *Information kept* = (regret at
random − regret private) / (regret at random − regret without noise): the share of what the
partners' noise-free effects tell the lab that survives the noise, each target lab and draw paired
across the levels. It is measured against picking at random, not against a lab that learns on its
own, so it overstates what a campaign keeps of its gain over going alone. Pure numpy; a minute.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Sequence

import numpy as np

from labfbo.core.seeding import rng as seeded_rng
from labfbo.protocols.surface.model import noisy_ridge_weights, ranked_sum_sensitivity

BENCH_ORDER = 96  # where `labfbo bench --help` lists it (after privacy-units)
TAUS = (0.05, 0.1, 0.2, 0.4, 0.8)   # prior std of a choice's effect, on the centred ranks' scale
SPREADS = (0.1, 0.3, 0.6)           # variance of one rank about its combination's effect
RULES = ("mean", "thompson")
RELEASES = ("idealized", "surface")


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
    """Mid-ranks scaled to [-1, 1] (as :func:`labfbo.protocols.surface.model.rank_scores` with C = 1)."""
    from labfbo.protocols.surface.model import rank_scores

    return rank_scores(y, 1.0)


def sensitivity(release: str, blocks: int) -> float:
    """:math:`\\Delta` of one experiment replaced: ``idealized`` :math:`2\\sqrt B`, ``surface`` the
    experiment-level release's (:math:`\\lVert\\phi\\rVert^2 = 1 + B`, one outcome)."""
    if release == "idealized":
        return 2.0 * math.sqrt(blocks)
    return ranked_sum_sensitivity(1.0 + blocks, 1.0)


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


def posterior_effects(h: np.ndarray, counts: np.ndarray, noise_sd: float, tau: float,
                      spread: float) -> tuple[np.ndarray, np.ndarray]:
    """The posterior mean and std of each choice's effect given its (noisy) sum ``h`` and count (module
    docstring); a negative noisy count reads as 0. The mean is ``surface``'s Wiener filter
    (:func:`labfbo.protocols.surface.model.noisy_ridge_weights`) on the design's diagonal Gram, ridge
    :math:`v/\tau^2`."""
    n = np.maximum(counts, 0.0)
    mean = noisy_ridge_weights(np.diag(n), h, spread / tau ** 2, noise_sd, spread)
    return mean, 1.0 / np.sqrt(1.0 / tau ** 2 + n ** 2 / (n * spread + noise_sd ** 2 + 1e-12))


def picks(X: np.ndarray, ok: np.ndarray, mean: np.ndarray, sd: np.ndarray, top: int, rule: str,
          gen: np.random.Generator) -> np.ndarray:
    """The ``top`` combinations the lab runs: the posterior mean's first (ties at random), or the
    distinct winners of posterior draws (``thompson``)."""
    if rule == "mean":
        score = np.where(ok, X @ mean, -np.inf)
        return np.lexsort((gen.random(len(score)), -score))[:top]
    chosen: list[int] = []
    for _ in range(20 * top):
        score = np.where(ok, X @ (mean + sd * gen.standard_normal(mean.shape)), -np.inf)
        score[chosen] = -np.inf
        chosen.append(int(np.argmax(score)))
        if len(chosen) == top:
            break
    return np.asarray(chosen)


def information_kept(Y: np.ndarray, X: np.ndarray, n: int, noise: Sequence[float], draws: int,
                     seed: int, top: int = 5, noisy_counts: bool = False) -> dict[str, Any]:
    """Mean regret at random, without noise and at each noise std (each the best rule and prior of
    the grid), the information kept with its standard error (paired over target labs and draws), and
    the rule and prior chosen per level."""
    configs = [(rule, tau, v) for rule in RULES for tau in TAUS for v in SPREADS]
    levels = [0.0, *noise]
    regrets = np.zeros((len(levels), len(configs), draws * Y.shape[0]))
    chance = np.zeros(draws * Y.shape[0])
    for d in range(draws):
        for target in range(Y.shape[0]):
            row = d * Y.shape[0] + target
            gen = seeded_rng(seed, target, d, "privacy-bound")
            h, counts = draw(Y, X, target, n, gen)
            y, ok = Y[target], ~np.isnan(Y[target])
            best = float(np.nanmax(y))
            chance[row] = best - float(np.max(y[gen.permutation(np.flatnonzero(ok))[:top]]))
            z, zc = gen.standard_normal(h.shape), gen.standard_normal(h.shape)  # one noise draw for every level
            for i, s in enumerate(levels):
                hn, cn = h + s * z, counts + s * zc if noisy_counts else counts
                for j, (rule, tau, v) in enumerate(configs):
                    mean, sd = posterior_effects(hn, cn, s, tau, v)
                    pick_gen = seeded_rng(seed, target, d, f"privacy-bound-{rule}")
                    regrets[i, j, row] = best - float(np.max(y[picks(X, ok, mean, sd, top, rule, pick_gen)]))
    chosen = regrets.mean(axis=2).argmin(axis=1)
    p, c = regrets[0, chosen[0]], chance
    out: dict[str, Any] = {"plain": float(p.mean()), "chance": float(c.mean()), "kept": {}, "rule": {}}
    for i, s in enumerate(levels[1:], start=1):
        v = regrets[i, chosen[i]]
        ratio = (c.mean() - v.mean()) / (c.mean() - p.mean())
        grad = (c - v) - ratio * (c - p)   # delta method on the ratio of paired means
        out["kept"][s] = (float(ratio), float(grad.std(ddof=1) / np.sqrt(len(v)) / abs(c.mean() - p.mean())))
        out["rule"][s] = configs[chosen[i]]
    return out


def table(scenario_names: Sequence[str], ns: Sequence[int], epsilons: Sequence[float], delta: float,
          draws: int, seed: int, top: int, releases: Sequence[str] = ("idealized",), planned: int = 1) -> str:
    """The information kept per scenario, ``n``, release and epsilon, as Markdown."""
    from labfbo.datasets import load_reactions, scenarios
    from labfbo.privacy.budget import calibrate

    data = load_reactions()
    named = scenarios(data)
    rows = ["| scenario (labs) | n per partner | release | no noise | at random | "
            + " | ".join(f"eps = {e:g}" for e in epsilons) + " |",
            "|---|---:|---|---:|---:|" + "---:|" * len(epsilons)]
    for name in scenario_names:
        sub = data.subset(named[name])
        combos = sub.combos()
        Y = np.stack([sub.yields(i) for i in range(len(sub.labs))])
        X, blocks = one_hot(combos)
        for release in releases:
            sens = sensitivity(release, blocks)
            noise = [calibrate({"effects": 1.0}, {"effects": planned}, e, delta) * sens for e in epsilons]
            for n in ns:
                res = information_kept(Y, X, n, noise, draws, seed, top, noisy_counts=release == "surface")
                cells = " | ".join(f"{100 * res['kept'][s][0]:.0f} % ± {100 * res['kept'][s][1]:.0f}" for s in noise)
                rows.append(f"| ({name}) ({len(sub.labs)}) | {n} | {release} | {res['plain']:.1f} | "
                            f"{res['chance']:.1f} | {cells} |")
    return "\n".join(rows)


def _cmd(args: argparse.Namespace) -> None:
    print(f"top {args.top} combinations by the posterior of the partners' summed main effects, "
          f"{args.releases} planned release(s), delta = {args.delta:g}; regret in yield points; "
          f"information kept ± s.e. ({args.draws} draws per target lab)")
    print(table(args.scenarios, args.n, args.epsilons, args.delta, args.draws, args.seed, args.top,
                args.release, args.releases))


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
    p.add_argument("--release", nargs="+", default=list(RELEASES), choices=RELEASES,
                   help="idealized: Delta = 2 sqrt(B), exact counts; surface: its experiment-level sensitivity, "
                   "noisy counts")
    p.add_argument("--releases", type=int, default=1, help="releases the budget is split over (composed)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd)
