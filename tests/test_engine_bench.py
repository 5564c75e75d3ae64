"""The engine suite: its panel, shared designs, metrics and the loss check; the engine's
categorical kernel and discrete optimizers."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo.core.exceptions import ConfigurationError
from labfbo.models.gp import SurrogateOptions, fit_local_gp, predict
from labfbo_bench import engine
from labfbo_bench.engine_panel import PANEL, QUICK, REAL, SYNTHETIC, engine_problem

pytestmark = pytest.mark.integration  # the engine benchmark: Optuna and BoTorch loops


def test_panel_covers_the_issue():
    problems = [engine_problem(n, 0) for n in SYNTHETIC]
    assert len(problems) == 15 and set(QUICK) <= set(PANEL) and set(PANEL) == {*SYNTHETIC, *REAL}
    dims = [p.space.dim for p in problems]
    assert min(dims) == 2 and max(dims) == 10
    assert any(not p.space.is_continuous for p in problems)
    assert any(p.noise_sd > 0 for p in problems) and any(p.noise_sd == 0 for p in problems)
    for p in problems:
        assert 5 <= p.n_init <= 10 and 20 <= p.budget <= 50
        u = np.random.default_rng(0).random((64, p.space.dim))
        vals = [p.fn(x) for x in p.space.decode(p.space.snap(u))]
        assert min(vals) >= p.f_min - 1e-9 and p.f_range > 0, p.name


def test_every_buchwald_hartwig_lab_is_a_panel_problem_on_its_yields():
    from labfbo.datasets import load_reactions

    data = load_reactions()
    assert len(REAL) == len(data.labs) == 15
    for i, name in enumerate(REAL):
        p = engine_problem(name, 0)
        assert (p.n_init, p.budget, p.noise_sd) == (3, 20, 0.0)
        table = data.tables[i]
        assert p.f_min == -data.best(i)  # regret 0 at the lab's best yield, in yield points
        worst = 0.0 if len(table) < 276 else min(max(v, 0.0) for v in table.values())  # a missing one yields 0
        assert p.f_range == pytest.approx(data.best(i) - worst)
        combo, y = next(iter(table.items()))
        assert p.fn(dict(zip(data.space.names, combo))) == -max(y, 0.0)


def test_family_problems_change_with_the_seed():
    a, b = engine_problem("branin_site", 0), engine_problem("branin_site", 1)
    assert a.f_min != b.f_min


def test_unknown_names_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="unknown engine methods"):
        engine.jobs(str(tmp_path), ["branin"], [0], ["labfbo", "nope"])
    with pytest.raises(ConfigurationError, match="unknown engine problems"):
        engine.jobs(str(tmp_path), ["nope"], [0])


def test_every_method_starts_from_the_same_design(tmp_path):
    jobs = engine.jobs(str(tmp_path), ["branin_catalyst"], [1], list(engine.DEFAULT_METHODS))
    jobs = [engine.EngineJob(**{**j.__dict__, "budget": 2}) for j in jobs]
    for j in jobs:
        engine.run_engine_job(j)
    recs = engine.load(jobs)
    n0 = recs[0]["n_init"]
    for r in recs:
        assert len(r["values"]) == n0 + 2 and len(r["ask_seconds"]) == 2
        assert r["values"][:n0] == recs[0]["values"][:n0]
    assert engine.jobs(str(tmp_path), ["branin_catalyst"], [1])[0].path == jobs[0].path  # cached
    text = engine.report(recs, ["branin_catalyst"], list(engine.DEFAULT_METHODS))
    assert "mean rank" in text and "labfbo: above both" in text


def _rec(problem, label, seed, final):
    return {"problem": problem, "label": label, "seed": seed, "n_init": 1, "f_min": 0.0, "f_range": 1.0,
            "values": [1.0, final], "ask_seconds": [0.1]}


def test_ranks_and_the_loss_check():
    recs = []
    for s in range(4):
        recs += [_rec("p", "labfbo", s, 0.5 + 0.01 * s), _rec("p", "optuna", s, 0.1), _rec("p", "botorch", s, 0.2),
                 _rec("q", "labfbo", s, 0.1), _rec("q", "optuna", s, 0.3 + 0.1 * s), _rec("q", "botorch", s, 0.05)]
    table = engine.cells(recs)
    assert engine.losses(table, ["p", "q"]) == ["p"]  # q: above optuna? no, below it
    ranks = engine.mean_ranks(table, ["p", "q"], ["labfbo", "optuna", "botorch"])
    assert ranks == {"labfbo": 2.5, "optuna": 2.0, "botorch": 1.5}
    assert engine.regret_curve(recs[0]).tolist() == [0.5]


def test_categorical_codes_are_not_ordinal():
    """Relabelling the choices (so every code moves) leaves the model's predictions unchanged."""
    rng = np.random.default_rng(0)
    names = ["a", "b", "c", "d"]
    perm = ["c", "a", "d", "b"]
    x = rng.random(16)
    cats = [names[i] for i in rng.integers(0, 4, 16)]
    y = np.sin(6 * x) + np.array([names.index(c) for c in cats]) * 0.7

    def preds(order):
        space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Categorical("c", order)])
        X = space.encode([{"x": a, "c": c} for a, c in zip(x, cats)])
        model = fit_local_gp(X, y, cat_dims=[1], seed=0)
        test = space.encode([{"x": 0.5, "c": c} for c in names])
        return predict(model, test)[0]

    assert np.allclose(preds(names), preds(perm), atol=1e-4)


