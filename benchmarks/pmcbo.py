r"""Suite ``pmcbo``: PMCBO Tables 4–5 — expert priors and consensus on homogeneous clients.

Setting (PMCBO §7.1): :math:`L = 5` identical clients (heterogeneity 0) on Branin,
Hartmann-3 and Hartmann-6, noise-free; ``n_init = 5`` per client (the paper does not say);
60 iterations; :math:`\omega = 0.01`; πBO :math:`\beta = 10`.

Priors (our reading of the paper, which is inconsistent — its text puts the strong prior
≈ 0.1 from the optimum with sd 0.01 (normalized), its Table 3 puts the means at the
optima). We take Table 3: per parameter, with :math:`r_j` the range,

* **strong**: ``Normal(mean = Table 3 optimum, std = 0.01 r_j)``;
* **weak**: mean moved ``0.1 r_j`` from the optimum towards the centre of the box,
  ``std = 0.1 r_j``;
* **incorrect**: ``Normal(mean = worst point, std = 0.01 r_j)``, the worst point being the
  maximizer of the objective over 4096 fixed Sobol points.

Methods: EI / UCB (``independent``); πBO-EI/UCB (``independent``, ``prior_mode="pibo"``) and
PMCBO-EI/UCB (``consensus``, uniform W, ``prior_mode="decay"``) with each prior in the
paper's exact setting (``prior_floor=0, prior_check=0, prior_patience=0``); CBOC-U / CBOC-L
(``consensus`` without prior, uniform / leader W); and PMCBO with labfbo's defaults (floor 0.1,
falsification after 3 points, confirmation from round 5) with the strong and the incorrect
prior, to show that they keep a right prior's gain and bound a wrong prior's cost.

Metric: mean average simple regret :math:`\frac{1}{tL}\sum_l \sum_{\tau \le t} r_l^\tau` at
:math:`t = 30` and :math:`t = 60`, side by side with the paper.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import qmc

from labfbo.apps.harness import Job
from labfbo.apps.simulation import SimulationResult
from labfbo.models.gp import PAPERS_SURROGATE
from labfbo.models.priors import Normal

FUNCTIONS = ("branin", "hartmann3", "hartmann6")
PAPER_KEYS = {"branin": "branin", "hartmann3": "hartmann3", "hartmann6": "hartmann6"}
EXACT = {"prior_floor": 0.0, "prior_check": 0, "prior_patience": 0}
#: the papers' acquisitions (Tables 4 and 5); their rows model the outputs as they are
PAPER_ACQUISITIONS = ("ei", "ucb")


def reference() -> dict[str, Any]:
    """PMCBO's Tables 3–5 as carried in ``benchmarks/reference_tables.json``."""
    text = resources.files("labfbo_bench").joinpath("reference_tables.json").read_text()
    return json.loads(text)["pmcbo"]


def make_priors(problem_name: str) -> dict[str, dict[str, Normal]]:
    """Strong, weak and incorrect priors of a PMCBO benchmark (see module docstring)."""
    from labfbo.problems.families import get_problem

    prob = get_problem(problem_name, n_sites=1, heterogeneity=0.0, seed=0)
    space = prob.space
    lows = np.array([p.low for p in space.params])
    highs = np.array([p.high for p in space.params])
    r = highs - lows
    opt = np.asarray(reference()["prior_means_table3"][PAPER_KEYS[problem_name]], dtype=np.float64)
    centre = 0.5 * (lows + highs)
    weak_mean = opt + 0.1 * r * np.sign(centre - opt)
    pts = space.decode(qmc.Sobol(space.dim, scramble=True, seed=7).random_base2(12))
    worst = np.array(space.vector(max(pts, key=lambda p: prob.evaluate(0, p))), dtype=np.float64)

    def prior(mean: np.ndarray, std: np.ndarray) -> dict[str, Normal]:
        return {n: Normal(float(m), float(s)) for n, m, s in zip(space.names, mean, std)}

    return {"strong": prior(opt, 0.01 * r), "weak": prior(weak_mean, 0.1 * r),
            "incorrect": prior(worst, 0.01 * r)}


