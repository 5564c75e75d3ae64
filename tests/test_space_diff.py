"""How a lab's space differs from the study's: every difference named, each side labelled."""

from __future__ import annotations

import pytest

import labfbo
from labfbo import Categorical, Coordinator, Discrete, Integer, Optimizer, Real, SearchSpace
from labfbo.space.constraints import LinearConstraint, NonlinearConstraint
from labfbo.space.diff import MAX_LISTED, space_differences, study_difference

LIGANDS = ["XPhos", "SPhos", "tBuXPhos", "BrettPhos"]


def _study(**kw) -> SearchSpace:
    return SearchSpace([Categorical("ligand", LIGANDS), Discrete("conc", [0.05, 0.1, 0.2]),
                        Real("T", 40.0, 100.0, unit="degC"), Integer("eq", 1, 3)], **kw)


def test_each_kind_of_difference_is_named_with_both_sides() -> None:
    lab = SearchSpace([Categorical("ligand", ["XPhos", "SPhos", "tBuXPhos", "RuPhos"]),
                       Discrete("conc", [0.05, 0.1, 0.3]), Real("T", 40.0, 120.0, unit="degC"), Real("eq", 1, 3),
                       Real("time", 1.0, 24.0)])
    said = space_differences(_study(), lab, "the study's space", "this lab's space")
    assert said == [
        "parameter(s) only in this lab's space: 'time' (real [1.0, 24.0])",
        "parameter 'ligand': choices only in the study's space: ['BrettPhos'] and only in this lab's space: "
        "['RuPhos'] (the study's space has ['XPhos', 'SPhos', 'tBuXPhos', 'BrettPhos'], this lab's space "
        "['XPhos', 'SPhos', 'tBuXPhos', 'RuPhos'])",
        "parameter 'conc': values only in the study's space: [0.2] and only in this lab's space: [0.3] "
        "(the study's space has [0.05, 0.1, 0.2], this lab's space [0.05, 0.1, 0.3])",
        "parameter 'T': bounds: the study's space has [40.0, 100.0], this lab's space [40.0, 120.0]",
        "parameter 'eq': the study's space has it integer [1, 3], this lab's space real [1.0, 3.0]",
    ]


def test_a_missing_parameter_an_order_a_scale_a_unit_and_a_step() -> None:
    study = SearchSpace([Real("a", 0, 1), Real("b", 1, 10, log=True), Real("c", 0, 1, step=0.1)])
    lab = SearchSpace([Real("b", 1, 10, unit="mg"), Real("a", 0, 1), Real("c", 0, 1, step=0.5)])
    said = study_difference(study, lab)
    assert "parameter 'b': log scale: the study's space has True, this lab's space False" in said
    assert "parameter 'b': unit: the study's space has None, this lab's space 'mg'" in said
    assert "parameter 'c': step: the study's space has 0.1, this lab's space 0.5" in said
    assert "in another order" in said
    assert "the study's space has ['a', 'b', 'c'], this lab's space ['b', 'a', 'c']" in said
    fewer = study_difference(study, SearchSpace([Real("a", 0, 1)]))
    assert fewer.startswith("parameter(s) only in the study's space: 'b' (real [1.0, 10.0], log scale), "
                            "'c' (real [0.0, 1.0], step 0.1)")


def test_the_same_choices_in_another_order_are_a_difference_and_long_lists_are_cut() -> None:
    a = SearchSpace([Categorical("s", ["x", "y"])])
    b = SearchSpace([Categorical("s", ["y", "x"])])
    assert "the same choices in another order" in study_difference(a, b)
    many = [f"c{i}" for i in range(30)]
    said = study_difference(SearchSpace([Categorical("s", many)]), SearchSpace([Categorical("s", many[:2])]))
    assert f"and {28 - MAX_LISTED} more]" in said and "c29" not in said.split("(")[0]


def test_identical_spaces_and_a_labs_own_nonlinear_constraints_are_no_difference() -> None:
    assert study_difference(_study(), _study()) == "" and _study().difference(_study()) == ""
    own = SearchSpace(_study().params, constraints=[NonlinearConstraint("cheap", lambda p: 1.0)])
    assert study_difference(_study(), own) == ""


def test_shared_constraints_and_allowed_combinations_are_part_of_the_study() -> None:
    lc = LinearConstraint({"T": 1.0}, "<=", 90.0)
    said = study_difference(_study(constraints=[lc]), _study())
    assert said.startswith("shared constraints differ (LinearConstraint, Forbidden): only in the study's space: [")
    stock = [{"ligand": "XPhos"}, {"ligand": "SPhos"}]
    said = study_difference(_study(allowed=stock), _study(allowed=stock[:1]))
    assert said.startswith("allowed combinations (over ['ligand']) differ: 1 only in the study's space (e.g. "
                           "[('SPhos',)]), 0 only in this lab's space")
    assert "this lab's space over none" in study_difference(_study(allowed=stock), _study())


def test_difference_keeps_its_generic_wording_for_other_callers() -> None:
    assert _study().difference(SearchSpace([Real("T", 40.0, 100.0)])).startswith(
        "parameter(s) only in this space: 'ligand'")


# ------------------------------------------------------------------ the coordinator's refusal
def test_a_join_refusal_names_the_parameter_and_each_side(fast) -> None:
    coord = Coordinator("independent", sites=["a", "b"], space=_study(), **fast)
    lab = SearchSpace([Categorical("ligand", LIGANDS[:3]), *_study().params[1:]])
    with pytest.raises(labfbo.FederationError) as err:
        Optimizer(lab, coordinator=coord, site="b", n_init=2, **fast)
    text = str(err.value)
    assert text.startswith("site 'b' has a different search space than the study: parameter 'ligand': choices only "
                           "in the study's space: ['BrettPhos'] (the study's space has ")
    assert "the study's space is pinned in its configuration" in text and coord.members == {}


def test_an_unpinned_study_says_which_site_set_its_space_and_a_refused_site_sets_nothing(fast) -> None:
    coord = Coordinator("independent", sites=["a", "b", "c"], **fast)
    wrong = SearchSpace([Real("T", 0.0, 1.0)])
    with pytest.raises(labfbo.FederationError, match="unknown site"):  # refused: it must not set the space
        Optimizer(wrong, coordinator=coord, site="zz", n_init=2, **fast)
    assert coord.space is None and coord.members == {}
    Optimizer(_study(), coordinator=coord, site="a", n_init=2, **fast)
    with pytest.raises(labfbo.FederationError, match="the study's space was set by 'a', the first site to join, "
                                                     "because the study pins none: pin the agreed space"):
        Optimizer(wrong, coordinator=coord, site="b", n_init=2, **fast)
    assert coord.site_names == ["a"]
