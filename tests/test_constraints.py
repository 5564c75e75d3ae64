"""Parameter constraints: linear, forbidden combinations and site-local nonlinear ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import labfbo
from labfbo import Categorical, Discrete, Forbidden, Integer, LinearConstraint, NonlinearConstraint, Real, SearchSpace

FAST = {"num_restarts": 2, "raw_samples": 32}
PROTOCOL_OPTIONS = {
    "independent": {},
    "consensus": {},
    "distribution": {"M": 64, "candidates": 128},
    "gradient": {"n_particles": 4, "hidden": [8, 8], "warmup_steps": 3, "svgd_steps": 2},
    "centralized": {"n_particles": 4, "hidden": [8, 8], "warmup_steps": 3, "svgd_steps": 2},
    "surface": {},
    "pooled": {},
}


def _mixture(local: bool = True) -> SearchSpace:
    """Three fractions that add up to 1, a temperature bounded with one of them, an integer and a
    concentration with one forbidden pair, and (``local``) a site's own nonlinear limit."""
    cons: list = [LinearConstraint({"a": 1, "b": 1, "c": 1}, "==", 1.0),
                  LinearConstraint({"a": 100, "T": 1}, "<=", 110.0),
                  Forbidden({"n": 4, "conc": 0.1})]
    if local:
        cons.append(NonlinearConstraint("dose", lambda p: 0.5 - p["a"] * p["b"] * 4))
    return SearchSpace([Real("a", 0, 1), Real("b", 0, 1), Real("c", 0, 1), Real("T", 20, 80), Integer("n", 1, 4),
                        Discrete("conc", [0.05, 0.1, 0.2])], constraints=cons)


def _f(i: int, p: dict) -> float:
    return -(p["a"] - 0.2 - 0.05 * i) ** 2 - (p["b"] - 0.5) ** 2 - ((p["T"] - 60) / 60) ** 2 + 0.1 * p["n"] - p["conc"]


def test_linear_constraints_refuse_parameters_they_cannot_hold() -> None:
    params = [Real("x", 0, 1), Real("lg", 1, 10, log=True), Real("st", 0, 1, step=0.1), Integer("k", 0, 3),
              Categorical("s", ["p", "q"])]
    for name, what in [("lg", "log-scaled"), ("st", "stepped"), ("k", "integer"), ("s", "categorical")]:
        with pytest.raises(labfbo.SearchSpaceError, match=f"parameter '{name}' is {what}"):
            SearchSpace(params, constraints=[LinearConstraint({"x": 1, name: 1}, "<=", 1)])
    with pytest.raises(labfbo.SearchSpaceError, match="unknown parameter 'z'"):
        SearchSpace(params, constraints=[LinearConstraint({"z": 1}, "<=", 1)])
    with pytest.raises(labfbo.SearchSpaceError, match="no feasible point"):
        SearchSpace(params, constraints=[LinearConstraint({"x": 1}, ">=", 2)])
    with pytest.raises(labfbo.SearchSpaceError, match="op"):
        LinearConstraint({"x": 1}, "<", 1)


def test_forbidden_combinations_compile_into_the_table_of_feasible_combinations() -> None:
    space = SearchSpace(
        [Categorical("base", ["KOAc", "DBU"]), Categorical("solvent", ["DMAc", "DMSO"]), Real("t", 0, 1)],
        constraints=[Forbidden({"base": "KOAc", "solvent": "DMAc"})],
    )
    assert len(space.feasible_grid(100)) == 3
    assert not space.is_allowed({"base": "KOAc", "solvent": "DMAc", "t": 0.5})
    X = space.snap(np.random.default_rng(0).random((200, 3)))
    assert all(space.is_allowed(p) for p in space.decode(X))
    with pytest.raises(labfbo.SearchSpaceError, match="any value in a range"):
        SearchSpace(space.params, constraints=[Forbidden({"t": 0.5})])
    with pytest.raises(labfbo.SearchSpaceError, match="forbid every combination"):
        SearchSpace([Categorical("c", ["p", "q"])], constraints=[Forbidden({"c": "p"}), Forbidden({"c": "q"})])
    # with allowed=, the forbidden rows are taken out of the allowed ones
    both = SearchSpace(space.params, allowed=[{"base": "KOAc"}, {"base": "DBU"}],
                       constraints=[Forbidden({"base": "KOAc", "solvent": "DMAc"})])
    assert len(both.feasible_grid(100)) == 3