def test_fully_discrete_space_never_repeats_an_observed_point():
    space = labfbo.SearchSpace([labfbo.Integer("k", 0, 3), labfbo.Categorical("c", ["a", "b", "c"])])
    opt = labfbo.Optimizer(space, seed=0, n_init=3)
    seen = []
    for _ in range(12):
        t = opt.ask()
        seen.append((t.params["k"], t.params["c"]))
        opt.tell(t, abs(t.params["k"] - 2) + "abc".index(t.params["c"]))
    design, proposed = seen[:3], seen[3:]  # (a snapped design may repeat itself)
    assert len(set(proposed)) == len(proposed) and not set(proposed) & set(design)
    assert len(set(seen)) >= 11
    batch = opt.ask(n=2)  # every combination tried: the whole grid is scored again
    assert len({(t.params["k"], t.params["c"]) for t in batch}) == 2


@pytest.mark.parametrize("options", [dict(kernel="matern52"), dict(input_warping=True),
                                     dict(acquisition="ucb"), dict(sample_around_best=True)])
def test_engine_options_propose_feasible_points(options):
    space = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Real("y", -1, 1),
                                labfbo.Categorical("c", ["p", "q"])])
    opt = labfbo.Optimizer(space, seed=1, n_init=4, **options)
    for _ in range(6):
        t = opt.ask()
        assert 0 <= t.params["x"] <= 1 and -1 <= t.params["y"] <= 1 and t.params["c"] in ("p", "q")
        opt.tell(t, (t.params["x"] - 0.2) ** 2 + t.params["y"] ** 2 + (t.params["c"] == "q"))
    assert opt.best.value < 1.0


def test_surrogate_options_are_validated():
    with pytest.raises(ValueError):
        SurrogateOptions(kernel="linear")
    with pytest.raises(labfbo.core.exceptions.ConfigurationError):
        labfbo.Optimizer(labfbo.SearchSpace([labfbo.Real("x", 0, 1)]), kernel="linear")


def test_latency_bench_times_three_sides():
    from labfbo.problems.families import get_problem
    from labfbo_bench.latency import format_rows, measure

    row = measure(get_problem("branin", n_sites=1, seed=0), n_obs=8, repeats=1)
    assert row.labfbo_s > 0 and row.botorch_s > 0 and row.tutorial_s > 0
    assert row.ratio > 0 and row.tutorial_ratio > 0
    assert "tutorial loop" in format_rows([row])


def test_the_same_model_loop_selects_its_noise_prior_as_labfbo_does():
    import torch

    from labfbo.models.gp import loo_log_density
    from labfbo_bench.latency import _loop_gp, botorch_loop_step

    rng = np.random.default_rng(0)
    X = rng.random((20, 2)) * [4, 2] - [1, 0]
    y = -((X[:, 0] - 1) ** 2 + (X[:, 1] - 0.5) ** 2)  # noiseless and smooth: the interpolating fit wins
    bounds = np.array([[-1.0, 3.0], [0.0, 2.0]])
    step = {p: botorch_loop_step(X, y, bounds, seed=3, noise_prior=p, output_transform="standardize")
            for p in ("lognormal", "gamma", "auto")}
    b = torch.as_tensor(bounds.T, dtype=torch.float64)
    fits = {p: _loop_gp(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), b, p, "matern52")
            for p in ("lognormal", "gamma")}
    best = max(fits, key=lambda p: loo_log_density(fits[p]))
    assert best == "gamma" and fits["gamma"].likelihood.noise.item() < fits["lognormal"].likelihood.noise.item()
    assert np.array_equal(step["auto"], step[best]) and not np.array_equal(step["lognormal"], step["gamma"])
    assert np.all((step["auto"] >= bounds[:, 0]) & (step["auto"] <= bounds[:, 1]))


def test_the_same_model_loop_winsorizes_when_labfbo_does():
    from labfbo.models.gp import winsorized
    from labfbo_bench.latency import botorch_loop_step

    rng = np.random.default_rng(2)
    X = rng.random((12, 2))
    y = -((X - 0.4) ** 2).sum(axis=1)
    y[:2] = -30.0                                                    # two failed runs
    assert not np.array_equal(winsorized(y), y)
    default = botorch_loop_step(X, y, np.array([[0.0, 1.0], [0.0, 1.0]]), seed=1, output_transform="winsorize")
    by_hand = botorch_loop_step(X, winsorized(y), np.array([[0.0, 1.0], [0.0, 1.0]]), seed=1,
                                output_transform="standardize")
    plain = botorch_loop_step(X, y, np.array([[0.0, 1.0], [0.0, 1.0]]), seed=1, output_transform="standardize")
    np.testing.assert_array_equal(default, by_hand)
    assert not np.array_equal(default, plain)


