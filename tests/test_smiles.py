"""Reagents described by their structure: SMILES -> RDKit descriptors (labfbo.space.chem)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("rdkit")

import labfbo  # noqa: E402
from labfbo import Categorical, Optimizer, Real, SearchSpace  # noqa: E402
from labfbo.core.exceptions import ConfigurationError, SearchSpaceError  # noqa: E402
from labfbo.space.chem import RDKIT_DESCRIPTORS, _cached, raw_descriptors, reduce  # noqa: E402

FAST = {"num_restarts": 2, "raw_samples": 32}
LIGANDS = {  # a few phosphines and amines, plus a choice without structure
    "XPhos": "CC(C)C1=CC(C(C)C)=CC(C(C)C)=C1C2=C(P(C3CCCCC3)C4CCCCC4)C=CC=C2",
    "t-BuXPhos": "CC(C)C1=CC(C(C)C)=CC(C(C)C)=C1C2=C(P(C(C)(C)C)C(C)(C)C)C=CC=C2",
    "PPh3": "c1ccc(P(c2ccccc2)c2ccccc2)cc1",
    "PCy3": "C1CCC(P(C2CCCCC2)C2CCCCC2)CC1",
    "DMAP": "CN(C)c1ccncc1",
    "none": None,
}
SOLVENTS = {"water": "O", "ethanol": "CCO", "toluene": "Cc1ccccc1", "DMSO": "CS(C)=O", "THF": "C1CCOC1"}


def space() -> SearchSpace:
    return SearchSpace([Real("T", 20.0, 100.0), Categorical.from_smiles("ligand", LIGANDS),
                        Categorical("solvent", SOLVENTS, encoding="morgan", n_components=3)])


def yield_of(p: dict) -> float:
    return float(p["T"] / 100 + {"XPhos": 1.0, "t-BuXPhos": 0.9, "none": -0.5}.get(p["ligand"], 0.2)
                 + (0.3 if p["solvent"] == "toluene" else 0.0))


def test_descriptors_are_computed_reduced_and_scaled() -> None:
    lig = Categorical.from_smiles("ligand", LIGANDS)
    assert lig.choices == tuple(LIGANDS) and lig.smiles == tuple(LIGANDS.values()) and lig.encoding == "rdkit"
    D = np.array(lig.descriptors)
    assert D.shape == (6, 4 + 1)                       # 5 molecules: 4 components (n - 1) + the indicator
    np.testing.assert_array_equal(D[:, -1], [0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(D[-1, :-1], 0.0)     # "none": the column means (PCA scores are centred)
    np.testing.assert_allclose(D[:-1, :-1].mean(0), 0.0, atol=1e-5)
    assert (D[:-1, :-1].std(0) > 0.01).all() and np.all(np.diff(D[:-1, :-1].var(0)) <= 1e-9)  # PCs by variance
    S = lig.scaled_descriptors()
    assert S.min() == 0.0 and S.max() == 1.0 and np.allclose(S.min(0), 0) and np.allclose(S.max(0), 1)
    # in the components, XPhos is nearest to t-BuXPhos (the same biaryl phosphine but for the P substituents)
    # and farthest from DMAP (a small amine)
    dist = np.linalg.norm(D[0, :-1] - D[:-1, :-1], axis=1)
    assert np.argsort(dist)[1] == 1 and np.argmax(dist) == 4
    # a cube point of each choice maps to its row of scaled descriptors in the models' features
    from labfbo.models.encoding import FeatureMap

    sp = SearchSpace([lig])
    feats = FeatureMap(sp).numpy(sp.encode([{"ligand": c} for c in LIGANDS]))
    np.testing.assert_allclose(feats, S)


def test_descriptors_are_deterministic_and_cached() -> None:
    a = Categorical.from_smiles("ligand", LIGANDS)
    _cached.cache_clear()
    b = Categorical.from_smiles("ligand", LIGANDS)
    assert a == b and a.descriptors == b.descriptors
    Categorical.from_smiles("ligand", LIGANDS)
    assert _cached.cache_info().hits >= 1
    # the same molecules in another order: the same rows, permuted (the signs are fixed by the data, not the order)
    rev = Categorical.from_smiles("ligand", dict(reversed(list(LIGANDS.items()))))
    assert rev.descriptors == tuple(reversed(a.descriptors))
    # the constructor's dict form is the same parameter as from_smiles
    assert Categorical("ligand", LIGANDS) == a
    assert Categorical("ligand", LIGANDS, encoding="rdkit", n_components=2).descriptors != a.descriptors


def test_reduction_drops_constant_and_duplicate_columns_then_pca() -> None:
    X = np.array([[1.0, 2.0, 5.0, 10.0, 0.3], [2.0, 4.0, 5.0, 1.0, 0.1], [3.0, 6.0, 5.0, 4.0, 0.9],
                  [4.0, 8.0, 5.0, 7.0, 0.2]])
    # column 1 = 2 * column 0 (duplicate), column 2 constant: 3 informative columns -> 3 components (n - 1 = 3)
    S = reduce(X, 5)
    assert S.shape == (4, 3)
    np.testing.assert_allclose(reduce(X[:, [0, 3, 4]], 5), S, atol=1e-12)
    assert reduce(X, 2).shape == (4, 2)
    # deterministic signs: each component's largest-magnitude score is positive
    assert all(S[np.argmax(np.abs(S[:, j])), j] > 0 for j in range(S.shape[1]))
    raw = raw_descriptors("solvent", list(SOLVENTS), list(SOLVENTS.values()), "rdkit")
    assert raw.shape == (5, len(RDKIT_DESCRIPTORS))
    assert raw[0, RDKIT_DESCRIPTORS.index("MolWt")] == pytest.approx(18.015, abs=1e-3)


def test_the_space_round_trips_through_json_and_keeps_its_smiles() -> None:
    sp = space()
    again = SearchSpace.from_json(sp.to_json())
    assert again == sp and again.fingerprint() == sp.fingerprint()
    dumped = json.loads(sp.to_json())["params"][1]
    assert dumped["smiles"][0] == LIGANDS["XPhos"] and dumped["smiles"][-1] is None and dumped["encoding"] == "rdkit"
    # spaces without SMILES keep their identity (the new fields are left out when unset)
    plain = SearchSpace([Categorical("c", ["a", "b"], descriptors={"a": [1.0], "b": [2.0]})])
    assert "smiles" not in json.dumps(plain.model_dump(mode="json", exclude_none=True))
    # the same choices by hand-made descriptors, or other SMILES: another space, and the difference is named
    other = SearchSpace([Real("T", 20.0, 100.0), Categorical.from_smiles("ligand", {**LIGANDS, "DMAP": "c1ccncc1"}),
                         sp.params[2]])
    assert other.fingerprint() != sp.fingerprint() and "ligand" in sp.difference(other)


def test_a_journal_replays_without_rdkit_and_proposes_the_same(tmp_path, monkeypatch) -> None:
    path = tmp_path / "site.jsonl"
    opt = Optimizer(space(), objective="maximize", n_init=3, seed=5, storage=str(path), **FAST)
    twin = Optimizer(space(), objective="maximize", n_init=3, seed=5, **FAST)
    for _ in range(5):
        t, u = opt.ask(), twin.ask()
        assert t.params == u.params
        opt.tell(t, yield_of(t.params))
        twin.tell(u, yield_of(u.params))
    opt.close()
    expected = twin.ask(n=2)
    head = json.loads(path.read_text().splitlines()[0])
    assert head["space"]["params"][1]["descriptors"] == [list(r) for r in space().params[1].descriptors]

    monkeypatch.setitem(sys.modules, "rdkit", None)  # `import rdkit` now fails: RDKit "not installed"
    _cached.cache_clear()
    with pytest.raises(ConfigurationError, match=r"pip install 'labfbo\[chem\]'"):
        space()
    resumed = Optimizer.load(str(path), **FAST)       # the space from the journal: its descriptor values
    assert resumed.space.params[1].smiles == tuple(LIGANDS.values())
    again = resumed.ask(n=2)
    assert [t.params for t in again] == [t.params for t in expected]
    resumed.close()


def test_bad_smiles_unknown_encoding_and_misuse_are_named() -> None:
    with pytest.raises(SearchSpaceError, match=r"'ligand'.*'XPhos'.*'C1CC\(P'"):
        Categorical.from_smiles("ligand", {"XPhos": "C1CC(P", "PPh3": LIGANDS["PPh3"]})
    with pytest.raises(SearchSpaceError, match=r"unknown SMILES encoding 'maccs'.*'rdkit'.*'morgan'"):
        Categorical.from_smiles("ligand", LIGANDS, encoding="maccs")
    with pytest.raises(SearchSpaceError, match="'a' and 'b' have the same"):
        Categorical.from_smiles("x", {"a": "CCO", "b": "OCC", "c": "C"})  # one molecule written twice
    with pytest.raises(SearchSpaceError, match=r"\['none', 'no additive'\] all lack a structure"):
        Categorical.from_smiles("x", {"a": "CCO", "none": None, "no additive": ""})
    with pytest.raises(SearchSpaceError, match="no choice has a SMILES"):
        Categorical.from_smiles("x", {"none": None, "blank": " "})
    with pytest.raises(SearchSpaceError, match="encoding= and n_components= describe choices by structure"):
        Categorical("x", ["a", "b"], encoding="rdkit")
    with pytest.raises(SearchSpaceError, match="n_components must be an integer >= 1"):
        Categorical.from_smiles("x", {"a": "CCO", "b": "C"}, n_components=0)
    # a space written by hand (JSON, YAML) with SMILES and no descriptors: they are computed
    by_hand = Categorical.model_validate({"name": "x", "choices": ["a", "b", "c"], "smiles": ["C", "CC", None],
                                          "encoding": "morgan"})
    assert by_hand == Categorical.from_smiles("x", {"a": "C", "b": "CC", "c": None}, encoding="morgan")
    with pytest.raises(ValueError, match="encoding= and n_components= describe choices by structure"):
        Categorical.model_validate({"name": "x", "choices": ["a", "b"], "encoding": "rdkit"})
    # the list form is untouched; a choices dict is SMILES now, not silently its keys
    assert Categorical("x", ["a", "b"]).descriptors is None


def test_a_choice_without_structure_is_the_mean_reagent_plus_an_indicator() -> None:
    with_none = Categorical.from_smiles("additive", {"water": "O", "ethanol": "CCO", "none": "", "DMSO": "CS(C)=O"})
    without = Categorical.from_smiles("additive", {"water": "O", "ethanol": "CCO", "DMSO": "CS(C)=O"})
    assert with_none.smiles[2] is None                 # "" is stored as "no structure"
    D, E = np.array(with_none.descriptors), np.array(without.descriptors)
    assert D.shape[1] == E.shape[1] + 1                # the indicator column exists only when needed
    np.testing.assert_array_equal(D[[0, 1, 3], :-1], E)  # the reagents' own rows do not move
    np.testing.assert_array_equal(D[2], [0.0] * E.shape[1] + [1.0])


@pytest.mark.parametrize("protocol", ["independent", "surface"])
def test_optimizers_run_on_a_smiles_space(protocol: str) -> None:
    sp = space()
    coord = None if protocol == "independent" else labfbo.Coordinator(
        "surface", sites=["a", "b"], seed=0, space=sp, horizon=3, fourier_features=4, **FAST)
    sites = ["a", "b"] if coord else ["a"]
    opts = [Optimizer(sp, objective="maximize", protocol=protocol, coordinator=coord, site=s, seed=1, n_init=3,
                      **({"fourier_features": 4} if coord else {}), **FAST) for s in sites]
    seen = set()
    for _ in range(5):
        trials = [o.ask() for o in opts]
        for o, t in zip(opts, trials):
            sp.validate_params(t.params)
            seen.add(t.params["ligand"])
            o.tell(t, yield_of(t.params))
    assert all(len(o.trials) == 5 for o in opts) and len(seen) >= 2
    for o in opts:
        o.close()


def test_the_reaction_data_with_smiles_descriptors() -> None:
    from labfbo.datasets import load_reactions
    from labfbo_bench import reactions as rx

    plain, rd = load_reactions(), load_reactions(encoding="rdkit")
    assert [p.choices for p in rd.space.params] == [p.choices for p in plain.space.params]
    assert rd.tables == plain.tables and rd.labs == plain.labs
    widths = {p.name: len(p.descriptors[0]) for p in rd.space.params}
    assert widths == {"base": 2, "ligand": 3, "additive": 5}  # at most n - 1 components, at most 5
    ligand = rd.space.params[1]
    assert ligand.smiles[ligand.choices.index("XPhos")].startswith("CC(C)C1=CC(C(C)C)")
    assert rx.method_options("surface-smiles") == ("surface", {"encoding": "rdkit", "descriptors": "use"})
    assert rx.ReactionJob("p", "a", ("x", "y"), "surface-smiles", 0).fingerprint() != \
        rx.ReactionJob("p", "a", ("x", "y"), "surface", 0).fingerprint()


def test_the_example_of_docs_chemistry_runs() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "chemistry.md").read_text()
    scope: dict = {}
    exec(re.search(r"```python\n(.*?)```", text, re.S).group(1), scope)
    assert scope["ligand"].descriptors[-1][-1] == 1.0 and scope["opt"].ask().params["ligand"] in LIGANDS
