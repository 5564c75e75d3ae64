"""Labs with different stock in one study: each lab's ``allowed=`` stays with it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import labfbo
from labfbo import Categorical, Real, SearchSpace
from labfbo.core.messages import JoinRequest
from labfbo.protocols.surface.model import SurfaceFeatures
from labfbo.protocols.vote.protocol import codebook
from labfbo.space.design import collaborative_design

FAST = {"num_restarts": 2, "raw_samples": 32}
LIGANDS = ["L1", "L2", "L3", "L4"]
PARAMS = [Categorical("ligand", LIGANDS), Categorical("base", ["B1", "B2", "B3"]),
          Categorical("additive", ["A1", "A2", "A3", "A4", "A5"])]


def lab_space(lacks: str | None) -> SearchSpace:
    """The reagent space of a lab that lacks one ligand (None: stocks everything, no table)."""
    if lacks is None:
        return SearchSpace(PARAMS)
    return SearchSpace(PARAMS, allowed=[{"ligand": ligand, "base": b, "additive": a} for ligand in LIGANDS
                                        if ligand != lacks for b in ("B1", "B2", "B3")
                                        for a in ("A1", "A2", "A3", "A4", "A5")])


def yield_of(i: int, p: dict) -> float:
    return float(LIGANDS.index(p["ligand"]) * 10 + int(p["base"][1]) * 3 - abs(int(p["additive"][1]) - 3) + i)


def _campaign(protocol: str, spaces: list[SearchSpace], rounds: int, **options) -> list[labfbo.Optimizer]:
    names = [f"lab{i}" for i in range(len(spaces))]
    coord = labfbo.Coordinator(protocol, sites=names, space=spaces[0], seed=3, horizon=rounds, **options)
    opts = [labfbo.Optimizer(s, objective="maximize", protocol=protocol, coordinator=coord, site=n, seed=3,
                             n_init=3, horizon=rounds, **options) for n, s in zip(names, spaces)]
    for _t in range(3 + rounds):
        trials = [o.ask() for o in opts]
        for i, (o, s, tr) in enumerate(zip(opts, spaces, trials)):
            assert s.is_allowed(tr.params), f"{names[i]} was proposed {tr.params}, which it does not stock"
            o.tell(tr, yield_of(i, tr.params))
    assert coord.space.allowed is None  # given the first lab's space, the study keeps no stock
    return opts


@pytest.mark.integration  # a multi-site campaign per protocol
@pytest.mark.parametrize("protocol, options", [("surface", {}), ("distribution", {"M": 32, "candidates": 64}),
                                               ("vote", {}), ("gradient", {})])
def test_labs_with_different_stock_join_one_study_and_are_never_proposed_what_they_lack(protocol, options) -> None:
    spaces = [lab_space(ligand) for ligand in ("L1", "L2", "L3")]
    opts = _campaign(protocol, spaces, rounds=3, **FAST, **options)
    for o, s in zip(opts, spaces):
        sent = [m.model_dump(mode="json") for m in o.sent_messages()]
        assert sent[0]["kind"] == "join" and sent[0]["space"]["params"]
        assert not list(_stock_fields(sent)), list(_stock_fields(sent))  # the stock never left the lab
        assert not any(r in json.dumps(sent) for r in ('"L1", "B1"', '["L2", "B1", "A1"]'))
        assert all(s.is_allowed(t.params) for t in o.trials)
        o.close()


def _stock_fields(tree):
    """Every ``allowed`` / ``allowed_names`` field with a value, anywhere in a JSON tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k in ("allowed", "allowed_names") and v is not None:
                yield k, v
            yield from _stock_fields(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _stock_fields(v)


def test_the_join_carries_the_study_part_and_every_lab_shares_the_public_seeds() -> None:
    a, b = lab_space("L1"), lab_space("L4")
    assert a.fingerprint() != b.fingerprint() and a.shared().fingerprint() == b.shared().fingerprint()
    assert SearchSpace(PARAMS).shared().fingerprint() == SearchSpace(PARAMS).fingerprint()  # no stock: as before
    assert np.array_equal(codebook(a, 8), codebook(b, 8))  # vote's public points do not depend on the stock
    fa, fb = SurfaceFeatures(a, fourier=8), SurfaceFeatures(b, fourier=8)
    assert np.array_equal(fa.onehot, fb.onehot)
    cont = [Real("T", 20.0, 80.0), Categorical("ligand", LIGANDS)]
    ca = SurfaceFeatures(SearchSpace(cont, allowed=[{"ligand": "L1"}]), fourier=8)
    cb = SurfaceFeatures(SearchSpace(cont, allowed=[{"ligand": "L2"}, {"ligand": "L3"}]), fourier=8)
    assert np.array_equal(ca.omega.numpy(), cb.omega.numpy())  # the same Fourier basis for both labs


def test_an_older_site_whose_join_carries_its_stock_is_admitted_and_the_stock_is_dropped() -> None:
    coord = labfbo.Coordinator("surface", sites=["a", "b"], seed=0, horizon=3)
    full = lab_space("L2")
    reply = coord.join(JoinRequest(site="a", protocol="surface", study="", space_hash=full.fingerprint(),
                                   space=full.model_dump(mode="json"), n_init=3))
    assert reply.site_index == 0 and coord.space.allowed is None
    assert coord.space.fingerprint() == full.shared().fingerprint()


def test_with_every_lab_stocking_the_same_its_design_cells_are_those_dealt_before_stock_was_local() -> None:
    stock = lab_space("L3")
    coord = labfbo.Coordinator("surface", sites=["a", "b"], space=stock, seed=5, horizon=3)
    opts = [labfbo.Optimizer(stock, objective="maximize", protocol="surface", coordinator=coord, site=n, seed=5,
                             n_init=3, horizon=3) for n in ("a", "b")]
    before = collaborative_design(stock, 2, 3, 5)  # what a coordinator holding the stock dealt
    for i, o in enumerate(opts):
        rows = o._design_rows()
        assert np.array_equal(rows, before[i])
        assert all(stock.is_allowed(p) for p in stock.decode(rows))
        o.close()


def test_a_lab_listing_only_some_choices_is_told_how_to_give_its_stock_and_one_with_none_in_common_is_told_so() -> None:
    coord = labfbo.Coordinator("surface", sites=["a", "b"], space=SearchSpace(PARAMS), seed=0, horizon=3)
    some = SearchSpace([Categorical("ligand", ["L1", "L2"]), *PARAMS[1:]])
    with pytest.raises(labfbo.FederationError, match=r"parameter 'ligand': choices only in the study's space: "
                       r"\['L3', 'L4'\].* gives its stock with allowed="):
        labfbo.Optimizer(some, protocol="surface", coordinator=coord, site="a", seed=0)
    other = SearchSpace([Categorical("ligand", ["X1", "X2"]), *PARAMS[1:]])
    with pytest.raises(labfbo.FederationError, match=r"parameter 'ligand': the study's space and this lab's space "
                       r"have no choice in common"):
        labfbo.Optimizer(other, protocol="surface", coordinator=coord, site="a", seed=0)
    assert coord.members == {}  # refused joins change nothing
