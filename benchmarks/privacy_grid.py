"""`labfbo bench privacy-utility --epsilons ...`: regret against a campaign budget ``DP(epsilon=...)``.

Every protocol with a DP mechanism (``gradient``, ``distribution``, ``surface``, and the
mechanism variants below) runs with its labfbo defaults and ``privacy=DP(epsilon=e)`` for
each budget ``e`` (the noise calibrated by each site to its planned releases,
:mod:`labfbo.privacy.budget`), beside the same protocol without DP and ``independent`` — all
in one run, with the same designs and seeds:

Protocol ``vote`` (randomized response over a public codebook) is in the grid beside them.

* **pacd** — the `pacd` quick setting: Branin and Wing Weight families, 5 sites, T = 30,
  3 seeds (``--quick``: the same); metric: the final normalized regret and the AUC over the
  first 10 % of iterations, site-averaged;
* **reactions** — a Buchwald–Hartwig scenario (``--scenario``: (a), 5 labs, the default; (c), all 15),
  3 initial experiments, 20 rounds; metric: yield regret after 10 and 20 (``--quick``: 3 seeds).

The *gain kept* of a private row is ``(R_independent - R_dp) / (R_independent - R_nonprivate)``
(means over seeds; undefined when the non-private gain is not larger than one standard error
of the difference, i.e. within the seed-to-seed spread).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from labfbo.apps.harness import Job
from labfbo.privacy import DP
from labfbo_bench import pacd

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
QUICK_EPSILONS = (0.5, 2.0, 8.0)
#: protocol (or mechanism variant) -> (protocol, options without privacy, DP clip C)
PRIVATE: dict[str, tuple[str, dict[str, Any], float]] = {
    "gradient": ("gradient", {}, 1.0),
    "distribution": ("distribution", {}, 3.0),
    "surface": ("surface", {}, 2.0),
    # the mechanisms that spend a budget on fewer or less noisy releases (docs/privacy.md)
    "gradient-lean": ("gradient", {"warmup_steps": 50, "svgd_steps": 2}, 1.0),  # 108 releases over T = 30, not 1,080
    "gradient-distributed": ("gradient", {"secure_aggregation": True, "dp_noise": "distributed"}, 1.0),
    "surface-every5": ("surface", {"release_every": 5}, 2.0),
    "distribution-centre": ("distribution", {"dp_belief": "centre", "release_every": 5}, 3.0),
    # a choice among a site's dealt design rows by randomized response (pure DP; clip unused): one vote under a budget
    "vote": ("vote", {}, 1.0),
    "vote-every10": ("vote", {"release_every": 10}, 1.0),
    # an earlier default: every site chooses among 8 public Sobol points of the cube
    "vote-codebook8": ("vote", {"codebook": 8}, 1.0),
    # the example-level guarantee: one experiment's setting and result protected (DP(unit="experiment"))
    # (gradient refuses that unit; distribution's noise is the same under both: docs/privacy.md)
    "surface-experiment": ("surface", {}, 2.0),
    "surface-experiment-every5": ("surface", {"release_every": 5}, 2.0),  # 4 releases over 20 rounds, not 20
    # the harm guard's leave-one-out check in place of most of the noise guard
    "surface-experiment-loose": ("surface", {"noise_guard": 4.0}, 2.0),
    "surface-loose": ("surface", {"noise_guard": 4.0}, 2.0),
}
#: the unit of protection of a variant (the others: "site", the task level)
UNITS: dict[str, str] = {"surface-experiment": "experiment", "surface-experiment-loose": "experiment",
                         "surface-experiment-every5": "experiment"}
PACD_FUNCTIONS = ("branin", "wing_weight")
NON_PRIVATE = {"independent": "Independent (labfbo defaults)", "gradient": "PACD-BO (labfbo defaults)",
               "distribution": "GUIDE-FBO (labfbo defaults)", "surface": "Surface (labfbo defaults)",
               "vote": "Vote (labfbo defaults)", "vote-codebook8": "Vote-codebook8"}


def plain_of(name: str) -> str | None:
    """The non-private method a variant's gain is measured against: its own if it has one (a variant
    that changes more than the DP mechanism), else its protocol's."""
    return NON_PRIVATE.get(name) or NON_PRIVATE.get(PRIVATE[name][0])


def register(name: str, protocol: str, options: dict[str, Any], clip: float) -> None:
    """Add a mechanism variant (e.g. ``release_every=5``) to the grid's choices."""
    PRIVATE[name] = (protocol, options, clip)


