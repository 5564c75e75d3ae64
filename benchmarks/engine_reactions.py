"""Single-site engine on the Buchwald-Hartwig labs: labfbo ``independent`` vs Optuna's GPSampler.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/engine_reactions.py \
        --seeds 3 --methods labfbo labfbo-catbotorch optuna random

Each lab of the shipped data (15 aryl halides x 276 base/ligand/additive combinations) alone:
the 3 initial experiments of ``labfbo bench reactions`` (:func:`reactions.initial_design`, the
same for every method, enqueued), then ``--budget`` experiments; a combination missing from
the lab's data is a failed experiment (``tell_failed`` / Optuna's ``FAIL``) that uses up
budget. Reported: the yield regret (lab's best yield minus the best found; 0 found while
nothing succeeded) after 5, 10 and 20 experiments past the design, per lab (mean over seeds)
and mean over labs and seeds (± s.e. over seeds of the mean over labs), and the number of
repeated proposals (a combination already run). Runs are cached as JSON under ``--out``
(labfbo's key is its full resolved option set, so a change of defaults is a new entry).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from labfbo.core.seeding import int_seed
from labfbo.datasets import ReactionData, initial_design, load_reactions
from labfbo_bench.engine_methods import FORMER

#: method -> (runner, options); ``labfbo`` is the current defaults, a ``labfbo-*`` variant changes the former ones
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "labfbo": ("labfbo", {}),
    "labfbo-former": ("labfbo", dict(FORMER)),
    "labfbo-ucb": ("labfbo", {**FORMER, "acquisition": "ucb", "beta": 4.0}),
    "labfbo-std": ("labfbo", {**FORMER, "output_transform": "standardize"}),
    "labfbo-gamma": ("labfbo", {**FORMER, "noise_prior": "gamma"}),
    "labfbo-ei": ("labfbo", {**FORMER, "acquisition": "ei"}),
    # the defaults before the Hamming kernel
    "labfbo-catbotorch": ("labfbo", {**FORMER, "categorical_kernel": "botorch"}),
    "labfbo-matern": ("labfbo", {**FORMER, "kernel": "matern52"}),
    "optuna": ("optuna", {}),
    "random": ("random", {}),
}
CHECKPOINTS = (5, 10, 20)


def _resolved(runner: str, options: dict[str, Any]) -> dict[str, Any]:
    if runner != "labfbo":
        return dict(options)
    from labfbo.protocols import get_protocol, parse_options

    return parse_options(get_protocol("independent"), options).model_dump(mode="json")


def _key(data: ReactionData, params: dict[str, Any]) -> tuple:
    return tuple(params[n] for n in data.space.names)


def run_labfbo(data: ReactionData, lab: int, seed: int, budget: int, options: dict[str, Any]) -> list:
    import labfbo

    opt = labfbo.Optimizer(data.space, objective="maximize", seed=int_seed(seed, lab, 0, "engine-reactions"),
                           n_init=3, horizon=budget, **options)
    out = []

    def run(trial: Any) -> None:
        combo = _key(data, trial.params)
        y = data.tables[lab].get(combo)
        if y is None:
            opt.tell_failed(trial, "combination not in this lab's data")
        else:
            opt.tell(trial, y)
        out.append((list(combo), y))

    for combo in initial_design(data, lab, seed, 3):
        run(opt.enqueue(dict(zip(data.space.names, combo))))
    for _ in range(budget):
        run(opt.ask())
    opt.close()
    return out


def run_optuna(data: ReactionData, lab: int, seed: int, budget: int, options: dict[str, Any]) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {p.name: optuna.distributions.CategoricalDistribution(list(p.choices)) for p in data.space.params}
    sampler = optuna.samplers.GPSampler(seed=int_seed(seed, lab, 0, "engine-reactions"), n_startup_trials=3,
                                        **options)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for combo in initial_design(data, lab, seed, 3):
        study.enqueue_trial(dict(zip(data.space.names, combo)))
    out = []
    for _ in range(3 + budget):
        trial = study.ask(dists)
        combo = _key(data, trial.params)
        y = data.tables[lab].get(combo)
        if y is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, y)
        out.append((list(combo), y))
    return out


def run_random(data: ReactionData, lab: int, seed: int, budget: int, options: dict[str, Any]) -> list:
    combos = data.combos()
    first = initial_design(data, lab, seed, 3)
    rest = [c for c in combos if c not in first]
    pick = np.random.default_rng(int_seed(seed, lab, 0, "engine-reactions-random")).permutation(len(rest))[:budget]
    return [(list(c), data.tables[lab].get(c)) for c in [*first, *(rest[k] for k in pick)]]


RUNNERS = {"labfbo": run_labfbo, "optuna": run_optuna, "random": run_random}


def job_path(out: str, method: str, options: dict[str, Any], lab: int, seed: int, budget: int) -> Path:
    runner, opts = METHODS[method] if method in METHODS else ("labfbo", options)
    key = hashlib.sha256(json.dumps([runner, _resolved(runner, opts), budget], sort_keys=True).encode()).hexdigest()[:8]
    return Path(out) / f"{method}-{key}" / f"lab{lab:02d}" / f"seed{seed}.json"


def run_job(args: tuple[str, str, int, int, int, str]) -> str:
    out, method, lab, seed, budget, data_path = args
    path = job_path(out, method, {}, lab, seed, budget)
    if path.exists():
        return str(path)
    runner, opts = METHODS[method]

    data = load_reactions(data_path or None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trials = RUNNERS[runner](data, lab, seed, budget, opts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"method": method, "lab": lab, "seed": seed, "budget": budget, "trials": trials,
                               "options": _resolved(runner, opts)}))
    tmp.replace(path)
    return str(path)


def regret_curve(data: ReactionData, rec: dict[str, Any]) -> np.ndarray:
    """Regret after the design and after each experiment past it: ``(budget + 1,)``."""
    ys = [0.0 if y is None else max(y, 0.0) for _, y in rec["trials"]]
    best = np.maximum.accumulate(ys)[2:]
    return data.best(rec["lab"]) - best


def repeats(rec: dict[str, Any]) -> int:
    seen, n = set(), 0
    for combo, _ in rec["trials"]:
        n += tuple(combo) in seen
        seen.add(tuple(combo))
    return n


def report(data: ReactionData, out: str, methods: list[str], labs: list[int], seeds: list[int], budget: int) -> str:
    marks = [c for c in CHECKPOINTS if c <= budget]
    lines = ["| method | " + " | ".join(f"after {c}" for c in marks) + " | repeats / campaign | campaigns |",
             "|---|" + "---:|" * (len(marks) + 2)]
    per_lab: dict[str, np.ndarray] = {}
    for m in methods:
        R = np.full((len(seeds), len(labs), budget + 1), np.nan)
        reps = []
        for a, s in enumerate(seeds):
            for b, lab in enumerate(labs):
                p = job_path(out, m, {}, lab, s, budget)
                if p.exists():
                    rec = json.loads(p.read_text())
                    R[a, b] = regret_curve(data, rec)
                    reps.append(repeats(rec))
        n = int(np.isfinite(R[:, :, 0]).sum())
        if not n:
            lines.append(f"| {m} | " + " | " * len(marks) + " 0 |")
            continue
        over_labs = np.nanmean(R, axis=1)  # (seeds, t)
        cells = []
        for c in marks:
            v = over_labs[:, c]
            se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
            cells.append(f"{v.mean():.1f} ± {se:.1f}")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {np.mean(reps):.1f} | {n} |")
        per_lab[m] = np.nanmean(R, axis=0)  # (labs, t)
    lines += ["", "Per lab (mean over seeds), regret after " + "/".join(map(str, marks)) + ":", "",
              "| lab | best | " + " | ".join(per_lab) + " |", "|---|---:|" + "---:|" * len(per_lab)]
    for b, lab in enumerate(labs):
        cells = ["/".join(f"{per_lab[m][b, c]:.0f}" for c in marks) for m in per_lab]
        lines.append(f"| {lab} {data.labs[lab][:26]} | {data.best(lab):.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labs", nargs="+", type=int, default=list(range(15)))
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    ap.add_argument("--methods", nargs="+", default=["labfbo", "optuna"], choices=list(METHODS))
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--data", default="")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--out", default="runs/bench/engine_reactions")
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds))
    todo = [(args.out, m, lab, s, args.budget, args.data) for m in args.methods for s in seeds for lab in args.labs
            if not job_path(args.out, m, {}, lab, s, args.budget).exists()]
    print(f"engine_reactions {' '.join(sys.argv[1:])}: {len(todo)} campaigns to run", flush=True)
    if todo and not args.report_only:
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as ex:
                for k, _ in enumerate(ex.map(run_job, todo), 1):
                    print(f"  {k}/{len(todo)}", flush=True)
        else:
            for k, job in enumerate(todo, 1):
                run_job(job)
                print(f"  {k}/{len(todo)} {job[1]} lab{job[2]} seed{job[3]}", flush=True)
    data = load_reactions(args.data or None)
    print(report(data, args.out, args.methods, args.labs, seeds, args.budget))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