def test_constraints_are_part_of_the_study_identity() -> None:
    a, b = _mixture(), _mixture(local=False)
    assert a.fingerprint() == b.fingerprint()  # a site's own nonlinear constraint is not
    again = SearchSpace.from_json(a.to_json())
    assert again.fingerprint() == a.fingerprint() and again.local_constraints == ()
    other = SearchSpace(a.params, constraints=[LinearConstraint({"a": 1, "b": 1, "c": 1}, "==", 1.0)])
    assert other.fingerprint() != a.fingerprint()
    coord = labfbo.Coordinator("distribution", sites=["x", "y"], seed=0, horizon=3)
    labfbo.Optimizer(a, protocol="distribution", coordinator=coord, site="x", seed=0)
    assert coord.local_constraints["x"] == ["dose"]  # the name, not the code
    with pytest.raises(labfbo.FederationError, match="constraints differ"):
        labfbo.Optimizer(other, protocol="distribution", coordinator=coord, site="y", seed=0)


def test_enqueue_refuses_an_infeasible_experiment_and_changes_nothing() -> None:
    opt = labfbo.Optimizer(_mixture(), seed=0, n_init=2)
    bad = {"a": 0.5, "b": 0.5, "c": 0.5, "T": 30.0, "n": 1, "conc": 0.05}
    with pytest.raises(labfbo.ConstraintError, match=r"linear constraint 1\*a \+ 1\*b \+ 1\*c == 1"):
        opt.enqueue(bad)
    with pytest.raises(labfbo.ConstraintError, match="'dose'"):
        opt.enqueue({"a": 0.5, "b": 0.5, "c": 0.0, "T": 30.0, "n": 1, "conc": 0.05})
    with pytest.raises(labfbo.ConstraintError, match="not a feasible combination"):
        opt.enqueue({"a": 0.2, "b": 0.2, "c": 0.6, "T": 30.0, "n": 4, "conc": 0.1})
    assert opt.trials == []
    ok = opt.enqueue({"a": 0.2, "b": 0.2, "c": 0.6, "T": 30.0, "n": 4, "conc": 0.2})
    assert ok.params["n"] == 4


def test_a_nonlinear_constraint_that_fails_is_named() -> None:
    def broken(p: dict) -> float:
        raise KeyError("dose_limit")

    space = SearchSpace([Real("x", 0, 1)], constraints=[NonlinearConstraint("limit", broken)])
    with pytest.raises(labfbo.SearchSpaceError, match="nonlinear constraint 'limit' raised KeyError"):
        space.sample(4, 0)
    never = SearchSpace([Real("x", 0, 1)], constraints=[NonlinearConstraint("never", lambda p: -1.0)])
    with pytest.raises(labfbo.SearchSpaceError, match="no point meets the nonlinear constraint"):
        never.sample(4, 0)


def test_degenerate_linear_constraints_are_refused_or_still_met() -> None:
    abc = [Real("a", 0, 1), Real("b", 0, 1), Real("c", 0, 1)]
    with pytest.raises(labfbo.SearchSpaceError, match=r"can only hold with equality .* declare it with '=='"):
        SearchSpace(abc, constraints=[LinearConstraint({"a": 1, "b": 1}, "<=", 1), LinearConstraint({"a": 1, "b": 1},
                                                                                                   ">=", 1)])
    # fractions of very different ranges, and an equality that pins a parameter to its bound
    for params, cons in [
        (
            [Real("a", 0, 0.1), Real("b", 0, 1), Real("c", 0, 10)],
            [LinearConstraint({"a": 1, "b": 1, "c": 1}, "==", 1.0)],
        ),
        (
            [Real("x0", 0, 2), Real("x1", 0, 1), Real("x2", 0, 1)],
            [LinearConstraint({"x2": 1}, "==", 0.5), LinearConstraint({"x0": 0.2, "x2": -2}, "==", -0.6)],
        ),
    ]:
        space = SearchSpace(params, constraints=cons)
        X = np.concatenate([space.snap(np.random.default_rng(1).random((300, 3))), space.sample(64, 0),
                            space.design(np.random.default_rng(2).random((6, 3)), 0)])
        bad = [p for p in space.decode(X) if space.violations(p)]
        assert bad == [], bad[:3]
    # a right-hand side of 0 is not a special case of the relative tolerance
    zero = SearchSpace([Real("a", 0, 1), Real("b", 0, 1)], constraints=[LinearConstraint({"a": 1, "b": -3}, "<=", 0)])
    assert zero.violations({"a": 2e-16, "b": 6e-17}) == []


