r"""Suite ``engine``: labfbo's single-site engine against Optuna, BoTorch and random search.

Each job is one method on one panel problem (:mod:`labfbo_bench.engine_panel`) for
one seed. Every method starts from the same Latin-hypercube design (seeded by
``(seed, problem)``) and sees the same noise draws, then evaluates ``budget`` points.

Metrics, on the noiseless function and normalized by the problem's range:

* simple regret after iteration :math:`t`: :math:`r_t = \min_{j \le n_0 + t} f(x_j) - f^*`;
* *final* regret :math:`r_T` and *mean* regret :math:`\frac1T \sum_{t=1}^T r_t`;
* the rank of each method on each problem by mean final regret (ties share the mean
  rank), and its mean rank over the problems;
* seconds per ``ask()`` (or the peer's equivalent step).

The check of the issue: on no problem may labfbo's default be above *both* peers
(Optuna and BoTorch) by more than one standard error of the seed-paired difference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import qmc, rankdata

from labfbo.apps.harness import write_atomic
from labfbo.core.exceptions import ConfigurationError
from labfbo.problems.families import stable_hash
from labfbo_bench.engine_methods import FORMER, RUNNERS
from labfbo_bench.engine_panel import PANEL, EngineProblem, engine_problem, is_known

METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "labfbo": ("labfbo", {}),
    "optuna": ("optuna", {}),
    "optuna-tpe": ("optuna", {"sampler": "tpe"}),
    "botorch": ("botorch", {}),
    "random": ("random", {}),
    # variants of labfbo's engine (studied with --methods), each a change of the former defaults
    "labfbo-smiles": ("labfbo", {"encoding": "rdkit", "descriptors": "use"}),  # reagents by RDKit descriptors
    "labfbo-smiles-auto": ("labfbo", {"encoding": "rdkit", "descriptors": "auto"}),
    "labfbo-morgan": ("labfbo", {"encoding": "morgan", "descriptors": "use"}),  # by Morgan fingerprints
    "labfbo-morgan-auto": ("labfbo", {"encoding": "morgan", "descriptors": "auto"}),
    "labfbo-dimscaled": ("labfbo", {"lengthscale_prior": "dim_scaled"}),  # the lengthscale prior before 2026-12-07
    "labfbo-capped": ("labfbo", {"lengthscale_prior": "capped"}),  # the log-normal with a tail on continuous columns
    "labfbo-qnei": ("labfbo", {"acquisition": "nei", "lengthscale_prior": "capped"}),  # qLogNEI, the capped prior
    # BoTorch's noise prior
    "labfbo-lognormal": ("labfbo", {"noise_prior": "lognormal", "lengthscale_prior": "capped"}),
    "labfbo-former": ("labfbo", dict(FORMER)),
    "labfbo-ucb": ("labfbo", {**FORMER, "acquisition": "ucb", "beta": 4.0}),
    # the categorical kernel before Hamming
    "labfbo-catbotorch": ("labfbo", {**FORMER, "categorical_kernel": "botorch"}),
    "labfbo-ei": ("labfbo", {**FORMER, "acquisition": "ei"}),
    "labfbo-nei": ("labfbo", {**FORMER, "acquisition": "nei"}),
    "labfbo-ei-matern": ("labfbo", {**FORMER, "acquisition": "ei", "kernel": "matern52"}),
    "labfbo-ei-warp": ("labfbo", {**FORMER, "acquisition": "ei", "input_warping": True}),
    "labfbo-ei-sab": ("labfbo", {**FORMER, "acquisition": "ei", "sample_around_best": True}),
    "labfbo-nei-sab": ("labfbo", {**FORMER, "acquisition": "nei", "sample_around_best": True}),
    "labfbo-ei-gamma": ("labfbo", {**FORMER, "acquisition": "ei", "noise_prior": "gamma"}),
    "labfbo-nei-gamma": ("labfbo", {**FORMER, "acquisition": "nei", "noise_prior": "gamma"}),
    "labfbo-nei-auto": ("labfbo", {**FORMER, "acquisition": "nei", "noise_prior": "auto"}),
    # = the former defaults
    "labfbo-nei-wins": ("labfbo", {**FORMER, "acquisition": "nei", "output_transform": "winsorize"}),
    # the defaults before winsorizing
    "labfbo-nei-std": ("labfbo", {**FORMER, "acquisition": "nei", "output_transform": "standardize"}),
    "labfbo-nei-auto-warp": ("labfbo", {**FORMER, "acquisition": "nei", "noise_prior": "auto", "input_warping": True}),
    "labfbo-nei-auto-wins": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "noise_prior": "auto", "output_transform": "winsorize"},
    ),
    "labfbo-nei-auto-r20": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "noise_prior": "auto", "num_restarts": 20, "raw_samples": 1024},
    ),
    "labfbo-nei-auto-r5": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "noise_prior": "auto", "num_restarts": 5, "raw_samples": 256},
    ),
    "labfbo-nei-gamma-matern": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "noise_prior": "gamma", "kernel": "matern52"},
    ),
    "labfbo-nei-gamma-sab": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "noise_prior": "gamma", "sample_around_best": True},
    ),
    "labfbo-nei-matern-sab": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "kernel": "matern52", "sample_around_best": True},
    ),
    "labfbo-ei-gamma-matern-std": (
        "labfbo",
        {
            **FORMER,
            "acquisition": "ei",
            "noise_prior": "gamma",
            "kernel": "matern52",
            # Optuna GPSampler's choices = the defaults
            "output_transform": "standardize",
        },
    ),
    "labfbo-matern": ("labfbo", {**FORMER, "kernel": "matern52"}),
    "labfbo-ei-matern-std": (
        "labfbo",
        {**FORMER, "acquisition": "ei", "kernel": "matern52", "output_transform": "standardize"},
    ),
    "labfbo-nei-matern-std": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "kernel": "matern52", "output_transform": "standardize"},
    ),
    "labfbo-ei-gamma-matern": ("labfbo", {**FORMER, "acquisition": "ei", "noise_prior": "gamma", "kernel": "matern52"}),
    "labfbo-ei-std": ("labfbo", {**FORMER, "acquisition": "ei", "output_transform": "standardize"}),
    "labfbo-nei-gamma-matern-sab": (
        "labfbo",
        {**FORMER, "acquisition": "nei", "noise_prior": "gamma", "kernel": "matern52", "sample_around_best": True},
    ),
}
DEFAULT_METHODS = ("labfbo", "optuna", "optuna-tpe", "botorch", "random")
PEERS = ("optuna", "botorch")


@dataclass(frozen=True)
class EngineJob:
    path: str
    label: str
    problem: str
    seed: int
    runner: str
    options: dict[str, Any] = field(default_factory=dict)
    budget: int | None = None  # None: the panel's


def _resolved(runner: str, options: dict[str, Any]) -> dict[str, Any]:
    """labfbo's full option set (so a change of defaults is a new cache entry)."""
    if runner != "labfbo":
        return dict(options)
    from labfbo.protocols import get_protocol, parse_options

    options = dict(options)
    encoding = options.pop("encoding", None)
    resolved = parse_options(get_protocol("independent"), options).model_dump(mode="json")
    return resolved if encoding is None else {**resolved, "encoding": encoding}


