r"""Reaction data: labs, their yield tables, the scenarios (``make demo``, ``labfbo bench reactions``).

A data file is a CSV with a **lab** column, one column per **parameter** and a **yield**
column (defaults ``lab``, ``base ligand additive`` and ``yield``; see
:func:`load_reactions`). Every parameter becomes a ``Categorical`` over the values seen in
the file; each lab searches the full product of them, and a combination missing from a
lab's rows is an experiment that *fails* there.

The shipped file (``data/buchwald_hartwig.csv``, Ahneman et al., *Science* 360, 186 (2018);
see ``data/README.md``) has 15 aryl halides (labs) × 3 bases × 4 ligands × 23 additives;
``data/buchwald_hartwig_smiles.csv`` has the SMILES of each, for ``load_reactions(encoding=...)``
(reagents described by their structure, :mod:`labfbo.space.chem`).

Scenarios (:func:`scenarios`), from the labs' pairwise Spearman correlations of yield
over the combinations both ran:

* ``a`` — the 5 labs with the largest *minimum* pairwise correlation (an exhaustive search
  over the 5-subsets);
* ``b`` — the 3 of those with the largest minimum correlation among themselves, plus the 2
  labs of a different kind (default: names containing ``chloro``) with the lowest mean
  correlation to them — partners that can mislead;
* ``c`` — every lab;
* ``d`` — one dissimilar lab: the 4 labs of ``a`` with the largest minimum correlation among
  themselves, plus the fifth lab of ``a`` *reversed* (:data:`REVERSED`): its own yields, with
  each parameter's choices swapped best-for-worst by the other four labs' mean yield, so the
  reagents they favour are the ones it does worst with (a rank correlation of about -0.55 with
  each of them on the shipped data) — a lab with real yields and opposite preferences.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.seeding import rng
from labfbo.space.search import Categorical, SearchSpace

if TYPE_CHECKING:
    import pandas as pd

REVERSED = " (reversed)"
"""The suffix of a derived lab (:meth:`ReactionData.subset`): the named lab's yields with each
parameter's choices swapped best-for-worst by the mean yield of the subset's other labs."""
SHIPPED = "buchwald_hartwig.csv"
SHIPPED_SMILES = "buchwald_hartwig_smiles.csv"  # component,kind,smiles of every lab and reagent
CITATION = ("Ahneman, Estrada, Lin, Dreher, Doyle, 'Predicting reaction performance in C-N cross-coupling "
            "using machine learning', Science 360, 186 (2018)")


def shipped_path(name: str = SHIPPED) -> Path:
    """Where a shipped data file (``buchwald_hartwig.csv``, ``buchwald_hartwig_smiles.csv``, ``README.md``) is."""
    path = Path(str(resources.files("labfbo.datasets") / "data" / name))
    if not path.is_file():
        raise ConfigurationError(f"labfbo's shipped data file {name} is missing (looked at {path}); "
                                 "reinstall labfbo, or give the path of your own CSV")
    return path


@dataclass(frozen=True)
class ReactionData:
    """Yield tables of several labs over one categorical space."""

    space: SearchSpace
    labs: tuple[str, ...]
    tables: tuple[dict[tuple, float], ...]  # per lab: combination (in parameter order) -> yield
    source: str

    def best(self, lab: int) -> float:
        return max(self.tables[lab].values())

    def combos(self) -> list[tuple]:
        """Every combination of the space, in a fixed order."""
        return list(itertools.product(*(p.choices for p in self.space.params)))

    def yields(self, lab: int) -> np.ndarray:
        """The lab's yield at every combination (NaN where it is missing)."""
        t = self.tables[lab]
        return np.array([t.get(c, np.nan) for c in self.combos()], dtype=np.float64)

    def subset(self, labs: Sequence[str]) -> "ReactionData":
        """These labs; a name ``"<lab> (reversed)"`` (:data:`REVERSED`) is derived from ``<lab>``
        with the subset's other labs as reference (:meth:`reversed_table`)."""
        missing = [n for n in labs if n not in self.labs and n.removesuffix(REVERSED) not in self.labs]
        if missing:
            raise ConfigurationError(f"no lab {missing[0]!r} in {self.source} (labs: {', '.join(self.labs)})")
        reference = [n for n in labs if n in self.labs]
        tables = tuple(self.tables[self.labs.index(n)] if n in self.labs
                       else self.reversed_table(n.removesuffix(REVERSED), reference) for n in labs)
        return ReactionData(self.space, tuple(labs), tables, self.source)

    def reversed_table(self, lab: str, reference: Sequence[str]) -> dict[tuple, float]:
        """``lab``'s yields with every parameter's choices swapped best-for-worst: the choices
        ordered by their mean yield over the ``reference`` labs' rows, the k-th best takes the
        yields of the k-th worst (rows whose swapped combination ``lab`` never ran are left out)."""
        rows = [self.tables[self.labs.index(r)] for r in reference if r != lab]
        if not rows:
            raise ConfigurationError(f"reversing {lab!r} needs other labs to rank the choices by")
        swaps = []
        for j, p in enumerate(self.space.params):
            mean = {c: np.mean([y for t in rows for k, y in t.items() if k[j] == c] or [0.0]) for c in p.choices}
            order = sorted(p.choices, key=lambda c: (mean[c], str(c)))
            swaps.append(dict(zip(order, order[::-1])))
        table = self.tables[self.labs.index(lab)]
        mapped = {k: tuple(s[c] for s, c in zip(swaps, k)) for k in table}
        return {k: table[m] for k, m in mapped.items() if m in table}