def test_equal_spaces_are_equal_and_allowed_keeps_working_in_any_column_order() -> None:
    a, b = _mixture(local=False), SearchSpace.from_json(_mixture(local=False).to_json())
    assert a == b
    space = SearchSpace([Categorical("a", ["p", "q"]), Integer("n", 0, 4), Real("x", 0, 1)],
                        allowed=[{"n": 2, "a": "q"}, {"n": 1, "a": "p"}])
    opt = labfbo.Optimizer(space, n_init=2, seed=0)
    assert all((t.params["a"], t.params["n"]) in {("q", 2), ("p", 1)} for t in opt.ask(n=2))


@st.composite
def constrained_spaces(draw: st.DrawFn) -> SearchSpace:
    """3-5 reals (one possibly log-scaled, left out of the constraints), a categorical, random linear
    inequalities and equalities with a feasible point by construction, random forbidden pairs."""
    d = draw(st.integers(3, 5))
    params: list = [Real(f"x{i}", -1.0, float(draw(st.integers(1, 5)))) for i in range(d)]
    params += [Real("lg", 0.1, 10, log=True), Categorical("c", ["p", "q", "r"]), Integer("k", 0, 2)]
    center = {p.name: p.low + (p.high - p.low) * draw(st.floats(0.2, 0.8)) for p in params[:d]}
    cons: list = []
    for _ in range(draw(st.integers(1, 3))):
        names = draw(st.lists(st.sampled_from([p.name for p in params[:d]]), min_size=1, max_size=d, unique=True))
        coef = {n: draw(st.floats(-3, 3).filter(lambda v: abs(v) > 0.1)) for n in names}
        at = sum(a * center[n] for n, a in coef.items())
        op = draw(st.sampled_from(["<=", ">=", "=="]))
        slack = 0.0 if op == "==" else draw(st.floats(0.0, 2.0))
        cons.append(LinearConstraint(coef, op, at + (slack if op == "<=" else -slack)))
    for _ in range(draw(st.integers(0, 3))):
        cons.append(Forbidden({"c": draw(st.sampled_from(["p", "q", "r"])), "k": draw(st.integers(0, 2))}))
    cons = [c for i, c in enumerate(cons) if c not in cons[:i]]
    if len([c for c in cons if isinstance(c, Forbidden)]) >= 9:
        cons = cons[:-1]
    cut = draw(st.floats(0.0, 0.5))
    cons.append(NonlinearConstraint("ring", lambda p, cut=cut, c0=center["x0"]: 10.0 - cut * (p["x0"] - c0) ** 2))
    try:
        return SearchSpace(params, constraints=cons)
    except labfbo.SearchSpaceError as exc:  # an inequality the others pin to equality: refused by design
        assume("can only hold with equality" not in str(exc))
        raise


@pytest.mark.integration  # a long property search: 40 constrained spaces
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=constrained_spaces(), seed=st.integers(0, 2**20))
def test_every_way_points_are_made_meets_every_constraint(space: SearchSpace, seed: int) -> None:
    rng = np.random.default_rng(seed)
    made = {"snap+repair": space.repair(rng.random((30, space.dim)), seed), "sample": space.sample(64, seed),
            "design": space.design(rng.random((12, space.dim)), seed)}
    for how, X in made.items():
        assert space.feasible(X).all(), how
        for p in space.decode(X):
            assert space.violations(p) == [], (how, p)


@pytest.mark.integration  # a multi-site campaign per protocol
@pytest.mark.parametrize("protocol", sorted(PROTOCOL_OPTIONS))
def test_no_protocol_proposes_an_infeasible_point(protocol: str) -> None:
    space, opts = _mixture(), {**FAST, **PROTOCOL_OPTIONS[protocol]}
    federated = protocol != "independent"
    coord = labfbo.Coordinator(protocol, sites=["a", "b", "c"], seed=3, horizon=4, **opts) if federated else None
    sites = [labfbo.Optimizer(space, objective="maximize", protocol=protocol, coordinator=coord, site=s, seed=3,
                              n_init=3, secret=10 + i, **opts) for i, s in enumerate(["a", "b", "c"])]
    told = 0
    for i, o in enumerate(sites):
        for t in o.ask(n=3):
            assert space.violations(t.params) == [], ("design", t.params)
            o.tell(t, _f(i, t.params))
    for r in range(2):  # a round of one proposal per site, then a round of a batch of two
        batch = [o.ask(n=2 if r == 1 else None) for o in sites]
        for i, (o, got) in enumerate(zip(sites, batch)):
            for t in got if isinstance(got, list) else [got]:
                assert space.violations(t.params) == [], (protocol, r, t.params)
                o.tell(t, _f(i, t.params))
                told += 1
    assert told == 3 * 3
    for p in (o.best.params for o in sites):
        assert abs(p["a"] + p["b"] + p["c"] - 1.0) <= 1e-6
