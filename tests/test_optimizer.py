"""Optimizer: the ask/tell facade of one site (protocol ``independent``)."""

from __future__ import annotations

import csv
import math
import warnings

import numpy as np
import pytest

import labfbo
from labfbo import Integer, Optimizer, Real, SearchSpace


def snapshot(opt: Optimizer, storage=None):
    """Everything an erroneous call must leave untouched."""
    return (opt.observations, tuple(opt.trials), tuple(opt.pending), opt.best,
            None if storage is None else storage.read_bytes())


def check_user_units(space: SearchSpace, params: dict) -> None:
    assert list(params) == space.names
    for p in space.params:
        v = params[p.name]
        if isinstance(p, Real):
            assert type(v) is float and p.low <= v <= p.high
        elif isinstance(p, Integer):
            assert type(v) is int and p.low <= v <= p.high
        else:
            assert any(type(c) is type(v) and c == v for c in p.choices), v
    space.validate_params(params, strict=True)


def distinct_rows(space: SearchSpace, trials) -> bool:
    X = space.encode([t.params for t in trials])
    return all(np.max(np.abs(X[i] - X[j])) > 1e-9 for i in range(len(X)) for j in range(i))


@pytest.fixture
def told(cont_space, cont_f, fast):
    """An optimizer past its 3-point initial design (3 told observations)."""
    opt = Optimizer(cont_space, n_init=3, seed=1, **fast)
    for t in opt.ask(n=3):
        opt.tell(t, cont_f(t.params))
    return opt


# ----------------------------------------------------------------------- ask
def test_ask_return_types(cont_space, fast):
    opt = Optimizer(cont_space, n_init=3, seed=0, **fast)
    one = opt.ask()
    assert isinstance(one, labfbo.Trial)
    lst = opt.ask(n=1)
    assert isinstance(lst, list) and len(lst) == 1 and isinstance(lst[0], labfbo.Trial)
    assert one.id != lst[0].id
    assert one.metadata["source"] == "design"
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(labfbo.ValidationError):
            opt.ask(n=bad)
    assert len(opt.pending) == 2
    with pytest.raises(
        labfbo.ValidationError, match=r"ask\(n=66\) would propose 65 points from the model .*at most 64"
    ):
        opt.ask(n=66)  # one design point left, 65 from the model: refused at once, nothing journaled
    assert len(opt.pending) == 2
    plate = Optimizer(cont_space, n_init=96, seed=0, **fast)
    assert len(plate.ask(n=96)) == 96  # a 96-well design is not a model batch


def test_ask_batch_in_user_units(mixed_space, mixed_f, fast):
    opt = Optimizer(mixed_space, n_init=3, seed=0, **fast)
    design = opt.ask(n=3)
    assert [t.metadata["source"] for t in design] == ["design"] * 3
    for t in design:
        opt.tell(t, mixed_f(t.params))
    batch = opt.ask(n=3)
    assert len(batch) == 3 and len({t.id for t in batch}) == 3
    assert {t.metadata["source"] for t in batch} == {"model"}
    assert distinct_rows(mixed_space, batch)
    for t in design + batch:
        check_user_units(mixed_space, t.params)


def test_pending_trials_are_never_reproposed(told, cont_space):
    asked = list(told.trials)
    for _ in range(6):
        asked.append(told.ask())
    assert len(told.pending) == 6
    assert distinct_rows(cont_space, asked)


def test_pending_never_reproposed_on_a_small_grid(cont_f, fast):
    space = SearchSpace([Integer("a", 0, 3), Integer("b", 0, 3)])
    opt = Optimizer(space, n_init=2, seed=3, **fast)
    for t in opt.ask(n=2):
        opt.tell(t, (t.params["a"] - 1) ** 2 + (t.params["b"] - 2) ** 2)
    asked = list(opt.trials) + [opt.ask() for _ in range(5)] + opt.ask(n=3)
    points = [tuple(t.params.values()) for t in asked]
    assert len(set(points)) == len(points) == 10


def test_batch_never_repeats_pending(told, cont_space):
    first = told.ask(n=3)
    second = told.ask(n=3)
    assert distinct_rows(cont_space, list(told.trials))
    assert len({t.id for t in first + second}) == 6


