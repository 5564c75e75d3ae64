r"""Cost of the ``distribution`` protocol: time per site-round, server time, message sizes.

* **Site**: seconds per round for one site with ``n_obs`` observations in :math:`d = 10`,
  split into the GP fit, extraction (candidate set + :math:`M` pathwise sample paths +
  argmax), the DPGMM fit, and the FI-GP acquisition. The ratio compares the whole
  site-round (fit + extraction + DPGMM + FI-GP UCB) with an ``independent`` round (fit +
  local UCB) measured in the same run.
* **Server**: seconds for merging, reweighting and drawing every site's packet from
  ``N`` random uploads (16 and 256 sites).
* **Communication** (GUIDE Table 4): scalars and bytes per site and round, read from the
  sites' own message logs of a real federation (``N`` sites, :math:`d = 10`, one round).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from labfbo.core.messages import Array
from labfbo.models.acquisition import AcquisitionData, propose_with_model
from labfbo.models.figp import FIGP, GuidanceField
from labfbo.models.gp import fit_local_gp
from labfbo.models.optimum_belief import candidate_set, fit_belief, optimum_samples
from labfbo.protocols.distribution.protocol import DistributionAggregator, DistributionOptions, OptimumBelief
from labfbo.space.search import Real, SearchSpace


def _space(d: int) -> SearchSpace:
    return SearchSpace([Real(f"x{j}", 0.0, 1.0) for j in range(d)])


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def site_round(n_obs: int, d: int = 10, repeats: int = 3, seed: int = 0) -> dict[str, float]:
    """Median seconds of each stage of one site-round (Ackley-like data, noise 0.1)."""
    opts = DistributionOptions(beta=2.0)
    space = _space(d)
    rows: dict[str, list[float]] = {k: [] for k in ("gp_fit", "extraction", "dpgmm", "figp_acq", "local_acq")}
    for r in range(repeats):
        gen = np.random.default_rng(seed + r)
        X = gen.random((n_obs, d))
        y = -np.sqrt(((X - 0.4) ** 2).sum(1)) + 0.1 * gen.standard_normal(n_obs)
        model, t = _timed(lambda: fit_local_gp(X, y, seed=r))
        rows["gp_fit"].append(t)
        samples, t = _timed(lambda: optimum_samples(model, candidate_set(space, X, y, opts.candidates, r), opts.M, r))
        rows["extraction"].append(t)
        belief, t = _timed(lambda: fit_belief(samples, r, opts.max_components))
        rows["dpgmm"].append(t)
        k = belief.top()
        field = GuidanceField(np.full(5, 0.2), np.clip(belief.means[k] + 0.05 * gen.standard_normal((5, d)), 0, 1),
                              np.tile(belief.variances[k], (5, 1)))
        data = AcquisitionData(X=X, y=y, pending=np.zeros((0, d)))
        _, t = _timed(lambda: propose_with_model(FIGP(model, field, 0.5), space, data, 1, r, opts))
        rows["figp_acq"].append(t)
        _, t = _timed(lambda: propose_with_model(model, space, data, 1, r, opts))
        rows["local_acq"].append(t)
    return {k: float(np.median(v)) for k, v in rows.items()}


def server_round(n_sites: int, d: int = 10, repeats: int = 5, seed: int = 0) -> float:
    """Median seconds of the coordinator's aggregation for ``n_sites`` uploads."""
    space = _space(d)
    names = [f"site{i}" for i in range(n_sites)]
    agg = DistributionAggregator(DistributionOptions(), names, seed, None, space)
    gen = np.random.default_rng(seed)
    times = []
    for r in range(repeats):
        centres = np.clip(gen.choice([0.3, 0.7], size=(n_sites, 1)) + 0.05 * gen.standard_normal((n_sites, d)), 0, 1)
        resp = {s: OptimumBelief(weight=float(gen.uniform(0.2, 1.0)), mean=Array.of(centres[i]),
                                 variance=Array.of(gen.uniform(1e-3, 2e-2, d)), value=float(gen.standard_normal()))
                for i, s in enumerate(names)}
        _, t = _timed(lambda: agg.on_responses(r, resp))
        times.append(t)
    return float(np.median(times))


