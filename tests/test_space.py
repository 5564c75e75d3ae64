"""SearchSpace: definitions, validation, unit-cube encoding, JSON round trips."""

from __future__ import annotations

import math
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import labfbo
from labfbo import Categorical, Integer, Real, SearchSpace, SearchSpaceError

HYP = settings(derandomize=True, deadline=None, max_examples=150,
               suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------- strategies
@st.composite
def reals(draw, name: str) -> Real:
    if draw(st.booleans()):
        lo_exp = draw(st.floats(-6.0, 4.0))
        width = draw(st.floats(0.05, 6.0))
        return Real(name, 10.0 ** lo_exp, 10.0 ** (lo_exp + width), log=True)
    low = draw(st.floats(-1e6, 1e6))
    width = draw(st.floats(1e-3, 1e6))
    high = low + width
    if not high > low:  # width lost to round-off at this magnitude
        high = math.nextafter(low, math.inf) if width < 1 else low + 1.0
    return Real(name, low, high)


@st.composite
def integers(draw, name: str) -> Integer:
    low = draw(st.integers(-1000, 1000))
    return Integer(name, low, low + draw(st.integers(1, 2000)))


CHOICE = st.one_of(st.text(min_size=0, max_size=6), st.integers(-100, 100),
                   st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), st.booleans())


@st.composite
def categoricals(draw, name: str) -> Categorical:
    choices = draw(st.lists(CHOICE, min_size=2, max_size=6, unique_by=lambda c: (type(c).__name__, c)))
    return Categorical(name, choices)


@st.composite
def spaces(draw) -> SearchSpace:
    names = draw(st.lists(st.text(string.ascii_lowercase + "_", min_size=1, max_size=8),
                          min_size=1, max_size=5, unique=True))
    params = [draw(st.one_of(reals(n), integers(n), categoricals(n))) for n in names]
    return SearchSpace(params)


def value_of(p):
    if isinstance(p, Real):
        return st.floats(p.low, p.high)
    if isinstance(p, Integer):
        return st.integers(p.low, p.high)
    return st.sampled_from(list(p.choices))


@st.composite
def space_and_params(draw):
    space = draw(spaces())
    return space, {p.name: draw(value_of(p)) for p in space.params}


def same_value(p, got, want) -> bool:
    if isinstance(p, Real):
        # relative 1e-9, plus an absolute floor at the bounds' scale (a value near 0 in
        # [-1e6, 1e6] cannot come back to a tiny *relative* error through u in [0, 1])
        return isinstance(got, float) and math.isclose(
            got, want, rel_tol=1e-9, abs_tol=1e-12 * max(abs(p.low), abs(p.high)))
    return type(got) is type(want) and got == want


# ----------------------------------------------------------------------- properties
@HYP
@given(space_and_params())
def test_encode_decode_round_trip(sp):
    space, params = sp
    X = space.encode([params])
    assert X.shape == (1, space.dim) and X.dtype == np.float64
    assert np.all((X >= 0.0) & (X <= 1.0))
    back = space.decode(X)[0]
    assert list(back) == space.names
    for p in space.params:
        assert same_value(p, back[p.name], params[p.name]), (p, back[p.name], params[p.name])


@HYP
@given(spaces(), st.data())
def test_decode_of_any_point_validates_strictly(space, data):
    n = data.draw(st.integers(1, 4))
    X = np.array(data.draw(st.lists(st.lists(st.floats(-0.5, 1.5), min_size=space.dim, max_size=space.dim),
                                    min_size=n, max_size=n)))
    decoded = space.decode(X)
    assert len(decoded) == n
    for params in decoded:
        clean, oob = space.validate_params(params, strict=True)
        assert oob == []
        for p in space.params:
            v = params[p.name]
            if isinstance(p, Real):
                assert type(v) is float and p.low <= v <= p.high
            elif isinstance(p, Integer):
                assert type(v) is int and p.low <= v <= p.high
            else:
                assert any(type(c) is type(v) and c == v for c in p.choices)
            assert same_value(p, clean[p.name], v)