# ----------------------------------------------------------------------- tell
def test_tell_float_mean_sem_and_failed(cont_space, fast):
    opt = Optimizer(cont_space, n_init=4, seed=0, **fast)
    a, b, c, d = opt.ask(n=4)
    opt.tell(a, 1.5)
    opt.tell(b.id, (2.5, 0.1))
    opt.tell(np.int64(c.id), np.float64(0.5))
    opt.tell_failed(d, "pump jammed")
    obs = opt.observations
    assert [(o.trial_id, o.value, o.sem) for o in obs] == [(a.id, 1.5, None), (b.id, 2.5, 0.1), (c.id, 0.5, None)]
    assert obs[0].params == a.params
    assert opt.pending == []
    assert opt.best.trial_id == c.id
    states = {t.id: t for t in opt.trials}
    assert set(states) == {a.id, b.id, c.id, d.id}
    with pytest.raises(labfbo.TrialError):
        opt.tell(d, 1.0)  # failed is final
    nxt = opt.ask()  # the model fits with mixed sem / no-sem data
    assert nxt.id == 4 and nxt.metadata["source"] == "model"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1.0", True, None, np.nan,
                                   (1.0, -0.1), (1.0, math.nan), (math.inf, 0.1), (1.0,),
                                   (1.0, 0.1, 0.2), [1.0, "x"], np.array([1.0, 2.0])])
def test_tell_invalid_value_changes_nothing(cont_space, value, tmp_path, fast):
    path = tmp_path / "j.jsonl"
    opt = Optimizer(cont_space, n_init=2, seed=0, storage=str(path), **fast)
    t1, t2 = opt.ask(n=2)
    opt.tell(t1, 1.0)
    before = snapshot(opt, path)
    with pytest.raises(labfbo.LabFBOError):
        opt.tell(t2, value)
    assert snapshot(opt, path) == before
    opt.tell(t2, 2.0)  # still pending, still tellable
    assert len(opt.observations) == 2
    opt.close()


def test_tell_unknown_or_told_id_changes_nothing(cont_space, tmp_path, fast):
    path = tmp_path / "j.jsonl"
    opt = Optimizer(cont_space, n_init=2, seed=0, storage=str(path), **fast)
    t1, t2 = opt.ask(n=2)
    opt.tell(t1, 1.0)
    before = snapshot(opt, path)
    for call in (lambda: opt.tell(999, 1.0), lambda: opt.tell(t1, 2.0), lambda: opt.tell(t1.id, 2.0),
                 lambda: opt.tell_failed(t1, "late"), lambda: opt.tell_failed(12345, "x"),
                 lambda: opt.tell("0", 1.0), lambda: opt.tell(True, 1.0), lambda: opt.tell(-1, 1.0)):
        with pytest.raises(labfbo.TrialError):
            call()
        assert snapshot(opt, path) == before
    with pytest.raises(labfbo.ValidationError):
        opt.tell_failed(t2, reason=42)
    assert snapshot(opt, path) == before
    opt.close()


def test_trial_error_message_names_the_id(cont_space, fast):
    opt = Optimizer(cont_space, n_init=2, seed=0, **fast)
    with pytest.raises(labfbo.TrialError, match="999"):
        opt.tell(999, 1.0)


# ----------------------------------------------------------------------- enqueue
def test_enqueue_registers_a_pending_trial(mixed_space, fast):
    opt = Optimizer(mixed_space, n_init=3, seed=0, **fast)
    t = opt.enqueue({"temperature": 180, "feed_rate": 0.5, "passes": 2.0, "solvent": 7})
    assert t.params == {"temperature": 180.0, "feed_rate": 0.5, "passes": 2, "solvent": 7}
    check_user_units(mixed_space, t.params)
    assert t.metadata["source"] == "enqueued"
    assert opt.pending == [t]
    nxt = opt.ask(n=2)  # the enqueued trial counts towards n_init: 2 design points remain
    assert [x.metadata["source"] for x in nxt] == ["design", "design"]
    assert opt.ask().metadata["source"] == "random"  # nothing told yet: no model


