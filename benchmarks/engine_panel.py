r"""The single-site panel of ``labfbo bench engine``: 15 synthetic problems in 2–10
parameters and the 15 Buchwald–Hartwig labs (real yields over 276 reagent combinations).

Every problem is a *minimization* of a noiseless function over a :class:`SearchSpace`;
``noise`` problems observe it with Gaussian noise of 2 % of the function's range (regret
is always measured on the noiseless value). ``*_site`` problems are one site of a
related-site family of :mod:`labfbo.problems.families`, a different site for each
seed (what a lab of a consortium faces alone). Mixed problems have integer and
categorical parameters; their optimum is found by enumerating the discrete part and
minimizing the continuous part numerically (:func:`minimize_in_box`).

``bh_labNN`` is lab ``NN`` of the shipped Buchwald–Hartwig data (Ahneman et al., *Science*
2018) alone: minimize minus the yield over base x ligand x additive; a combination the lab
did not run yields 0 (a failed experiment), 3 initial experiments and 20 more, as
``engine_reactions``.

The range (normalizer of the normalized regret) is ``max - min`` over every feasible
combination of a fully discrete space of up to 4,096, otherwise over 1024 scrambled Sobol points (fixed seed)
and the optimum. Definitions: ``docs/benchmarks/engine.md``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.stats import qmc

from labfbo.core.exceptions import ConfigurationError
from labfbo.problems.families import BraninTask, get_problem, site_rng
from labfbo.problems.functions import (
    FUNCTIONS,
    WING_BOUNDS,
    WING_ORDER,
    hartmann3,
    hartmann6,
    minimize_in_box,
    wing_weight,
)
from labfbo.space.search import Categorical, Integer, Real, SearchSpace
from labfbo_bench.engine_chem import LabTable

Array = np.ndarray
NOISE_SHARE = 0.02  # noise standard deviation as a share of the function's range


@dataclass(frozen=True)
class EngineProblem:
    """One single-site problem instance: ``fn(params) -> noiseless value`` (minimize)."""

    name: str
    space: SearchSpace
    fn: Callable[[dict[str, Any]], float]
    f_min: float
    f_range: float
    n_init: int
    budget: int
    noise_sd: float = 0.0
    encoded: Callable[[str], SearchSpace] | None = None  # the space with reagents by structure (reaction labs)


@dataclass(frozen=True)
class _Spec:
    build: Callable[[int], tuple[SearchSpace, Callable[[dict[str, Any]], float], float]]
    n_init: int
    budget: int
    noisy: bool = False
    per_seed: bool = False  # a new instance (site) per seed


# ------------------------------------------------------------------ continuous
@dataclass(frozen=True)
class _Batch:
    """``params -> float`` over a vectorized function of the space's columns."""

    batch: Callable[[Array], Array]
    names: tuple[str, ...]

    def __call__(self, params: dict[str, Any]) -> float:
        return float(self.batch(np.array([[float(params[n]) for n in self.names]]))[0])


def _classic(name: str, d: int) -> Callable[[int], tuple[SearchSpace, Any, float]]:
    tf = FUNCTIONS[name]

    def build(seed: int) -> tuple[SearchSpace, Any, float]:
        b = tf.bounds(d)
        space = SearchSpace([Real(f"x{j + 1}", float(lo), float(hi)) for j, (lo, hi) in enumerate(b)])
        return space, _Batch(tf.fn, tuple(space.names)), float(tf.f_min(d))
    return build


_WING_BOX = np.array([WING_BOUNDS[k] for k in WING_ORDER])


@functools.lru_cache(maxsize=None)
def _wing_min() -> float:
    return minimize_in_box(wing_weight, _WING_BOX, seed=0)[1]


def _wing(seed: int) -> tuple[SearchSpace, Any, float]:
    space = SearchSpace([Real(n, float(lo), float(hi)) for n, (lo, hi) in zip(WING_ORDER, _WING_BOX)])
    return space, _Batch(wing_weight, tuple(WING_ORDER)), _wing_min()