@dataclass(frozen=True)
class Method:
    label: str            # the paper's row name where there is one
    protocol: str
    acquisition: str
    prior: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def methods(acquisitions: tuple[str, ...] = ("ei", "ucb")) -> list[Method]:
    """The rows under each acquisition. Under the paper's (EI, UCB) every row but the ``(labfbo
    defaults)`` ones is the paper's setting, outputs as they are; under ``nei`` (labfbo's) every row
    has labfbo's surrogate defaults."""
    out: list[Method] = []
    for acq in acquisitions:
        base = acq.upper()
        paper = PAPERS_SURROGATE if acq in PAPER_ACQUISITIONS else {}
        out.append(Method(base, "independent", acq, None, dict(paper)))
        for p, tag in (("strong", "S"), ("weak", "W"), ("incorrect", "I")):
            out.append(Method(f"{tag}-piBO", "independent", acq, p,
                              {"prior_mode": "pibo", "prior_beta": 10.0, **EXACT, **paper}))
            out.append(Method(f"{tag}-PMCBO", "consensus", acq, p, {"prior_mode": "decay", "omega": 0.01, **EXACT,
                                                                    **paper}))
        out.append(Method("S-PMCBO (labfbo defaults)", "consensus", acq, "strong", {"prior_mode": "decay"}))
        out.append(Method("I-PMCBO (labfbo defaults)", "consensus", acq, "incorrect", {"prior_mode": "decay"}))
        out.append(Method("CBOC-U", "consensus", acq, None, {"matrix": "uniform", **paper}))
        out.append(Method("CBOC-L", "consensus", acq, None, {"matrix": "leader", **paper}))
    return out


def jobs(out: str, functions: tuple[str, ...], acquisitions: tuple[str, ...], seeds: list[int],
         budget: int = 60, n_init: int = 5, n_sites: int = 5, only: tuple[str, ...] | None = None) -> list[Job]:
    """The suite's jobs; ``only``: these method labels (e.g. ``"EI"``, ``"CBOC-U"``)."""
    from labfbo.core.exceptions import ConfigurationError

    known = {m.label for m in methods(acquisitions)}
    unknown = sorted(set(only or ()) - known)
    if unknown:
        raise ConfigurationError(f"unknown methods {unknown}; choose from {sorted(known)}")
    result = []
    for fn in functions:
        priors = make_priors(fn)
        for m in methods(acquisitions):
            if only and m.label not in only:
                continue
            opts: dict[str, Any] = {"acquisition": m.acquisition, **m.options}
            if m.prior is not None:
                opts["prior"] = priors[m.prior]
            slug = m.label.replace(" ", "_").replace("(", "").replace(")", "")
            for s in seeds:
                result.append(Job(path=str(Path(out) / fn / m.acquisition / slug / f"seed{s}.json"),
                                  label=f"{m.acquisition}:{m.label}", problem=fn,
                                  problem_kwargs={"n_sites": n_sites, "heterogeneity": 0.0},
                                  protocol=m.protocol, seed=s, n_init=n_init, budget=budget, options=opts))
    return result


def mean_average_simple_regret(res: SimulationResult, t: int) -> float:
    """:math:`\\frac{1}{tL}\\sum_l\\sum_{\\tau\\le t} r_l^\\tau` (raw simple regret)."""
    t = min(t, res.budget)
    return float(res.simple_regret[:, :t].mean())