def label(name: str, epsilon: float | None) -> str:
    return name if epsilon is None else f"{name} ε={epsilon:g}"


def private_options(name: str, epsilon: float) -> tuple[str, dict[str, Any]]:
    protocol, options, clip = PRIVATE[name]
    return protocol, {**options, "privacy": DP(epsilon=epsilon, clip=clip, unit=UNITS.get(name, "site"))}


def pacd_jobs(out: str, names: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int],
              functions: Sequence[str] = PACD_FUNCTIONS, budget: int = 30, n_sites: int = 5,
              initial: int | None = None) -> list[Job]:
    """The non-private rows (the `pacd` suite's cache folder layout) and one row per (variant, budget);
    ``n_sites`` sites with ``initial`` points each (default: the suite's) and ``budget`` rounds after them."""
    plain = [NON_PRIVATE["independent"], *sorted({m for m in map(plain_of, names) if m is not None})]
    jobs = pacd.jobs(out, tuple(functions), list(seeds), budget=budget, n_sites=n_sites, methods=tuple(plain),
                     initial=initial)
    setting = pacd.setting(n_sites, initial)
    for fn in functions:
        for name in names:
            for eps in epsilons:
                protocol, options = private_options(name, eps)
                for s in seeds:
                    path = Path(out) / f"{fn}{setting}" / f"DP-{name}-eps{eps:g}" / f"seed{s}.json"
                    jobs.append(Job(path=str(path), label=label(name, eps), problem=fn,
                                    problem_kwargs={"n_sites": n_sites}, protocol=protocol, seed=s,
                                    n_init=initial or pacd.n_init(fn), budget=budget, options=options))
    return jobs


def _mean_sd(values: Sequence[float]) -> str:
    a = np.asarray(values, dtype=float)
    return f"{a.mean():.3g} ± {a.std():.2g}" if len(a) else ""


def _kept(alone: Sequence[float], plain: Sequence[float], private: Sequence[float]) -> str:
    """The share of the non-private gain over independent that the private row keeps; none when the
    non-private gain is not larger than one standard error of the difference (seed-to-seed spread)."""
    a, p, q = (np.asarray(v, dtype=float) for v in (alone, plain, private))
    gain = a.mean() - p.mean()
    se = float(np.sqrt(a.var(ddof=1) / len(a) + p.var(ddof=1) / len(p))) if min(len(a), len(p)) > 1 else 0.0
    if not gain > se:
        return "— (no gain beyond the spread)"
    return f"{100 * (a.mean() - q.mean()) / gain:.0f} %"


def pacd_summary(results: Sequence[Any], jobs: Sequence[Job]) -> dict[tuple[str, str], dict[str, Any]]:
    """(function, label) -> final regrets, AUCs and epsilons per seed."""
    label_of = {j.path: j.label for j in jobs}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for job, r in zip(jobs, results):
        row = out.setdefault((r.problem, label_of[job.path]), {"final": [], "auc": [], "eps": []})
        row["final"].append(float(r.final_regret().mean()))
        row["auc"].append(float(r.auc.mean()))
        row["eps"].extend(float(e) for e in (r.epsilon or []))
    return out


