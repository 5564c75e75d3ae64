"""A site's privacy budget holds when its journal does not: the coordinator accounts every release
it receives, durably, tells a rejoining site what it spent, and discards a release beyond the
budget (a site that bypassed its own gate) — never aggregated, counted, and the site is told."""

from __future__ import annotations

import shutil
import warnings
from collections import Counter

import numpy as np
import pytest
from toy_protocol import ToyAggregator, ToyProtocol, ToySite

import labfbo
from labfbo.core.messages import Abstain, BudgetExhausted, SpentBudget
from labfbo.core.release import Release
from labfbo.privacy.accounts import BUDGET_DISCARDED
from labfbo.privacy.budget import Budget
from labfbo.privacy.dp import composed_epsilon
from labfbo.protocols import _REGISTRY, register_protocol  # noqa: PLC2701 - the test unregisters it
from labfbo.site.agent import SiteAgent

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
DP2 = labfbo.DP(epsilon=2.0, delta=1e-5)
HORIZON = 3  # the plan: one noised mean a round, three rounds: calibrated to spend epsilon 2 in all


class PlannedSite(ToySite):
    def planned_releases(self, horizon: int) -> dict[str, int]:
        return {"toy_noised_mean": horizon}


class Seen(ToyAggregator):
    """The toy aggregator, remembering which sites' answers each round aggregated."""

    aggregated: list[set[str]] = []

    def on_responses(self, t, responses):
        Seen.aggregated.append(set(responses))
        return super().on_responses(t, responses)


class PlannedToy(ToyProtocol):
    name = "toy-budgeted-mean"
    site_logic = PlannedSite
    aggregator = Seen


@pytest.fixture(autouse=True)
def toy():
    register_protocol(PlannedToy)
    Seen.aggregated = []
    try:
        yield PlannedToy
    finally:
        _REGISTRY.pop(PlannedToy.name, None)


def _site(coordinator, path, site: str = "a", **kw) -> labfbo.Optimizer:
    return labfbo.Optimizer(SPACE, protocol=PlannedToy.name, coordinator=coordinator, site=site, seed=0, n_init=1,
                            storage=str(path), privacy=kw.pop("privacy", DP2), horizon=HORIZON, **kw)


def _rounds(opts, k: int) -> None:
    """``k`` BO rounds (the first ask of a fresh site is its design point)."""
    for _ in range(k):
        trials = [o.ask() for o in opts]
        for o, t in zip(opts, trials):
            o.tell(t, float(t.params["x"]))


def _damage(path, how: str, copy) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":  # the tail lost, its last line torn
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * 0.45)])
    else:  # rolled back to an older copy
        shutil.copyfile(copy, path)


class _Local:
    """The in-process coordinator (kept for its lifetime)."""

    def __init__(self, tmp_path) -> None:
        self.coord = labfbo.Coordinator(PlannedToy.name, sites=["a"], seed=0, space=SPACE, horizon=HORIZON)

    def link(self, site: str = "a"):
        return self.coord

    def restart(self) -> None:
        pass

    def close(self) -> None:
        pass


class _HTTP:
    """A real server on 127.0.0.1 with its state in SQLite, restarted between the damage and the rejoin."""

    def __init__(self, tmp_path) -> None:
        from labfbo.server.config import ServerConfig, new_token

        pytest.importorskip("fastapi")
        token, digest = new_token()
        self.token = token
        self.cfg = ServerConfig(protocol=PlannedToy.name, study="budget-study", sites={"a": digest},
                                space=SPACE.model_dump(mode="json"), horizon=HORIZON,
                                state=str(tmp_path / "coordinator.sqlite"))
        self._start()

    def _start(self) -> None:
        from labfbo.server.app import CoordinatorServer, ServerThread

        self.thread = ServerThread(CoordinatorServer(self.cfg)).__enter__()
        self.coord = self.thread.server.coordinator

    def link(self, site: str = "a"):
        from labfbo.transport.http import HTTPCoordinator

        return HTTPCoordinator(self.thread.url, self.token)

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        self.thread.__exit__(None, None, None)