def table(results: list[SimulationResult], functions: tuple[str, ...]) -> str:
    """Markdown: ours (mean ± sd over seeds) and the paper at 30 and 60 iterations."""
    ref = reference()
    lines = ["| function | acq | method | seeds | ours @30 | paper @30 | ratio | ours @60 | paper @60 | ratio | "
             "final simple regret |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by: dict[tuple[str, str], list[SimulationResult]] = {}
    for r in results:
        by.setdefault((r.problem, r.options["label"]), []).append(r)
    for fn in functions:
        for (prob, label), rs in by.items():
            if prob != fn:
                continue
            acq, name = label.split(":", 1)
            table_key = {"ei": "ei_table4", "ucb": "ucb_table5"}.get(acq)  # nei: labfbo's, not in the paper
            paper = ref[table_key][PAPER_KEYS[fn]].get(name) if table_key else None
            cells = []
            for k, t in enumerate((30, 60)):
                vals = np.array([mean_average_simple_regret(r, t) for r in rs])
                ours = f"{vals.mean():.4g} ± {vals.std():.2g}"
                if paper is None:
                    cells += [ours, "—", "—"]
                else:
                    cells += [ours, f"{paper[k]:.4g}", f"{vals.mean() / paper[k]:.2f}"]
            final = np.array([r.simple_regret[:, -1].mean() for r in rs])
            cells.append(f"{final.mean():.3g} (max {final.max():.3g})")
            lines.append(f"| {fn} | {acq.upper()} | {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[SimulationResult], out: Path, functions: tuple[str, ...]) -> list[Path]:
    """One convergence plot per function and acquisition: mean simple regret vs iteration."""
    from labfbo.apps.harness import plot_curves

    paths = []
    for fn in functions:
        for acq in ("ei", "ucb", "nei"):
            rs = [r for r in results if r.problem == fn and r.options["label"].startswith(acq + ":")]
            if not rs:
                continue
            labels = list(dict.fromkeys(r.options["label"] for r in rs))
            curves = {label.split(":", 1)[1]: np.stack([r.simple_regret.mean(0) for r in rs
                                                        if r.options["label"] == label]).mean(0) for label in labels}
            paths.append(plot_curves(curves, out / f"{fn}-{acq}.png", f"PMCBO suite: {fn}, {acq.upper()}", "iteration",
                                     "simple regret (mean over clients and seeds)", log=True))
    return paths


def _cmd(args: argparse.Namespace) -> int:
    from labfbo_bench.suite_cli import run_suite

    if args.quick:
        functions, acqs, seeds = ("branin",), tuple(args.acquisitions or ("ucb",)), list(range(3))
    else:
        functions, acqs, seeds = (
            tuple(args.functions),
            tuple(args.acquisitions or ("ei", "ucb")),
            list(range(args.seeds)),
        )
    out = Path(args.out)
    todo = jobs(str(out), functions, acqs, seeds, budget=args.budget, n_init=args.n_init,
                only=tuple(args.methods) if args.methods else None)
    return run_suite("pmcbo", sys.modules[__name__], todo, out, functions, args.workers)


BENCH_ORDER = 30  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench pmcbo``."""
    pm = bsub.add_parser("pmcbo", help="PMCBO Tables 4-5: priors and consensus (cached, resumable)")
    pm.add_argument("--quick", action="store_true", help="3 seeds, UCB variants on Branin only")
    pm.add_argument("--functions", nargs="+", default=["branin", "hartmann3", "hartmann6"])
    pm.add_argument("--acquisitions", nargs="+", default=None, choices=["ei", "ucb", "nei"],
                    help="the paper's ei and ucb (default; --quick: ucb), or nei (labfbo's default)")
    pm.add_argument("--seeds", type=int, default=10)
    pm.add_argument("--budget", type=int, default=60)
    pm.add_argument("--n-init", type=int, default=5)
    pm.add_argument("--methods", nargs="+", help="only these rows, e.g. EI CBOC-U 'I-PMCBO (labfbo defaults)'")
    pm.add_argument("--workers", type=int, default=2)
    pm.add_argument("--out", default="runs/bench/pmcbo")
    pm.set_defaults(func=_cmd)