def communication(n_sites: int = 16, d: int = 10, P: int = 5, n_init: int = 30, seed: int = 0) -> dict[str, float]:
    """Scalars and bytes per site for one real round, from the sites' message logs."""
    from labfbo.coordinator import Coordinator
    from labfbo.optimizer import Optimizer
    from labfbo.problems.families import get_problem
    from labfbo.protocols.distribution.protocol import GuidancePacket

    prob = get_problem("sphere", n_sites=n_sites, dim=d, seed=seed)
    names = list(prob.site_names)
    coord = Coordinator("distribution", sites=names, space=prob.space, seed=seed, P=P)
    opts = [Optimizer(prob.space, protocol="distribution", coordinator=coord, site=s, seed=seed, n_init=n_init, P=P,
                      num_restarts=2, raw_samples=64) for s in names]
    for i, o in enumerate(opts):
        for t in o.ask(n=n_init):
            o.tell(t, prob.evaluate(i, t.params))
    for o in opts:
        o.ask()
    ups = [m for o in opts for m in o.sent_messages() if isinstance(m, OptimumBelief)]
    downs = [m for o in opts for m in o.received_messages() if isinstance(m, GuidancePacket)]
    return {"up_scalars": max(m.n_scalars for m in ups), "down_scalars_max": max(m.n_scalars for m in downs),
            "up_bytes": float(np.mean([m.nbytes() for m in ups])),
            "down_bytes": float(np.mean([m.nbytes() for m in downs])), "sites": n_sites, "d": d, "P": P}


def report(n_obs: tuple[int, ...] = (30, 80), sites: tuple[int, ...] = (16, 256), repeats: int = 3,
           comm_sites: int = 16) -> str:
    lines = ["| n_obs | GP fit (s) | extraction (s) | DPGMM (s) | FI-GP UCB (s) | local UCB (s) | "
             "site-round / independent round |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for n in n_obs:
        r = site_round(n, repeats=repeats)
        guide_round = r["gp_fit"] + r["extraction"] + r["dpgmm"] + r["figp_acq"]
        local_round = r["gp_fit"] + r["local_acq"]
        lines.append(f"| {n} | {r['gp_fit']:.3f} | {r['extraction']:.3f} | {r['dpgmm']:.3f} | {r['figp_acq']:.3f} | "
                     f"{r['local_acq']:.3f} | {guide_round / local_round:.2f}x |")
    lines += ["", "| sites | server merge + reweight + packets (s) |", "|---:|---:|"]
    for n in sites:
        lines.append(f"| {n} | {server_round(n):.4f} |")
    c = communication(n_sites=comm_sites)
    lines += ["", f"| per site and round (N={c['sites']}, d={c['d']}, P={c['P']}) | scalars (ours) | "
              "scalars (Table 4) | bytes (JSON) |", "|---|---:|---:|---:|",
              f"| uplink | {c['up_scalars']} | 22 | {c['up_bytes']:.0f} |",
              f"| downlink (max) | {c['down_scalars_max']} | ≤ 105 | {c['down_bytes']:.0f} (mean) |"]
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    print("labfbo bench guide-cost " + " ".join(sys.argv[3:]) + "\n")
    print(report(tuple(args.n_obs), tuple(args.sites), args.repeats, args.comm_sites))
    return 0


BENCH_ORDER = 60  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench guide-cost``."""
    gc = bsub.add_parser("guide-cost", help="distribution protocol: seconds per site-round, server time, message sizes")
    gc.add_argument("--n-obs", nargs="+", type=int, default=[30, 80])
    gc.add_argument("--sites", nargs="+", type=int, default=[16, 256], help="server aggregation sizes")
    gc.add_argument("--comm-sites", type=int, default=16, help="sites of the federation whose messages are read")
    gc.add_argument("--repeats", type=int, default=3)
    gc.set_defaults(func=_cmd)
