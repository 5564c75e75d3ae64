r"""`labfbo bench reactions`: does federation pay off for labs choosing reagents from lists?

Each lab of a scenario (:mod:`labfbo.datasets`) runs a real
:class:`~labfbo.Optimizer` over the categorical space (no allowed-combinations table): 3
initial experiments, then ``budget`` BO iterations in lock-step rounds. A proposal the lab's
data does not contain is a failed experiment there (``tell_failed``) and uses up budget.
The 3 initial experiments of a lab are the same for every method (drawn from
``(seed, lab)``) and enter as enqueued trials.

Methods: ``random`` (the exact expectation of sampling without replacement; no seeds),
``independent`` and every federated protocol with its defaults, and ``pooled`` — every lab's
raw yields in one BoTorch ``MultiTaskGP`` (one-hot inputs, an index kernel over labs; LogEI
on the lab's own output, every untried combination scored) — the non-private upper
reference. Metric: a lab's yield regret (its best yield in the data minus the best it has
found; 0 found while nothing succeeded), averaged over labs, after 5, 10 and 20 iterations;
and the transfer efficiency :math:`(R_\text{alone} - R) / (R_\text{alone} - R_\text{pooled})`.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from linear_operator.utils.warnings import NumericalWarning

from labfbo.apps.harness import options_fingerprint, write_atomic
from labfbo.core.exceptions import ProtocolError
from labfbo.core.seeding import int_seed
from labfbo.datasets import ReactionData, initial_design, load_family, load_reactions
from labfbo.privacy import DP

PROTOCOLS = ("independent", "gradient", "distribution", "consensus", "surface", "vote")
METHODS = ("random", *PROTOCOLS, "pooled")
#: variants studied beside the defaults: method -> (protocol, options)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gradient-noguard": ("gradient", {"harm_guard": False, "acquisition": "ucb", "beta": 4.0}),  # the paper's PACD-BO
    "gradient-ucb": ("gradient", {"acquisition": "ucb", "beta": 4.0}),  # the default before qLogNEI
    "distribution-ucb": ("distribution", {"acquisition": "ucb", "beta": 4.0}),
    "distribution-trust": ("distribution", {"trust": "agreement"}),  # the guidance strength times the lab's agreement
    "surface-dp": ("surface", {"privacy": DP(clip=2.0, noise_multiplier=2.0)}),  # task-level, eps ~ 11.5 at 20 rounds
    # how strongly a lab's agreement scale c is held to the others' surface (prior N(c0, s_c^2))
    "surface-sd06": ("surface", {"scale_sd": 0.6}),
    "surface-c05": ("surface", {"scale_mean": 0.5, "scale_sd": 0.5}),
    # how far a lab trusts its partners' surface, and whether it weighs its own upload by its agreement
    "surface-top": ("surface", {"trust": "top", "weigh_upload": "off"}),
    "surface-prior": ("surface", {"trust": "prior", "weigh_upload": "off"}),  # the defaults before 2026-12-06
    "surface-weigh": ("surface", {"trust": "prior", "weigh_upload": "agreement"}),
    # the engine's candidate defaults on real, outlier-heavy yields
    "independent-auto": ("independent", {"noise_prior": "auto"}),
    "independent-winsorize": ("independent", {"output_transform": "winsorize"}),  # = today's defaults
    "independent-standardize": ("independent", {"output_transform": "standardize"}),  # the defaults before
    "gradient-standardize": ("gradient", {"output_transform": "standardize"}),
    "distribution-standardize": ("distribution", {"output_transform": "standardize"}),  # = its own default
    "distribution-winsorize": ("distribution", {"output_transform": "winsorize"}),  # the engine's default
    "surface-standardize": ("surface", {"output_transform": "standardize"}),
    "independent-auto-winsorize": ("independent", {"noise_prior": "auto", "output_transform": "winsorize"}),
    "vote-beta3": ("vote", {"prior_beta": 3.0}),  # the votes' prior at exponent 1 after the 3 initial experiments
    "vote-codebook8": ("vote", {"codebook": 8}),  # vote's former default: 8 Sobol points of the cube
    "vote-off": ("vote", {"trust": "off"}),  # the votes' prior at its exponent, whatever the lab's data say
    # reagents described by their structure (labfbo.space.chem): "encoding" builds the space, it is no protocol option
    "independent-smiles": ("independent", {"encoding": "rdkit", "descriptors": "use"}),
    "surface-smiles": ("surface", {"encoding": "rdkit", "descriptors": "use"}),
    "independent-morgan": ("independent", {"encoding": "morgan", "descriptors": "use"}),
    "surface-morgan": ("surface", {"encoding": "morgan", "descriptors": "use"}),
}
#: options of a method that choose how the data's space is built (load_reactions), not the protocol's
DATA_OPTIONS = ("encoding",)
CHECKPOINTS = (5, 10, 20)


@dataclass(frozen=True)
class ReactionJob:
    """One campaign: a scenario's labs under one method and seed."""

    path: str
    scenario: str
    labs: tuple[str, ...]
    method: str
    seed: int
    n_init: int = 3
    budget: int = 20
    data: str | None = None
    stock: str | None = None  # a parameter of which each lab lacks a different quarter of the choices
    family: str | None = None  # a shipped family (labfbo.datasets.FAMILIES) instead of data

    def fingerprint(self) -> str | None:
        """The method's complete option set, hashed (None for the pooled reference, which has none)."""
        if self.method == "pooled":
            return None
        return options_fingerprint(*method_options(self.method))