def load_reactions(path: str | Path | None = None, lab: str = "lab",
                   params: Sequence[str] = ("base", "ligand", "additive"), target: str = "yield",
                   encoding: str | None = None, n_components: int = 5,
                   smiles: str | Path | None = None, scale: float = 1.0) -> ReactionData:
    """Read a reaction CSV (the shipped one by default). Duplicate rows of a lab and
    combination are averaged; rows with a missing value are dropped.

    With ``encoding`` (``"rdkit"``, ``"morgan"``: :mod:`labfbo.space.chem`, needs ``labfbo[chem]``)
    every parameter's choices are described by their structure: the SMILES come from
    ``<param>_smiles`` columns of the data file if it has them, else from ``smiles`` (a CSV
    ``component,kind,smiles``; default: the shipped ``buchwald_hartwig_smiles.csv`` for the
    shipped data; ``smiles="values"``: the choices themselves are SMILES). ``scale`` multiplies
    the yields (100: a fraction read as percent)."""
    import pandas as pd

    if path is None:
        df = pd.read_csv(shipped_path(SHIPPED))
        source = f"shipped {SHIPPED} ({CITATION})"
    else:
        if not Path(path).exists():
            raise ConfigurationError(f"reaction data file {path} does not exist")
        df = pd.read_csv(path)
        source = str(path)
    missing = [c for c in (lab, *params, target) if c not in df.columns]
    if missing:
        raise ConfigurationError(f"{source}: missing column(s) {missing}; it has {list(df.columns)} "
                                 f"(expected a lab column, parameter columns and a yield column)")
    structures = None if encoding is None else _smiles_of(df, params, smiles, path is None, source)
    df = df[[lab, *params, target]].dropna()
    if not pd.api.types.is_numeric_dtype(df[target]):
        raise ConfigurationError(f"{source}: column {target!r} must be numeric")
    choices = {p: sorted(df[p].astype(str).unique()) for p in params}
    if structures is None:
        space = SearchSpace([Categorical(p, choices[p]) for p in params])
    else:
        space = SearchSpace([Categorical(p, {c: structures[p][c] for c in choices[p]}, encoding=encoding,
                                         n_components=n_components) for p in params])
    df = df.assign(**{p: df[p].astype(str) for p in params})
    grouped = df.groupby([lab, *params], sort=True)[target].mean()
    labs = tuple(sorted(df[lab].astype(str).unique()))
    if len(labs) < 2:
        raise ConfigurationError(f"{source}: needs at least two labs, found {len(labs)}")
    tables = tuple({k[1:]: scale * float(v) for k, v in grouped.items() if str(k[0]) == name} for name in labs)
    return ReactionData(space, labs, tables, source)


