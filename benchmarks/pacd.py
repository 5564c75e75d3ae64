r"""Suite ``pacd``: PACD-BO Table I — related-but-different sites, meta-learned priors.

Setting (PACD-BO §IV-A): :math:`N = 5` sites on the frequency-varying sinusoid (1-D),
Branin (2-D), Hartmann-6 (6-D) and Wing Weight (6 design variables, operating conditions
per site), heterogeneity 1.0 of :mod:`labfbo.problems.families` (the paper does not
define its task families; ours are in ``docs/problems.md``); 5 initial points per site
for 1-D/2-D and 10 for 6-D by collaborative LHS (any other problem of
:mod:`labfbo.problems.families`: 5 up to 2-D, else 10); :math:`T = 100`; 10 seeds; UCB
(:math:`\beta = 4`) everywhere, pinned by name (labfbo's default is qLogNEI). Methods:
Independent (``independent``), PACOH-BO (``centralized``), PACD-BO (``gradient``), CBOC-U /
CBOC-L (``consensus``, uniform / leader W), the same protocols with labfbo's defaults
(``... (labfbo defaults)``) and, with ``--dp``, DP-PACD-BO (σ = 8, C = 1) for the
privacy–utility plot. By name: GUIDE-FBO (``distribution``), Surface (``surface``), Vote (``vote``) and Pooled MTGP
(``pooled``,
the multi-task GP on every site's raw data), the preferred pooled reference of the
transfer efficiency printed under the table (PACOH-BO otherwise, which ``gradient``
equals by construction).
Ablations by name (``--methods``): Independent-escape (``independent`` with the
stalled-basin escape PACD-BO has by default, :mod:`labfbo.models.acquisition`) and PACD-BO-paper
(``gradient`` without it, as in the paper).

Metrics: final normalized regret and the AUC of the normalized regret over the first
10 % of iterations (:mod:`labfbo.apps.simulation`), mean ± std over seeds of the site average,
side by side with Table I.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from labfbo.apps.harness import Job
from labfbo.apps.simulation import SimulationResult
from labfbo.core.exceptions import ConfigurationError
from labfbo.models.gp import PAPERS_SURROGATE
from labfbo.privacy import DP

FUNCTIONS = ("sinusoid", "branin", "hartmann6", "wing_weight")
N_INIT = {"sinusoid": 5, "branin": 5, "hartmann6": 10, "wing_weight": 10}


def n_init(problem: str) -> int:
    """Initial points per site: the paper's for its problems; otherwise 5 up to 2-D, else 10."""
    if problem in N_INIT:
        return N_INIT[problem]
    from labfbo.problems.families import get_problem

    return 5 if get_problem(problem, n_sites=1).space.dim <= 2 else 10


#: the paper's setting: UCB with beta = 4 on the outputs as they are (labfbo's defaults: qLogNEI, winsorized)
PAPER_ACQ: dict[str, Any] = {"acquisition": "ucb", "beta": 4.0, **PAPERS_SURROGATE}
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "Independent": ("independent", PAPER_ACQ),
    "PACOH-BO": ("centralized", PAPER_ACQ),
    "PACD-BO": ("gradient", PAPER_ACQ),
    "CBOC-U": ("consensus", {"matrix": "uniform", **PAPER_ACQ}),
    "CBOC-L": ("consensus", {"matrix": "leader", **PAPER_ACQ}),
    "Independent (labfbo defaults)": ("independent", {}),
    "PACD-BO (labfbo defaults)": ("gradient", {}),
    "CBOC-U (labfbo defaults)": ("consensus", {"matrix": "uniform"}),
    # by name only: the pooled references (raw data: PACOH's model, and the multi-task GP that the
    # transfer efficiency prefers) and GUIDE-FBO
    "PACOH-BO (labfbo defaults)": ("centralized", {}),
    "Pooled MTGP (labfbo defaults)": ("pooled", {}),
    "GUIDE-FBO (labfbo defaults)": ("distribution", {}),
    "Surface (labfbo defaults)": ("surface", {}),
    "Vote (labfbo defaults)": ("vote", {}),
    "Vote-codebook8": ("vote", {"codebook": 8}),  # vote's former default: 8 Sobol points of the cube
    "Surface-quadratic": ("surface", {"fourier_features": 0}),  # ablation: no Fourier features
    # ablations (only with --methods): the stalled-basin escape on Independent, and off on PACD-BO
    "Independent-escape": ("independent", {"stall_rounds": 10, **PAPER_ACQ}),
    "PACD-BO-paper": ("gradient", {"stall_rounds": None, "harm_guard": False, **PAPER_ACQ}),
    # the compact wire's cost in regret (8-bit scores and particle changes, labfbo.protocols.gradient.wire)
    "PACD-BO (compact wire)": ("gradient", {"wire": "compact"}),
}
DEFAULT_METHODS = ("Independent", "PACOH-BO", "PACD-BO", "CBOC-U", "CBOC-L", "Independent (labfbo defaults)",
                   "PACD-BO (labfbo defaults)", "CBOC-U (labfbo defaults)")
