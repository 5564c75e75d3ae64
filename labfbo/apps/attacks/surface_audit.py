"""``labfbo privacy audit --protocol surface``: campaigns on Buchwald–Hartwig labs, the three attacks, table, plot.

One job is one campaign (labs, seed, experiments, privacy) of ``surface`` on the labs of
:mod:`labfbo.datasets` (by default the demo's three most related labs, :func:`labfbo.apps.demo.screen.related_labs`),
every lab from its initial combinations (enqueued, as in ``labfbo demo``) then ``budget``
proposals, one per round; a combination missing from a lab's data fails there. Each lab is
then attacked from the ``coordinator``'s view of its statistics, from a ``peer``'s (the next
lab's leave-one-out totals), from the cohort's ``sum`` (secure aggregation with the sum unmasked by
the coordinator) and from what the coordinator holds by default (``sealed``: a second campaign at the
defaults, whose proposals are compared with the first's), and scored
(:func:`labfbo.apps.attacks.surface.score`). Each job's JSON is cached: an interrupted
audit resumes, and a cache made with other settings is refused.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from labfbo.apps.attacks.surface import (
    VIEWS,
    Candidates,
    Snapshot,
    attack,
    candidates,
    coordinator_view,
    peer_view,
    reconstruct_values,
    score,
    sealed_view,
    secure_sum_view,
    sum_view,
)
from labfbo.core.exceptions import ConfigurationError

METRICS = ("recall", "precision", "pearson", "spearman", "rmse")
KNOWN = ("spearman", "spearman_chance", "rmse", "rmse_chance")


@dataclass(frozen=True)
class SurfaceJob:
    """One campaign and its attacks; ``epsilon`` None: no DP."""

    path: str
    labs: tuple[str, ...]
    seed: int
    budget: int
    n_init: int = 3
    epsilon: float | None = None
    delta: float = 1e-5
    sealed: bool = True  # also the campaign at the defaults (secure sums sealed to the members)
    unit: str = "site"  # DP(unit=...): "experiment" protects one experiment (ranked statistics)


def jobs(out: str, labs: Sequence[str], epsilons: Sequence[float | None], seeds: Sequence[int], budget: int,
         n_init: int = 3, unit: str = "site") -> list[SurfaceJob]:
    """One job per (budget epsilon, seed); None is the campaign without DP; ``unit`` the DP's unit."""
    def folder(e: float | None) -> str:
        return "nodp" if e is None else f"eps{e:g}" + ("" if unit == "site" else f"-{unit}")

    return [SurfaceJob(str(Path(out) / "surface" / folder(e) / f"seed{k}.json"), tuple(labs), int(k), int(budget),
                       int(n_init), None if e is None else float(e), unit=unit if e is not None else "site")
            for e in epsilons for k in seeds]


def default_labs(n: int = 3) -> tuple[str, ...]:
    """The demo's ``n`` most related labs."""
    from labfbo.apps.demo.screen import related_labs
    from labfbo.datasets import load_reactions

    return related_labs(load_reactions(), n)


def campaign(labs: Sequence[str], seed: int, budget: int, n_init: int = 3, **options: Any) -> tuple[Any, list[Any]]:
    """A ``surface`` campaign of the labs in one process, its statistics in the clear unless ``options``
    say otherwise (the coordinator's view; the secure sum is computed from it, :func:`_secure_sum`);
    returns the data and the labs' optimizers."""
    from labfbo.coordinator import Coordinator
    from labfbo.core.seeding import int_seed
    from labfbo.datasets import initial_design, load_reactions
    from labfbo.optimizer import Optimizer
    from labfbo.protocols.surface.protocol import SurfaceOptions

    if "secure_aggregation" in SurfaceOptions.model_fields:  # the clear statistics: the coordinator's view
        options = {"secure_aggregation": "off", **options}
    data = load_reactions().subset(list(labs))
    names = list(data.labs)
    coord = Coordinator("surface", sites=names, space=data.space, seed=seed, horizon=budget, **options)
    sites = [Optimizer(data.space, objective="maximize", protocol="surface", coordinator=coord, site=name,
                              seed=seed, n_init=n_init, horizon=budget, secret=int_seed(seed, i, 0, "site-secret"),
                              **options) for i, name in enumerate(names)]

    def run(i: int, trial: Any) -> None:
        y = data.tables[i].get(tuple(trial.params[n] for n in data.space.names))
        if y is None:
            sites[i].tell_failed(trial, "combination not in this lab's data")
        else:
            sites[i].tell(trial, y)

    for i, o in enumerate(sites):
        for combo in initial_design(data, i, seed, n_init):
            run(i, o.enqueue(dict(zip(data.space.names, combo))))
    for _ in range(budget):
        trials = [o.ask() for o in sites]
        for i, tr in enumerate(trials):
            run(i, tr)
    return data, sites