def _smiles_of(df: "pd.DataFrame", params: Sequence[str], smiles: str | Path | None, shipped: bool,
               source: str) -> dict[str, dict[str, str | None]]:
    """Parameter -> choice -> SMILES (None: the choice has no structure, e.g. "no additive")."""
    import pandas as pd

    def text(v: object) -> str | None:
        return None if pd.isna(v) or not str(v).strip() else str(v).strip()

    out: dict[str, dict[str, str | None]] = {}
    if smiles == "values":  # each choice is its own structure
        return {p: {str(c): text(c) for c in df[p].dropna().unique()} for p in params}
    if all(f"{p}_smiles" in df.columns for p in params) and smiles is None:
        for p in params:
            pairs = df[[p, f"{p}_smiles"]].dropna(subset=[p]).drop_duplicates()
            out[p] = {str(c): text(v) for c, v in zip(pairs[p], pairs[f"{p}_smiles"])}
            many = pairs[p].astype(str).value_counts()
            if (many > 1).any():
                raise ConfigurationError(f"{source}: {p} {list(many[many > 1].index)[:3]} have several SMILES")
        return out
    if smiles is None and not shipped:
        raise ConfigurationError(f"{source}: no {', '.join(f'{p}_smiles' for p in params)} columns; give "
                                 "smiles= (a CSV component,kind,smiles)")
    if smiles is None:
        table = pd.read_csv(shipped_path(SHIPPED_SMILES), dtype=str, keep_default_na=False)
    elif not Path(smiles).exists():
        raise ConfigurationError(f"SMILES file {smiles} does not exist")
    else:
        table = pd.read_csv(smiles, dtype=str, keep_default_na=False)
    if not {"component", "kind", "smiles"} <= set(table.columns):
        raise ConfigurationError(f"SMILES file {smiles or SHIPPED_SMILES}: needs columns component,kind,smiles; "
                                 f"it has {list(table.columns)}")
    for p in params:
        rows = table[table["kind"] == p]
        out[p] = {str(c): text(v) for c, v in zip(rows["component"], rows["smiles"])}
        missing = sorted(set(df[p].dropna().astype(str)) - set(out[p]))
        if missing:
            raise ConfigurationError(f"SMILES file {smiles or SHIPPED_SMILES}: no row (kind {p!r}) for {missing}")
    return out


def initial_design(data: ReactionData, lab: int, seed: int, n: int,
                   stock: Sequence[tuple] | None = None) -> list[tuple]:
    """The lab's ``n`` initial combinations (distinct; the same for every method), drawn from
    ``stock`` (the combinations it can run) when given, else from the whole space."""
    combos = data.combos() if stock is None else list(stock)
    pick = rng(seed, lab, 0, "reaction-design").choice(len(combos), size=n, replace=False)
    return [combos[int(k)] for k in pick]


def spearman_matrix(data: ReactionData) -> np.ndarray:
    """Pairwise Spearman correlation of the labs' yields over the combinations both ran."""
    from scipy.stats import spearmanr

    Y = np.stack([data.yields(i) for i in range(len(data.labs))])
    n = len(data.labs)
    C = np.eye(n)
    for i, j in itertools.combinations(range(n), 2):
        ok = ~np.isnan(Y[i]) & ~np.isnan(Y[j])
        C[i, j] = C[j, i] = float(spearmanr(Y[i, ok], Y[j, ok]).statistic)
    return C


def _max_min_subset(C: np.ndarray, pool: Sequence[int], k: int) -> tuple[int, ...]:
    best, arg = -np.inf, tuple(pool[:k])
    for sub in itertools.combinations(pool, k):
        m = min(C[i, j] for i, j in itertools.combinations(sub, 2))
        if m > best + 1e-12:
            best, arg = m, sub
    return arg


def scenarios(data: ReactionData, harmful_kind: str = "chloro") -> dict[str, tuple[str, ...]]:
    """Scenario name -> labs (see the module docstring)."""
    C = spearman_matrix(data)
    n = len(data.labs)
    a = _max_min_subset(C, list(range(n)), min(5, n))
    out = {"a": tuple(data.labs[i] for i in a)}
    core = _max_min_subset(C, list(a), min(3, len(a)))
    others = [i for i in range(n) if i not in core and harmful_kind in data.labs[i]] or \
        [i for i in range(n) if i not in core]
    weak = sorted(others, key=lambda i: float(np.mean(C[i, list(core)])))[:2]
    out["b"] = tuple(data.labs[i] for i in (*core, *weak))
    out["c"] = data.labs
    related = _max_min_subset(C, list(a), min(4, len(a) - 1))
    out["d"] = (*(data.labs[i] for i in related), *(data.labs[i] + REVERSED for i in a if i not in related))
    return out


def describe(data: ReactionData, labs: Sequence[str]) -> str:
    """Minimum and mean pairwise Spearman correlation of ``labs``."""
    C = spearman_matrix(data.subset(labs))
    pairs = [C[i, j] for i, j in itertools.combinations(range(len(labs)), 2)]
    return f"min Spearman {min(pairs):.2f}, mean {np.mean(pairs):.2f}"