def _family_site(family: str) -> Callable[[int], tuple[SearchSpace, Any, float]]:
    def build(seed: int) -> tuple[SearchSpace, Any, float]:
        site = seed % 5
        prob = get_problem(family, n_sites=5, seed=seed)
        return prob.space, prob.objectives[site], float(prob.optima[site])
    return build


# ----------------------------------------------------------------------- mixed
@dataclass(frozen=True)
class _BraninChoice:
    """Branin whose task parameters (and an offset) depend on a categorical ``catalyst``."""

    tasks: tuple[BraninTask, ...]
    offsets: tuple[float, ...]
    choices: tuple[str, ...]

    def __call__(self, params: dict[str, Any]) -> float:
        k = self.choices.index(params["catalyst"])
        x = np.array([[float(params["x1"]), float(params["x2"])]])
        return float(self.tasks[k](x)[0]) + self.offsets[k]


@functools.lru_cache(maxsize=None)
def _branin_choice_fn() -> _BraninChoice:
    prob = get_problem("branin_family", n_sites=4, seed=7)
    tasks = tuple(BraninTask(**p) for p in prob.metadata["site_params"])
    return _BraninChoice(tasks, (0.0, 3.0, 1.0, 6.0), ("A", "B", "C", "D"))


def _branin_choice(seed: int) -> tuple[SearchSpace, Any, float]:
    fn = _branin_choice_fn()
    space = SearchSpace([Real("x1", -5.0, 10.0), Real("x2", 0.0, 15.0), Categorical("catalyst", list(fn.choices))])
    prob = get_problem("branin_family", n_sites=4, seed=7)
    return space, fn, float(min(o + f for o, f in zip(fn.offsets, prob.optima)))


H6_LEVELS = 6  # integer columns of the Hartmann-6 variant take 0..5, i.e. x = k / 5


@dataclass(frozen=True)
class _H6Int:
    def __call__(self, params: dict[str, Any]) -> float:
        x = [float(params[f"x{j}"]) for j in range(1, 5)] + [params["k5"] / (H6_LEVELS - 1),
                                                                 params["k6"] / (H6_LEVELS - 1)]
        return float(hartmann6(np.array([x]))[0])


@functools.lru_cache(maxsize=None)
def _h6_int_min() -> float:
    best = np.inf
    for k5, k6 in itertools.product(range(H6_LEVELS), repeat=2):
        tail = np.array([k5, k6]) / (H6_LEVELS - 1)
        def f(U, t=tail):
            return (hartmann6(np.hstack([U, np.tile(t, (len(U), 1))])))
        best = min(best, minimize_in_box(f, np.tile([0.0, 1.0], (4, 1)), seed=0, n_raw=1024, n_starts=16)[1])
    return float(best)


def _h6_int(seed: int) -> tuple[SearchSpace, Any, float]:
    space = SearchSpace([Real(f"x{j}", 0.0, 1.0) for j in range(1, 5)]
                        + [Integer("k5", 0, H6_LEVELS - 1), Integer("k6", 0, H6_LEVELS - 1)])
    return space, _H6Int(), _h6_int_min()


@dataclass(frozen=True)
class _Reaction:
    r"""A reaction-like response: :math:`s_a \cdot h_3(t, \tau, (e - 1)/4; \alpha_b) + o_a`
    for solvent ``a`` (scale, offset), base ``b`` (Hartmann weights), temperature ``t``,
    time ``tau`` and equivalents ``e`` in 1..5."""

    scales: tuple[float, ...]
    offsets: tuple[float, ...]
    alphas: tuple[tuple[float, ...], ...]

    solvents = ("water", "ethanol", "dmso")
    bases = ("K2CO3", "Cs2CO3", "DBU", "Et3N")

    def value(self, a: int, b: int, X: Array) -> Array:
        return self.scales[a] * hartmann3(X, np.asarray(self.alphas[b])) + self.offsets[a]

    def __call__(self, params: dict[str, Any]) -> float:
        a, b = self.solvents.index(params["solvent"]), self.bases.index(params["base"])
        x = np.array([[params["temperature"], params["time"], (params["equiv"] - 1) / 4]])
        return float(self.value(a, b, x)[0])


