r"""Categorical problems of ``labfbo bench engine``: the shipped reaction families lab by lab, and a
synthetic *pairing* screen.

* ``<family>#NN`` — lab ``NN`` of a shipped family (:mod:`labfbo.datasets.families`) alone:
  minimize minus its yield (percent; a combination the lab did not run yields 0), 3 first
  experiments and the family's budget (Buchwald–Hartwig 20, borylation 15, deoxyfluorination 8).
  ``problem.encoded("rdkit")`` is the same space with every reagent described by its structure.
* ``pairing#i`` — a synthetic 4-factor screen of 576 combinations (12 ligands × 4 bases ×
  4 solvents × 3 additives), instance ``i`` drawn from the seed: good yields need one
  ligand–base pairing and most combinations give almost nothing:
  :math:`y = 100\, c(l, b)^{3/2} s_s a_a` with :math:`c = \exp(-\|u_l - v_b\|^2/0.3)` over
  latent 2-D positions (sharpened so that the runner-up pair has half the best's :math:`c`, then
  rescaled so the best pair has :math:`c = 1`), solvent factors :math:`s \in [0.3, 1]` and additive
  factors :math:`a \in [0.5, 1]` (one of each at 1); yields reported to 0.1 points.
  3 first experiments and 20 more. Built to resemble the held-out family on which the engine
  stalled; no reaction data goes into it.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from labfbo.space.search import Categorical, SearchSpace

PAIRING_INSTANCES = 4
PAIRING_BUDGET = 20


@dataclass(frozen=True)
class LabTable:
    """Minus the yield of one lab's reaction table (0 for a combination it did not run)."""

    names: tuple[str, ...]
    table: dict[tuple, float]

    def __call__(self, params: dict[str, Any]) -> float:
        return -max(self.table.get(tuple(params[n] for n in self.names), 0.0), 0.0)


@functools.lru_cache(maxsize=None)
def family_data(family: str, encoding: str | None = None) -> Any:
    from labfbo.datasets.families import load_family

    return load_family(family, encoding=encoding)


def family_labs(family: str) -> list[str]:
    """Problem names ``family#NN``, one per lab of the shipped family."""
    return [f"{family}#{i:02d}" for i in range(len(family_data(family).labs))]


def lab_problem(name: str) -> tuple[SearchSpace, LabTable, float, int, Callable[[str], SearchSpace]]:
    """Space, objective, optimum, budget and the encoder of ``family#NN``."""
    from labfbo.datasets.families import FAMILIES

    family, lab = name.split("#")
    data = family_data(family)
    fn = LabTable(tuple(data.space.names), dict(data.tables[int(lab)]))
    return data.space, fn, -float(data.best(int(lab))), FAMILIES[family].budget, \
        functools.partial(_encoded, family)


def _encoded(family: str, encoding: str) -> SearchSpace:
    return family_data(family, encoding).space


@dataclass(frozen=True)
class Pairing:
    """Minus the yield of a synthetic pairing screen (see the module docstring)."""

    compat: np.ndarray    # (ligands, bases)
    solvent: np.ndarray   # (solvents,)
    additive: np.ndarray  # (additives,)
    space: SearchSpace

    def __call__(self, params: dict[str, Any]) -> float:
        idx = [p.choices.index(params[p.name]) for p in self.space.params]
        y = 100.0 * float(self.compat[idx[0], idx[1]] ** 1.5 * self.solvent[idx[2]] * self.additive[idx[3]])
        return -round(y, 1)  # reported to 0.1 points, as a plate reader's yields are


@functools.lru_cache(maxsize=None)
def pairing(seed: int, instance: int) -> Pairing:
    rng = np.random.default_rng(np.random.SeedSequence([seed, instance, 577]))
    u, v = rng.random((12, 2)), rng.random((4, 2))
    c = np.exp(-((u[:, None, :] - v[None, :, :]) ** 2).sum(-1) / 0.3)
    c = c ** (np.log(0.5) / np.log(np.sort(c.ravel())[-2] / c.max())) if c.max() > 0 else c  # runner-up pair at half
    c = c / c.max()
    s, a = rng.uniform(0.3, 1.0, 4), rng.uniform(0.5, 1.0, 3)
    s[rng.integers(4)], a[rng.integers(3)] = 1.0, 1.0
    space = SearchSpace(
        [
            Categorical("ligand", [f"L{k}" for k in range(12)]),
            Categorical("base", [f"B{k}" for k in range(4)]),
            Categorical("solvent", [f"S{k}" for k in range(4)]),
            Categorical("additive", [f"A{k}" for k in range(3)]),
        ]
    )
    return Pairing(c, s, a, space)


def pairing_problem(name: str, seed: int) -> tuple[SearchSpace, Pairing, float, int]:
    fn = pairing(seed, int(name.split("#")[1]))
    best = min(fn({p.name: p.choices[k] for p, k in zip(fn.space.params, combo)})
               for combo in itertools.product(*(range(len(p.choices)) for p in fn.space.params)))
    return fn.space, fn, best, PAIRING_BUDGET
