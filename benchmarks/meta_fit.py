r"""``labfbo bench meta-fit``: how well (and how fast) PACOH meta-training fits related sites.

Offline, without BO: each of ``n_sites`` sites of a benchmark problem gets ``n`` uniform
random points; the particles are meta-trained on all sites' scores (exactly the
``gradient`` protocol's meta-update, :func:`labfbo.protocols.gradient.protocol.meta_step`) for up to
``steps`` steps, once per meta-optimizer setting. At the checkpoints, each site's particle
mixture (conditioned on its own points) predicts 1000 held-out points of its function.

Reported: the site-averaged test nRMSE (RMSE / std of the test values; 1 = predicting the
mean) of the mixture, next to two baselines fitted in the same run — a local GP per site
(BoTorch's ``SingleTaskGP``, what ``independent`` uses) and one GP on the pooled,
per-site standardized data (what sharing raw data would buy) — and the mixture's median
noise variance and summed :math:`\ln Z`.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from labfbo.core.exceptions import ConfigurationError
from labfbo.models import pacoh
from labfbo.models.gp import fit_local_gp, predict
from labfbo.models.particle_mixture import mixture_moments
from labfbo.problems.families import get_problem
from labfbo.protocols.gradient.protocol import meta_step

CHECKPOINTS = (100, 200, 500, 1000, 2000, 4000)


@dataclass(frozen=True)
class FitRow:
    setting: str
    steps: int
    nrmse: float
    noise: float
    log_evidence: float
    seconds: float


def _nrmse(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)) / y.std())


def site_data(problem: str, n_sites: int, n: int, seed: int, n_test: int = 1000) -> tuple[list, list]:
    """Per site: ``n`` training and ``n_test`` test points, unit-cube inputs, maximization ``y``."""
    prob = get_problem(problem, n_sites=n_sites, seed=seed)
    if any(getattr(p, "log", False) or not hasattr(p, "low") for p in prob.space.params):
        raise ConfigurationError(f"meta-fit needs a box of linear Real parameters; {problem!r} has others")
    lo = np.array([p.low for p in prob.space.params])
    hi = np.array([p.high for p in prob.space.params])
    gen = np.random.default_rng(seed)

    def draw(i: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        U = gen.random((m, prob.space.dim))
        return U, -prob.loss_sign * np.asarray(prob.metadata["batch"][i](lo + U * (hi - lo)), float)

    return [draw(i, n) for i in range(n_sites)], [draw(i, n_test) for i in range(n_sites)]


def baselines(train: Sequence[tuple], test: Sequence[tuple]) -> dict[str, float]:
    """Test nRMSE of a local GP per site and of one GP on the pooled standardized data."""
    local = [_nrmse(predict(fit_local_gp(X, y), Xt[:, None, :])[0].ravel(), yt)
             for (X, y), (Xt, yt) in zip(train, test)]
    pooled = fit_local_gp(np.concatenate([X for X, _ in train]),
                          np.concatenate([(y - y.mean()) / y.std() for _, y in train]))
    shared = [_nrmse(predict(pooled, Xt[:, None, :])[0].ravel() * y.std() + y.mean(), yt)
              for (_, y), (Xt, yt) in zip(train, test)]
    return {"local GP": float(np.mean(local)), "pooled GP": float(np.mean(shared))}


def meta_fit(train: Sequence[tuple], test: Sequence[tuple], cfg: pacoh.PacohConfig, steps: int,
             seed: int = 0, setting: str = "") -> list[FitRow]:
    """Meta-train from the hyper-prior for ``steps`` steps; a row at every checkpoint."""
    d = train[0][0].shape[1]
    phi, state, rows, t0 = pacoh.init_particles(cfg, d, seed), None, [], time.perf_counter()
    for s in range(1, steps + 1):
        scores = [pacoh.site_score(phi, X, y, cfg) for X, y in train]
        phi, state = meta_step(phi, scores, [len(y) for _, y in train], cfg, state)
        if s in CHECKPOINTS or s == steps:
            elapsed = time.perf_counter() - t0
            err = [_nrmse(mixture_moments(phi, X, y, Xt, cfg)[0].mean(0).numpy(), yt)
                   for (X, y), (Xt, yt) in zip(train, test)]
            noise = float(pacoh._noise(pacoh._unpack(phi, cfg, d)).median())
            lnz = float(sum(pacoh.site_log_evidence(phi, X, y, cfg).mean() for X, y in train))
            rows.append(FitRow(setting, s, float(np.mean(err)), noise, lnz, elapsed))
            t0 = time.perf_counter() - elapsed
    return rows


def run(problem: str, n_sites: int, n: int, steps: int, settings: Sequence[dict[str, Any]],
        seed: int = 0) -> tuple[dict[str, float], list[FitRow]]:
    """Baselines and every setting's rows (``settings``: :class:`PacohConfig` overrides)."""
    torch.set_num_threads(1)
    train, test = site_data(problem, n_sites, n, seed)
    rows: list[FitRow] = []
    configs = []
    for over in settings:
        try:
            configs.append((", ".join(f"{k}={v}" for k, v in over.items()) or "defaults", pacoh.PacohConfig(**over)))
        except ValueError as exc:
            raise ConfigurationError(f"meta-fit setting {dict(over)}: {exc}") from exc
    for label, cfg in configs:
        rows += meta_fit(train, test, cfg, steps, seed, label)
    return baselines(train, test), rows


def format_rows(base: dict[str, float], rows: Sequence[FitRow]) -> str:
    lines = ["| meta-optimizer | steps | mixture test nRMSE | median noise | Σ ln Z | seconds |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.setting} | {r.steps} | {r.nrmse:.3f} | {r.noise:.1e} | {r.log_evidence:.1f} | {r.seconds:.1f} |"
              for r in rows]
    lines += [f"| {name} (baseline) | — | {v:.3f} | — | — | — |" for name, v in base.items()]
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    from labfbo.core.exceptions import ConfigurationError

    def parse(text: str) -> dict[str, str]:     # values stay strings: PacohConfig validates them
        pairs = [item.partition("=") for item in filter(None, text.split(","))]
        if any(not sep for _, sep, _ in pairs):
            raise ConfigurationError(f"--settings wants key=value pairs separated by commas, got {text!r}")
        return {key: value for key, _, value in pairs}

    print("labfbo bench meta-fit " + " ".join(sys.argv[3:]) + "\n")
    base, rows = run(args.problem, args.sites, args.n, args.steps, [parse(s) for s in args.settings], args.seed)
    print(format_rows(base, rows))
    return 0


BENCH_ORDER = 120  # where `labfbo bench --help` lists it


def add_parser(bsub: "argparse._SubParsersAction") -> None:  # type: ignore[type-arg]
    """``labfbo bench meta-fit``."""
    mf = bsub.add_parser("meta-fit", help="offline PACOH meta-training: test error vs steps, local and pooled GPs")
    mf.add_argument("--problem", default="hartmann6")
    mf.add_argument("--sites", type=int, default=5)
    mf.add_argument("--n", type=int, default=30, help="random points per site")
    mf.add_argument("--steps", type=int, default=2000)
    mf.add_argument("--seed", type=int, default=0)
    mf.add_argument("--settings", nargs="+", default=["meta_optimizer=adam,step_size=0.01",
                                                       "meta_optimizer=sgd,step_size=0.1"],
                    help="PacohConfig overrides to compare, e.g. meta_optimizer=adam,step_size=0.03")
    mf.set_defaults(func=_cmd)
