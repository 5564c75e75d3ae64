r"""``labfbo bench multiobjective``: several objectives and outcome constraints, alone and federated.

Three parts, every run cached as JSON under ``--out`` (resumable, ``--workers``):

* **single** — one site on BoTorch's ``BraninCurrin`` (2-D, two objectives) and
  ``C2DTLZ2`` (4-D, two objectives, one outcome constraint): labfbo ``independent``
  (qLogNEHVI) against a hand-written BoTorch qLogNEHVI loop (the BoTorch tutorial's
  settings: one ``SingleTaskGP`` per outcome, 10 restarts, 512 raw samples, 128 QMC
  samples) and random search, from the same initial design. Reported: the dominated
  hypervolume of the feasible observations after 20 and 40 BO iterations, as a fraction
  of the problem's maximum, and seconds per ask.
* **constrained** — ``ConstrainedGramacy`` (minimize :math:`x_1 + x_2` under two
  nonlinear outcome constraints): labfbo with the outcome constraints against labfbo
  that ignores them (the constraints still measured): the share of infeasible experiments
  after the design, and the best feasible value.
* **family** — 5 related sites, each a shifted ``BraninCurrin`` (site :math:`i` evaluates
  it at :math:`\mathrm{clip}(x + \delta_i)`, :math:`\delta_i` drawn from the seed) with a
  linear parameter constraint :math:`x + y \le 1.6`: every federated protocol against
  independent BO, hypervolume per site after 20 iterations, and a count of proposals that
  broke the parameter constraint (0 is the only acceptable count).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy.stats import qmc

from labfbo.apps.harness import write_atomic
from labfbo.core.objectives import Objective, Outcome
from labfbo.core.seeding import stable_hash
from labfbo.space.search import Real, SearchSpace

SINGLE = ("branin_currin", "c2dtlz2")
SINGLE_METHODS = ("labfbo", "botorch", "random")
FAMILY_PROTOCOLS = ("independent", "distribution", "consensus", "surface", "surface-parego", "gradient")
QUICK_PROTOCOLS = ("independent", "distribution", "consensus", "surface", "surface-parego")
#: family arms that are a protocol with options: name -> (protocol, options)
ARMS: dict[str, tuple[str, dict[str, Any]]] = {"surface-parego": ("surface", {"multi_objective": "parego"})}
#: the cache version of an arm whose behaviour changed (v3: surface shares one surface per objective;
#: v4: its Fourier features scaled by sqrt(2/F))
ARM_VERSION = {"surface": "family-v4", "surface-parego": "family-v4-parego"}
FAMILY_SITES, FAMILY_ITERS = 5, 20
#: the federated families: name -> (initial points per site, shift dimensions, the linear parameter constraint)
FAMILIES: dict[str, tuple[int, int, tuple[dict[str, float], float]]] = {
    "branin_currin": (4, 2, ({"x0": 1.0, "x1": 1.0}, 1.6)),
    "dtlz2_6d": (6, 5, ({"x1": 1.0, "x2": 1.0}, 1.5)),
}
FAMILY_INIT = FAMILIES["branin_currin"][0]
CHECKPOINTS = (20, 40)


@dataclass(frozen=True)
class MOProblem:
    """A benchmark problem: ``evaluate(x in [0,1]^d) -> {outcome: value}`` and its declaration."""

    name: str
    dim: int
    n_init: int
    objectives: tuple[Objective, ...]
    constraints: tuple[Outcome, ...]
    evaluate: Callable[[np.ndarray], dict[str, float]]
    max_hv: float

    def space(self, linear: Sequence[Any] = ()) -> SearchSpace:
        return SearchSpace([Real(f"x{i}", 0.0, 1.0) for i in range(self.dim)], constraints=list(linear) or None)


def _botorch_problem(name: str, shift: np.ndarray | None = None) -> MOProblem:
    from botorch.test_functions.multi_objective import C2DTLZ2, BraninCurrin

    if name == "branin_currin":
        f: Any = BraninCurrin()
        objs = (Objective("f1", "minimize", threshold=18.0), Objective("f2", "minimize", threshold=6.0))
        cons: tuple[Outcome, ...] = ()
        n_init = 6
    elif name == "c2dtlz2":
        f = C2DTLZ2(dim=4, num_objectives=2)
        objs = (Objective("f1", "minimize", threshold=1.1), Objective("f2", "minimize", threshold=1.1))
        cons = (Outcome("slack", ">=", 0.0),)
        n_init = 10
    else:
        raise KeyError(name)
    d = f.dim

    def evaluate(x: np.ndarray) -> dict[str, float]:
        u = np.clip(np.asarray(x, dtype=np.float64) + (0.0 if shift is None else shift), 0.0, 1.0)
        X = torch.as_tensor(u, dtype=torch.float64).reshape(1, d)
        Y = f.evaluate_true(X).reshape(-1).tolist()
        out = {"f1": Y[0], "f2": Y[1]}
        if cons:
            out["slack"] = float(f.evaluate_slack_true(X).reshape(-1)[0])
        return out

    return MOProblem(name, d, n_init, objs, cons, evaluate, float(f.max_hv))


def shifted_dtlz2(shift: np.ndarray, dim: int = 6) -> MOProblem:
    r"""DTLZ2 (Deb et al. 2002; two objectives, minimized) in ``dim`` parameters whose distance
    variables' optimum sits at :math:`0.5 + \delta` instead of 0.5:
    :math:`f_{1,2} = (1 + g)\,(\cos, \sin)(\pi x_0 / 2)`, :math:`g = \sum_{i \ge 1} (x_i - 0.5 - \delta_i)^2`.
    The Pareto front (and the maximal hypervolume, reference point 1.1) is DTLZ2's for every
    :math:`|\delta_i| \le 0.5`: the sites share the front and differ in where it is reached."""
    delta = np.asarray(shift, dtype=np.float64).reshape(dim - 1)

    def evaluate(x: np.ndarray) -> dict[str, float]:
        u = np.asarray(x, dtype=np.float64).reshape(dim)
        g = float(np.sum((u[1:] - 0.5 - delta) ** 2))
        return {"f1": (1 + g) * float(np.cos(np.pi * u[0] / 2)), "f2": (1 + g) * float(np.sin(np.pi * u[0] / 2))}

    objs = (Objective("f1", "minimize", threshold=1.1), Objective("f2", "minimize", threshold=1.1))
    return MOProblem("dtlz2_6d", dim, 6, objs, (), evaluate, 1.1 ** 2 - np.pi / 4)


def hypervolume(problem: MOProblem, outcomes: list[dict[str, float]]) -> float:
    """Dominated hypervolume of the feasible outcomes (maximization orientation, thresholds as the
    reference point)."""
    from botorch.utils.multi_objective.box_decompositions.dominated import DominatedPartitioning

    feas = [o for o in outcomes if all(c.slack(o[c.name]) >= 0 for c in problem.constraints)]
    ref = torch.tensor([ob.sign * ob.threshold for ob in problem.objectives], dtype=torch.float64)  # type: ignore
    if not feas:
        return 0.0
    Y = torch.tensor([[ob.sign * o[ob.name] for ob in problem.objectives] for o in feas], dtype=torch.float64)
    return float(DominatedPartitioning(ref_point=ref, Y=Y).compute_hypervolume())


def design(dim: int, n: int, seed: int, name: str) -> np.ndarray:
    ss = np.random.SeedSequence([seed, stable_hash(name), 0])
    return qmc.LatinHypercube(dim, seed=np.random.default_rng(ss)).random(n)


# -- jobs ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MOJob:
    path: str
    part: str      # single | constrained | family
    problem: str
    method: str
    seed: int
    budget: int
    options: dict[str, Any] = field(default_factory=dict)


def jobs(out: str, quick: bool, seeds: Sequence[int]) -> list[MOJob]:
    budget = CHECKPOINTS[0] if quick else CHECKPOINTS[-1]
    result = []
    key = hashlib.sha256(b"v1").hexdigest()[:6]  # bump a part's version when its runs change meaning
    fkey = hashlib.sha256(b"family-v2").hexdigest()[:6]  # v2: independent starts from the collaborative design
    for prob in SINGLE:
        for m in SINGLE_METHODS:
            for s in seeds:
                result.append(MOJob(f"{out}/single/{prob}/{m}-{key}/b{budget}-seed{s}.json", "single", prob, m, s,
                                    budget))
    for m in ("constrained", "unconstrained"):
        for s in seeds:
            result.append(MOJob(f"{out}/constrained/gramacy/{m}-{key}/seed{s}.json", "constrained", "gramacy", m, s,
                                20))
    for fam in FAMILIES:
        for m in QUICK_PROTOCOLS if quick else FAMILY_PROTOCOLS:
            mkey = hashlib.sha256(ARM_VERSION[m].encode()).hexdigest()[:6] if m in ARM_VERSION else fkey
            for s in seeds:
                result.append(MOJob(f"{out}/family/{fam}/{m}-{mkey}/seed{s}.json", "family", fam, m, s, FAMILY_ITERS))
    return result


def run_job(job: MOJob) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = {"single": _run_single, "constrained": _run_constrained, "family": _run_family}[job.part](job)
    record.update(part=job.part, problem=job.problem, method=job.method, seed=job.seed, budget=job.budget)
    return write_atomic(job.path, json.dumps(record))


def _run_single(job: MOJob) -> dict[str, Any]:
    problem = _botorch_problem(job.problem)
    X0 = design(problem.dim, problem.n_init, job.seed, job.problem)
    outcomes, times = [problem.evaluate(x) for x in X0], []
    if job.method == "labfbo":
        import labfbo

        space = problem.space()
        opt = labfbo.Optimizer(space, objective=list(problem.objectives), seed=job.seed, n_init=0,
                               outcome_constraints=list(problem.constraints) or None)
        opt.add_observations(space.decode(X0), outcomes)
        for _ in range(job.budget):
            t0 = time.perf_counter()
            tr = opt.ask()
            times.append(time.perf_counter() - t0)
            x = space.encode([tr.params])[0]
            outcomes.append(problem.evaluate(x))
            opt.tell(tr, outcomes[-1])
    elif job.method == "botorch":
        from labfbo_bench.multiobjective_loop import botorch_qlognehvi

        times = botorch_qlognehvi(problem, X0, outcomes, job.budget, job.seed)
    else:
        rng = np.random.default_rng([job.seed, 7])
        outcomes += [problem.evaluate(x) for x in rng.random((job.budget, problem.dim))]
    hv = [hypervolume(problem, outcomes[: problem.n_init + k]) / problem.max_hv for k in range(job.budget + 1)]
    return {"outcomes": outcomes, "hv": hv, "ask_seconds": times, "n_init": problem.n_init}


def _run_constrained(job: MOJob) -> dict[str, Any]:
    from botorch.test_functions.synthetic import ConstrainedGramacy

    import labfbo

    f = ConstrainedGramacy()
    space = SearchSpace([Real("x1", 0.0, 1.0), Real("x2", 0.0, 1.0)])

    def evaluate(params: dict[str, float]) -> dict[str, float]:
        X = torch.tensor([[params["x1"], params["x2"]]], dtype=torch.float64)
        s = f.evaluate_slack_true(X).reshape(-1).tolist()
        return {"value": float(f.evaluate_true(X)), "c1": s[0], "c2": s[1]}

    cons = [Outcome("c1", ">=", 0.0), Outcome("c2", ">=", 0.0)]
    with_cons = job.method == "constrained"
    opt = (labfbo.Optimizer(space, objective=Objective("value", "minimize"), outcome_constraints=cons, seed=job.seed,
                            n_init=5) if with_cons else labfbo.Optimizer(space, "minimize", seed=job.seed, n_init=5))
    outcomes = []
    for _ in range(5 + job.budget):
        tr = opt.ask()
        outcomes.append(evaluate(tr.params))
        opt.tell(tr, outcomes[-1] if with_cons else outcomes[-1]["value"])
    feasible = [o["c1"] >= 0 and o["c2"] >= 0 for o in outcomes]
    best = [min([o["value"] for o, ok in zip(outcomes[:k], feasible[:k]) if ok], default=None)
            for k in range(5, 5 + job.budget + 1)]
    return {"outcomes": outcomes, "infeasible_after_design": 1.0 - float(np.mean(feasible[5:])),
            "best_feasible": best, "optimum": 0.5998}


def _run_family(job: MOJob) -> dict[str, Any]:
    import labfbo
    from labfbo.space.constraints import LinearConstraint

    n_init, k, (coefs, rhs) = FAMILIES[job.problem]
    tag = "mo-family" if job.problem == "branin_currin" else f"mo-family/{job.problem}"
    rng = np.random.default_rng(np.random.SeedSequence([job.seed, stable_hash(tag)]))
    shifts = rng.uniform(-0.1, 0.1, size=(FAMILY_SITES, k))
    problems = [_botorch_problem(job.problem, shift=s) if job.problem == "branin_currin" else shifted_dtlz2(s)
                for s in shifts]
    space = problems[0].space([LinearConstraint(coefs, "<=", rhs)])
    names = [f"site{i}" for i in range(FAMILY_SITES)]
    protocol, options = ARMS.get(job.method, (job.method, {}))
    federated = protocol != "independent"
    coord = (
        labfbo.Coordinator(protocol, sites=names, seed=job.seed, horizon=job.budget, **options) if federated else None
    )
    sites = [labfbo.Optimizer(space, objective=list(problems[0].objectives), protocol=protocol, coordinator=coord,
                              site=s, seed=job.seed, n_init=n_init if federated else 0, secret=1000 + i,
                              **options) for i, s in enumerate(names)]
    if not federated:  # the same starting points as the federated arms: the study's collaborative design
        from labfbo.coordinator import collaborative_design

        cells = collaborative_design(space, FAMILY_SITES, n_init, job.seed)
        for o, rows in zip(sites, cells):
            for params in space.decode(rows):
                o.enqueue(params)
    outcomes: list[list[dict[str, float]]] = [[] for _ in names]
    violations, times = 0, []

    def run(i: int, tr: Any) -> None:
        nonlocal violations
        violations += bool(space.violations(tr.params))
        outcomes[i].append(problems[i].evaluate(space.encode([tr.params])[0]))
        sites[i].tell(tr, outcomes[i][-1])

    for i, o in enumerate(sites):
        for tr in (o.ask(n=n_init) if federated else o.pending):
            run(i, tr)
    for _ in range(job.budget):
        t0 = time.perf_counter()
        trials = [o.ask() for o in sites]
        times.append((time.perf_counter() - t0) / len(sites))
        for i, tr in enumerate(trials):
            run(i, tr)
    for o in sites:
        o.close()
    hv = [[hypervolume(problems[i], outcomes[i][: n_init + k]) / problems[i].max_hv
           for k in range(job.budget + 1)] for i in range(len(names))]
    return {"hv": hv, "violations": violations, "ask_seconds": times, "shifts": shifts.tolist()}


# -- report ----------------------------------------------------------------------------------------------
def load(jobs_: Sequence[MOJob]) -> list[dict[str, Any]]:
    return [json.loads(Path(j.path).read_text()) for j in jobs_ if Path(j.path).exists()]


def _ms(x: Sequence[float]) -> str:
    a = np.asarray(x, dtype=np.float64)
    se = a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else 0.0
    return f"{a.mean():.3f} ± {se:.3f}"


def report(records: list[dict[str, Any]]) -> str:
    lines = ["**Single site** — hypervolume of the feasible observations, fraction of the maximum "
             "(mean ± s.e. over seeds); seconds per ask (median)", "",
             "| problem | method | seeds | HV after 20 | HV after 40 | s / ask |", "|---|---|---:|---:|---:|---:|"]
    by: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["part"], r["problem"], r["method"]), []).append(r)
    for (part, prob, m), rs in sorted(by.items()):
        if part != "single":
            continue
        at = [_ms([r["hv"][k] for r in rs]) if all(len(r["hv"]) > k for r in rs) else "—" for k in CHECKPOINTS]
        secs = np.median(np.concatenate([r["ask_seconds"] for r in rs])) if rs[0]["ask_seconds"] else 0.0
        lines.append(f"| {prob} | {m} | {len(rs)} | {at[0]} | {at[1]} | {secs:.2f} |")
    lines += ["", "**Outcome constraints** — ConstrainedGramacy, 5 initial points + 20: share of infeasible "
              "experiments after the design; best feasible value (optimum 0.5998)", "",
              "| method | seeds | infeasible share | best feasible after 20 |", "|---|---:|---:|---:|"]
    for (part, _prob, m), rs in sorted(by.items()):
        if part == "constrained":
            bests = [r["best_feasible"][-1] for r in rs if r["best_feasible"][-1] is not None]
            lines.append(f"| {m} | {len(rs)} | {_ms([r['infeasible_after_design'] for r in rs])} | "
                         f"{_ms(bests) if bests else '—'} ({len(bests)} of {len(rs)} seeds found one) |")
    lines += [
        "",
        f"**Federated families** — {FAMILY_SITES} related sites (shifted BraninCurrin: 4 initial points, "
        f"x0 + x1 <= 1.6; shifted DTLZ2 in 6-D: 6 initial points, x1 + x2 <= 1.5) + {FAMILY_ITERS} rounds: "
        "hypervolume per site after 10 and 20 iterations (mean over sites, mean ± s.e. over seeds); proposals "
        "that broke the parameter constraint",
        "",
        "| family | protocol | seeds | HV of the design | HV after 10 | HV after 20 | violations | s / site-ask |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (part, prob, m), rs in sorted(by.items()):
        if part == "family":
            h0, h10, h20 = ([np.mean([h[k] for h in r["hv"]]) for r in rs] for k in (0, 10, -1))
            lines.append(f"| {prob} | {m} | {len(rs)} | {_ms(h0)} | {_ms(h10)} | {_ms(h20)} | "
                         f"{sum(r['violations'] for r in rs)} | "
                         f"{np.median(np.concatenate([r['ask_seconds'] for r in rs])):.2f} |")
    return "\n".join(lines)
