"""The hit-and-run sampler: feasible, seeded, and uniform on polytopes whose law is known."""

from __future__ import annotations

import numpy as np
import pytest

from labfbo.space.polytope import chebyshev_start, hit_and_run

NONE = np.zeros((0, 3))


def test_points_are_uniform_on_the_simplex() -> None:
    # a + b + c = 1 in the unit cube: each coordinate is Beta(1, 2), mean 1/3, variance 1/18
    X = hit_and_run(NONE, np.zeros(0), np.ones((1, 3)), np.ones(1), 4096, seed=0)
    assert X.shape == (4096, 3)
    assert np.abs(X.sum(1) - 1).max() < 1e-9 and X.min() >= -1e-12 and X.max() <= 1 + 1e-12
    assert np.allclose(X.mean(0), 1 / 3, atol=0.02)
    assert np.allclose(X.var(0), 1 / 18, atol=0.006)
    assert np.mean(X[:, 0] < 0.5) == pytest.approx(0.75, abs=0.03)  # P(a < 1/2) = 1 - (1/2)^2


def test_points_are_uniform_under_an_inequality() -> None:
    # x + y <= 1 (written -x - y >= -1) on the square, z free: the triangle's centroid, z uniform
    A_ge, b_ge = np.array([[-1.0, -1.0, 0.0]]), np.array([-1.0])
    X = hit_and_run(A_ge, b_ge, np.zeros((0, 3)), np.zeros(0), 4096, seed=1)
    assert (X[:, 0] + X[:, 1] <= 1 + 1e-9).all()
    assert np.allclose(X.mean(0), [1 / 3, 1 / 3, 0.5], atol=0.02)
    assert np.var(X[:, 2]) == pytest.approx(1 / 12, abs=0.006)


def test_the_same_seed_gives_the_same_points_and_another_seed_others() -> None:
    A_ge, b_ge = np.array([[-1.0, -1.0, 0.0]]), np.array([-1.0])
    a = hit_and_run(A_ge, b_ge, np.zeros((0, 3)), np.zeros(0), 100, seed=5)
    assert np.array_equal(a, hit_and_run(A_ge, b_ge, np.zeros((0, 3)), np.zeros(0), 100, seed=5))
    assert not np.allclose(a, hit_and_run(A_ge, b_ge, np.zeros((0, 3)), np.zeros(0), 100, seed=6))
    assert len(hit_and_run(A_ge, b_ge, np.zeros((0, 3)), np.zeros(0), 3, seed=5)) == 3


def test_a_polytope_without_interior_is_reported_not_walked() -> None:
    # x + y >= 2 on the square is the corner (1, 1): no ball fits
    assert chebyshev_start(np.array([[1.0, 1.0]]), np.array([2.0]), np.zeros((0, 2)), np.zeros(0)) is None
    assert hit_and_run(np.array([[1.0, 1.0]]), np.array([2.0]), np.zeros((0, 2)), np.zeros(0), 10, seed=0) is None


def test_a_column_pinned_by_the_equalities_stays_put() -> None:
    # a = 0.3 pins one column; b + c = 0.5 leaves a segment
    A_eq, b_eq = np.array([[1.0, 0, 0], [0, 1.0, 1.0]]), np.array([0.3, 0.5])
    X = hit_and_run(NONE, np.zeros(0), A_eq, b_eq, 512, seed=2)
    assert np.allclose(X[:, 0], 0.3) and np.allclose(X[:, 1] + X[:, 2], 0.5)
    assert X[:, 1].min() < 0.05 and X[:, 1].max() > 0.45  # the whole segment is visited