def test_engine_cli_reports_from_the_cache(tmp_path, capsys):
    from labfbo.cli import main

    out = tmp_path / "eng"
    jobs = engine.jobs(str(out), ["branin"], [0], ["random", "labfbo"])
    for j in jobs:  # a tiny budget cached under the suite's paths
        engine.run_engine_job(engine.EngineJob(**{**j.__dict__, "budget": 2}))
    assert main(["bench", "engine", "--problems", "branin", "--seeds", "1", "--methods", "random", "labfbo",
                 "--workers", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "0 to do" in text and "| branin | 2 | labfbo |" in text
    assert (out / "summary.md").exists()
    with pytest.raises(SystemExit):  # argparse refuses an unknown method by name
        main(["bench", "engine", "--methods", "nope"])


def test_engine_cli_runs_one_named_family(tmp_path, capsys):
    from labfbo.cli import main

    out = tmp_path / "fam"
    assert main(["bench", "engine", "--families", "branin_family-5x(3+20)", "--seeds", "1", "--methods", "random",
                 "--workers", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "5 runs (5 to do)" in text and "| branin_family-5x(3+20) | random | 1 |" in text
    assert "hartmann3" not in text


def test_latency_bench_has_the_categorical_rows():
    from labfbo_bench.latency import categorical_rows

    rows = categorical_rows(repeats=1, n_obs=10)
    assert len(rows) == 4 and "276 combinations" in rows[2] and "4 reals" in rows[3]
    for row in rows[2:]:
        assert float(row.split("|")[-2].strip().rstrip("x")) > 0


def test_reaction_labs_are_engine_problems_with_their_structures():
    from labfbo.datasets import load_family

    data = load_family("borylation")
    p = engine_problem("borylation#04", 0)
    assert (p.n_init, p.budget) == (3, 15) and p.f_min == -data.best(4)
    combo, y = next(iter(data.tables[4].items()))
    assert p.fn(dict(zip(data.space.names, combo))) == -y
    pytest.importorskip("rdkit")
    enc = p.encoded("rdkit")
    assert enc.names == p.space.names and all(q.descriptors is not None for q in enc.params)


def test_engine_cli_runs_reaction_labs_and_reports_in_yield_points(tmp_path, capsys):
    from labfbo.cli import main

    out = tmp_path / "rx"
    assert main(["bench", "engine", "--family", "deoxyfluorination", "--labs", "2", "--seeds", "2", "--methods",
                 "optuna", "random", "--workers", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "8 runs (8 to do)" in text
    assert "| deoxyfluorination | random | 2 |" in text and "| deoxyfluorination | optuna | 2 |" in text
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["deoxyfluorination#00", "deoxyfluorination#19"]


def _record(problem: str, label: str, seed: int, regrets: list[float]) -> dict:
    """A cached run whose simple regret after each experiment past the first one is ``regrets``."""
    return {"problem": problem, "label": label, "seed": seed, "n_init": 1, "f_min": 0.0, "f_range": 1.0,
            "values": [regrets[0], *regrets]}


def test_leave_one_family_out_picks_on_the_other_groups():
    from labfbo_bench.engine_lofo import lofo, score

    # 'steady' is as good as Optuna everywhere; 'tuned' is far ahead on two families and far behind on
    # the third: picked when that third family is held out, never when one of the other two is (the
    # score is the worst checkpoint: a default that is never behind)
    recs = []
    for s in range(3):
        for fam, tuned in (("borylation", 0.2), ("deoxyfluorination", 0.2), ("buchwald_hartwig", 5.0)):
            recs += [
                _record(f"{fam}#00", "optuna", s, [10.0 + s] * 12),
                _record(f"{fam}#00", "steady", s, [10.0 + s] * 12),
                _record(f"{fam}#00", "tuned", s, [tuned * (10.0 + s)] * 12),
            ]
    groups = ["borylation", "deoxyfluorination", "buchwald_hartwig"]
    assert score(recs, "borylation", "tuned") == pytest.approx(0.2) and score(recs, "borylation", "steady") == 1.0
    text = lofo(recs, groups, ["steady", "tuned"])
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| tuned |" in rows["buchwald_hartwig"] and "| 5.00 |" in rows["buchwald_hartwig"]
    assert "| steady |" in rows["borylation"] and "| steady |" in rows["deoxyfluorination"]
    assert "Picked on every group: **steady**" in text  # worst score 1.0 against 5.0