@pytest.mark.integration
@pytest.mark.timeout(300, method="signal")
@pytest.mark.parametrize("transport", ["local", "http"])
@pytest.mark.parametrize("how", ["deleted", "truncated", "rolled back"])
def test_a_lost_journal_cannot_push_the_sites_epsilon_past_its_budget(transport, how, tmp_path) -> None:
    study = (_Local if transport == "local" else _HTTP)(tmp_path)
    path = tmp_path / "a.jsonl"
    try:
        o = _site(study.link(), path)
        _rounds([o], 2)  # the design point and one round: one release
        shutil.copyfile(path, tmp_path / "older.jsonl")
        _rounds([o], 2)  # the whole plan: three releases, epsilon 2
        assert len(o.releases()) == 3 and 1.9 < o.epsilon() <= 2.0
        acc = study.coord.ledger.account("a")
        assert acc.releases == 3 and acc.budget == 2.0
        assert study.coord.ledger.epsilon("a") == pytest.approx(o.epsilon())  # the site's own accountant
        o.close()

        _damage(path, how, tmp_path / "older.jsonl")
        study.restart()  # over HTTP the coordinator restarts too: its account is in its state store
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            o = _site(study.link(), path)
            lost = [str(w.message) for w in caught if "journal was lost" in str(w.message)]
            assert len(lost) == 1 and "accounted 3 release(s)" in lost[0]
            assert len(o.releases()) < 3
            assert o.privacy_budget()["spent"] == pytest.approx(study.coord.ledger.epsilon("a"))  # the larger
            _rounds([o], 4)
            said = [str(w.message) for w in caught]
        assert any("privacy budget spent" in m for m in said)  # its own gate, planning from the coordinator's figure
        acc = study.coord.ledger.account("a")
        assert acc.releases == 3 and acc.discarded == 0 and study.coord.ledger.epsilon("a") <= 2.0
        o.close()

        # a site that ignores what the coordinator told it (an older labfbo, a patched one): discarded
        path.unlink()
        study.restart()
        mp = pytest.MonkeyPatch()
        mp.setattr(SiteAgent, "adopt", lambda self, spent, when: None)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                o = _site(study.link(), path)
                _rounds([o], 3)
        finally:
            mp.undo()
        told = [str(w.message) for w in caught if "the coordinator discarded" in str(w.message)]
        assert told and "beyond its budget ε ≤ 2" in told[0]
        acc = study.coord.ledger.account("a")
        assert acc.releases == 3 and acc.discarded == 1 and study.coord.ledger.epsilon("a") <= 2.0
        assert len(o.releases()) == 1  # it sent one; told, it then planned from the coordinator's figure
        assert "budget_exhausted" in [g.kind for g in o.state.guidance]
        o.close()
    finally:
        study.close()


@pytest.mark.integration
def test_a_site_that_bypasses_its_gate_is_discarded_counted_not_aggregated_and_told(tmp_path, monkeypatch) -> None:
    coord = labfbo.Coordinator(PlannedToy.name, sites=["a", "b"], seed=0, space=SPACE, horizon=HORIZON)
    a = _site(coord, tmp_path / "a.jsonl")
    b = _site(coord, tmp_path / "b.jsonl", site="b", privacy=labfbo.DP(noise_multiplier=2.0, delta=1e-5))
    monkeypatch.setattr(Budget, "allows", lambda self, releases, release: True)  # a's gate disabled
    monkeypatch.setattr(SiteAgent, "adopt", lambda self, spent, when: None)    # and deaf to the coordinator
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _rounds([a, b], 1 + HORIZON + 2)
    assert len(a.releases()) == HORIZON + 2  # it sent two releases beyond its plan
    acc = coord.ledger.account("a")
    assert acc.releases == HORIZON and acc.discarded == 2 and coord.ledger.epsilon("a") <= 2.0
    assert coord.ledger.account("b").discarded == 0 and coord.ledger.account("b").budget is None
    # never aggregated: the rounds after the plan saw b alone, and a got no guidance but the refusal
    assert Seen.aggregated == [{"a", "b"}] * HORIZON + [{"b"}] * 2
    over = sorted(t for t, sites in coord.discards.items() if "a" in sites)
    assert over == [HORIZON, HORIZON + 1]
    for t in over:
        got = coord.rounds[t]["a"]
        assert isinstance(got, BudgetExhausted) and got.spent.discarded >= 1 and got.spent.epsilon <= 2.0
        assert coord.rounds[t]["b"].kind == "toy_grand_mean"
    told = [str(w.message) for w in caught if "the coordinator discarded" in str(w.message)]
    assert len(told) == 2 and all("releases nothing more" in m for m in told)
    assert [g.kind for g in a.state.guidance][-2:] == ["budget_exhausted"] * 2
    assert len(a.ask(n=1)) == 1  # it goes on, on its own model


