"""The in-process transport with one thread per site (as `labfbo demo` runs its labs)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from labfbo.apps.demo.runs import Screen, run_labfbo
from labfbo.coordinator import Coordinator
from labfbo.datasets import load_reactions
from labfbo_bench.reactions import ReactionJob, run_protocol

pytestmark = pytest.mark.integration  # labs on threads, campaigns against a local coordinator

LABS = ("1-bromo-4-ethylbenzene", "2-bromopyridine", "2-chloropyridine")
BUDGET = 4


@pytest.fixture(scope="module")
def data():
    return load_reactions().subset(LABS)


def test_threads_run_each_round_once_and_propose_as_the_lock_step_loop(data, monkeypatch) -> None:
    runs: collections.Counter[int] = collections.Counter()
    run_one = Coordinator._run_one

    def counted(self, t, gather, participants):
        runs[t] += 1
        return run_one(self, t, gather, participants)

    monkeypatch.setattr(Coordinator, "_run_one", counted)
    threaded = run_labfbo(Screen(data, seed=0, budget=BUDGET), "surface")
    assert dict(runs) == {t: 1 for t in range(BUDGET)}  # three threads asked for each round; it ran once
    # the same best-yield curves as the benchmark's lock-step loop of the same seed and first experiments
    lock_step = run_protocol(ReactionJob(path="", scenario="demo", labs=LABS, method="surface", seed=0,
                                         budget=BUDGET), data)
    found = np.array([data.best(i) for i in range(len(LABS))])[:, None] - np.array(lock_step["regret"])
    curves = np.array([[max((e.yield_ or 0.0) for e in lab[:3 + t]) for t in range(BUDGET + 1)] for lab in threaded])
    np.testing.assert_allclose(curves, found)


def test_threaded_labs_propose_the_same_experiments_on_every_run(data) -> None:
    screen = Screen(data, seed=1, budget=2)
    first, again = (run_labfbo(screen, "surface") for _ in range(2))
    assert [[e.params for e in lab] for lab in first] == [[e.params for e in lab] for lab in again]
    alone = run_labfbo(screen, "independent")
    assert [lab[:3] for lab in alone] == [lab[:3] for lab in first]  # the shared first experiments
