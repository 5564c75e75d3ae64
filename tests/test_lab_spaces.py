"""Parameters a lab actually has: Discrete, stepped Real, descriptors, allowed combinations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import labfbo
from labfbo import Categorical, Discrete, Integer, Real, SearchSpace
from labfbo.models.encoding import FeatureMap

FAST = {"num_restarts": 2, "raw_samples": 32}


def test_stepped_real_proposes_only_grid_values() -> None:
    space = SearchSpace([Real("dial", 20.0, 80.0, step=0.5), Real("t", 0.0, 1.0)])
    opt = labfbo.Optimizer(space, objective="maximize", seed=0, n_init=4, **FAST)
    for _ in range(7):
        tr = opt.ask()
        v = tr.params["dial"]
        assert 20.0 <= v <= 80.0 and abs((v - 20.0) / 0.5 - round((v - 20.0) / 0.5)) < 1e-12
        assert repr(v) == repr(round(v, 1))  # 73.5, never 73.50000000000001
        opt.tell(tr, -(v - 61.3) ** 2 - tr.params["t"])
    assert space.decode([[0.1, 0.5]])[0]["dial"] == 26.0


@pytest.mark.parametrize("bad, match", [
    (lambda: Real("x", 1.0, 10.0, log=True, step=0.5), "step= and log=True"),
    (lambda: Real("x", 0.0, 1.0, step=0.3), "not a multiple of step"),
    (lambda: Real("x", 0.0, 1.0, step=-1.0), "step must be > 0"),
    (lambda: Discrete("c", [0.1]), "at least two values"),
    (lambda: Discrete("c", [0.1, 0.1, 0.2]), "duplicate"),
    (lambda: Discrete("c", [0.1, "x"]), "must be numbers"),
    (lambda: Categorical("s", ["a", "b"], descriptors={"a": [1.0]}), "missing \\['b'\\]"),
    (lambda: Categorical("s", ["a", "b"], descriptors={"a": [1.0], "b": [1.0, 2.0]}), "same number"),
    (lambda: Categorical("s", ["a", "b"], descriptors={"a": [1.0], "b": [1.0]}), "identical descriptors"),
    (lambda: Categorical("s", ["a", "b"], descriptors={"a": [1.0], "b": [float("nan")]}), "finite"),
])
def test_bad_parameters_are_refused_by_name(bad, match) -> None:
    with pytest.raises(labfbo.SearchSpaceError, match=match):
        bad()


def test_discrete_keeps_real_spacing_and_refuses_other_values() -> None:
    conc = Discrete("conc", [0.153, 0.057, 0.1])
    assert conc.values == (0.057, 0.1, 0.153)
    assert conc.grid() == pytest.approx([0.0, 0.043 / 0.096, 1.0])
    space = SearchSpace([conc, Real("t", 0, 1)])
    with pytest.raises(labfbo.SearchSpaceError, match="not one of"):
        space.validate_params({"conc": 0.08, "t": 0.5})
    assert space.validate_params({"conc": 0.08, "t": 0.5}, strict=False)[1] == ["conc"]
    assert space.decode([[0.4, 0.5]])[0]["conc"] == 0.1


def test_spaces_round_trip_through_json_with_the_same_fingerprint() -> None:
    space = _reagents()
    again = SearchSpace.from_json(space.to_json())
    assert again == space and again.fingerprint() == space.fingerprint()
    plain = SearchSpace([Real("t", 150, 250), Categorical("s", ["a", "b"]), Integer("n", 1, 5)])
    assert plain.fingerprint() == "6eefcecb0b3a7d93"  # unchanged by the new optional fields: old journals reopen


def _reagents(allowed=None) -> SearchSpace:
    return SearchSpace([Categorical("base", ["K2CO3", "Cs2CO3", "DBU"], descriptors={"K2CO3": [10.3, 1.0],
                                                                                   "Cs2CO3": [10.3, 2.0],
                                                                                   "DBU": [12.0, 0.0]}),
                        Categorical("ligand", ["XPhos", "SPhos"]), Discrete("conc", [0.057, 0.1, 0.153]),
                        Real("T", 40.0, 100.0, step=5.0)], allowed=allowed)


STOCK = [{"base": "K2CO3", "ligand": "XPhos"}, {"base": "DBU", "ligand": "SPhos"}, {"base": "DBU", "ligand": "XPhos"}]


@pytest.mark.integration  # a multi-site campaign
def test_allowed_combinations_restrict_every_proposal_and_the_design() -> None:
    space = _reagents(allowed=STOCK)
    ok = {(r["base"], r["ligand"]) for r in STOCK}
    opt = labfbo.Optimizer(space, objective="maximize", seed=1, n_init=4, **FAST)
    for _ in range(10):
        tr = opt.ask()
        assert (tr.params["base"], tr.params["ligand"]) in ok and space.is_allowed(tr.params)
        opt.tell(tr, tr.params["T"] / 100 + (tr.params["base"] == "DBU") - tr.params["conc"])
    grid = space.feasible_grid(10_000)
    assert len(grid) == 3 * 3 * 13


def test_allowed_accepts_a_dataframe_and_is_order_insensitive() -> None:
    pd = pytest.importorskip("pandas")
    a = _reagents(allowed=pd.DataFrame(STOCK))
    b = _reagents(allowed=list(reversed([{"ligand": r["ligand"], "base": r["base"]} for r in STOCK])))
    assert a.fingerprint() == b.fingerprint()


def test_bad_allowed_tables_are_refused() -> None:
    with pytest.raises(labfbo.SearchSpaceError, match="any value in a range"):
        SearchSpace([Real("x", 0, 1), Categorical("c", ["a", "b"])], allowed=[{"x": 0.5, "c": "a"}])
    with pytest.raises(labfbo.SearchSpaceError, match="unknown category 'z'"):
        SearchSpace([Categorical("c", ["a", "b"])], allowed=[{"c": "z"}])
    with pytest.raises(labfbo.SearchSpaceError, match="unknown parameter"):
        SearchSpace([Categorical("c", ["a", "b"])], allowed=[{"d": "a"}])
    with pytest.raises(labfbo.SearchSpaceError, match="non-empty"):
        SearchSpace([Categorical("c", ["a", "b"])], allowed=[])


def test_feature_map_uses_scaled_descriptors_or_one_hot() -> None:
    space = _reagents()
    X = space.encode([{"base": "DBU", "ligand": "SPhos", "conc": 0.1, "T": 45.0}])
    codes = FeatureMap(space)(torch.as_tensor(X))
    assert codes.shape == (1, 2 + 1 + 1 + 1)  # base -> 2 descriptors, ligand stays a code
    assert codes[0, :2].tolist() == [1.0, 0.0]  # DBU: the largest pKa, the smallest second descriptor
    onehot = FeatureMap(space, one_hot=True)(torch.as_tensor(X))
    assert onehot.shape == (1, 2 + 2 + 1 + 1) and onehot[0, 2:4].tolist() == [0.0, 1.0]


def test_descriptors_let_the_gp_transfer_between_similar_choices() -> None:
    """Trained on K2CO3 and DBU, a GP that reads the descriptors (``descriptors="use"``; the default
    ignores them) predicts Cs2CO3 (the same pKa) closer to K2CO3 than to DBU."""
    from labfbo.models.gp import SurrogateOptions, fit_local_gp, predict

    space = SearchSpace([Categorical("base", ["K2CO3", "Cs2CO3", "DBU"],
                                     descriptors={"K2CO3": [10.3], "Cs2CO3": [10.4], "DBU": [20.0]}),
                         Real("T", 0.0, 1.0)])
    T = np.linspace(0, 1, 8)
    X = space.encode([{"base": "K2CO3", "T": t} for t in T] + [{"base": "DBU", "T": t} for t in T])
    y = np.concatenate([np.sin(3 * T) + 2.0, -np.sin(3 * T)])
    model = fit_local_gp(X, y, space=space, options=SurrogateOptions(descriptors="use"))
    q = space.encode([{"base": b, "T": 0.5} for b in ("K2CO3", "Cs2CO3", "DBU")])
    mean, _ = predict(model, q[:, None, :])
    assert abs(mean[1] - mean[0]) < abs(mean[1] - mean[2])


def test_failed_combinations_are_not_proposed_again_on_a_small_discrete_space() -> None:
    space = SearchSpace([Categorical("a", ["x", "y", "z"]), Categorical("b", ["u", "v"])])
    opt = labfbo.Optimizer(space, objective="maximize", seed=0, n_init=2)
    seen = []
    for _ in range(6):
        tr = opt.ask()
        key = (tr.params["a"], tr.params["b"])
        assert key not in seen
        seen.append(key)
        if key == ("z", "v"):
            opt.tell_failed(tr, "not in stock")
        else:
            opt.tell(tr, float(len(seen)))
    assert len(set(seen)) == 6


def test_a_mixed_space_with_many_allowed_combinations_stays_inside_them() -> None:
    space = SearchSpace([Real("t", 0.0, 1.0), Categorical("a", list("pqrstu")), Categorical("b", list("xyz"))],
                        allowed=[{"a": a, "b": b} for a in "pqrstu" for b in "xy"])  # 12 > 10: pre-selected
    opt = labfbo.Optimizer(space, objective="maximize", seed=0, n_init=3, **FAST)
    for _ in range(6):
        tr = opt.ask()
        assert tr.params["b"] != "z"
        opt.tell(tr, -(tr.params["t"] - 0.4) ** 2 + (tr.params["a"] == "s"))


def test_designs_on_few_allowed_combinations_do_not_repeat_experiments() -> None:
    space = SearchSpace([Categorical("a", list("pqrs")), Categorical("b", list("xyz"))],
                        allowed=[{"a": a, "b": b} for a in "pqrs" for b in "xy"])  # 8 combinations
    opt = labfbo.Optimizer(space, seed=3, n_init=8)
    rows = {(t.params["a"], t.params["b"]) for t in opt.ask(n=8)}
    assert len(rows) == 8
    coord_design = labfbo.coordinator.collaborative_design(space, 2, 4, seed=0).reshape(-1, 2)
    assert len({tuple(r) for r in coord_design}) == 8


def test_uniform_designs_pick_every_choice_equally_often() -> None:
    from scipy.stats import qmc

    space = SearchSpace([Categorical("c", list("abcd")), Real("x", 0, 1)])
    X = space.snap(qmc.LatinHypercube(2, seed=0).random(400))
    counts = np.bincount(np.rint(X[:, 0] * 3).astype(int), minlength=4)
    assert counts.tolist() == [100, 100, 100, 100]


def test_more_points_than_allowed_combinations_is_a_clear_error() -> None:
    space = SearchSpace([Categorical("a", list("pq")), Categorical("b", list("xy"))],
                        allowed=[{"a": "p", "b": "x"}, {"a": "q", "b": "y"}])
    opt = labfbo.Optimizer(space, seed=0, n_init=1)
    opt.tell(opt.ask(), 1.0)
    with pytest.raises(labfbo.SearchSpaceError, match="only 2 feasible combinations"):
        opt.ask(n=3)
    with pytest.raises(labfbo.SearchSpaceError, match="lists no combination"):
        SearchSpace([Categorical("a", list("pq"))], allowed_names=("a",), allowed=[])
    with pytest.raises(labfbo.ConstraintError, match="is not a feasible combination"):
        opt.enqueue({"a": "p", "b": "y"})
    assert not opt.pending  # refused: nothing journaled


def test_a_fine_step_is_optimized_continuously_and_still_snapped() -> None:
    dial = Real("flow", 0.0, 100.0, step=0.001)  # 100,000 steps: too many to enumerate
    assert not dial.is_discrete
    space = SearchSpace([dial, Real("t", 0, 1)])
    assert space.is_continuous
    v = space.decode(space.snap(np.array([[0.123456789, 0.5]])))[0]["flow"]
    assert v == 12.346