def jobs(out: str, problems: Sequence[str], seeds: Sequence[int],
         methods: Sequence[str] = DEFAULT_METHODS) -> list[EngineJob]:
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ConfigurationError(f"unknown engine methods {unknown}; available: {list(METHODS)}")
    bad = sorted(p for p in problems if not is_known(p))
    if bad:
        raise ConfigurationError(f"unknown engine problems {bad}; available: {list(PANEL)}")
    result = []
    for prob in problems:
        for label in methods:
            runner, opts = METHODS[label]
            key = hashlib.sha256(json.dumps(_resolved(runner, opts), sort_keys=True).encode()).hexdigest()[:8]
            for s in seeds:
                path = Path(out) / prob / f"{label}-{key}" / f"seed{s}.json"
                result.append(EngineJob(str(path), label, prob, int(s), runner, dict(opts)))
    return result


def initial_design(problem: EngineProblem, seed: int) -> list[dict[str, Any]]:
    """The shared Latin-hypercube design of ``problem.n_init`` points (seeded by problem and seed)."""
    ss = np.random.SeedSequence([seed, stable_hash(problem.name), 0])
    u = qmc.LatinHypercube(problem.space.dim, seed=np.random.default_rng(ss)).random(problem.n_init)
    return problem.space.decode(problem.space.snap(u))


