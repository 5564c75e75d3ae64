"""Expert priors: densities, weighting schedules, falsification, effect on proposals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import labfbo
from labfbo.models.priors import LocationPrior, Normal, PriorOptions, Uniform, prior_exponent

FAST = {"num_restarts": 2, "raw_samples": 64}


def _integrate_1d(prior: LocationPrior) -> float:
    u = torch.linspace(0, 1, 200_001, dtype=torch.float64)[:, None]
    return float(torch.trapezoid(prior.log_density(u).exp(), dx=1 / 200_000))


@pytest.mark.parametrize("param,dens", [
    (labfbo.Real("t", 150.0, 250.0), Normal(200.0, 5.0)),
    (labfbo.Real("t", 150.0, 250.0), Normal(245.0, 30.0)),   # truncated at the upper bound
    (labfbo.Real("r", 1e-3, 1.0, log=True), Normal(0.01, 0.02)),
    (labfbo.Real("t", 0.0, 10.0), Uniform(2.0, 4.0)),
])
def test_unit_cube_density_integrates_to_one(param: labfbo.Real, dens: object) -> None:
    space = labfbo.SearchSpace([param])
    assert _integrate_1d(LocationPrior(space, {param.name: dens}, floor=0.0)) == pytest.approx(1.0, rel=2e-3)
    assert _integrate_1d(LocationPrior(space, {param.name: dens}, floor=0.3)) == pytest.approx(1.0, rel=2e-3)


def test_floor_bounds_the_suppression() -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
    prior = LocationPrior(space, {"a": Normal(0.9, 0.01)}, floor=0.1)
    lp = prior.log_density(torch.rand(1000, 2, dtype=torch.float64))
    assert float(lp.min()) >= math.log(0.1) - 1e-9


def test_prior_validation() -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Categorical("c", ["x", "y"])])
    with pytest.raises(labfbo.ConfigurationError, match="unknown"):
        LocationPrior(space, {"zz": Normal(0.5, 0.1)})
    with pytest.raises(labfbo.ConfigurationError, match="categorical"):
        LocationPrior(space, {"c": Normal(0.5, 0.1)})
    with pytest.raises(ValueError):
        Normal(0.5, -1.0)
    with pytest.raises(labfbo.ConfigurationError, match="Thompson"):
        labfbo.Optimizer(space, acquisition="ts", prior={"a": Normal(0.5, 0.1)})


def test_decay_and_pibo_exponents() -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1)])
    prior = LocationPrior(space, {"a": Normal(0.5, 0.1)})
    X, y = np.zeros((0, 1)), np.zeros(0)
    opts = PriorOptions(prior={"a": Normal(0.5, 0.1)}, prior_mode="decay", omega=0.01, prior_check=0,
                        prior_patience=0)
    assert prior_exponent(opts, prior, 0, X, y) == pytest.approx(0.5)
    assert prior_exponent(opts, prior, 30, X, y) == pytest.approx(1 / (1 + math.exp(0.3)))  # ~0.43
    pibo = PriorOptions(prior={"a": Normal(0.5, 0.1)}, prior_mode="pibo", prior_beta=10.0, prior_patience=0)
    assert prior_exponent(pibo, prior, 7, np.zeros((20, 1)), np.arange(20.0)) == pytest.approx(0.5)


def test_a_prior_contradicted_by_data_is_switched_off() -> None:
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1)])
    dens = {"a": Normal(0.9, 0.02)}
    prior = LocationPrior(space, dens)
    opts = PriorOptions(prior=dens, prior_check=3)
    X = np.array([[0.9], [0.91], [0.89], [0.1], [0.2], [0.3]])
    bad = np.array([-5.0, -5.1, -4.9, 0.0, 1.0, 2.0])     # maximization orientation
    good = -bad
    assert prior_exponent(opts, prior, 1, X, bad) == 0.0
    assert prior_exponent(opts, prior, 1, X, good) > 0.4
    exact = PriorOptions(prior=dens, prior_check=0)
    assert prior_exponent(exact, prior, 1, X, bad) > 0.4


def test_a_prior_never_confirmed_is_dropped_after_its_patience():
    """Under consensus a site evaluates the consensus point, not its own proposal: a wrong
    prior's region may never be evaluated, so it cannot be falsified; it must not pull for ever."""
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1)])
    dens = {"a": Normal(0.9, 0.02)}
    prior = LocationPrior(space, dens)
    X = np.array([[0.1], [0.2], [0.3], [0.4], [0.5], [0.6]])      # nothing in the prior's region
    y = np.arange(6.0)
    opts = PriorOptions(prior=dens)                                  # defaults: patience 5
    assert prior_exponent(opts, prior, 4, X, y) > 0.4
    assert prior_exponent(opts, prior, 5, X, y) == 0.0
    confirmed_X, confirmed_y = np.vstack([X, [[0.9]]]), np.append(y, 10.0)  # a point in it beats the median
    assert prior_exponent(opts, prior, 5, confirmed_X, confirmed_y) > 0.4
    assert prior_exponent(opts, prior, 5, confirmed_X, np.append(y, -1.0)) == 0.0
    never = PriorOptions(prior=dens, prior_check=0, prior_patience=0)  # the paper's exact setting
    assert prior_exponent(never, prior, 50, X, y) > 0.3


def _branin(p: dict) -> float:
    x1, x2 = p["x1"], p["x2"]
    return (x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6) ** 2 \
        + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10


def _run(prior: dict | None, iters: int, seed: int, acquisition: str = "ei") -> float:
    space = labfbo.SearchSpace([labfbo.Real("x1", -5, 10), labfbo.Real("x2", 0, 15)])
    opt = labfbo.Optimizer(space, seed=seed, n_init=3, prior=prior, acquisition=acquisition, **FAST)
    for _ in range(3 + iters):
        t = opt.ask()
        opt.tell(t, _branin(t.params))
    return opt.best.value - 0.397887


@pytest.mark.integration  # a multi-site campaign
def test_strong_prior_finds_the_optimum_sooner() -> None:
    strong = {"x1": Normal(math.pi, 0.15), "x2": Normal(2.275, 0.15)}
    with_prior = [_run(strong, 4, s) for s in range(2)]
    without = [_run(None, 4, s) for s in range(2)]
    assert max(with_prior) < 0.05
    assert np.mean(with_prior) < 0.25 * np.mean(without)


def test_pmcbo_suite_rows_can_be_chosen_and_the_paper_setting_turns_every_safeguard_off() -> None:
    from labfbo_bench import pmcbo

    jobs = pmcbo.jobs("/tmp/unused", ("branin",), ("ucb",), [0, 1], only=("UCB", "I-PMCBO (labfbo defaults)"))
    assert sorted({j.label for j in jobs}) == ["ucb:I-PMCBO (labfbo defaults)", "ucb:UCB"] and len(jobs) == 4
    with pytest.raises(labfbo.ConfigurationError, match="unknown methods"):
        pmcbo.jobs("/tmp/unused", ("branin",), ("ucb",), [0], only=("UCB-typo",))
    exact = [j for j in pmcbo.jobs("/tmp/unused", ("branin",), ("ucb",), [0]) if j.label == "ucb:I-PMCBO"][0]
    assert PriorOptions(**{k: v for k, v in exact.options.items() if k.startswith("prior")}) \
        .model_dump(include={"prior_floor", "prior_check", "prior_patience"}) == \
        {"prior_floor": 0.0, "prior_check": 0, "prior_patience": 0}