@HYP
@given(spaces(), st.data())
def test_snap_is_idempotent_and_feasible(space, data):
    X = np.array(data.draw(st.lists(st.lists(st.floats(0.0, 1.0), min_size=space.dim, max_size=space.dim),
                                    min_size=1, max_size=4)))
    S = space.snap(X)
    np.testing.assert_array_equal(space.snap(S), S)
    for c, p in enumerate(space.params):
        if isinstance(p, Real):
            np.testing.assert_array_equal(S[:, c], X[:, c])
        else:
            grid = np.asarray(p.grid())
            assert all(np.any(grid == v) for v in S[:, c])
            # the snapped code decodes to the same value as the raw point
    assert space.decode(S) == space.decode(space.snap(S))


@HYP
@given(spaces())
def test_json_round_trip_preserves_space_and_fingerprint(space):
    a = SearchSpace.model_validate_json(space.model_dump_json())
    b = SearchSpace.from_json(space.to_json())
    c = SearchSpace.model_validate(space.model_dump(mode="json"))
    for other in (a, b, c):
        assert other == space
        assert other.fingerprint() == space.fingerprint()
        for p, q in zip(space.params, other.params):
            if isinstance(p, Categorical):
                assert [type(x) for x in p.choices] == [type(x) for x in q.choices]


def test_fingerprint_distinguishes_spaces():
    a = SearchSpace([Real("x", 0, 1)])
    assert a.fingerprint() == SearchSpace([Real("x", 0.0, 1.0)]).fingerprint()
    assert a.fingerprint() != SearchSpace([Real("x", 0, 2)]).fingerprint()
    assert a.fingerprint() != SearchSpace([Real("x", 0.1, 1, log=True)]).fingerprint()
    assert a.fingerprint() != SearchSpace([Real("y", 0, 1)]).fingerprint()
    c1 = SearchSpace([Categorical("c", [1, 2])])
    assert c1.fingerprint() != SearchSpace([Categorical("c", [1.0, 2.0])]).fingerprint()


def test_encoding_formulae():
    space = SearchSpace([Real("a", 0, 10), Real("b", 1, 100, log=True), Integer("n", 2, 6),
                         Categorical("c", ["x", "y", "z"])])
    X = space.encode([{"a": 2.5, "b": 10.0, "n": 3, "c": "z"}])
    np.testing.assert_allclose(X, [[0.25, 0.5, 0.25, 1.0]], rtol=0, atol=1e-12)
    assert space.decode([[1.0, 0.0, 0.49, 0.5]]) == [{"a": 10.0, "b": 1.0, "n": 4, "c": "y"}]
    assert space.discrete_dims() == {2: [0.0, 0.25, 0.5, 0.75, 1.0]}
    assert space.cat_dims() == {3: [0.0, 0.5, 1.0]}
    with pytest.raises(SearchSpaceError):
        space.decode([[0.5, 0.5]])


# ----------------------------------------------------------------------- definitions
@pytest.mark.parametrize("make, needle", [
    (lambda: Real("x", 1.0, 1.0), "x"),
    (lambda: Real("x", 2.0, 1.0), "x"),
    (lambda: Real("x", 0.0, 1.0, log=True), "x"),
    (lambda: Real("x", -1.0, 1.0, log=True), "x"),
    (lambda: Real("x", 0.0, math.inf), "x"),
    (lambda: Real("x", math.nan, 1.0), "x"),
    (lambda: Integer("n", 3, 3), "n"),
    (lambda: Integer("n", 4, 1), "n"),
    (lambda: Categorical("c", ["only"]), "two"),
    (lambda: Categorical("c", []), "two"),
    (lambda: Categorical("c", ["a", "b", "a"]), "duplicate"),
    (lambda: SearchSpace([Real("a", 0, 1), Integer("a", 0, 3)]), "a"),
    (lambda: SearchSpace([]), "at least one"),
    (lambda: Real("", 0, 1), ""),
])
def test_invalid_definitions_raise(make, needle):
    with pytest.raises(ValueError) as exc:
        make()
    assert needle in str(exc.value)


