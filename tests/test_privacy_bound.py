"""`labfbo bench privacy-bound`: the idealized experiment-level release of reagent effects."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from labfbo_bench.privacy_bound import draw, information_kept, one_hot, picks, posterior_effects, sensitivity, table


def additive_labs(n_labs: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """Labs whose yields are the same additive effects of two categorical parameters plus small noise."""
    combos = list(itertools.product("abcd", "uvwxyz"))
    X, blocks = one_hot(combos)
    gen = np.random.default_rng(seed)
    effects = gen.normal(0.0, 10.0, X.shape[1])
    Y = np.stack([X @ effects + 50.0 + gen.normal(0.0, 0.5, len(combos)) for _ in range(n_labs)])
    return Y, X, blocks


def test_one_hot_rows_have_one_choice_per_parameter() -> None:
    X, blocks = one_hot([("a", 1), ("b", 2), ("a", 2)])
    assert blocks == 2 and X.shape == (3, 4)
    assert np.all(X.sum(axis=1) == 2)


def test_exact_effects_of_an_additive_family_find_the_best_combination() -> None:
    Y, X, _ = additive_labs()
    h, counts = draw(Y, X, target=0, n=24, gen=np.random.default_rng(1))   # the partners ran everything
    assert counts.sum() == 3 * 24 * 2
    mean, sd = posterior_effects(h, counts, 0.0, tau=1.0, spread=0.1)
    ok = np.ones(len(Y[0]), bool)
    best = picks(X, ok, mean, sd, top=1, rule="mean", gen=np.random.default_rng(0))
    assert Y[0].max() - Y[0][best].max() == pytest.approx(0.0, abs=1.0)


def test_the_posterior_shrinks_a_choice_the_noise_swamps_and_keeps_one_it_does_not() -> None:
    h, counts = np.array([30.0, 3.0]), np.array([60.0, 6.0])      # both: an effect of 0.5 per experiment
    mean, sd = posterior_effects(h, counts, 0.0, tau=1.0, spread=0.1)
    assert mean == pytest.approx([0.5, 0.5], rel=0.05)
    mean, sd = posterior_effects(h, counts, 20.0, tau=1.0, spread=0.1)
    assert mean[0] > 0.25 and mean[1] < 0.05 and sd[1] == pytest.approx(1.0, rel=0.05)
    # a negative noisy count reads as no experiment: the prior
    mean, sd = posterior_effects(np.array([5.0]), np.array([-3.0]), 1.0, tau=0.4, spread=0.1)
    assert mean[0] == 0.0 and sd[0] == pytest.approx(0.4)


def test_thompson_picks_distinct_combinations_and_the_surface_release_is_noisier() -> None:
    X, _ = one_hot(list(itertools.product("ab", "xyz")))
    ok = np.ones(len(X), bool)
    chosen = picks(X, ok, np.zeros(X.shape[1]), np.ones(X.shape[1]), top=4, rule="thompson",
                   gen=np.random.default_rng(0))
    assert len(set(chosen.tolist())) == 4
    assert sensitivity("idealized", 3) == pytest.approx(2 * np.sqrt(3))
    assert sensitivity("surface", 3) == pytest.approx(2 * np.sqrt(15))   # the rank coupling and the counts


def test_information_kept_is_one_without_noise_and_vanishes_in_noise() -> None:
    Y, X, _ = additive_labs()
    res = information_kept(Y, X, n=10, noise=[0.0, 2.0, 1e9], draws=20, seed=0, top=2)
    assert res["plain"] < res["chance"]
    assert res["kept"][0.0][0] == pytest.approx(1.0)
    assert res["kept"][2.0][0] > res["kept"][1e9][0]
    assert res["kept"][1e9][0] < 0.5


def test_table_on_the_reaction_labs() -> None:
    out = table(["a"], [6], [8.0], 1e-5, draws=2, seed=0, top=5, releases=("idealized", "surface")).splitlines()
    assert out[0].startswith("| scenario") and "eps = 8" in out[0]
    assert out[2].startswith("| (a) (5) | 6 | idealized |") and out[3].startswith("| (a) (5) | 6 | surface |")