def test_the_ledger_discards_beyond_the_budget_and_survives_its_state() -> None:
    coord = labfbo.Coordinator(PlannedToy.name, sites=["a"], seed=0, space=SPACE, horizon=HORIZON)
    coord.join(labfbo.core.messages.JoinRequest(site="a", protocol=PlannedToy.name, space_hash=SPACE.fingerprint(),
                                           space=SPACE.model_dump(mode="json"),
                                           privacy=labfbo.core.messages.PrivacyDeclaration(epsilon=1.0, delta=1e-5)))
    from toy_protocol import NoisedMean

    msg = NoisedMean(mean=0.1, dp_noise_multiplier=6.0, round=0)
    kept = [coord.admit("a", msg.model_copy(update={"round": t})) for t in range(4)]
    eps1 = composed_epsilon(Counter({6.0: 1}), 1e-5)  # noise std 6 x the sensitivity 2C
    assert eps1 < 1.0
    n = sum(not isinstance(m, Abstain) for m in kept)
    assert n >= 1 and all(isinstance(m, Abstain) and m.reason == BUDGET_DISCARDED for m in kept[n:])
    assert coord.ledger.epsilon("a") <= 1.0 and coord.ledger.account("a").discarded == 4 - n
    # without noise: never within a budget
    assert isinstance(coord.admit("a", NoisedMean(mean=0.1, round=5)), Abstain)
    again = labfbo.Coordinator(PlannedToy.name, sites=["a"], seed=0, space=SPACE, horizon=HORIZON)
    again.ledger.restore(coord.ledger.state())
    assert again.ledger.spent("a") == coord.ledger.spent("a")
    # a rejoin cannot raise the budget, and it is told what it spent
    reply = coord.join(labfbo.core.messages.JoinRequest(
        site="a", protocol=PlannedToy.name, space_hash=SPACE.fingerprint(), space=SPACE.model_dump(mode="json"),
        privacy=labfbo.core.messages.PrivacyDeclaration(epsilon=5.0, delta=1e-5)))
    assert reply.spent is not None and reply.spent.budget == 1.0 and reply.spent.releases == n
    assert labfbo.core.messages.parse(reply.to_wire()) == reply
    first = labfbo.Coordinator(PlannedToy.name, sites=["b"], seed=0, space=SPACE, horizon=HORIZON)
    plain = first.join(
        labfbo.core.messages.JoinRequest(
            site="b", protocol=PlannedToy.name, space_hash=SPACE.fingerprint(), space=SPACE.model_dump(mode="json")
        )
    )
    assert "spent" not in plain.model_dump_json()  # a first join's reply is as before


def test_a_budget_plans_from_the_coordinators_larger_account() -> None:
    def rel(m: float) -> Release:
        return Release(round=0, message="x", sensitivity=1.0, noise_std=m, effective_noise_multiplier=m, delta=1e-5)

    budget = Budget(labfbo.DP(epsilon=1.75, noise_multiplier=1.0, delta=1e-5), plan={4.0: 3})  # 3 fit, 4 do not
    journal = [rel(4.0)]
    told = SpentBudget(releases=3, gaussian=[(4.0 * (1 + 1e-13), 3)], delta=1e-5, budget=2.0)
    missing = budget.adopt(told, journal)
    assert sum(missing.values()) == 2  # the journal's one release is among the coordinator's three
    assert budget.spent(journal) == pytest.approx(composed_epsilon(Counter({4.0: 3}), 1e-5))
    assert budget.allows(journal, rel(4.0)) is False  # the plan's three are spent
    assert sum(budget.adopt(SpentBudget(releases=1, gaussian=[(4.0, 1)], delta=1e-5), journal).values()) == 0
    exposed = Budget(labfbo.DP(epsilon=2.0, noise_multiplier=1.0, delta=1e-5))
    exposed.adopt(SpentBudget(releases=1, exposed=True, delta=1e-5), [])
    assert np.isinf(exposed.spent([])) and not exposed.allows([], rel(4.0))  # a release without noise: no finite ε
