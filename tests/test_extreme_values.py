"""A wrong number, a corrupted journal or a hostile string does not brick a campaign or a consortium."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo.models.gp import TAME_SPREADS, tamed
from labfbo.protocols import get_protocol

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Real("y", 0, 1)])
FAST = {"num_restarts": 2, "raw_samples": 32}


def test_ordinary_values_are_left_as_they_are() -> None:
    rng = np.random.default_rng(0)
    for y in (rng.normal(size=30), rng.lognormal(0, 3, size=30), np.r_[np.zeros(20), 44.0, 1.2, 0.3],
              np.array([1.0, 2.0]), np.array([5.0, 5.0, 5.0])):
        assert np.array_equal(tamed(y), y)


def test_an_extreme_value_is_pulled_in_but_keeps_its_place() -> None:
    y = np.array([0.1, 0.4, 0.2, 0.9, 1e308, -1e200, 0.5])
    t = tamed(y)
    assert np.array_equal(np.argsort(t), np.argsort(y))  # the order is kept
    assert np.array_equal(t[[0, 1, 2, 3, 6]], y[[0, 1, 2, 3, 6]])  # the ordinary values are untouched
    spread = np.median(np.abs(y - np.median(y)))
    assert TAME_SPREADS * spread < t[4] - np.median(y) < (TAME_SPREADS + 800) * spread
    assert np.all(np.isfinite(t)) and np.std(t[[0, 1, 2, 3, 6]]) / np.std(t) > 1e-6  # the rest keep a scale


@pytest.mark.parametrize("value", [-1e200, 1e308])  # each the bad tail under one objective, the good under the other
@pytest.mark.parametrize("objective", ["maximize", "minimize"])
def test_a_campaign_keeps_proposing_after_an_extreme_value(objective: str, value: float) -> None:
    opt = labfbo.Optimizer(SPACE, objective, seed=0, n_init=3, **FAST)
    for _ in range(4):
        t = opt.ask()
        opt.tell(t, t.params["x"])
    opt.tell(opt.ask(), value)
    for _ in range(2):
        t = opt.ask()
        assert SPACE.violations(t.params) == []
        opt.tell(t, t.params["x"])
    assert opt.best.value == (value if (value > 0) == (objective == "maximize") else
                              max(o.value for o in opt.observations) if objective == "maximize" else
                              min(o.value for o in opt.observations))
    mean, std = opt.predict([{"x": 0.5, "y": 0.5}])
    assert np.isfinite(mean).all() and np.isfinite(std).all()


@pytest.mark.integration  # a three-site campaign
def test_a_federated_campaign_keeps_going_after_one_sites_extreme_value() -> None:
    # the extreme is the site's 4th value: a spread from quantiles would be set by the outlier itself
    opts = {**FAST, **get_protocol("surface").quick_options}
    coord = labfbo.Coordinator("surface", sites=["a", "b", "c"], seed=1, horizon=3, **opts)
    sites = [labfbo.Optimizer(SPACE, "maximize", protocol="surface", coordinator=coord, site=s, seed=1, n_init=3,
                              secret=i + 1, **opts) for i, s in enumerate("abc")]
    for o in sites:
        for t in o.ask(n=3):
            o.tell(t, t.params["x"])
    for r in range(2):
        batch = [o.ask() for o in sites]
        for i, (o, t) in enumerate(zip(sites, batch)):
            o.tell(t, 1e200 if (r, i) == (0, 0) else t.params["x"])
    assert all(len(o.observations) == 5 for o in sites)


def _journaled_site(path) -> labfbo.Optimizer:
    """A site journaling to ``path`` with four results told (the last trial: ``opt.trials[-1]``)."""
    opt = labfbo.Optimizer(SPACE, "maximize", seed=0, n_init=3, storage=path, **FAST)
    for _ in range(4):
        t = opt.ask()
        opt.tell(t, t.params["x"])
    return opt


def test_a_retracted_tell_leaves_the_models_and_the_best_and_survives_a_restart(tmp_path) -> None:
    path = tmp_path / "site.journal"
    opt = _journaled_site(path)
    wrong = opt.ask()
    opt.tell(wrong, 1e6)  # a unit slip
    assert opt.best.value == 1e6
    before = opt.site_data().n
    opt.retract(wrong, reason="mg read as µg")
    assert opt.best.value < 1e6 and all(o.trial_id != wrong.id for o in opt.observations)
    assert opt.site_data().n == before - 1 and 1e6 not in opt.site_data().y
    t = opt.ask()  # the campaign goes on
    opt.tell(t, t.params["x"])
    with pytest.raises(labfbo.TrialError, match="only a told result can be retracted"):
        opt.retract(wrong)  # already retracted
    with pytest.raises(labfbo.TrialError, match="is pending: only a told result"):
        opt.retract(opt.ask())
    with pytest.raises(labfbo.TrialError, match="unknown trial id 999"):
        opt.retract(999)
    with pytest.raises(labfbo.TrialError, match="already retracted"):
        opt.tell(wrong, 0.5)
    opt.close()
    again = labfbo.Optimizer(SPACE, "maximize", seed=0, n_init=3, storage=path, **FAST)
    assert [o.trial_id for o in again.observations] == [o.trial_id for o in opt.observations]
    record = again.state.trials[wrong.id]
    assert (record.state, record.reason) == ("retracted", "mg read as µg")
    assert record.state_at(record.finished_at) == "complete"  # what the rounds before the retraction saw
    again.close()


@pytest.mark.integration  # draws the report
def test_the_report_lists_a_retracted_result(tmp_path) -> None:
    from labfbo.report import write_report

    path = tmp_path / "site.journal"
    opt = _journaled_site(path)
    opt.retract(opt.trials[-1], reason="wrong vial")
    opt.close()
    write_report(path, tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text()
    assert "retracted by the lab: wrong vial" in html and "1 told result(s) were retracted" in html


@pytest.mark.integration  # draws the report
def test_a_name_that_is_math_to_matplotlib_is_drawn_as_text(tmp_path) -> None:
    from labfbo.report import write_report

    space = labfbo.SearchSpace([labfbo.Real(r"$\frac{$", 0, 1), labfbo.Real("b", 0, 1),
                                labfbo.Categorical("c", ["$x^", "b$"])])
    opt = labfbo.Optimizer(space, "maximize", seed=0, n_init=3, storage=tmp_path / "s.journal", **FAST)
    for _ in range(8):  # enough for the model's views (importance, dependence), whose axes carry the names
        t = opt.ask()
        opt.tell(t, t.params[r"$\frac{$"])
    opt.close()
    report = write_report(tmp_path / "s.journal", tmp_path / "report.html")
    assert r"$\frac{$" in (tmp_path / "report.html").read_text()
    assert {"progress", "importance", "dependence"} <= set(report.plots)


def test_a_failed_round_tells_the_sites_who_failed_never_what_a_site_said() -> None:
    from labfbo.core.messages import JoinRequest, Message

    coord = labfbo.Coordinator("distribution", sites=["a", "b", "c"], seed=0, space=SPACE, quorum=3)
    for s in "abc":
        coord.join(JoinRequest(site=s, protocol="distribution", space_hash=SPACE.fingerprint(),
                               space=SPACE.model_dump(mode="json")))

    def gather(requests, quorum, deadline) -> dict:
        return {s: ValueError("lab b's yield was 87.3 at 120 C") if s == "b" else TimeoutError("late")
                for s in requests}

    with pytest.raises(labfbo.RoundError) as err:
        coord.run_round(0, gather)
    assert "87.3" not in str(err.value) and "'b': 'ValueError'" in str(err.value)
    assert "87.3" in coord.failures[0]["b"]  # the operator's view
    assert not any(isinstance(m, Message) for m in coord.failures[0].values())


def test_one_extreme_among_equal_values_is_pulled_in_too() -> None:
    t = tamed(np.array([1.0, 1.0, 1e308]))  # no spread among the others; the square of 1e308 overflows
    assert t[0] == t[1] == 1.0 and TAME_SPREADS < t[2] < 2 * TAME_SPREADS
    assert np.isfinite(np.std(t))


@pytest.mark.parametrize("corrupt", ["point", "key_seed"])
def test_a_corrupted_journal_is_a_journal_error(tmp_path, corrupt: str) -> None:
    import json

    path = tmp_path / "site.journal"
    _journaled_site(path).close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    if corrupt == "point":
        ask = next(r for r in records if r["op"] == "ask")
        ask["trials"][0]["x"] = [0.5, 0.5, 0.5]  # three coordinates in a 2-D space
    else:
        records[0]["key_seed"] = "not hex"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(labfbo.JournalError):
        labfbo.Optimizer(SPACE, "maximize", seed=0, n_init=3, storage=path, **FAST)


def test_a_join_whose_space_is_not_its_hash_is_refused_and_changes_nothing() -> None:
    from labfbo.core.messages import JoinRequest

    other = labfbo.SearchSpace([labfbo.Real("x", 0, 2), labfbo.Real("y", 0, 1)])
    coord = labfbo.Coordinator("distribution", sites=["a", "b"], seed=0)  # no space pinned yet
    with pytest.raises(labfbo.FederationError, match="does not match its space_hash"):
        coord.join(JoinRequest(site="a", protocol="distribution", space_hash=SPACE.fingerprint(),
                               space=other.model_dump(mode="json")))
    assert coord.space is None and coord.members == {}
    coord.join(JoinRequest(site="a", protocol="distribution", space_hash=SPACE.fingerprint(),
                           space=SPACE.model_dump(mode="json")))
    assert coord.space.fingerprint() == SPACE.fingerprint()
