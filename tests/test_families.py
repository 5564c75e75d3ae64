"""The three shipped reaction families: one loader, yields in percent, structures kept."""

from __future__ import annotations

import numpy as np
import pytest

from labfbo.core.exceptions import ConfigurationError
from labfbo.datasets import FAMILIES, load_family, shipped_path

SHAPES = {"buchwald_hartwig": (15, (3, 4, 23), 20), "borylation": (33, (23, 2), 15),
          "deoxyfluorination": (37, (4, 5), 8)}


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_family_loads_with_its_labs_space_and_budget(name):
    labs, sizes, budget = SHAPES[name]
    data = load_family(name)
    assert len(data.labs) == labs and tuple(len(p.choices) for p in data.space.params) == sizes
    assert FAMILIES[name].budget == budget
    values = np.array([v for t in data.tables for v in t.values()])
    assert values.max() >= 100.0 - 1e-9 and values.min() >= 0.0  # percent, not fractions
    full = int(np.prod(sizes))
    assert all(len(t) >= full - 5 for t in data.tables)  # a lab ran (nearly) the whole space
    assert data.source.startswith(f"shipped {FAMILIES[name].file}")


def test_the_deoxyfluorination_values_above_100_are_kept():
    data = load_family("deoxyfluorination")
    assert max(data.best(i) for i in range(len(data.labs))) == pytest.approx(106.0)


@pytest.mark.parametrize("name", ["borylation", "deoxyfluorination", "buchwald_hartwig"])
def test_reagents_keep_their_structures(name):
    pytest.importorskip("rdkit")
    data = load_family(name, encoding="rdkit")
    plain = load_family(name)
    for p, q in zip(data.space.params, plain.space.params):
        assert p.choices == q.choices and p.descriptors is not None and len(p.descriptors) == len(p.choices)
    assert data.tables == plain.tables


def test_an_unknown_family_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="unknown reaction family 'suzuki'.*borylation"):
        load_family("suzuki")


def test_the_readme_gives_provenance_and_licence_of_every_family():
    text = shipped_path("README.md").read_text()
    for fam in FAMILIES.values():
        assert fam.file in text
    assert "MIT" in text and "2502.18966" in text and "Nielsen" in text