def test_mixed_choice_types_are_distinct():
    c = Categorical("c", ["1", 1, 1.5, True])
    assert c.index("1") == 0 and c.index(1) == 1 and c.index(1.5) == 2 and c.index(True) == 3
    assert c.index(np.int64(1)) == 1 and c.index(np.float64(1.5)) == 2
    with pytest.raises(SearchSpaceError):
        Categorical("c", ["a", True]).index(1)


def test_numpy_scalars_match_their_categories():
    c = Categorical("c", ["water", "dmso", True, False])
    assert c.index(np.str_("dmso")) == 1
    assert c.index(np.bool_(False)) == 3
    space = SearchSpace([c])
    clean, _ = space.validate_params({"c": np.str_("water")})
    assert clean == {"c": "water"} and type(clean["c"]) is str


# ----------------------------------------------------------------------- validate_params
@pytest.fixture
def space4():
    return SearchSpace([Real("temperature", 150.0, 250.0), Real("feed", 1e-3, 1.0, log=True),
                        Integer("passes", 1, 8), Categorical("solvent", ["water", "ethanol", "dmso"])])


GOOD = {"temperature": 200.0, "feed": 0.1, "passes": 3, "solvent": "water"}


def test_validate_params_accepts_and_cleans(space4):
    clean, oob = space4.validate_params({**GOOD, "passes": 3.0, "temperature": np.float32(180)})
    assert oob == []
    assert type(clean["passes"]) is int and clean["passes"] == 3
    assert type(clean["temperature"]) is float and clean["temperature"] == 180.0
    clean, oob = space4.validate_params({**GOOD, "temperature": 300.0, "passes": 0}, strict=False)
    assert sorted(oob) == ["passes", "temperature"] and clean["temperature"] == 300.0


@pytest.mark.parametrize("change, needle", [
    ({"colour": "red"}, "colour"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": None}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": 251.0}, "temperature"),
    ({"temperature": 149.999}, "temperature"),
    ({"feed": 0.0}, "feed"),
    ({"feed": 1.5}, "feed"),
    ({"passes": 2.5}, "passes"),
    ({"passes": "3"}, "passes"),
    ({"passes": False}, "passes"),
    ({"passes": math.nan}, "passes"),
    ({"passes": 9}, "passes"),
    ({"solvent": "acetone"}, "solvent"),
    ({"solvent": 0}, "solvent"),
])
def test_validate_params_errors_name_the_parameter(space4, change, needle):
    with pytest.raises(SearchSpaceError) as exc:
        space4.validate_params({**GOOD, **change}, strict=True)
    assert needle in str(exc.value)
    assert isinstance(exc.value, labfbo.LabFBOError)


def test_validate_params_missing_and_non_dict(space4):
    params = dict(GOOD)
    del params["passes"]
    with pytest.raises(SearchSpaceError, match="passes"):
        space4.validate_params(params)
    with pytest.raises(SearchSpaceError):
        space4.validate_params([200.0, 0.1, 3, "water"])


def test_out_of_bounds_only_raises_when_strict(space4):
    bad = {**GOOD, "temperature": 1000.0}
    with pytest.raises(SearchSpaceError, match="temperature"):
        space4.validate_params(bad)
    assert space4.validate_params(bad, strict=False)[1] == ["temperature"]
    # non-strict still refuses wrong types and unknown categories
    with pytest.raises(SearchSpaceError, match="solvent"):
        space4.validate_params({**GOOD, "solvent": "acetone"}, strict=False)
    # and encoding clips the out-of-bounds value to the box
    assert space4.encode([space4.validate_params(bad, strict=False)[0]])[0, 0] == 1.0


def test_a_space_has_at_most_max_params_parameters_and_duplicates_are_named():
    from labfbo.space.search import MAX_PARAMS

    params = [labfbo.Real(f"x{i}", 0.0, 1.0) for i in range(MAX_PARAMS + 1)]
    with pytest.raises(labfbo.SearchSpaceError, match=f"at most {MAX_PARAMS} parameters"):
        labfbo.SearchSpace(params)
    assert labfbo.SearchSpace(params[:MAX_PARAMS]).dim == MAX_PARAMS
    with pytest.raises(labfbo.SearchSpaceError, match=r"duplicate parameter names: \['x1', 'x3'\]"):
        labfbo.SearchSpace(params[:5] + [params[3], params[1]])