@pytest.mark.parametrize("params, needle", [
    ({"temperature": 180.0, "feed_rate": 0.5, "passes": 2, "solvent": "water", "ph": 7}, "ph"),
    ({"temperature": 180.0, "feed_rate": 0.5, "passes": 2}, "solvent"),
    ({"temperature": "180", "feed_rate": 0.5, "passes": 2, "solvent": "water"}, "temperature"),
    ({"temperature": True, "feed_rate": 0.5, "passes": 2, "solvent": "water"}, "temperature"),
    ({"temperature": 180.0, "feed_rate": 0.5, "passes": 2.5, "solvent": "water"}, "passes"),
    ({"temperature": 180.0, "feed_rate": 0.5, "passes": 2, "solvent": "acetone"}, "solvent"),
    ({"temperature": 180.0, "feed_rate": 0.5, "passes": 2, "solvent": 1}, "solvent"),
    ({"temperature": 260.0, "feed_rate": 0.5, "passes": 2, "solvent": "water"}, "temperature"),
    ({"temperature": 180.0, "feed_rate": 2.0, "passes": 2, "solvent": "water"}, "feed_rate"),
    ({"temperature": 180.0, "feed_rate": 0.5, "passes": 0, "solvent": "water"}, "passes"),
    ({"temperature": math.nan, "feed_rate": 0.5, "passes": 2, "solvent": "water"}, "temperature"),
])
def test_enqueue_invalid_changes_nothing(mixed_space, params, needle, tmp_path, fast):
    path = tmp_path / "j.jsonl"
    opt = Optimizer(mixed_space, n_init=3, seed=0, storage=str(path), **fast)
    t = opt.ask()
    opt.tell(t, 1.0)
    opt.ask()
    before = snapshot(opt, path)
    with pytest.raises(labfbo.SearchSpaceError) as exc:
        opt.enqueue(params)
    assert needle in str(exc.value)
    assert snapshot(opt, path) == before
    opt.close()


# ----------------------------------------------------------------------- historical data
def test_add_observations_out_of_bounds_is_kept(cont_space, cont_f, tmp_path, fast):
    path = tmp_path / "j.jsonl"
    opt = Optimizer(cont_space, n_init=3, seed=0, storage=str(path), **fast)
    rows = [{"x": 7.5, "rate": 0.01}, {"x": 0.0, "rate": 3.0}, {"x": 1.0, "rate": 0.2}]
    with pytest.warns(UserWarning, match="outside the bounds"):
        opt.add_observations(rows, [1.0, 2.0, 3.0])
    obs = opt.observations
    assert [o.params for o in obs] == rows  # raw values, not clipped
    assert [o.value for o in obs] == [1.0, 2.0, 3.0]
    assert all(o.source == "historical" for o in obs)
    t = opt.ask()  # 3 historical observations satisfy n_init=3: the model fits on clipped inputs
    assert t.metadata["source"] == "model"
    check_user_units(cont_space, t.params)
    mean, std = opt.predict(rows)
    assert mean.shape == (3,) and np.all(np.isfinite(mean)) and np.all(std > 0)
    opt.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # replay does not warn again
        again = Optimizer(cont_space, n_init=3, seed=0, storage=str(path), **fast)
    assert [o.params for o in again.observations] == rows
    assert again.pending == [t]
    again.close()


def test_add_observations_is_atomic(mixed_space, tmp_path, fast):
    path = tmp_path / "j.jsonl"
    opt = Optimizer(mixed_space, n_init=3, seed=0, storage=str(path), **fast)
    good = {"temperature": 180.0, "feed_rate": 0.5, "passes": 2, "solvent": "water"}
    before = snapshot(opt, path)
    with pytest.raises(labfbo.SearchSpaceError, match="acetone") as exc:
        opt.add_observations([good, {**good, "passes": 3}, {**good, "solvent": "acetone"}], [1.0, 2.0, 3.0])
    assert "observation 2" in str(exc.value)
    assert snapshot(opt, path) == before
    for rows, values in (([good, good], [1.0, math.nan]),
                         ([good, good], [1.0]),
                         ([good, {**good, "pH": 7}], [1.0, 2.0]),
                         ([good, {**good, "passes": 2.5}], [1.0, 2.0]),
                         ([good, {**good, "temperature": 1e9}], [1.0, "2"])):
        with pytest.raises(labfbo.LabFBOError):
            opt.add_observations(rows, values)
        assert snapshot(opt, path) == before
    assert opt.observations == ()
    opt.close()


