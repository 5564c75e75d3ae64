"""Data sets shipped with labfbo: three multi-substrate reaction screens and their loaders.

``load_family(name)`` reads one of the shipped families (:data:`FAMILIES`: Buchwald–Hartwig,
borylation, deoxyfluorination; labs are substrates, yields in percent) into a
:class:`ReactionData`; ``load_reactions()`` reads any CSV of a lab column, parameter columns and a
yield column (the shipped Buchwald–Hartwig file by default). ``data/README.md`` says where the data
come from, under which licence, and how to cite them. ``make demo`` (:mod:`labfbo.apps.demo.screen`) and the
reaction benchmarks use them.
"""

from labfbo.datasets.families import FAMILIES, Family, load_family
from labfbo.datasets.reactions import (
    CITATION,
    SHIPPED,
    SHIPPED_SMILES,
    ReactionData,
    describe,
    initial_design,
    load_reactions,
    scenarios,
    shipped_path,
    spearman_matrix,
)

__all__ = [
    "FAMILIES",
    "Family",
    "load_family",
    "CITATION",
    "SHIPPED",
    "SHIPPED_SMILES",
    "ReactionData",
    "describe",
    "initial_design",
    "load_reactions",
    "scenarios",
    "shipped_path",
    "spearman_matrix",
]
