"""`labfbo bench privacy-units`: what the unit protected costs `surface` on the demo's reaction screen.

The demo's three Buchwald–Hartwig labs (:func:`labfbo.apps.demo.screen.related_labs`, Ahneman et al. 2018),
each from the same initial experiments (``n_init``), then ``budget`` more, under:

* ``independent`` (alone), ``surface`` without DP,
* ``surface`` with ``DP(epsilon, delta, unit="site")`` (the lab's whole dataset protected),
* ``surface`` with ``DP(epsilon, delta, unit="experiment")`` (one experiment protected).

Regret after ``budget`` = the lab's best yield in the data minus the best it found (initial
experiments included), averaged over labs and seeds; "gain kept" = (regret alone − regret
private) / (regret alone − regret without DP). A combination missing from a lab's data is a
failed experiment (it uses up budget), as in ``labfbo demo``.

``--noise`` prints, without running anything, the noise each unit needs at the budget on a
campaign of ``n_init + budget`` experiments: the calibrated noise multiplier (the same for both
units: the same plan of releases), the sensitivity of the last release and the noise std per entry.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

METHODS = ("independent", "surface", "surface-dp-site", "surface-dp-experiment")


def _labs(n: int = 3) -> Any:
    from labfbo.apps.demo.screen import related_labs
    from labfbo.datasets import load_reactions

    full = load_reactions()
    return full.subset(related_labs(full, n))


def _options(method: str, epsilon: float, delta: float) -> tuple[str, dict[str, Any]]:
    from labfbo.privacy import DP

    if method in ("independent", "surface"):
        return method, {}
    unit = method.rsplit("-", 1)[1]
    return "surface", {"privacy": DP(epsilon=epsilon, delta=delta, unit=unit)}


def run(method: str, seed: int, n_init: int, budget: int, epsilon: float, delta: float) -> list[list[float | None]]:
    """Each lab's yields in order (None: failed), the labs in lock step: every lab tells its
    experiment before any asks for the next (deterministic with the in-process coordinator)."""
    from labfbo import Coordinator, Optimizer
    from labfbo.core.seeding import int_seed
    from labfbo.datasets import initial_design

    data = _labs()
    labs = list(data.labs)
    protocol, options = _options(method, epsilon, delta)
    coord = None if protocol == "independent" else Coordinator(protocol, sites=labs, space=data.space, seed=seed,
                                                                horizon=budget, **options)
    opts = [Optimizer(data.space, objective="maximize", protocol=protocol, coordinator=coord, site=name, seed=seed,
                      n_init=n_init, horizon=budget, secret=int_seed(seed, i, 0, "site-secret"), **options)
            for i, name in enumerate(labs)]
    yields: list[list[float | None]] = [[] for _ in labs]

    def evaluate(i: int, trial: Any) -> None:
        y = data.tables[i].get(tuple(trial.params[n] for n in data.space.names))
        if y is None:
            opts[i].tell_failed(trial, "combination not in this lab's data")
        else:
            opts[i].tell(trial, y)
        yields[i].append(y)

    try:
        for i in range(len(labs)):
            for combo in initial_design(data, i, seed, n_init):
                evaluate(i, opts[i].enqueue(dict(zip(data.space.names, combo))))
        for _ in range(budget):
            trials = [o.ask() for o in opts]
            for i, t in enumerate(trials):
                evaluate(i, t)
    finally:
        for o in opts:
            o.close()
    return yields


def regret(data: Any, yields: list[list[float | None]]) -> float:
    """Mean over labs of (best yield in the lab's data − best found)."""
    best = [max(t.values()) for t in data.tables]
    found = [max([y for y in ys if y is not None], default=0.0) for ys in yields]
    return float(np.mean([b - f for b, f in zip(best, found)]))


def noise_table(n_init: int, budget: int, epsilon: float, delta: float) -> str:
    """The noise each unit needs for ``budget`` releases of `surface` at (epsilon, delta) on the
    demo's space, its last release made with ``n_init + budget - 1`` experiments."""
    from labfbo.privacy.budget import calibrate
    from labfbo.protocols.surface.aggregate import features
    from labfbo.protocols.surface.model import dp_sensitivity, ranked_sum_sensitivity
    from labfbo.protocols.surface.protocol import SurfaceOptions

    space = _labs().space
    feats = features(space, SurfaceOptions())
    sigma = calibrate({"surface_stats": 1.0}, {"surface_stats": budget}, epsilon, delta)
    n = n_init + budget - 1
    rows = [f"surface on the demo's space (p = {feats.p} features, ||phi||^2 <= P = {feats.norm_bound:g}), "
            f"DP(epsilon={epsilon:g}, delta={delta:g}), {budget} releases, the last with n = {n} experiments, C = 1:",
            f"  noise multiplier sigma (either unit): {sigma:.3f}"]
    for unit in ("site", "experiment"):
        d = dp_sensitivity(feats.norm_bound, 1.0, 1, unit, n)
        rows.append(f"  unit={unit!r:13} sensitivity {d:.4f}   noise std per entry of the averages {sigma * d:.3f}")
    d = ranked_sum_sensitivity(feats.norm_bound, 1.0)
    rows.append(
        f"  unit='experiment' over secure sums (3 labs or more): sensitivity {d:.4f} of the moment and "
        f"feature sums, noise std per entry of the cohort's sum {sigma * d:.3f} (against signals of order the count)"
    )
    return "\n".join(rows)


def _cmd(args: argparse.Namespace) -> None:
    if args.noise:
        print(noise_table(args.n_init, args.budget, args.epsilon, args.delta))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = _labs()
    table: dict[str, list[float]] = {}
    for method in args.methods:
        for seed in range(args.seeds):
            path = out / f"{method}-seed{seed}-n{args.n_init}-b{args.budget}-e{args.epsilon:g}.json"
            if path.exists():
                yields = json.loads(path.read_text())
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    yields = run(method, seed, args.n_init, args.budget, args.epsilon, args.delta)
                path.write_text(json.dumps(yields))
            table.setdefault(method, []).append(regret(data, yields))
    print(
        f"labs: {', '.join(data.labs)}; {args.n_init} initial + {args.budget} experiments; seeds 0..{args.seeds - 1}; "
        f"DP(epsilon={args.epsilon:g}, delta={args.delta:g})"
    )
    alone, plain = np.mean(table.get("independent", [np.nan])), np.mean(table.get("surface", [np.nan]))
    print(f"{'method':24} {'mean regret':>12}  per seed           gain kept")
    for method, values in table.items():
        kept = (alone - np.mean(values)) / (alone - plain) if method.startswith("surface-dp") else None
        print(f"{method:24} {np.mean(values):12.2f}  {' '.join(f'{v:6.2f}' for v in values):18} "
              f"{'' if kept is None else f'{kept:.2f}'}")


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench privacy-units``."""
    p = bsub.add_parser("privacy-units", help="surface under DP(unit='site') and DP(unit='experiment') against no DP "
                        "and independent on the demo's three reaction labs (cached)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--n-init", type=int, default=3)
    p.add_argument("--budget", type=int, default=10, help="experiments per lab after the initial ones (= rounds)")
    p.add_argument("--epsilon", type=float, default=2.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--noise", action="store_true", help="print the noise each unit needs; run nothing")
    p.add_argument("--out", default="runs/bench/privacy-units")
    p.set_defaults(func=_cmd)


def main(argv: Sequence[str] | None = None) -> None:
    import sys

    parser = argparse.ArgumentParser(prog="privacy_units")
    add_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(["privacy-units", *(sys.argv[1:] if argv is None else argv)])
    args.func(args)


if __name__ == "__main__":
    main()
