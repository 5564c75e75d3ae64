r"""The three shipped reaction families, one loader: labs are substrates, the other factors the space.

=====================  ===========================================  ====================  =======
family                 space (every factor a ``Categorical``)        labs (substrates)     budget
=====================  ===========================================  ====================  =======
``buchwald_hartwig``   3 bases × 4 ligands × 23 additives (276)      15 aryl halides       3 + 20
``borylation``         23 ligands × 2 solvents (46)                  33 electrophiles      3 + 15
``deoxyfluorination``  4 bases × 5 sulfonyl fluorides (20)           37 alcohols           3 + 8
=====================  ===========================================  ====================  =======

Yields are in percent for all three (the borylation and deoxyfluorination files hold fractions;
a few deoxyfluorination values above 100 are measurement error and are kept). The budget is the
number of experiments after 3 first ones that ``labfbo bench engine --family`` and
``labfbo bench reactions --family`` give each lab. Every reagent keeps its SMILES, so
``load_family(name, encoding="rdkit")`` describes the choices by their structure
(:mod:`labfbo.space.chem`). Provenance, licences and how to cite: ``data/README.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from labfbo.core.exceptions import ConfigurationError
from labfbo.datasets.reactions import CITATION, SHIPPED_SMILES, ReactionData, load_reactions, shipped_path


@dataclass(frozen=True)
class Family:
    """One shipped multi-substrate screen: its file, columns and the budget a lab gets."""

    name: str
    file: str
    lab: str
    params: tuple[str, ...]
    target: str
    scale: float        # to percent
    budget: int         # experiments after the 3 first ones
    smiles: str  # where the structures are: a shipped SMILES table, or "values" (the choices are SMILES)
    citation: str
    licence: str


CURRYBO = "distributed with the CurryBO benchmarks (Schmid et al., arXiv 2502.18966), MIT licence"
FAMILIES: dict[str, Family] = {
    "buchwald_hartwig": Family("buchwald_hartwig", "buchwald_hartwig.csv", "lab", ("base", "ligand", "additive"),
                               "yield", 1.0, 20, SHIPPED_SMILES, CITATION,
                               "from BayBE's benchmark copy (emdgroup/baybe, Apache-2.0 repository)"),
    "borylation": Family("borylation", "borylation.csv", "Electrophile", ("ligand", "solvent"), "yield", 100.0, 15,
                         "values", "Schmid et al., 'Bayesian optimization over curried function spaces', "
                         "arXiv 2502.18966 (the borylation screen of its benchmarks)", CURRYBO),
    "deoxyfluorination": Family("deoxyfluorination", "deoxyfluorination.csv", "substrate", ("base", "fluoride"),
                                "yield", 100.0, 8, "values",
                                "Nielsen, Ahneman, Riera, Doyle, 'Deoxyfluorination with sulfonyl fluorides: "
                                "navigating reaction space with machine learning', J. Am. Chem. Soc. 140, 5004 (2018)",
                                CURRYBO),
}
"""name -> :class:`Family`, in the order the benchmarks report them."""


def load_family(name: str, encoding: str | None = None, n_components: int = 5) -> ReactionData:
    """The shipped family ``name`` (:data:`FAMILIES`) as :class:`ReactionData`, yields in percent;
    ``encoding`` (``"rdkit"``, ``"morgan"``) describes every reagent by its structure."""
    fam = FAMILIES.get(name)
    if fam is None:
        raise ConfigurationError(f"unknown reaction family {name!r}; shipped: {', '.join(FAMILIES)}")
    smiles = fam.smiles if fam.smiles == "values" else shipped_path(fam.smiles)
    data = load_reactions(shipped_path(fam.file), lab=fam.lab, params=fam.params, target=fam.target,
                          encoding=encoding, n_components=n_components, smiles=smiles, scale=fam.scale)
    return ReactionData(data.space, data.labs, data.tables, f"shipped {fam.file} ({fam.citation})")