def test_historical_observations_count_towards_n_init(cont_space, fast):
    rows = [{"x": x, "rate": r} for x, r in [(-1.0, 0.01), (0.0, 0.1), (1.0, 0.5), (2.0, 0.002)]]
    opt = Optimizer(cont_space, n_init=4, seed=0, **fast)
    opt.add_observations(rows, [4.0, 1.0, 2.0, 3.0])
    assert opt.ask().metadata["source"] == "model"

    opt = Optimizer(cont_space, n_init=4, seed=0, **fast)
    opt.add_observations(rows[:3], [4.0, 1.0, 2.0])
    assert [t.metadata["source"] for t in opt.ask(n=2)] == ["design", "model"]


# ----------------------------------------------------------------------- best / predict
@pytest.mark.parametrize("objective, best_value", [("minimize", -1.0), ("maximize", 5.0)])
def test_best_respects_objective(cont_space, objective, best_value, fast):
    opt = Optimizer(cont_space, objective=objective, n_init=3, seed=0, **fast)
    assert opt.best is None
    opt.add_observations([{"x": 0.0, "rate": 0.1}], [2.0])
    t1, t2 = opt.ask(n=2)
    opt.tell(t1, 5.0)
    opt.tell(t2, -1.0)
    assert opt.best.value == best_value


@pytest.mark.parametrize("objective", ["minimize", "maximize"])
def test_predict_in_user_units(objective, fast):
    space = SearchSpace([Real("x", 0.0, 1.0)])
    opt = Optimizer(space, objective=objective, n_init=0, seed=0, **fast)
    xs = [0.05, 0.2, 0.4, 0.6, 0.8, 0.95]
    ys = [10.0, 8.0, 3.0, -2.0, -6.0, -10.0]
    opt.add_observations([{"x": x} for x in xs], ys)
    query = [{"x": 0.05}, {"x": 0.5}, {"x": 0.95}, {"x": 0.3}]
    mean, std = opt.predict(query)
    assert mean.shape == (4,) and std.shape == (4,)
    assert np.all(std > 0)
    assert mean[0] > 5.0 and mean[2] < -5.0  # the sign is the user's, whatever the objective
    assert mean[0] > mean[1] > mean[2]


def test_predict_needs_data(cont_space, fast):
    opt = Optimizer(cont_space, n_init=2, seed=0, **fast)
    with pytest.raises(labfbo.LabFBOError):
        opt.predict([{"x": 0.0, "rate": 0.1}])
    opt.add_observations([{"x": 0.0, "rate": 0.1}], [1.0])
    with pytest.raises(labfbo.SearchSpaceError):
        opt.predict([{"x": 0.0}])


# ----------------------------------------------------------------------- read-only views
def test_observations_are_read_only(cont_space, fast):
    assert isinstance(Optimizer.observations, property) and Optimizer.observations.fset is None
    opt = Optimizer(cont_space, n_init=2, seed=0, **fast)
    opt.add_observations([{"x": 0.0, "rate": 0.1}], [1.0])
    t = opt.ask()
    opt.tell(t, 2.0)
    obs = opt.observations
    assert isinstance(obs, tuple) and len(obs) == 2
    with pytest.raises(AttributeError):
        opt.observations = ()
    with pytest.raises((TypeError, ValueError, AttributeError)):  # pydantic's frozen-instance error
        obs[0].value = 99.0  # frozen records
    obs[0].params["x"] = 2.5  # mutating a returned dict must not reach the optimizer
    obs[1].params["x"] = 2.5
    assert opt.observations[0].params == {"x": 0.0, "rate": 0.1}
    assert opt.observations[1].params == t.params
    t.params["x"] = 1.0
    assert opt.trials[0].params != t.params