#: (alone, pooled references in order of preference) of the transfer efficiency, by the suffix of a label
_TE_REFERENCES = {"": ("Independent", ("PACOH-BO",)),
                  " (labfbo defaults)": ("Independent (labfbo defaults)",
                                         ("Pooled MTGP (labfbo defaults)", "PACOH-BO (labfbo defaults)"))}
DP_METHOD = ("DP-PACD-BO", ("gradient", {"privacy": DP(clip=1.0, noise_multiplier=8.0), **PAPER_ACQ}))


def reference() -> dict[str, Any]:
    text = resources.files("labfbo_bench").joinpath("reference_tables.json").read_text()
    return json.loads(text)["pacd_bo"]


def setting(n_sites: int, initial: int | None) -> str:
    """The cache folder suffix of a family size or design other than the paper setting's."""
    return "" if n_sites == 5 and initial is None else f"-{n_sites}sites-{initial or 'paper'}init"


def jobs(out: str, functions: tuple[str, ...], seeds: list[int], budget: int = 100, n_sites: int = 5,
         dp: bool = False, methods: tuple[str, ...] | None = None, initial: int | None = None) -> list[Job]:
    """The suite's jobs; ``initial`` overrides the initial points per site (default :func:`n_init`)."""
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown:
        raise ConfigurationError(f"unknown pacd methods {unknown}; available: {list(METHODS)}")
    chosen = {k: METHODS[k] for k in (DEFAULT_METHODS if methods is None else methods)}
    suffix = setting(n_sites, initial)  # another family size or design: its own cache folder
    if dp:
        chosen[DP_METHOD[0]] = DP_METHOD[1]
    result = []
    for fn in functions:
        for label, (protocol, opts) in chosen.items():
            for s in seeds:
                path = Path(out) / f"{fn}{suffix}" / label / f"seed{s}.json"
                result.append(Job(path=str(path), label=label, problem=fn,
                                  problem_kwargs={"n_sites": n_sites}, protocol=protocol, seed=s,
                                  n_init=initial or n_init(fn), budget=budget, options=dict(opts)))
    return result


