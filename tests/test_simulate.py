"""labfbo.simulate on a user-built FederatedProblem and on a built-in one."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import labfbo
from labfbo import FederatedProblem, Real, SearchSpace

pytestmark = pytest.mark.integration  # simulated multi-site campaigns

CENTERS = [(-0.3, 0.2), (0.0, 0.0), (0.3, -0.2)]
OFFSETS = [0.0, 1.0, -2.0]
BUDGET, N_INIT = 4, 3


def bowl(params, center, offset, sign):
    return sign * ((params["x1"] - center[0]) ** 2 + (params["x2"] - center[1]) ** 2 + offset)


def make_problem(objective: str = "minimize") -> FederatedProblem:
    sign = 1.0 if objective == "minimize" else -1.0
    space = SearchSpace([Real("x1", -1.0, 1.0), Real("x2", -1.0, 1.0)])
    return FederatedProblem(
        space=space,
        objectives=[functools.partial(bowl, center=c, offset=o, sign=sign) for c, o in zip(CENTERS, OFFSETS)],
        optima=[sign * o for o in OFFSETS], objective=objective, name=f"bowl-{objective}",
        site_names=["lab-a", "lab-b", "lab-c"])


@pytest.fixture(scope="module")
def results():
    fast = {"num_restarts": 2, "raw_samples": 64}
    out = {}
    for objective in ("minimize", "maximize"):
        out[objective] = labfbo.simulate(make_problem(objective), budget=BUDGET, n_init=N_INIT, seed=0, **fast)
    out["again"] = labfbo.simulate(make_problem("minimize"), budget=BUDGET, n_init=N_INIT, seed=0, **fast)
    out["other"] = labfbo.simulate(make_problem("minimize"), budget=1, n_init=N_INIT, seed=1, **fast)
    return out


@pytest.mark.parametrize("objective", ["minimize", "maximize"])
def test_result_arrays(results, objective):
    res = results[objective]
    problem = make_problem(objective)
    assert isinstance(res, labfbo.SimulationResult)
    assert res.site_names == ["lab-a", "lab-b", "lab-c"] and res.n_sites == 3
    assert (res.budget, res.n_init, res.protocol, res.seed) == (BUDGET, N_INIT, "independent", 0)
    for name in ("best_values", "simple_regret", "normalized_regret", "bytes_up", "bytes_down"):
        assert getattr(res, name).shape == (3, BUDGET), name
    assert res.auc.shape == (3,)
    assert res.proposals.shape == (3, BUDGET, 2) and res.proposals.dtype == np.float64
    assert np.all((res.proposals >= -1.0) & (res.proposals <= 1.0))
    assert np.all(res.bytes_up == 0) and np.all(res.bytes_down == 0)
    assert res.wall_time > 0 and res.epsilon == []

    steps = np.diff(res.best_values, axis=1)
    assert np.all(steps <= 0) if objective == "minimize" else np.all(steps >= 0)
    assert np.all(res.simple_regret >= 0) and np.all(res.normalized_regret >= 0)
    assert np.all(np.isfinite(res.auc)) and np.all(res.auc >= 0)

    sign = problem.loss_sign
    ranges = problem.objective_ranges()
    for i in range(3):
        np.testing.assert_allclose(res.simple_regret[i], sign * (res.best_values[i] - problem.optima[i]), atol=1e-12)
        np.testing.assert_allclose(res.normalized_regret[i], res.simple_regret[i] / ranges[i], rtol=1e-12)
        # best-so-far = the design's best, then the best of every evaluated proposal
        values = [problem.evaluate(i, {"x1": p[0], "x2": p[1]}) for p in res.proposals[i]]
        assert sign * res.best_values[i, 0] <= sign * values[0] + 1e-12
        for t in range(1, BUDGET):
            expected = min(sign * res.best_values[i, t - 1], sign * values[t])
            assert sign * res.best_values[i, t] == pytest.approx(expected, abs=1e-12)
    window = max(1, math.ceil(0.1 * BUDGET))
    np.testing.assert_allclose(res.auc, res.normalized_regret[:, :window].mean(axis=1))


def test_normalizer_depends_only_on_the_problem():
    a, b = make_problem().objective_ranges(), make_problem().objective_ranges()
    np.testing.assert_array_equal(a, b)
    assert np.all(a > 0)


def test_same_seed_same_result(results):
    a, b = results["minimize"], results["again"]
    np.testing.assert_array_equal(a.proposals, b.proposals)
    np.testing.assert_array_equal(a.best_values, b.best_values)
    assert not np.array_equal(a.proposals[:, :1], results["other"].proposals)


def test_result_json_round_trip(results, tmp_path):
    res = results["maximize"]
    path = tmp_path / "result.json"
    text = res.to_json(str(path))
    assert path.read_text() == text
    back = labfbo.SimulationResult.from_json(text)
    for name in ("best_values", "simple_regret", "normalized_regret", "auc", "proposals",
                 "bytes_up", "bytes_down", "ask_seconds"):
        np.testing.assert_array_equal(getattr(back, name), getattr(res, name))
        assert getattr(back, name).shape == getattr(res, name).shape
    for name in ("problem", "protocol", "seed", "n_init", "budget", "site_names", "wall_time",
                 "epsilon", "options"):
        assert getattr(back, name) == getattr(res, name), name
    assert back.to_json() == text


def test_builtin_problem_by_name():
    res = labfbo.simulate("branin", n_sites=2, budget=2, n_init=3, seed=0, num_restarts=2, raw_samples=64)
    assert res.n_sites == 2 and res.best_values.shape == (2, 2) and res.proposals.shape[:2] == (2, 2)
    assert res.auc.shape == (2,)
    assert np.all(res.simple_regret >= 0) and np.all(np.diff(res.best_values, axis=1) <= 0)
    problem = labfbo.problems.families.get_problem("branin", n_sites=2, seed=0)
    space = problem.space
    lows = np.array([p.low for p in space.params])
    highs = np.array([p.high for p in space.params])
    assert np.all((res.proposals >= lows) & (res.proposals <= highs))


def test_simulate_configuration_errors():
    with pytest.raises(labfbo.ConfigurationError):
        labfbo.simulate(make_problem(), budget=-1)
    with pytest.raises(labfbo.ConfigurationError):
        labfbo.simulate(make_problem(), budget=1, acquisitoin="ei")
    with pytest.raises(labfbo.ConfigurationError):
        labfbo.simulate(42, budget=1)
    with pytest.raises(labfbo.ConfigurationError):
        FederatedProblem(space=make_problem().space, objectives=[lambda p: 0.0], optima=[0.0, 1.0])


def test_demo_suite_runs_every_protocol_it_lists(tmp_path):
    from labfbo_bench.demo_suite import SuiteConfig, demo_protocols, run_suite

    assert demo_protocols()[0] == "independent" and "distribution" in demo_protocols()
    assert "centralized" not in demo_protocols()
    cfg = SuiteConfig(problem="sinusoid", n_sites=2, n_init=3, budget=2, seeds=[0],
                      protocols=["independent", "distribution"], out=str(tmp_path), workers=1)
    results, png = run_suite(cfg)
    assert [r.protocol for r in results] == ["independent", "distribution"]
    assert png.exists() and (png.parent / "summary.md").exists()
    # the suite journals every site of its federated run and ends with one site's report
    assert sorted(p.name for p in (png.parent / "journals").glob("*.journal")) == ["site-0.journal", "site-1.journal"]
    assert (png.parent / "report-site-0.html").exists()
