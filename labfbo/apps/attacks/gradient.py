"""The gradient-leakage study of PACD-BO §V (Figs. 3-4) that ``labfbo privacy audit`` runs, cached and resumable.

One job is one campaign of the ``gradient`` protocol (``n_sites`` sites of ``problem``, K
particles, DP noise multiplier ``sigma`` or none) followed by the coordinator's attack
(:func:`labfbo.privacy.audit.reconstruct`) on site 0 at each audited BO iteration. Its JSON
(``<out>/<problem>/sigma<s>/seed<k>.json``) is written atomically, so an interrupted study
resumes; jobs run in spawned worker processes with one torch thread each.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from labfbo.apps.harness import run_pending

METRICS = ("dispersion", "dispersion_true", "dispersion_uniform", "matched_distance", "recovered",
           "recovered_chance", "incumbent_nearest", "incumbent_guess", "incumbent_guess_chance",
           "optimum_guess", "optimum_guess_chance")


@dataclass(frozen=True)
class AuditJob:
    """One campaign and its attacks."""

    path: str
    problem: str
    sigma: float
    seed: int
    iterations: tuple[int, ...]
    n_sites: int = 5
    n_particles: int = 5
    n_init: int = 5
    clip: float = 1.0
    restarts: int = 5
    steps: int = 5
    tol: float = 0.05
    sparse_start: bool = True
    acquisition: str = "ucb"
    sequential: bool = True
    stall_rounds: int | None = None  # the paper's PACD-BO: no escape from a stalled basin
    epsilon: float | None = None  # a campaign budget DP(epsilon=...) instead of sigma (calibrated by the sites)


def jobs(out: str, problem: str, sigmas: Sequence[float], seeds: Sequence[int], iterations: Sequence[int],
         epsilons: Sequence[float] = (), **kw: Any) -> list[AuditJob]:
    """The study's jobs, one per (sigma, seed) and one per (campaign budget epsilon, seed)."""
    its = tuple(sorted(set(int(t) for t in iterations)))
    return ([AuditJob(str(Path(out) / problem / f"sigma{s:g}" / f"seed{k}.json"), problem, float(s), int(k), its, **kw)
             for s in sigmas for k in seeds]
            + [AuditJob(str(Path(out) / problem / f"eps{e:g}" / f"seed{k}.json"), problem, 0.0, int(k), its,
                        epsilon=float(e), **kw) for e in epsilons for k in seeds])


def campaign(problem: str, n_sites: int, seed: int, budget: int, n_init: int = 5, protocol: str = "gradient",
             **options: Any) -> list[Any]:
    """A campaign (``gradient`` by default), all sites in one process, one proposal per site per
    round (GUIDE functions at ``dim=2``); returns the sites' optimizers."""
    from labfbo.coordinator import Coordinator
    from labfbo.core.seeding import int_seed
    from labfbo.optimizer import Optimizer
    from labfbo.problems.families import GUIDE_NAMES, get_problem

    prob = get_problem(problem, n_sites=n_sites, seed=seed, **({"dim": 2} if problem in GUIDE_NAMES else {}))
    coord = Coordinator(protocol, sites=list(prob.site_names), seed=seed, horizon=budget, **options)
    sites = [Optimizer(prob.space, protocol=protocol, coordinator=coord, site=s, seed=seed,
                              n_init=n_init, horizon=budget, secret=int_seed(seed, i, 0, "site-secret"), **options)
             for i, s in enumerate(prob.site_names)]  # site secrets from the seed, as simulate's: reproducible DP draws
    for i, o in enumerate(sites):
        for tr in o.ask(n=o.n_init):
            o.tell(tr, prob.evaluate(i, tr.params))
    for _ in range(budget):
        trials = [o.ask() for o in sites]
        for i, (o, tr) in enumerate(zip(sites, trials)):
            o.tell(tr, prob.evaluate(i, tr.params))
    return sites