def pacd_table(summary: dict[tuple[str, str], dict[str, Any]], names: Sequence[str],
               epsilons: Sequence[float]) -> str:
    lines = ["| function | method | seeds | final normalized regret | gain kept (final) | AUC | gain kept (AUC) "
             "| max ε spent per site |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    functions = sorted({fn for fn, _ in summary}, key=lambda f: PACD_FUNCTIONS.index(f) if f in PACD_FUNCTIONS else 99)
    for fn in functions:
        alone = summary.get((fn, NON_PRIVATE["independent"]))
        if alone is None:
            continue
        lines.append(f"| {fn} | independent | {len(alone['final'])} | {_mean_sd(alone['final'])} | | "
                     f"{_mean_sd(alone['auc'])} | | — |")
        for name in names:
            plain = summary.get((fn, plain_of(name) or ""))
            rows = [(None, plain)] + [(e, summary.get((fn, label(name, e)))) for e in epsilons]
            for eps, row in rows:
                if row is None or (eps is None and name not in NON_PRIVATE):  # a variant: its protocol's row
                    continue
                kept_f = kept_a = ""
                if eps is not None and plain is not None:
                    kept_f = _kept(alone["final"], plain["final"], row["final"])
                    kept_a = _kept(alone["auc"], plain["auc"], row["auc"])
                spent = f"{max(row['eps']):.3g}" if row["eps"] else "— (no DP)"
                lines.append(f"| {fn} | {label(name, eps) if eps is not None else name + ' (no DP)'} | "
                             f"{len(row['final'])} | {_mean_sd(row['final'])} | {kept_f} | {_mean_sd(row['auc'])} | "
                             f"{kept_a} | {spent} |")
    return "\n".join(lines)


def reaction_plain(name: str) -> str:
    """The reactions suite's non-private method of a variant: its own (a method of the suite's
    ``VARIANTS``) if it has one, else its protocol's defaults."""
    return name if name in NON_PRIVATE else PRIVATE[name][0]


def reaction_method(name: str, epsilon: float) -> str:
    """The reactions suite's method name of a private row (parsed by :func:`reaction_variant`)."""
    return f"{name}@eps={epsilon:g}"


def reaction_variant(method: str) -> tuple[str, dict[str, Any]] | None:
    """``"<variant>@eps=<e>"`` -> (protocol, options with ``DP(epsilon=e)``); None for other names."""
    if "@eps=" not in method:
        return None
    name, eps = method.split("@eps=")
    if name not in PRIVATE:
        return None
    return private_options(name, float(eps))


def reaction_summary(paths: dict[str, list[Path]], at: Sequence[int] = (10, 20)) -> dict[str, dict[str, Any]]:
    """method -> regret after each checkpoint (per seed, averaged over labs) and epsilons spent."""
    out: dict[str, dict[str, Any]] = {}
    for method, files in paths.items():
        recs = [json.loads(p.read_text()) for p in files if p.exists()]
        recs = [r for r in recs if "regret" in r]
        if not recs:
            continue
        reg = np.array([r["regret"] for r in recs]).mean(axis=1)  # (seeds, budget + 1)
        out[method] = {f"@{k}": reg[:, k].tolist() for k in at if k < reg.shape[1]}
        out[method]["eps"] = [e for r in recs for e in (r.get("epsilon") or []) if e is not None]
    return out


def reaction_table(summary: dict[str, dict[str, Any]], names: Sequence[str], epsilons: Sequence[float]) -> str:
    lines = ["| method | seeds | regret @10 | gain kept @10 | regret @20 | gain kept @20 | max ε spent per site |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    alone = summary.get("independent")
    if alone is None:
        return "\n".join(lines)
    lines.append(f"| independent | {len(alone['@10'])} | {_mean_sd(alone['@10'])} | | {_mean_sd(alone['@20'])} | | — |")
    for name in names:
        plain = summary.get(reaction_plain(name))
        rows = ([(None, plain)] if name in NON_PRIVATE else []) + [
            (e, summary.get(reaction_method(name, e))) for e in epsilons]
        for eps, row in rows:
            if row is None:
                continue
            kept = {k: (_kept(alone[k], plain[k], row[k])
                        if eps is not None and plain is not None else "") for k in ("@10", "@20")}
            spent = f"{max(row['eps']):.3g}" if row["eps"] else "— (no DP)"
            lines.append(f"| {name + ' (no DP)' if eps is None else label(name, eps)} | {len(row['@10'])} | "
                         f"{_mean_sd(row['@10'])} | {kept['@10']} | {_mean_sd(row['@20'])} | {kept['@20']} | {spent} |")
    return "\n".join(lines)


def plot(panels: dict[str, dict[str, Any]], path: Path) -> Path:
    """One panel per problem: metric against the budget (log x) per variant, with the variant's
    non-private level (dashed) and independent (grey) as horizontal lines.

    ``panels[title] = {"ylabel": str, "independent": float, "rows": {variant: ([eps], [metric]),
    ...}, "plain": {variant: float}}``.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (title, p) in zip(axes[0], panels.items()):
        for i, (name, (eps, vals)) in enumerate(p["rows"].items()):
            colour = f"C{i}"
            ax.plot(eps, vals, "o-", color=colour, label=f"{name}, DP(epsilon)")
            if name in p["plain"]:
                ax.axhline(p["plain"][name], color=colour, ls="--", lw=1, label=f"{name}, no DP")
        ax.axhline(p["independent"], color="0.4", lw=2, label="independent (no federation)")
        ax.set_xscale("log")
        ticks = sorted({e for eps, _ in p["rows"].values() for e in eps})
        if ticks:  # the budgets themselves, no crowded minor labels
            ax.set_xticks(ticks, [f"{e:g}" for e in ticks])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_yscale("log" if p.get("log") else "linear")
        ax.set_xlabel("campaign budget ε per site (δ = 1e-5)")
        ax.set_ylabel(p["ylabel"])
        ax.set_title(title)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
