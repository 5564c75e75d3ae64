"""Data sets shipped with labfbo: the Buchwald–Hartwig yields of Ahneman et al. (2018) and their loader.

``load_reactions()`` reads the shipped ``data/buchwald_hartwig.csv`` (or any CSV of the same
shape) into a :class:`ReactionData`; ``data/README.md`` says where the data come from and how
to cite them. ``make demo`` (:mod:`labfbo.demo`) and the reaction benchmarks use them.
"""

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

__all__ = ["CITATION", "SHIPPED", "SHIPPED_SMILES", "ReactionData", "describe", "initial_design", "load_reactions",
           "scenarios", "shipped_path", "spearman_matrix"]