@functools.lru_cache(maxsize=None)
def _reaction_fn() -> _Reaction:
    rng = site_rng("engine-reaction", 0, 0)
    alphas = tuple(tuple(float(v) for v in np.array([1.0, 1.2, 3.0, 3.2]) * np.exp(0.3 * rng.standard_normal(4)))
                   for _ in range(4))
    return _Reaction(scales=(1.0, 0.7, 0.85), offsets=(0.0, -0.4, 0.3), alphas=alphas)


@functools.lru_cache(maxsize=None)
def _reaction_min() -> float:
    fn = _reaction_fn()
    best = np.inf
    for a, b, e in itertools.product(range(3), range(4), range(1, 6)):
        def f(U, a=a, b=b, e=e):
            return (fn.value(a, b, np.hstack([U, np.full((len(U), 1), (e - 1) / 4)])))
        best = min(best, minimize_in_box(f, np.tile([0.0, 1.0], (2, 1)), seed=0, n_raw=512, n_starts=8)[1])
    return float(best)


def _reaction(seed: int) -> tuple[SearchSpace, Any, float]:
    fn = _reaction_fn()
    space = SearchSpace([Categorical("solvent", list(fn.solvents)), Categorical("base", list(fn.bases)),
                         Real("temperature", 0.0, 1.0), Real("time", 0.0, 1.0), Integer("equiv", 1, 5)])
    return space, fn, _reaction_min()


# ------------------------------------------------------- Buchwald–Hartwig labs
@functools.lru_cache(maxsize=None)
def _reactions() -> Any:
    from labfbo.datasets import load_reactions

    return load_reactions()


def _bh_lab(lab: int) -> Callable[[int], tuple[SearchSpace, Any, float]]:
    def build(seed: int) -> tuple[SearchSpace, Any, float]:
        data = _reactions()
        return data.space, LabTable(tuple(data.space.names), dict(data.tables[lab])), -float(data.best(lab))
    return build


BH_LABS = 15
"""The aryl halides of the shipped Buchwald–Hartwig data, one panel problem each."""

# ----------------------------------------------------------------------- panel
PANEL: dict[str, _Spec] = {
    "branin": _Spec(_classic("branin", 2), 5, 20),
    "branin_site": _Spec(_family_site("branin_family"), 5, 20, per_seed=True),
    "hartmann3_site": _Spec(_family_site("hartmann3"), 5, 25, per_seed=True),
    "hartmann3_site_noisy": _Spec(_family_site("hartmann3"), 5, 25, noisy=True, per_seed=True),
    "levy4": _Spec(_classic("levy", 4), 8, 30),
    "rosenbrock4": _Spec(_classic("rosenbrock", 4), 8, 30),
    "styblinski_tang5": _Spec(_classic("styblinski_tang", 5), 8, 40),
    "ackley5": _Spec(_classic("ackley", 5), 10, 40),
    "hartmann6": _Spec(_classic("hartmann6", 6), 10, 40),
    "hartmann6_noisy": _Spec(_classic("hartmann6", 6), 10, 40, noisy=True),
    "wing_weight": _Spec(_wing, 10, 50),
    "branin_catalyst": _Spec(_branin_choice, 5, 25),
    "hartmann6_int": _Spec(_h6_int, 10, 40),
    "reaction": _Spec(_reaction, 10, 40),
    "reaction_noisy": _Spec(_reaction, 10, 40, noisy=True),
    **{f"bh_lab{i:02d}": _Spec(_bh_lab(i), 3, 20) for i in range(BH_LABS)},
}
"""name -> how to build it, initial points, budget (BO iterations after the design)."""

