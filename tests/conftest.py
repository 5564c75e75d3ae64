"""Shared fixtures of the foundation's test suite.

Tiny settings everywhere: GP-based proposals use ``FAST`` acquisition options so the
whole suite stays fast on two cores. The ``sum_protocol`` fixture registers a minimal
*federated* protocol (two exchanges per round, summing counts the sites send from their
local data) for the tests of the optimizer's and the coordinator's federated paths.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Literal, Mapping

import numpy as np
import pytest
from leftovers import LeftoverGuard
from pydantic import BaseModel, ConfigDict

import labfbo
from labfbo.core.messages import Message, register
from labfbo.protocols import (
    _REGISTRY,  # noqa: PLC2701 - tests unregister what they registered
    Aggregator,
    Exchange,
    Finish,
    Protocol,
    SiteLogic,
    register_protocol,
)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(LeftoverGuard(), "labfbo-leftovers")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s module order: the waiting Flower modules first, beside the CPU-bound ones."""
    from schedule import make_scheduler

    return make_scheduler(config, log)


FAST: dict[str, Any] = {"num_restarts": 2, "raw_samples": 64}
"""Protocol options that keep acquisition optimization cheap."""


@pytest.fixture
def cont_space() -> labfbo.SearchSpace:
    return labfbo.SearchSpace([labfbo.Real("x", -2.0, 3.0), labfbo.Real("rate", 1e-3, 1.0, log=True)])


@pytest.fixture
def mixed_space() -> labfbo.SearchSpace:
    return labfbo.SearchSpace([
        labfbo.Real("temperature", 150.0, 250.0),
        labfbo.Real("feed_rate", 1e-3, 1.0, log=True),
        labfbo.Integer("passes", 1, 8),
        labfbo.Categorical("solvent", ["water", 7, 2.5, True]),
    ])


def cont_objective(params: dict[str, Any]) -> float:
    """A smooth function of ``cont_space`` (minimum near x=0.5, rate=0.03)."""
    return (params["x"] - 0.5) ** 2 + (math.log10(params["rate"]) + 1.5) ** 2


def mixed_objective(params: dict[str, Any]) -> float:
    cat = {"water": 0.0, 7: 1.0, 2.5: 0.5, True: 2.0}
    key = params["solvent"]
    offset = next(v for k, v in cat.items() if type(k) is type(key) and k == key)
    return ((params["temperature"] - 200.0) / 50.0) ** 2 + math.log(params["feed_rate"]) ** 2 / 10 \
        + 0.1 * (params["passes"] - 3) ** 2 + offset


@pytest.fixture
def cont_f():
    return cont_objective


@pytest.fixture
def mixed_f():
    return mixed_objective


@pytest.fixture
def fast() -> dict[str, Any]:
    return dict(FAST)


# --------------------------------------------------------------------- a dummy protocol
@register
class SumRequest(Message):
    kind: Literal["test_sum_request"] = "test_sum_request"
    step: int


@register
class SumAnswer(Message):
    kind: Literal["test_sum_answer"] = "test_sum_answer"
    step: int
    value: float


@register
class SumReply(Message):
    kind: Literal["test_sum_reply"] = "test_sum_reply"
    total_n: float
    total_pending: float
    contributors: list[str]


class SumOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SumSite(SiteLogic):
    """Step 1: send the number of observations; step 2: the number of pending trials."""

    fail = False  # set True on one site to make its handler raise

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.guidance: list[Message | None] = []

    def answer(self, request: Message, data: Any, round: int) -> Message:
        if self.fail:
            raise RuntimeError(f"{self.context.site}: instrument offline")
        assert isinstance(request, SumRequest)
        value = data.n if request.step == 1 else data.pending.shape[0]
        return SumAnswer(step=request.step, value=float(value))

    def propose(self, data: Any, guidance: Message | None, n: int, round: int) -> np.ndarray:
        self.guidance.append(guidance)
        return np.random.default_rng(self.context.seed_for(round, "test-sum")).random((n, self.space.dim))


class SumAggregator(Aggregator):
    """Two exchanges per round; replies the sums to every site."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.received: list[tuple[int, str, Message]] = []
        self._totals: dict[int, float] = {}

    def open_round(self, t: int) -> Exchange:
        return Exchange({s: SumRequest(step=1) for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Exchange | Finish:
        steps = set()
        for s, m in responses.items():
            self.received.append((t, s, m))
            steps.add(m.step)
        assert len(steps) == 1
        step = steps.pop()
        total = float(sum(m.value for m in responses.values()))
        if step == 1:
            self._totals[t] = total
            return Exchange({s: SumRequest(step=2) for s in self.sites})
        reply = SumReply(total_n=self._totals[t], total_pending=total, contributors=sorted(responses))
        return Finish({s: reply for s in self.sites})


class SumProtocol(Protocol):
    name = "test-sum"
    federated = True
    Options = SumOptions
    site_logic = SumSite
    aggregator = SumAggregator


@contextlib.contextmanager
def registered(protocol: type[Protocol]) -> Iterator[type[Protocol]]:
    """``protocol`` in the registry for a block, removed again after it."""
    register_protocol(protocol)
    try:
        yield protocol
    finally:
        _REGISTRY.pop(protocol.name, None)


@pytest.fixture
def sum_protocol():
    """Register the ``test-sum`` protocol for one test, then remove it again."""
    with registered(SumProtocol) as protocol:
        yield protocol


@pytest.fixture
def toy():
    """Register the toy protocol of ``tests/toy_protocol.py`` for one test, then remove it again."""
    from toy_protocol import ToyProtocol

    with registered(ToyProtocol) as protocol:
        yield protocol


@pytest.fixture(scope="module")
def cpu_load():
    """Both cores busy with another process while the test runs (timing must not matter).

    Under pytest-xdist the suite's other processes already keep both cores busy; the burners
    then run at the lowest priority, taking only the cycles the suite leaves idle instead of
    slowing every other test. Alone, they run at normal priority."""
    import os
    import subprocess
    import sys

    nice = 19 if os.environ.get("PYTEST_XDIST_WORKER") else 0
    burners = [subprocess.Popen([sys.executable, "-c", f"import os\nos.nice({nice})\nwhile True: pass"])
               for _ in range(2)]
    try:
        yield
    finally:
        for p in burners:
            p.kill()
            p.wait()