def run_job(job: AuditJob) -> str:
    """Campaign, attacks, JSON; returns the path."""
    from labfbo.core.dp import DP
    from labfbo.privacy.audit import audit

    options: dict[str, Any] = {"n_particles": job.n_particles, "acquisition": job.acquisition,
                               "stall_rounds": job.stall_rounds}
    if job.epsilon is not None:
        options["privacy"] = DP(clip=job.clip, epsilon=job.epsilon)
    elif job.sigma > 0:
        options["privacy"] = DP(clip=job.clip, noise_multiplier=job.sigma)
    site = campaign(job.problem, job.n_sites, job.seed, max(job.iterations), job.n_init, **options)[0]
    # the table and plots show the noise multiplier a budget calibrated (the job, the cache's key, stays as asked)
    calibrated = float(site.privacy_budget()["noise_multiplier"]) if job.epsilon is not None else None
    rows = audit(site, job.iterations, tol=job.tol, restarts=job.restarts, steps=job.steps, seed=job.seed,
                 sparse_start=job.sparse_start, sequential=job.sequential and job.sparse_start)
    path = Path(job.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"job": asdict(job), "sigma": calibrated, "epsilon": site.epsilon(), "rows": rows}))
    os.replace(tmp, path)
    return job.path


def run_jobs(todo: Sequence[AuditJob], workers: int = 1,
             progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Run the jobs not cached yet; return every job's JSON, in order."""
    from labfbo.core.exceptions import ConfigurationError

    for j in todo:              # a cached run made with other settings would silently answer for these
        if Path(j.path).exists() and json.loads(Path(j.path).read_text())["job"] != json.loads(json.dumps(asdict(j))):
            raise ConfigurationError(f"{j.path} was cached with other settings; use another --out")
    run_pending(todo, run_job, workers, progress)
    return [json.loads(Path(j.path).read_text()) for j in todo]


def _sigma(res: dict[str, Any]) -> float:
    """The campaign's noise multiplier: as configured, or as its budget calibrated it."""
    return float(res["sigma"]) if res.get("sigma") is not None else float(res["job"]["sigma"])


def _cells(results: Sequence[dict[str, Any]]) -> dict[tuple[float, int], dict[str, list[float]]]:
    cells: dict[tuple[float, int], dict[str, list[float]]] = {}
    for res in results:
        for row in res["rows"]:
            cell = cells.setdefault((_sigma(res), row["iteration"]), {m: [] for m in (*METRICS, "n")})
            for m in (*METRICS, "n"):
                cell[m].append(row[m])
    return cells


def _fmt(values: list[float], digits: int = 3) -> str:
    v = np.asarray(values, float)
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per (sigma, iteration), mean ± std over seeds."""
    lines = ["| σ | t | n | dispersion (recovered) | dispersion (true) | dispersion (uniform) | "
             "matched distance | recovered within tol (chance) | site's best query: nearest recovered | "
             "attacker's guess of it (chance) | guess to the site's final best (chance) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (sigma, t), c in sorted(_cells(results).items()):
        lines.append(f"| {sigma:g} | {t} | {int(np.mean(c['n']))} | {_fmt(c['dispersion'])} | "
                     f"{_fmt(c['dispersion_true'])} | {_fmt(c['dispersion_uniform'])} | "
                     f"{_fmt(c['matched_distance'])} | {_fmt(c['recovered'], 2)} "
                     f"({np.mean(c['recovered_chance']):.2f}) | {_fmt(c['incumbent_nearest'])} | "
                     f"{_fmt(c['incumbent_guess'])} ({np.mean(c['incumbent_guess_chance']):.2f}) | "
                     f"{_fmt(c['optimum_guess'])} ({np.mean(c['optimum_guess_chance']):.2f}) |")
    eps = {}
    for res in results:
        eps.setdefault(_sigma(res), []).append(res["epsilon"])
    notes = [f"σ = {s:g}: site 0's ε = {np.mean([e if e is not None else math.inf for e in v]):.1f} "
             f"at δ = 1e-5 after the campaign" for s, v in sorted(eps.items()) if s > 0]
    return "\n".join(lines) + ("\n\n" + "; ".join(notes) + "." if notes else "")


def plot(results: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Fig. 3 (true vs recovered queries, first seed, smallest and largest sigma) and Fig. 4
    (dispersion and recovered fraction against the iteration, dispersion against sigma)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    cells = _cells(results)
    sigmas = sorted({s for s, _ in cells})
    its = sorted({t for _, t in cells})
    first = min(r["job"]["seed"] for r in results)
    shown = [s for s in (sigmas[0], sigmas[-1])][: 1 if len(sigmas) == 1 else 2]
    fig, axes = plt.subplots(len(shown), len(its), figsize=(3.0 * len(its), 3.0 * len(shown)), squeeze=False)
    for i, s in enumerate(shown):
        res = next(r for r in results if _sigma(r) == s and r["job"]["seed"] == first)
        for j, row in enumerate(sorted(res["rows"], key=lambda r: r["iteration"])):
            ax = axes[i][j]
            Xt, Xh = np.asarray(row["X_true"]), np.asarray(row["X_hat"])
            ax.scatter(Xt[:, 0], Xt[:, 1], s=14, marker="x", c="k", label="site's queries")
            ax.scatter(Xh[:, 0], Xh[:, 1], s=14, facecolors="none", edgecolors="tab:red", label="recovered")
            ax.set(xlim=(0, 1), ylim=(0, 1), title=f"σ={s:g}, t={row['iteration']}")
            ax.set_aspect("equal")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    p1 = out / "leakage_queries.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    fig, (a1, a2, a4, a3) = plt.subplots(1, 4, figsize=(18, 3.8))
    for s in sigmas:
        d = [np.mean(cells[(s, t)]["dispersion"]) for t in its]
        e = [np.std(cells[(s, t)]["dispersion"]) for t in its]
        a1.errorbar(its, d, yerr=e, marker="o", capsize=3, label=f"σ={s:g}")
        line = a2.plot(its, [np.mean(cells[(s, t)]["recovered"]) for t in its], marker="o", label=f"σ={s:g}")[0]
        # chance depends on how clustered that campaign's queries are: one line per sigma
        a2.plot(its, [np.mean(cells[(s, t)]["recovered_chance"]) for t in its], "--", color=line.get_color(),
                label=f"random points (σ={s:g})")
        a4.plot(its, [np.mean(cells[(s, t)]["optimum_guess"]) for t in its], marker="o", label=f"σ={s:g}")
    a1.plot(its, [np.mean(cells[(sigmas[0], t)]["dispersion_uniform"]) for t in its], "k--", label="uniform")
    a1.plot(its, [np.mean(cells[(sigmas[0], t)]["dispersion_true"]) for t in its], "k:", label="true queries")
    a1.set(xlabel="BO iteration t", ylabel="dispersion (mean pairwise distance)", title="dispersion vs t")
    a2.set(xlabel="BO iteration t", ylabel="fraction of queries recovered", title="recovery vs t", ylim=(-0.02, 1.02))
    a4.plot(its, [np.mean(cells[(sigmas[0], t)]["optimum_guess_chance"]) for t in its], "k--", label="random guess")
    a4.set(xlabel="BO iteration t", ylabel="distance", title="attacker's guess vs the site's final best")
    for t in its:
        a3.errorbar(sigmas, [np.mean(cells[(s, t)]["dispersion"]) for s in sigmas],
                    yerr=[np.std(cells[(s, t)]["dispersion"]) for s in sigmas], marker="o", capsize=3, label=f"t={t}")
    a3.set(xlabel="noise multiplier σ", ylabel="dispersion", title="dispersion vs σ")
    for a in (a1, a2, a3, a4):
        a.legend(fontsize=7)
    fig.tight_layout()
    p2 = out / "leakage_dispersion.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]