# ----------------------------------------------------------------------- export
def test_to_csv_and_dataframe(cont_space, tmp_path, fast):
    opt = Optimizer(cont_space, n_init=4, seed=0, **fast)
    with pytest.warns(UserWarning, match="outside the bounds"):
        opt.add_observations([{"x": 0.0, "rate": 0.1}, {"x": 5.0, "rate": 0.1}], [1.0, 2.0])
    a, b = opt.ask(n=2)
    opt.tell(a, (3.0, 0.2))
    opt.tell_failed(b, "spilled")
    c = opt.ask()
    path = tmp_path / "history.csv"
    opt.to_csv(str(path))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 5
    assert [r["state"] for r in rows] == ["complete", "complete", "complete", "failed", "pending"]
    assert [r["source"] for r in rows][:2] == ["historical", "historical"]
    assert float(rows[1]["x"]) == 5.0  # raw out-of-bounds value kept
    assert float(rows[2]["value"]) == 3.0 and float(rows[2]["sem"]) == 0.2
    assert rows[3]["reason"] == "spilled"
    assert int(rows[4]["trial_id"]) == c.id
    assert {"x", "rate", "value"} <= set(rows[0])

    df = opt.to_dataframe()
    assert len(df) == 5 and {"trial_id", "state", "x", "rate", "value", "sem"} <= set(df.columns)
    assert list(df["state"]) == [r["state"] for r in rows]
    assert df["x"].iloc[2] == pytest.approx(a.params["x"], rel=1e-12)


# ----------------------------------------------------------------------- configuration
def test_federated_protocol_needs_a_coordinator(cont_space, sum_protocol):
    with pytest.raises(labfbo.ConfigurationError, match=r"needs a coordinator \(coordinator=labfbo.Coordinator"):
        Optimizer(cont_space, protocol="test-sum")
    from labfbo.lab.config import SiteConfig
    from labfbo.lab.run import _check_coordinator

    with pytest.raises(labfbo.ConfigurationError, match="give the site config a `coordinator:`.*protocol: independent"):
        _check_coordinator(SiteConfig(protocol="test-sum"))  # the same check, in a site config's words
    _check_coordinator(SiteConfig(protocol="test-sum", coordinator="mpi"))
    with pytest.raises(labfbo.ConfigurationError, match="token"):
        Optimizer(cont_space, protocol="test-sum", coordinator="https://consortium.example:8443")
    with pytest.raises(labfbo.ConfigurationError, match="URL"):
        Optimizer(cont_space, protocol="test-sum", coordinator="consortium.example")


def test_configuration_errors(cont_space):
    with pytest.raises(labfbo.ConfigurationError, match="no-such-protocol"):
        Optimizer(cont_space, protocol="no-such-protocol")
    with pytest.raises(labfbo.ConfigurationError, match="acquisitoin"):
        Optimizer(cont_space, acquisitoin="ei")
    with pytest.raises(labfbo.ConfigurationError, match="acquisition"):
        Optimizer(cont_space, acquisition="pi")
    with pytest.raises(labfbo.ConfigurationError):
        Optimizer(cont_space, objective="minimise")
    with pytest.raises(labfbo.ConfigurationError):
        Optimizer(cont_space, seed=-1)
    with pytest.raises(labfbo.ConfigurationError):
        Optimizer({"x": (0, 1)})
    assert "independent" in labfbo.available_protocols()


@pytest.mark.parametrize("given, unknown, near", [
    ({"protocl": "surface"}, "protocl", "protocol"),                        # an Optimizer keyword
    ({"seeed": 1}, "seeed", "seed"),
    ({"acquisiton": "ei"}, "acquisiton", "acquisition"),                    # an option of the protocol
    ({"protocol": "gradient", "n_particle": 3}, "n_particle", "n_particles"),
    ({"protocol": labfbo.protocols.Surface(), "fourier_feature": 8}, "fourier_feature", "fourier_features"),
])
def test_a_misspelt_keyword_names_the_closest_valid_one(cont_space, given, unknown, near) -> None:
    with pytest.raises(labfbo.ConfigurationError) as err:
        Optimizer(cont_space, **given)
    assert str(err.value).startswith(f"labfbo.Optimizer() got an unknown keyword {unknown!r}; did you mean {near!r}?")
    assert "invalid options for protocol 'independent'" not in str(err.value)


