"""Named objectives, outcome constraints and several objectives, alone and federated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import labfbo
from labfbo import Objective, Outcome, Real, SearchSpace

FAST = {"num_restarts": 2, "raw_samples": 32, "mc_samples": 64}
SPACE = SearchSpace([Real("x", 0, 1), Real("y", 0, 1)])
TWO = [Objective("yield", "maximize"), Objective("cost", "minimize", threshold=12.0)]
PURE = [Outcome("impurity", "<=", 0.5)]


def lab(p: dict, shift: float = 0.0) -> dict:
    x, y = p["x"], p["y"]
    return {"yield": 80 * np.sin(3 * (x + shift)) * y + 10, "cost": 10 * x + 2 * y,
            "impurity": (0.8 * x + 0.5 * (1 - y), 0.01)}


def test_tell_takes_every_named_outcome_and_refuses_anything_else() -> None:
    opt = labfbo.Optimizer(SPACE, objective=TWO, outcome_constraints=PURE, seed=0, n_init=2)
    tr = opt.ask()
    with pytest.raises(labfbo.ValidationError, match=r"missing \['impurity'\], unknown \['purity'\]"):
        opt.tell(tr, {"yield": 1.0, "cost": 2.0, "purity": 0.1})
    with pytest.raises(labfbo.ValidationError, match="tell takes a dict"):
        opt.tell(tr, 1.0)
    with pytest.raises(labfbo.ValidationError, match="outcome 'cost'"):
        opt.tell(tr, {"yield": 1.0, "cost": float("nan"), "impurity": 0.1})
    assert [t.id for t in opt.pending] == [tr.id]  # refused: nothing changed
    opt.tell(tr, {"yield": 1.0, "cost": 2.0, "impurity": (0.1, 0.01)})
    assert opt.observations[0].outcomes == {"yield": 1.0, "cost": 2.0, "impurity": 0.1}
    plain = labfbo.Optimizer(SPACE, seed=0, n_init=1)
    with pytest.raises(labfbo.ValidationError, match="one unnamed value"):
        plain.tell(plain.ask(), {"yield": 1.0})


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="need a named objective"):
        labfbo.Optimizer(SPACE, objective="maximize", outcome_constraints=PURE)
    with pytest.raises(labfbo.ConfigurationError, match="distinct"):
        labfbo.Optimizer(SPACE, objective=[Objective("a"), Objective("a", "minimize")])
    with pytest.raises(labfbo.ConfigurationError, match="log-acquisition"):
        labfbo.Optimizer(SPACE, objective=TWO, acquisition="ucb")
    with pytest.raises(labfbo.ConfigurationError, match="Outcome 'p'"):
        Outcome("p", "<", 1.0)


def test_best_is_feasible_and_the_front_is_not_dominated() -> None:
    opt = labfbo.Optimizer(SPACE, objective=TWO, outcome_constraints=PURE, seed=0, n_init=0)
    opt.add_observations([{"x": 0.9, "y": 0.1}], [{"yield": 99.0, "cost": 1.0, "impurity": 0.9}])
    assert opt.best is None and opt.pareto_front() == []  # nothing feasible yet
    rows = [({"x": 0.1, "y": 0.9}, 50.0, 3.0), ({"x": 0.2, "y": 0.8}, 60.0, 5.0), ({"x": 0.3, "y": 0.7}, 55.0, 6.0)]
    opt.add_observations([p for p, *_ in rows], [{"yield": a, "cost": c, "impurity": 0.2} for _, a, c in rows])
    assert opt.best.outcomes["yield"] == 60.0  # the best feasible by the first objective
    assert [o.outcomes["yield"] for o in opt.pareto_front()] == [50.0, 60.0]  # (55, 6) is dominated by (60, 5)
    df = opt.to_dataframe()
    assert {"yield", "cost", "impurity"} <= set(df.columns) and df["impurity"].tolist()[0] == 0.9


@pytest.mark.integration  # a model-based campaign
def test_outcome_constraints_steer_away_from_infeasible_experiments(tmp_path: Path) -> None:
    path = tmp_path / "site.jsonl"
    opt = labfbo.Optimizer(SPACE, objective=Objective("yield"), outcome_constraints=PURE, seed=1, n_init=4,
                           storage=str(path), **FAST)
    for _ in range(10):
        tr = opt.ask()
        opt.tell(tr, {k: v for k, v in lab(tr.params).items() if k != "cost"})
    model_obs = opt.observations[4:]
    assert opt.best is not None and opt.best.outcomes["impurity"] <= 0.5
    assert sum(o.outcomes["impurity"] > 0.5 for o in model_obs) <= 3
    pred = opt.predict([{"x": 0.5, "y": 0.5}])
    assert set(pred) == {"yield", "impurity"} and pred["impurity"][1][0] > 0
    nxt = opt.ask().params
    opt.close()
    again = labfbo.Optimizer(SPACE, objective=Objective("yield"), outcome_constraints=PURE, seed=1, n_init=4,
                             storage=str(path), **FAST)  # resumes: the outcomes replay
    assert again.best == opt.best and again.pending[0].params == nxt
    again.close()
    with pytest.raises(labfbo.JournalError, match="outcomes"):
        labfbo.Optimizer(SPACE, objective=Objective("yield"), outcome_constraints=[Outcome("impurity", "<=", 0.4)],
                         seed=1, n_init=4, storage=str(path), **FAST)


@pytest.mark.integration  # qLogNEHVI
def test_independent_finds_a_front_with_several_objectives() -> None:
    opt = labfbo.Optimizer(SPACE, objective=TWO, seed=2, n_init=4, **FAST)
    for _ in range(8):
        tr = opt.ask()
        opt.tell(tr, {k: v for k, v in lab(tr.params).items() if k != "impurity"})
    front = opt.pareto_front()
    assert len(front) >= 2 and opt.best.outcomes["yield"] == max(o.outcomes["yield"] for o in opt.observations)


def test_parego_weights_are_shared_by_the_round_and_change_with_it() -> None:
    spec = labfbo.core.objectives.OutcomeSpec(objectives=tuple(TWO))
    Y = np.random.default_rng(0).random((6, 2))
    a, b = spec.chebyshev(Y, seed=5, round=3), spec.chebyshev(Y, seed=5, round=3)
    assert np.array_equal(a, b) and not np.allclose(a, spec.chebyshev(Y, seed=5, round=4))


@pytest.mark.integration  # a multi-site campaign per protocol
@pytest.mark.parametrize("protocol,options", [("distribution", {"M": 32, "candidates": 64}), ("consensus", {}),
                                              ("gradient", {"n_particles": 4, "hidden": [8, 8], "warmup_steps": 3,
                                                            "svgd_steps": 2}), ("surface", {})])
def test_federated_sites_never_send_their_constraint_outcomes(protocol: str, options: dict) -> None:
    coord = labfbo.Coordinator(protocol, sites=["a", "b"], seed=4, horizon=3, **{**FAST, **options})
    sites = [labfbo.Optimizer(SPACE, objective=TWO, outcome_constraints=PURE, protocol=protocol, coordinator=coord,
                              site=s, seed=4, n_init=3, secret=7 + i, **{**FAST, **options})
             for i, s in enumerate(["a", "b"])]
    secret_values = set()
    for i, o in enumerate(sites):
        for t in o.ask(n=3):
            m = lab(t.params, 0.1 * i)
            secret_values.add(round(m["impurity"][0], 9))
            o.tell(t, m)
    for _ in range(2):
        trials = [o.ask() for o in sites]
        for i, (o, t) in enumerate(zip(sites, trials)):
            m = lab(t.params, 0.1 * i)
            secret_values.add(round(m["impurity"][0], 9))
            o.tell(t, m)
    # a value with a short decimal form (0.0 at the corner x=0, y=1) occurs in any message: only
    # the distinctive ones (six characters or more) can be looked for, and most values are distinctive
    distinctive = {f"{v:.9g}"[:8] for v in secret_values if len(f"{v:.9g}") >= 6}
    assert len(distinctive) >= len(secret_values) - 2
    for o in sites:
        sent = " ".join(m.model_dump_json() for m in o.sent_messages())
        assert "impurity" not in sent
        assert not any(s in sent for s in distinctive)
        assert len(o.observations) == 5


# -- adapters, site configs, the closed loop -------------------------------------------------------------
def test_measurements_carry_named_outcomes() -> None:
    from labfbo.adapters import Measurement

    m = Measurement.coerce({"yield": 81.2, "impurity": (0.3, 0.02)})
    assert m.outcomes == {"yield": 81.2, "impurity": (0.3, 0.02)} and m.told() == m.outcomes
    with pytest.raises(ValueError, match="standard error must be >= 0"):
        Measurement.of({"yield": (1.0, -1.0)})
    with pytest.raises(ValueError, match="not both"):
        Measurement(value=1.0, outcomes={"yield": 1.0})


def test_the_csv_and_command_adapters_read_a_column_or_a_key_per_outcome(tmp_path: Path) -> None:
    import sys

    from labfbo.adapters import AdapterContext, Measurement, load_adapter
    from labfbo.core.trial import Trial

    ctx = AdapterContext(site="a", space=SPACE, campaign="c0ffee", outcomes=["yield", "Impurity"])
    q, r = tmp_path / "queue.csv", tmp_path / "results.csv"
    a = load_adapter("csv", queue=str(q), results=str(r))
    a.prepare(ctx)
    h = a.submit(Trial(id=0, params={"x": 0.5, "y": 0.5}))
    r.write_text("trial_id,yield,impurity,impurity_sem,operator\n0,81.5,,,\n")
    with pytest.warns(UserWarning, match=r"no value for outcome\(s\) \['impurity'\]"):
        assert a.poll(h) is None  # waits for a corrected row
    with open(r, "a") as fh:
        fh.write("0,81.5,0.4,0.01,jd\n")
    with pytest.warns(UserWarning, match="2 result rows for trial 0; using the first that parses"):
        assert a.poll(h) == Measurement.of({"yield": 81.5, "Impurity": (0.4, 0.01)}, operator="jd")
    code = "import json; print(json.dumps({'outcomes': {'yield': 70.0, 'impurity': [0.2, 0.01]}, 'batch': 'B7'}))"
    cmd = load_adapter("command", command=[sys.executable, "-c", code], parse="json")
    assert cmd.run(Trial(id=1, params={"x": 0.1, "y": 0.1})) == Measurement.of(
        {"yield": 70.0, "impurity": (0.2, 0.01)}, batch="B7")


def test_a_site_config_declares_objectives_constraints_and_space_constraints(tmp_path: Path) -> None:
    import yaml

    from labfbo.adapters import Adapter
    from labfbo.lab import SiteConfig

    cfg = {"site": "lab-a", "seed": 0, "n_init": 3, "budget": 3, "storage": "lab-a.journal",
           "space": {"params": [{"name": "x", "type": "real", "low": 0, "high": 1},
                                {"name": "y", "type": "real", "low": 0, "high": 1}],
                     "constraints": [{"type": "linear", "coefficients": {"x": 1, "y": 1}, "op": "<=", "rhs": 1.2}]},
           "objective": [{"name": "yield", "direction": "maximize"}, {"name": "cost", "direction": "minimize"}],
           "outcome_constraints": [{"name": "impurity", "op": "<=", "bound": 0.5}],
           "options": FAST}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(cfg))
    config = SiteConfig.load(path)

    class Lab(Adapter):
        name = "lab"

        def run(self, trial):  # noqa: ANN001, ANN201
            return lab(trial.params) if trial.id != 2 else {"yield": 1.0}  # trial 2 forgets two outcomes

    from labfbo.lab.loop import CampaignLoop
    from labfbo.lab.run import open_optimizer

    opt = open_optimizer(config, Lab(), secret=1)
    CampaignLoop(opt, Lab(), budget=config.budget).run()
    df = opt.to_dataframe()
    assert {"yield", "cost", "impurity"} <= set(df.columns) and len(df) == 6
    assert (df["state"] == "failed").sum() == 1 and "outcomes: missing" in df["reason"].dropna().iloc[0]
    assert all(p["x"] + p["y"] <= 1.2 + 1e-9 for p in df[["x", "y"]].to_dict("records"))
    assert opt.space.constraints and opt.outcomes.names == ["yield", "cost", "impurity"]
    opt.close()


def test_the_multiobjective_bench_measures_hypervolume_and_lists_its_runs() -> None:
    from labfbo_bench import multiobjective as mo

    problem = mo._botorch_problem("branin_currin")
    # (f1, f2) = (8, 3) dominates the box up to the reference point (18, 6): 10 x 3
    assert mo.hypervolume(problem, [{"f1": 8.0, "f2": 3.0}]) == pytest.approx(30.0)
    assert mo.hypervolume(problem, [{"f1": 8.0, "f2": 3.0}, {"f1": 9.0, "f2": 4.0}]) == pytest.approx(30.0)
    assert mo.hypervolume(problem, [{"f1": 20.0, "f2": 1.0}]) == 0.0  # beyond the reference point
    c2 = mo._botorch_problem("c2dtlz2")
    assert mo.hypervolume(c2, [{"f1": 0.1, "f2": 0.1, "slack": -0.01}]) == 0.0  # infeasible: not counted
    dtlz = mo.shifted_dtlz2(np.array([0.05, -0.1, 0.02, 0.0, 0.08]))
    front = [dtlz.evaluate(np.r_[a, 0.5 + np.array([0.05, -0.1, 0.02, 0.0, 0.08])]) for a in np.linspace(0, 1, 200)]
    assert mo.hypervolume(dtlz, front) / dtlz.max_hv == pytest.approx(1.0, abs=0.01)  # the shift keeps the front
    assert mo.hypervolume(dtlz, [dtlz.evaluate(np.full(6, 0.5))]) < 0.9 * dtlz.max_hv
    quick = mo.jobs("out", quick=True, seeds=[0, 1])
    assert {j.problem for j in quick if j.part == "family"} == set(mo.FAMILIES)
    assert {j.part for j in quick} == {"single", "constrained", "family"}
    assert "gradient" not in {j.method for j in quick if j.part == "family"}
    assert len({j.path for j in quick}) == len(quick)


@pytest.mark.integration  # model-based asks
def test_batches_that_mix_design_and_model_points_keep_every_outcome(tmp_path: Path) -> None:
    opt = labfbo.Optimizer(SPACE, objective=Objective("yield"), outcome_constraints=PURE, seed=3, n_init=4,
                           **FAST)
    for t in opt.ask(n=2):
        opt.tell(t, {k: v for k, v in lab(t.params).items() if k != "cost"})
    batch = opt.ask(n=4)  # two design points and two from the constrained model
    assert [t.metadata["source"] for t in batch] == ["design", "design", "model", "model"]
    for t in batch:
        opt.tell(t, {k: v for k, v in lab(t.params).items() if k != "cost"})
    opt.save(str(tmp_path / "snap.jsonl"))
    back = labfbo.Optimizer.load(str(tmp_path / "snap.jsonl"))
    assert back.outcomes == opt.outcomes and back.best == opt.best and len(back.observations) == 6


@pytest.mark.integration  # a two-site campaign
def test_sites_with_their_own_seeds_share_the_rounds_parego_weights() -> None:
    coord = labfbo.Coordinator("consensus", sites=["a", "b"], seed=11, horizon=3, **FAST)
    sites = [labfbo.Optimizer(SPACE, objective=TWO, outcome_constraints=PURE, protocol="consensus",
                              coordinator=coord, site=s, seed=seed, n_init=3, **FAST)
             for s, seed in (("a", 1), ("b", 2))]
    for i, o in enumerate(sites):
        for t in o.ask(n=3):
            o.tell(t, lab(t.params, 0.1 * i))
    for o in sites:  # the round's target is scalarized with the study's seed (11), not the site's own
        raw = o.site_data()
        assert np.array_equal(o.agent.round_data(raw, 1).y, o.outcomes.chebyshev(raw.Y[:, :2], 11, 1))
        assert not np.array_equal(o.agent.round_data(raw, 1).y, o.outcomes.chebyshev(raw.Y[:, :2], o.seed, 1))
    for o in sites:  # consensus with a batch: its local fill-in keeps the outcome data
        assert len(o.ask(n=2)) == 2
