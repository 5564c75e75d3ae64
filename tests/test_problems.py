"""Fast checks of the federated benchmark problems (labfbo.problems.families)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labfbo.problems.families import get_problem, list_problems, stable_hash
from labfbo.problems.functions import FUNCTIONS, HARTMANN6_XMIN, branin, hartmann3, hartmann6
from labfbo.problems.guide_functions import GUIDE_NAMES

SMALL = {"dim": 4}  # GUIDE functions at d = 4 keep the suite fast


def _build(name: str, **kw):
    extra = SMALL if name in GUIDE_NAMES else {}
    return get_problem(name, n_sites=3, **extra, **kw)


def _box(problem) -> np.ndarray:
    return np.array([[p.low, p.high] for p in problem.space.params])


@pytest.mark.parametrize("name", list_problems())
def test_builds_and_optimum_values(name: str) -> None:
    prob = _build(name)
    assert prob.n_sites == 3 and prob.objective == "minimize" and prob.name == name
    assert all(p.type == "real" for p in prob.space.params)
    b = _box(prob)
    for i in range(3):
        x = prob.metadata["optimizers"][i]
        assert np.all(x >= b[:, 0]) and np.all(x <= b[:, 1])
        params = dict(zip(prob.space.names, x.tolist()))
        assert abs(prob.evaluate(i, params) - prob.optima[i]) <= 1e-6
        assert abs(float(prob.metadata["batch"][i](x[None])[0]) - prob.optima[i]) <= 1e-6


@pytest.mark.parametrize("name", list_problems())
def test_regret_non_negative_on_random_points(name: str) -> None:
    prob = _build(name)
    b = _box(prob)
    X = b[:, 0] + np.random.default_rng(7).random((2000, len(b))) * (b[:, 1] - b[:, 0])
    for i in range(3):
        assert prob.metadata["batch"][i](X).min() >= prob.optima[i] - 1e-6


@pytest.mark.parametrize("name", ["sinusoid", "branin_family", "hartmann3",
                                  "wing_weight", "rastrigin", "weierstrass", "styblinski_tang"])
def test_deterministic_per_seed(name: str) -> None:
    a, b, c = _build(name, seed=3), _build(name, seed=3), _build(name, seed=4)
    pts = np.random.default_rng(0).random((16, a.space.dim))
    box = _box(a)
    X = box[:, 0] + pts * (box[:, 1] - box[:, 0])
    va = np.stack([f(X) for f in a.metadata["batch"]])
    vb = np.stack([f(X) for f in b.metadata["batch"]])
    vc = np.stack([f(X) for f in c.metadata["batch"]])
    assert np.array_equal(va, vb) and a.optima == b.optima
    assert not np.allclose(va, vc)
    assert not np.allclose(va[0], va[1])  # sites differ when heterogeneity > 0


def test_dict_and_batch_agree() -> None:
    prob = get_problem("wing_weight", n_sites=2)
    X = np.array([[160.0, 7.0, 5.0, 0.7, 0.1, 0.05]])
    params = dict(zip(prob.space.names, X[0].tolist()))
    assert prob.space.names == ["Sw", "A", "Lambda", "lam", "tc", "Wp"]
    assert prob.evaluate(1, params) == pytest.approx(float(prob.metadata["batch"][1](X)[0]))


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_guide_level1_identical_sites(name: str) -> None:
    prob = get_problem(name, n_sites=3, heterogeneity=1, **SMALL)
    X = np.random.default_rng(1).uniform(-0.5, 0.5, (20, 4))
    vals = [f(X) for f in prob.metadata["batch"]]
    assert np.array_equal(vals[0], vals[1]) and np.array_equal(vals[0], vals[2])
    assert prob.optima == [FUNCTIONS[name].f_min(4)] * 3
    assert np.allclose(vals[0], FUNCTIONS[name].fn(X))


@pytest.mark.parametrize("name", ["rastrigin", "sphere", "levy", "weierstrass"])
def test_guide_level3_regret_non_negative(name: str) -> None:
    prob = get_problem(name, n_sites=3, heterogeneity=3, dim=3)
    b = _box(prob)
    X = b[:, 0] + np.random.default_rng(2).random((2000, 3)) * (b[:, 1] - b[:, 0])
    for i in range(3):
        assert prob.metadata["batch"][i](X).min() >= prob.optima[i] - 1e-6
        x = prob.metadata["optimizers"][i]
        assert abs(prob.metadata["batch"][i](x[None])[0] - prob.optima[i]) <= 1e-6


def test_zero_heterogeneity_identical_sites() -> None:
    prob = get_problem("branin", n_sites=3, heterogeneity=0.0)
    assert np.allclose(prob.optima, 0.397887, atol=1e-6)


def test_known_values() -> None:
    assert branin(np.array([[math.pi, 2.275]]))[0] == pytest.approx(0.397887, abs=1e-6)
    assert hartmann6(HARTMANN6_XMIN[None])[0] == pytest.approx(-3.32237, abs=1e-5)
    assert FUNCTIONS["michalewicz"].f_min(10) == pytest.approx(-9.66015, abs=1e-5)
    assert FUNCTIONS["styblinski_tang"].f_min(10) == pytest.approx(-391.6617, abs=1e-3)
    prob = get_problem("ackley", n_sites=2)  # d = 10, level 2: optimum stays in the box
    assert len(prob.space.names) == 10 and prob.space.names[0] == "x1"


def test_stable_hash_and_errors() -> None:
    assert stable_hash("branin") == stable_hash("branin") != stable_hash("levy")
    with pytest.raises(ValueError):
        get_problem("nope")
    with pytest.raises(ValueError):
        get_problem("levy", heterogeneity=5)
    with pytest.raises(ValueError):
        get_problem("branin", dim=3)


def test_the_hand_written_functions_agree_with_botorch_at_the_standard_coefficients() -> None:
    """Branin, Hartmann, Michalewicz and Powell stay ours (sites vary their coefficients; any d):
    at BoTorch's coefficients they are BoTorch's functions."""
    import torch
    from botorch import test_functions as bt

    from labfbo.problems.functions import michalewicz, powell

    gen = np.random.default_rng(3)
    U2, U3, U6 = gen.random((40, 2)), gen.random((40, 3)), gen.random((40, 6))
    X2 = np.c_[-5 + 15 * U2[:, 0], 15 * U2[:, 1]]
    M, P = np.pi * gen.random((40, 5)), -4 + 9 * gen.random((40, 8))

    def ref(f, X):
        return f.evaluate_true(torch.as_tensor(X)).numpy()

    np.testing.assert_allclose(branin(X2), ref(bt.Branin(), X2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hartmann6(U6), ref(bt.Hartmann(dim=6), U6), atol=1e-7)  # BoTorch rounds a constant
    np.testing.assert_allclose(hartmann3(U3), ref(bt.Hartmann(dim=3), U3), atol=1e-7)
    np.testing.assert_allclose(michalewicz(M), ref(bt.Michalewicz(dim=5), M), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(powell(P), ref(bt.Powell(dim=8), P), rtol=1e-12)