SYNTHETIC = tuple(p for p in PANEL if not p.startswith("bh_"))
"""The 15 synthetic problems (``--problems synthetic``)."""
REAL = tuple(p for p in PANEL if p.startswith("bh_"))
"""The Buchwald–Hartwig labs (``--problems real``)."""

QUICK = ("branin_site", "hartmann3_site_noisy", "hartmann6", "branin_catalyst", "reaction_noisy")
"""The ``--quick`` third of the panel."""


def _range(space: SearchSpace, fn: Callable[[dict[str, Any]], float], f_min: float) -> float:
    discrete = len({**space.discrete_dims(), **space.cat_dims()}) == space.dim
    grid = space.feasible_grid(4096) if discrete else None  # a fully discrete space's rows are points
    points = space.decode(grid if grid is not None else
                          qmc.Sobol(space.dim, scramble=True, seed=20240601).random(1024))
    vals = np.array([fn(p) for p in points] + [f_min])
    return max(float(vals.max() - vals.min()), 1e-12)


FAMILIES: dict[str, tuple[str, int, int, int]] = {
    "hartmann3-4x(4+20)": ("hartmann3", 4, 4, 20),
    "branin_family-5x(3+20)": ("branin_family", 5, 3, 20),
    "hartmann6-5x(6+30)": ("hartmann6", 5, 6, 30),
}
"""Related-site families run site by site (``--families``): family, sites, design, budget.
The first two are the settings in which the issue measured Optuna ahead of labfbo."""


def family_problems(family: str) -> list[str]:
    """Problem names ``family#site`` of a :data:`FAMILIES` entry."""
    return [f"{family}#{i}" for i in range(FAMILIES[family][1])]


def _family_problem(name: str, seed: int) -> EngineProblem:
    family, site = name.split("#")
    base, n_sites, n_init, budget = FAMILIES[family]
    prob = get_problem(base, n_sites=n_sites, seed=seed)
    i = int(site)
    fn, f_min = prob.objectives[i], float(prob.optima[i])
    return EngineProblem(name, prob.space, fn, f_min, float(prob.objective_ranges()[i]), n_init, budget)


def is_known(name: str) -> bool:
    """A panel problem, a site of a :data:`FAMILIES` entry, a reaction lab or a pairing instance."""
    from labfbo.datasets.families import FAMILIES as REACTIONS

    head = name.split("#")[0]
    return name in PANEL or ("#" in name and (head in FAMILIES or head in REACTIONS or head == "pairing"))


def engine_problem(name: str, seed: int) -> EngineProblem:
    """The panel problem ``name`` for ``seed`` (family problems: site ``seed % 5``), site
    ``i`` of a :data:`FAMILIES` entry, ``"family#i"`` (the family drawn from ``seed``), lab ``NN``
    of a shipped reaction family, ``"borylation#NN"``, or a pairing screen, ``"pairing#i"``
    (:mod:`labfbo_bench.engine_chem`)."""
    from labfbo.datasets.families import FAMILIES as REACTIONS
    from labfbo_bench.engine_chem import lab_problem, pairing_problem

    head = name.split("#")[0]
    if "#" in name and head in FAMILIES:
        return _family_problem(name, seed)
    if "#" in name and head in REACTIONS:
        space, fn, f_min, budget, encoded = lab_problem(name)
        return EngineProblem(name, space, fn, f_min, _range(space, fn, f_min), 3, budget, encoded=encoded)
    if "#" in name and head == "pairing":
        space, fn, f_min, budget = pairing_problem(name, seed)
        return EngineProblem(name, space, fn, f_min, _range(space, fn, f_min), 3, budget)
    if name not in PANEL:
        raise ConfigurationError(f"unknown engine problem {name!r}; available: {list(PANEL)}")
    spec = PANEL[name]
    space, fn, f_min = spec.build(seed if spec.per_seed else 0)
    f_range = _range(space, fn, f_min)
    return EngineProblem(name, space, fn, f_min, f_range, spec.n_init, spec.budget,
                         NOISE_SHARE * f_range if spec.noisy else 0.0)