def run_engine_job(job: EngineJob) -> str:
    """Run one method on one problem and seed; write its JSON (atomically)."""
    problem = engine_problem(job.problem, job.seed)
    if job.budget is not None:
        problem = dataclasses.replace(problem, budget=job.budget)
    noise = np.random.default_rng(np.random.SeedSequence([job.seed, stable_hash(job.problem), 1])) \
        .standard_normal(problem.n_init + problem.budget) * problem.noise_sd
    truth: list[float] = []

    def observe(params: dict[str, Any]) -> float:
        if len(truth) >= len(noise):
            raise ConfigurationError(f"{job.label} evaluated more than n_init + budget points")
        value = problem.fn(params)
        truth.append(value)
        return value + float(noise[len(truth) - 1])

    with warnings.catch_warnings():  # jitter and restart chatter of every GP method, not failures
        warnings.simplefilter("ignore")
        times = RUNNERS[job.runner](problem, initial_design(problem, job.seed), observe, job.seed, job.options)
    record = {"problem": job.problem, "label": job.label, "seed": job.seed, "n_init": problem.n_init,
              "budget": problem.budget, "f_min": problem.f_min, "f_range": problem.f_range,
              "noise_sd": problem.noise_sd, "values": truth, "ask_seconds": times,
              "options": _resolved(job.runner, job.options)}
    return write_atomic(job.path, json.dumps(record))


def regret_curve(record: dict[str, Any]) -> np.ndarray:
    """Normalized simple regret after each iteration 1..T."""
    best = np.minimum.accumulate(np.asarray(record["values"], dtype=np.float64))[record["n_init"]:]
    return np.maximum(best - record["f_min"], 0.0) / record["f_range"]


@dataclass
class Cell:
    """One method on one problem, over seeds."""

    final: np.ndarray  # (seeds,) normalized final regret
    mean: np.ndarray   # (seeds,) normalized mean regret over iterations
    ask_s: float       # median seconds per ask
    seeds: list[int]


def cells(records: list[dict[str, Any]]) -> dict[tuple[str, str], Cell]:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["problem"], r["label"]), []).append(r)
    out = {}
    for key, rs in by.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        curves = [regret_curve(r) for r in rs]
        out[key] = Cell(np.array([c[-1] for c in curves]), np.array([c.mean() for c in curves]),
                        float(np.median(np.concatenate([r["ask_seconds"] for r in rs]))), [r["seed"] for r in rs])
    return out


def mean_ranks(table: dict[tuple[str, str], Cell], problems: Sequence[str], methods: Sequence[str]) -> dict[str, float]:
    """Each method's rank by mean final regret on each problem, averaged over problems."""
    ranks = np.array([rankdata([table[(p, m)].final.mean() for m in methods]) for p in problems])
    return dict(zip(methods, ranks.mean(0)))


def losses(table: dict[tuple[str, str], Cell], problems: Sequence[str], candidate: str = "labfbo",
           peers: Sequence[str] = PEERS) -> list[str]:
    """Problems where ``candidate``'s mean final regret is above every peer's by more than one
    standard error of the seed-paired difference."""
    bad = []
    for p in problems:
        above = []
        for peer in peers:
            a, b = table[(p, candidate)], table[(p, peer)]
            common = sorted(set(a.seeds) & set(b.seeds))
            d = np.array([a.final[a.seeds.index(s)] - b.final[b.seeds.index(s)] for s in common])
            se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else 0.0
            above.append(d.mean() > se)
        if all(above):
            bad.append(p)
    return bad