def test_did_you_mean_in_protocol_options_names_and_the_coordinator() -> None:
    from labfbo.protocols import Gradient, get_protocol

    with pytest.raises(labfbo.ConfigurationError, match=r"invalid options for protocol 'gradient': unknown option "
                                                        r"'n_particle'; did you mean 'n_particles'\? \(its options: "):
        Gradient(n_particle=3)
    with pytest.raises(labfbo.ConfigurationError, match=r"unknown protocol 'surfce'; did you mean 'surface'\?"):
        get_protocol("surfce")
    with pytest.raises(labfbo.ConfigurationError, match=r"labfbo.Coordinator\(\) got an unknown keyword 'horizn'; "
                                                        r"did you mean 'horizon'\?"):
        labfbo.Coordinator("surface", sites=2, horizn=3)
    with pytest.raises(labfbo.ConfigurationError, match=r"unknown keyword 'zzzz' \(labfbo.Optimizer's own"):
        Optimizer(labfbo.SearchSpace([labfbo.Real("x", 0, 1)]), zzzz=1)  # nothing close: no guess


@pytest.mark.parametrize("acquisition", ["ucb", "ei", "nei", "ts"])
@pytest.mark.parametrize("which", ["continuous", "mixed"])
def test_every_acquisition_proposes_batches(acquisition, which, cont_space, mixed_space, cont_f, mixed_f, fast):
    space, f = (cont_space, cont_f) if which == "continuous" else (mixed_space, mixed_f)
    opt = Optimizer(space, n_init=3, seed=0, acquisition=acquisition, mc_samples=32, ts_candidates=256, **fast)
    for t in opt.ask(n=3):
        opt.tell(t, f(t.params))
    batch = opt.ask(n=2)
    assert len(batch) == 2 and [t.metadata["source"] for t in batch] == ["model", "model"]
    assert distinct_rows(space, list(opt.trials))
    for t in batch:
        check_user_units(space, t.params)


@pytest.mark.integration  # a subprocess
def test_jitter_notices_do_not_reach_the_console_but_other_warnings_do() -> None:
    import subprocess
    import sys

    # a fresh interpreter: what a lab script's console shows (pytest resets warning filters per test)
    script = ("import warnings, torch, labfbo\n"
              "from linear_operator.utils.cholesky import psd_safe_cholesky\n"
              "psd_safe_cholesky(torch.ones(3, 3, dtype=torch.float64))  # singular: GPyTorch adds jitter\n"
              "warnings.warn('something a lab should see', UserWarning)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "something a lab should see" in proc.stderr and "added jitter" not in proc.stderr, proc.stderr


def test_a_long_batch_shows_a_notice_on_a_terminal(cont_space, cont_f, fast, monkeypatch):
    import io
    import time

    from labfbo.core import progress

    out = io.StringIO()
    with progress.slow_notice("proposing a batch of 8", after=0.1, stream=out, force=True):
        time.sleep(1.3)
    assert "proposing a batch of 8" in out.getvalue() and "00:01" in out.getvalue()
    quiet = io.StringIO()
    with progress.slow_notice("fast", after=0.5, stream=quiet, force=True):
        pass
    assert quiet.getvalue() == ""
    # through ask(n): on stderr (not a terminal under pytest: tqdm stays silent unless forced)
    monkeypatch.setattr(progress, "NOTICE_AFTER", 0.0)
    seen: list[str] = []
    real = progress.slow_notice
    monkeypatch.setattr("labfbo.optimizer.slow_notice", lambda what: (seen.append(what), real(what))[1])
    opt = Optimizer(cont_space, n_init=2, seed=0, site="lab", **fast)
    for t in opt.ask(n=2):
        opt.tell(t, cont_f(t.params))
    opt.ask(n=3)
    opt.ask()
    assert seen == ["lab: proposing a batch of 3 from the model"]