def _observed(opt: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The lab's first ``n`` experiments: unit-cube inputs and results, larger better (as the lab fits them)."""
    obs = list(opt.observations)[:n]
    X = np.asarray(opt.space.encode([o.params for o in obs]), dtype=np.float64)
    return X, (-1.0 if opt.objective == "minimize" else 1.0) * np.asarray([o.value for o in obs], float)


def _truth(opt: Any, cand: Any, n: int) -> tuple[list[int], np.ndarray]:
    """The lab's first ``n`` experiments (combination indices) and their results standardized as the lab did
    (under ``DP(unit="experiment")`` centred ranks in [-C, C])."""
    from labfbo.protocols.surface.model import rank_scores, standardized

    X, y = _observed(opt, n)
    dp = opt.options.privacy
    return cand.index(X), rank_scores(y, dp.clip) if dp is not None and dp.unit == "experiment" else standardized(y)


def audit_sites(sites: Sequence[Any], seed: int = 0, sealed: Sequence[Any] | None = None
                ) -> dict[str, list[dict[str, Any]]]:
    """Every lab attacked from each view (:data:`~labfbo.apps.attacks.surface.VIEWS`): per view, one row per
    lab (``sealed``: the same labs' campaign at the defaults, for the coordinator's view of a sealed sum)."""
    opt0 = sites[0]
    cand = candidates(opt0.space, opt0.options.fourier_features, opt0.options.fourier_lengthscale)
    own = [coordinator_view(o.sent_messages()) for o in sites]
    counts = [{s.round: s.count for s in v} for v in own]
    summed, sum_cand = _secure_sum(sites, cand, counts, seed)
    held = sealed_view([o.sent_messages() for o in sealed], cand.Phi.shape[1],
                       {r: sum(c.get(r, 0) for c in counts) for r in counts[0]}) if sealed else []
    out: dict[str, list[dict[str, Any]]] = {v: [] for v in VIEWS}
    L = len(sites)
    for i in range(L):
        peer = (i + 1) % L
        views = {"coordinator": (own[i], [i], cand), "peer": (peer_view(sites[peer].received_messages()),
                                                              [k for k in range(L) if k != peer], cand),
                 "sum": (summed, list(range(L)), sum_cand), "sealed": (held, list(range(L)), cand)}
        for view, (snaps, summed_labs, view_cand) in views.items():
            last = [s for s in snaps if s.round in counts[i]]
            if not last:
                continue
            single = summed_labs == [i]
            rows, values = attack(last, view_cand, single)
            r = max(s.round for s in last)
            true, z = _truth(sites[i], cand, counts[i][r])
            # the results an attacker that knew every summed lab's combinations would recover (their bound)
            known = [c for k in summed_labs for c in _truth(sites[k], cand, counts[k].get(r, 0))[0]]
            known_values = reconstruct_values(last, true if single else known, view_cand, single)
            res_known = score(true if single else known, known_values, true, z, len(cand.X), seed=seed + i)
            out[view].append({"lab": str(sites[i].site), "attacker": view, "peer": peer if view == "peer" else None,
                              "rounds": len(last), "noise_sd": max(s.noise_sd for s in last),
                              "sites_summed": last[-1].sites,
                              **score(rows, values, true, z, len(cand.X), seed=seed + i),
                              **{f"{m}_known": res_known[m] for m in KNOWN},
                              "z_true": z.tolist(), "z_hat_matched": _matched_values(rows, values, true)})
    return out


def _secure_sum(sites: Sequence[Any], cand: Any, counts: list[dict[int, int]], seed: int) -> tuple[list[Any], Any]:
    """What the coordinator learns under secure aggregation, per round all labs released in, and the
    candidates to attack it with. Without DP the unmasked sum is the sum of the clear statistics
    (:func:`sum_view`); under DP each lab adds only its share of the noise (distributed DP), so the sum
    carries one mechanism's noise: simulated here from the labs' data and the noise the messages state —
    of the averages under ``unit="site"``; under ``unit="experiment"`` the ranked release of
    :mod:`labfbo.protocols.surface.secure` (moment sums of ranks and the features' sums, the Gram's
    constant row alone), attacked with each combination's features as its only Gram entries."""
    first = next(m for m in sites[0].sent_messages() if getattr(m, "kind", None) == "surface_stats")
    if first.dp_noise_multiplier is None:
        return sum_view([o.sent_messages() for o in sites]), cand
    from labfbo.protocols.surface.model import feature_sums, ranked_moments, ranked_sum_sensitivity, site_statistics

    dp = sites[0].options.privacy
    ranked = dp.unit == "experiment"
    p = cand.Phi.shape[1]
    sd = float(first.dp_noise_multiplier * (ranked_sum_sensitivity(_norm_bound(sites[0]), first.dp_clip)
                                            if ranked else first.dp_sensitivity))
    gen = np.random.default_rng([seed, 7919])
    sums = []
    for r in sorted(set.intersection(*(set(c) for c in counts))):
        V = 0.0
        for k, o in enumerate(sites):
            X, y = _observed(o, counts[k][r])
            Phi = cand.Phi[cand.index(X)]
            if ranked:
                part = np.concatenate([[len(y)], feature_sums(Phi), ranked_moments(Phi, y, first.dp_clip)])
            else:
                part = np.concatenate(site_statistics(Phi, y, first.dp_clip))
            V = V + np.concatenate([part, [len(y), 1.0]])
        if ranked:  # the share on C s is over C: s carries sd / C
            V[1:p] += gen.normal(0.0, sd / first.dp_clip, p - 1)
            V[p:-2] += gen.normal(0.0, sd, p)
        else:
            V[:-2] += gen.normal(0.0, sd, len(V) - 2)
        sums.append((r, V))
    if ranked:
        return [Snapshot(r, int(round(V[-2])), V[:p], V[p:2 * p], sd / first.dp_clip, int(round(V[-1])))
                for r, V in sums], Candidates(cand.X, cand.Phi, cand.Phi)
    return secure_sum_view(sums, p, sd), cand


def _norm_bound(opt: Any) -> float:
    from labfbo.protocols.surface.model import SurfaceFeatures

    return SurfaceFeatures(opt.space, opt.options.fourier_features, opt.options.fourier_lengthscale).norm_bound


def _matched_values(rows: Sequence[int], values: np.ndarray, true: Sequence[int]) -> list[float | None]:
    """The recovered result of each true row (None: its combination is not in the guess)."""
    from labfbo.apps.attacks.surface import _matched

    ti, gi = _matched(rows, values, true)
    out: list[float | None] = [None] * len(true)
    for a, b in zip(ti, gi):
        out[a] = float(values[b])
    return out


def run_job(job: SurfaceJob) -> dict[str, Any]:
    """Campaign, attacks, JSON (written atomically); returns the JSON."""
    from labfbo.core.dp import DP

    options: dict[str, Any] = {}
    if job.epsilon is not None:
        options["privacy"] = DP(epsilon=job.epsilon, delta=job.delta, unit=job.unit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, sites = campaign(job.labs, job.seed, job.budget, job.n_init, **options)
        sealed = campaign(job.labs, job.seed, job.budget, job.n_init, secure_aggregation="auto",
                          **options)[1] if job.sealed else None
    res = {"job": asdict(job), "epsilon": sites[0].epsilon(), "results": audit_sites(sites, job.seed, sealed)}
    if sealed is not None:  # the sealed campaign proposed what the clear one did (its regret is the same)
        res["same_proposals"] = all([t.params for t in a.trials] == [t.params for t in b.trials]
                                    for a, b in zip(sites, sealed))
    path = Path(job.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    os.replace(tmp, path)
    return res


def run_jobs(todo: Sequence[SurfaceJob], progress: Any = None) -> list[dict[str, Any]]:
    """Run the jobs not cached yet (a cache of other settings is refused); every job's JSON, in order."""
    for j in todo:
        cached = Path(j.path).exists() and {"unit": "site", **json.loads(Path(j.path).read_text())["job"]}
        if cached and cached != json.loads(json.dumps(asdict(j))):
            raise ConfigurationError(f"{j.path} was cached with other settings; use another --out")
    out = []
    for k, j in enumerate(todo):
        out.append(json.loads(Path(j.path).read_text()) if Path(j.path).exists() else run_job(j))
        if progress is not None:
            progress(k + 1, len(todo))
    return out


def _setting(res: dict[str, Any]) -> str:
    e, unit = res["job"]["epsilon"], res["job"].get("unit", "site")
    return "no DP" if e is None else f"ε = {e:g}" + ("" if unit == "site" else f" per {unit}")


def cells(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """(setting, view) -> metric -> the values over labs and seeds."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for res in results:
        for view in VIEWS:
            for row in res["results"].get(view, []):
                c = out.setdefault((_setting(res), view), {})
                for m in (*METRICS, *(f"{m}_chance" for m in METRICS), *(f"{m}_known" for m in KNOWN), "n",
                          "sites_summed"):
                    c.setdefault(m, []).append(float(row[m]) if row[m] is not None else float("nan"))
    return {k: {m: np.asarray(v) for m, v in c.items()} for k, c in out.items()}


def _mean(a: np.ndarray | None) -> float:
    """The mean of the finite values (nan: none)."""
    a = np.asarray([] if a is None else a, float)
    return float(a[np.isfinite(a)].mean()) if np.isfinite(a).any() else float("nan")


def _f(a: np.ndarray, digits: int = 2) -> str:
    return "—" if not np.isfinite(a).any() else f"{np.nanmean(a):.{digits}f}"


def table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown: per setting and attacker, mean over labs and seeds (chance in parentheses)."""
    lines = [
        "| setting | attacker | labs summed | experiments | combinations recovered (chance) | precision (chance) "
        "| Pearson of results (chance) | Spearman (chance) | RMSE (chance) "
        "| Spearman knowing the combinations (chance) |",
        "|---|---|---:|---:|---|---|---|---|---|---|",
    ]
    for (setting, view), c in cells(results).items():
        lines.append(f"| {setting} | {view} | {_f(c['sites_summed'], 0)} | {_f(c['n'], 1)} | "
                     + " | ".join(f"{_f(c[m])} ({_f(c[m + '_chance'])})" for m in METRICS[:2]) + " | "
                     + " | ".join(f"{_f(c[m])} ({_f(c[m + '_chance'])})" for m in METRICS[2:])
                     + f" | {_f(c['spearman_known'])} ({_f(c['spearman_chance_known'])}) |")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], out: Path) -> Path:
    """Bars per setting and attacker: combinations recovered and the results' Spearman, chance as ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = cells(results)
    settings = list(dict.fromkeys(s for s, _ in c))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(VIEWS)
    for ax, metric, title in zip(axes, ("recall", "spearman"), ("lab's experiments recovered", "Spearman of "
                                                                 "recovered vs true results (none: < 3 recovered)")):
        for k, view in enumerate(VIEWS):
            xs = np.arange(len(settings)) + (k - (len(VIEWS) - 1) / 2) * width
            vals = [_mean(c.get((s, view), {}).get(metric)) for s in settings]
            chance = [_mean(c.get((s, view), {}).get(metric + "_chance")) for s in settings]
            ax.bar(xs, np.nan_to_num(vals), width, label=view)
            ax.scatter(xs, chance, marker="_", s=200, color="black", zorder=3,
                       label="chance" if k == 0 else None)
        ax.set_xticks(np.arange(len(settings)), settings)
        ax.set_title(title)
        ax.set_ylim(-0.2 if metric == "spearman" else 0, 1.05)
        ax.axhline(0, color="grey", lw=0.5)
    axes[0].legend()
    fig.suptitle("What surface's messages give away (labfbo privacy audit --protocol surface)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "surface_leakage.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