def _fmt(x: np.ndarray) -> str:
    se = x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0.0
    return f"{x.mean():.3g} ± {se:.2g}"


def report(records: list[dict[str, Any]], problems: Sequence[str], methods: Sequence[str]) -> str:
    """Markdown: per-problem final / mean regret (mean ± s.e.), seconds per ask, ranks, the check.

    Ranks, mean ranks and the check use the problems every method was run on; a problem
    with a method missing (not run yet) is listed with what it has.
    """
    table = cells(records)
    complete = [p for p in problems if all((p, m) in table for m in methods)]
    lines = ["| problem | d | method | seeds | final regret | mean regret | s / ask | rank |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for p in problems:
        ranks = dict(zip(methods, rankdata([table[(p, m)].final.mean() for m in methods]))) if p in complete else {}
        dim = engine_problem(p, 0).space.dim
        for m in methods:
            c = table.get((p, m))
            if c is None:
                lines.append(f"| {p} | {dim} | {m} | 0 | not run | | | |")
                continue
            rk = f"{ranks[m]:g}" if m in ranks else "—"
            lines.append(
                f"| {p} | {dim} | {m} | {len(c.seeds)} | {_fmt(c.final)} | {_fmt(c.mean)} | {c.ask_s:.3f} | {rk} |"
            )
    if not complete:
        return "\n".join(lines)
    mr = mean_ranks(table, complete, methods)
    lines += ["", f"Over the {len(complete)} problems every method ran on:", "",
              "| method | mean rank | mean normalized final regret | mean normalized mean regret |",
              "|---|---:|---:|---:|"]
    for m in sorted(methods, key=lambda m: mr[m]):
        fin = np.mean([table[(p, m)].final.mean() for p in complete])
        mean = np.mean([table[(p, m)].mean.mean() for p in complete])
        lines.append(f"| {m} | {mr[m]:.2f} | {fin:.4f} | {mean:.4f} |")
    missing = [p for p in problems if p not in complete]
    if missing:
        lines.append(f"\nNot ranked (a method not run): {', '.join(missing)}")
    peers = [q for q in PEERS if q in methods]
    for cand in [m for m in methods if m.startswith("labfbo")] if peers else []:
        bad = losses(table, complete, cand, peers)
        lines.append(f"\n{cand}: above both {'/'.join(peers)} by more than one s.e. on "
                     f"{len(bad)} of {len(complete)} problems{': ' + ', '.join(bad) if bad else ''}")
    return "\n".join(lines)


def family_report(records: list[dict[str, Any]], families: Sequence[str], methods: Sequence[str]) -> str:
    """Markdown: per family, each method's final regret averaged over sites, then mean ± s.e.
    over seeds (unnormalized, as the issue quotes them, and normalized)."""
    lines = ["| family | method | seeds | mean final simple regret | normalized |", "|---|---|---:|---:|---:|"]
    for fam in families:
        for m in methods:
            rs = [r for r in records if r["label"] == m and r["problem"].split("#")[0] == fam]
            seeds = sorted({r["seed"] for r in rs})
            raw = np.array([np.mean([regret_curve(r)[-1] * r["f_range"] for r in rs if r["seed"] == s]) for s in seeds])
            norm = np.array([np.mean([regret_curve(r)[-1] for r in rs if r["seed"] == s]) for s in seeds])
            lines.append(f"| {fam} | {m} | {len(seeds)} | {_fmt(raw)} | {_fmt(norm)} |")
    return "\n".join(lines)


def load(jobs_: Sequence[EngineJob]) -> list[dict[str, Any]]:
    """The cached records of ``jobs_`` (jobs not run yet are skipped)."""
    out = []
    for j in jobs_:
        if not Path(j.path).exists():
            continue
        rec = json.loads(Path(j.path).read_text())
        rec["label"] = j.label
        out.append(rec)
    return out