def table(results: list[SimulationResult], functions: tuple[str, ...]) -> str:
    """Markdown: normalized regret and AUC, ours (mean ± std over seeds) and Table I."""
    ref = reference()
    by: dict[tuple[str, str], list[SimulationResult]] = {}
    for r in results:
        by.setdefault((r.problem, r.options["label"]), []).append(r)
    lines = ["| function | method | seeds | T | normalized regret (ours) | Table I | AUC (ours) | Table I |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for fn in functions:
        for (prob, label), rs in by.items():
            if prob != fn:
                continue
            nr = np.array([r.final_regret().mean() for r in rs])
            auc = np.array([r.auc.mean() for r in rs])
            p_nr = ref["normalized_regret"].get(label, {}).get(fn)
            p_auc = ref["auc"].get(label, {}).get(fn)
            def fmt(v):
                return (f"{v[0]:.4g} ± {v[1]:.2g}" if v else "—")
            lines.append(f"| {fn} | {label} | {len(rs)} | {rs[0].budget} | {nr.mean():.4g} ± {nr.std():.2g} | "
                         f"{fmt(p_nr)} | {auc.mean():.4g} ± {auc.std():.2g} | {fmt(p_auc)} |")
    te = transfer_efficiency(by)
    if te:
        lines += ["", "Transfer efficiency (R_alone - R) / (R_alone - R_pooled), alone = Independent, pooled = the "
                  "pooled multi-task GP (every site's raw data) if run, else PACOH-BO, with the same acquisition; of "
                  "the final normalized regret and of its AUC:",
                  "", "| function | method | pooled reference | of the final regret | of the AUC |",
                  "|---|---|---|---:|---:|"]
        lines += [f"| {fn} | {label} | {ref} | {final} | {auc} |" for (fn, label), (ref, final, auc) in te.items()]
    return "\n".join(lines)


def transfer_efficiency(by: dict[tuple[str, str], list[SimulationResult]]
                        ) -> dict[tuple[str, str], tuple[str, str, str]]:
    """The share of the pooled-data gain a method captures, per (function, method):
    ``(pooled reference, of the final normalized regret, of its AUC)``."""
    value = {metric: {k: float(np.mean([(r.final_regret() if metric == "final" else r.auc).mean() for r in rs]))
                      for k, rs in by.items()} for metric in ("final", "auc")}
    out = {}
    for fn, label in by:
        alone, pooled_refs = _TE_REFERENCES[" (labfbo defaults)" if label.endswith(" (labfbo defaults)") else ""]
        ref = next((r for r in pooled_refs if (fn, r) in by), None)
        if ref is None or (fn, alone) not in by or label in (alone, ref) or label.startswith("Independent"):
            continue
        cells = []
        for metric in ("final", "auc"):
            v = value[metric]
            gain = v[(fn, alone)] - v[(fn, ref)]
            cells.append(f"{(v[(fn, alone)] - v[(fn, label)]) / gain:.0%}" if gain > 1e-12
                         else "n/a (pooling gains nothing)")
        out[(fn, label)] = (ref, *cells)
    return out


def plot(results: list[SimulationResult], out: Path, functions: tuple[str, ...]) -> list[Path]:
    """Convergence plots like Fig. 2 (mean normalized regret, ±1 std band over seeds)."""
    from labfbo.apps.harness import plot_convergence

    paths = []
    for fn in functions:
        rs = [r for r in results if r.problem == fn]
        if rs:
            paths.append(plot_convergence(rs, out / f"{fn}.png", title=f"PACD suite: {fn}, {rs[0].n_sites} sites"))
    return paths


def _cmd(args: argparse.Namespace) -> int:
    from labfbo_bench.suite_cli import run_suite

    if args.quick:
        functions, seeds, budget = ("branin", "wing_weight"), list(range(3)), 30
    else:
        functions, seeds, budget = tuple(args.functions), list(range(args.seeds)), args.budget
    out = Path(args.out)
    todo = jobs(str(out), functions, seeds, budget=budget, dp=args.dp, n_sites=args.sites,
                methods=tuple(args.methods) if args.methods else None, initial=args.n_init)
    return run_suite("pacd", sys.modules[__name__], todo, out, functions, args.workers)


BENCH_ORDER = 40  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench pacd``."""
    pa = bsub.add_parser("pacd", help="PACD-BO Table I: gradient vs centralized, independent, CBOC")
    pa.add_argument("--quick", action="store_true", help="Branin and Wing Weight, T=30, 3 seeds")
    pa.add_argument("--functions", nargs="+", default=["sinusoid", "branin", "hartmann6", "wing_weight"])
    pa.add_argument("--methods", nargs="+", default=None)
    pa.add_argument("--seeds", type=int, default=10)
    pa.add_argument("--budget", type=int, default=100)
    pa.add_argument("--dp", action="store_true", help="add DP-PACD-BO (sigma=8, C=1)")
    pa.add_argument("--sites", type=int, default=5, help="sites of the family (the paper: 5)")
    pa.add_argument("--n-init", type=int, default=None, help="initial points per site (default: the paper's)")
    pa.add_argument("--workers", type=int, default=2)
    pa.add_argument("--out", default="runs/bench/pacd")
    pa.set_defaults(func=_cmd)