def method_options(method: str) -> tuple[str, dict[str, Any]]:
    """(protocol, options) of a method of the suite: a variant, a private setting, or a protocol's defaults."""
    from labfbo_bench.privacy_grid import reaction_variant

    return VARIANTS.get(method) or reaction_variant(method) or (method, {})


def lab_stock(data: ReactionData, param: str | None, lab: int) -> list[tuple] | None:
    """The combinations lab ``lab`` stocks when each lab lacks a different quarter of ``param``'s
    choices (lab ``i`` lacks quarter ``i mod 4``; None: it stocks everything)."""
    if param is None:
        return None
    j = data.space.names.index(param)
    choices = list(data.space.params[j].choices)
    quarter = max(1, len(choices) // 4)
    lacks = set(choices[(lab % 4) * quarter:(lab % 4 + 1) * quarter]) if (lab % 4) * quarter < len(choices) else set()
    return [c for c in data.combos() if c[j] not in lacks]


def stocked(data: ReactionData, param: str | None) -> tuple[ReactionData, list[list[tuple] | None]]:
    """The data as the labs of a stock scenario see it (each lab's table cut to what it stocks, so
    its regret is against the best it can run) and each lab's stock."""
    stocks = [lab_stock(data, param, i) for i in range(len(data.labs))]
    if param is None:
        return data, stocks
    tables = tuple({c: y for c, y in t.items() if c in set(s)} for t, s in zip(data.tables, stocks))
    return ReactionData(data.space, data.labs, tables, data.source), stocks


def lab_space(data: ReactionData, stock: list[tuple] | None) -> Any:
    """The lab's own space: the data's, with its stock as ``allowed=`` (kept at the lab)."""
    from labfbo.space.search import SearchSpace

    if stock is None:
        return data.space
    return SearchSpace(list(data.space.params), allowed=[dict(zip(data.space.names, c)) for c in stock])


def _key(data: ReactionData, params: dict[str, Any]) -> tuple:
    return tuple(params[n] for n in data.space.names)


class _Tracker:
    """Best yield found per lab after the design and after every iteration."""

    def __init__(self, data: ReactionData, budget: int) -> None:
        self.data = data
        self.best = np.zeros(len(data.labs))
        self.curve = np.zeros((len(data.labs), budget + 1))
        self.failed = np.zeros(len(data.labs), dtype=int)

    def run(self, lab: int, combo: tuple) -> float | None:
        y = self.data.tables[lab].get(combo)
        if y is None:
            self.failed[lab] += 1
            return None
        self.best[lab] = max(self.best[lab], y)
        return y

    def mark(self, t: int) -> None:
        self.curve[:, t] = self.best

    def regret(self) -> np.ndarray:
        return np.array([self.data.best(i) for i in range(len(self.data.labs))])[:, None] - self.curve


def run_protocol(job: ReactionJob, data: ReactionData) -> dict[str, Any]:
    """Every lab a real Optimizer under ``job.method``; lock-step rounds, failures told."""
    from labfbo.coordinator import Coordinator
    from labfbo.optimizer import Optimizer

    names = [f"lab{i}" for i in range(len(data.labs))]
    protocol, options = method_options(job.method)
    options = {k: v for k, v in options.items() if k not in DATA_OPTIONS}
    data, stocks = stocked(data, job.stock)
    spaces = [lab_space(data, s) for s in stocks]
    coord = None if protocol == "independent" else Coordinator(  # given the first lab's space, stock and all
        protocol, sites=names, space=spaces[0], seed=job.seed, horizon=job.budget, **options)
    opts = [Optimizer(spaces[i], objective="maximize", protocol=protocol, coordinator=coord, site=n,
                      seed=job.seed, n_init=job.n_init, horizon=job.budget,
                      secret=int_seed(job.seed, i, 0, "site-secret"), **options) for i, n in enumerate(names)]
    track = _Tracker(data, job.budget)
    out_of_stock = [0] * len(opts)
    have = [None if s is None else set(s) for s in stocks]

    def evaluate(i: int, trial: Any) -> None:
        if have[i] is not None and _key(data, trial.params) not in have[i]:
            out_of_stock[i] += 1  # never expected: a lab is proposed only what it stocks
        y = track.run(i, _key(data, trial.params))
        if y is None:
            opts[i].tell_failed(trial, "combination not in this lab's data")
        else:
            opts[i].tell(trial, y)

    for i, opt in enumerate(opts):
        for combo in initial_design(data, i, job.seed, job.n_init, stocks[i]):
            evaluate(i, opt.enqueue(dict(zip(data.space.names, combo))))
    track.mark(0)
    ask_s = np.zeros((len(opts), job.budget))
    for t in range(job.budget):
        trials = []
        for i, opt in enumerate(opts):
            t0 = time.perf_counter()
            trials.append(opt.ask())
            ask_s[i, t] = time.perf_counter() - t0
        for i, trial in enumerate(trials):
            evaluate(i, trial)
        track.mark(t + 1)
    bytes_up = sum(sum(o.ledger.round_bytes(t)[0] for t in range(job.budget)) for o in opts)
    epsilon = [o.epsilon() for o in opts]
    for o in opts:
        o.close()
    return {"regret": track.regret().tolist(), "failed": track.failed.tolist(),
            "ask_seconds": float(ask_s.mean()), "bytes_up_per_site_round": bytes_up / (len(opts) * job.budget),
            "epsilon": epsilon, "out_of_stock": out_of_stock}


def run_pooled(job: ReactionJob, data: ReactionData) -> dict[str, Any]:
    """Every lab's raw yields in one ``MultiTaskGP`` (the non-private reference)."""
    import torch
    from botorch.acquisition import LogExpectedImprovement
    from botorch.acquisition.objective import ScalarizedPosteriorTransform
    from botorch.optim import optimize_acqf_discrete

    from labfbo.models.encoding import FeatureMap
    from labfbo.models.gp import as_tensor
    from labfbo.protocols.pooled import fit_multitask_gp

    data, stocks = stocked(data, job.stock)
    have = [None if s is None else set(s) for s in stocks]
    combos = data.combos()
    index = {c: k for k, c in enumerate(combos)}
    feats = FeatureMap(data.space, one_hot=True).numpy(data.space.encode([dict(zip(data.space.names, c))
                                                                          for c in combos]))
    L = len(data.labs)
    obs: list[list[tuple[int, float]]] = [[] for _ in range(L)]
    tried: list[set[int]] = [set() for _ in range(L)]
    track = _Tracker(data, job.budget)

    def evaluate(i: int, k: int) -> None:
        tried[i].add(k)
        y = track.run(i, combos[k])
        if y is not None:
            obs[i].append((k, y))

    for i in range(L):
        for combo in initial_design(data, i, job.seed, job.n_init, stocks[i]):
            evaluate(i, index[combo])
    track.mark(0)
    ask_s = []
    for t in range(job.budget):
        t0 = time.perf_counter()
        rows = [(np.append(feats[k], i), y) for i in range(L) for k, y in obs[i]]
        Y = np.array([y for _, y in rows])
        model = fit_multitask_gp(np.array([r for r, _ in rows]), Y, int_seed(job.seed, 0, t, "pooled-fit"))
        picks = []
        for i in range(L):
            cand = [k for k in range(len(combos)) if k not in tried[i]
                    and (have[i] is None or combos[k] in have[i])]
            best = max((y for _, y in obs[i]), default=float(Y.min()))
            w = torch.zeros(L, dtype=torch.float64)
            w[i] = 1.0
            acqf = LogExpectedImprovement(model, best_f=best, posterior_transform=ScalarizedPosteriorTransform(w))
            x, _ = optimize_acqf_discrete(acqf, q=1, choices=as_tensor(feats[cand]))
            picks.append(cand[int(np.argmin(np.abs(feats[cand] - x.numpy()).sum(1)))])
        ask_s.append((time.perf_counter() - t0) / L)
        for i, k in enumerate(picks):
            evaluate(i, k)
        track.mark(t + 1)
    return {"regret": track.regret().tolist(), "failed": track.failed.tolist(),
            "ask_seconds": float(np.mean(ask_s)), "bytes_up_per_site_round": float("nan")}


def random_regret(data: ReactionData, n_init: int, budget: int, stock: str | None = None) -> np.ndarray:
    r"""Exact expected regret ``(labs, budget + 1)`` of sampling combinations without
    replacement: with the values sorted :math:`v_1 \ge \dots \ge v_M` (a missing combination
    counts 0), :math:`P(\text{best of } n \text{ is } v_k) = \binom{M-k}{n-1} / \binom{M}{n}`."""
    data, stocks = stocked(data, stock)
    out = np.zeros((len(data.labs), budget + 1))
    for i in range(len(data.labs)):
        v = np.nan_to_num(data.yields(i), nan=0.0).clip(min=0.0)
        if stocks[i] is not None:  # sampled among what the lab stocks
            have = set(stocks[i])
            v = v[[c in have for c in data.combos()]]
        v = np.sort(v)[::-1]
        M = len(v)
        for t in range(budget + 1):
            n = min(n_init + t, M)
            p = np.array([math.comb(M - k, n - 1) for k in range(1, M + 1)], dtype=float) / math.comb(M, n)
            out[i, t] = data.best(i) - float(p @ v)
    return out


def run_reaction_job(job: ReactionJob) -> str:
    """Run one job in a worker and write its JSON (atomically)."""
    data = load_data(job.data, job.family, method_options(job.method)[1].get("encoding")).subset(job.labs)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # jitter notices from near-singular covariances: expected, not news
            warnings.simplefilter("ignore", NumericalWarning)
            warnings.filterwarnings("ignore", message=".*Sparse.*|.*sparse.*")
            res = run_pooled(job, data) if job.method == "pooled" else run_protocol(job, data)
    except ProtocolError as exc:  # a protocol that refuses categorical spaces: reported as such
        res = {"refused": str(exc)}
    res.update(job=asdict(job), wall_seconds=time.perf_counter() - t0, fingerprint=job.fingerprint())
    return write_atomic(job.path, json.dumps(res))


def load_data(data: str | None, family: str | None, encoding: str | None = None) -> ReactionData:
    """A shipped family (yields in percent), or a CSV (the shipped Buchwald–Hartwig file by default)."""
    if family is not None:
        return load_family(family, encoding=encoding)
    return load_reactions(data, encoding=encoding)


def jobs(out: str, scenarios: dict[str, tuple[str, ...]], methods: Sequence[str], seeds: Sequence[int],
         budget: int = 20, data: str | None = None, stock: str | None = None,
         family: str | None = None) -> list[ReactionJob]:
    tag = (family or ("shipped" if data is None else Path(data).stem)) + ("" if stock is None else f"-stock-{stock}")
    return [ReactionJob(path=str(Path(out) / tag / name / m / f"seed{s}.json"), scenario=name, labs=labs,
                        method=m, seed=s, budget=budget, data=data, stock=stock, family=family)
            for name, labs in scenarios.items() for m in methods if m != "random" for s in seeds]
