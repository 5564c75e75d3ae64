"""A new protocol is one package plus one registry line: it then passes the conformance test case
and the capability classes (labfbo.testing) with no other file changing."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import labfbo.protocols
import labfbo.testing
from labfbo.core.messages import Message
from labfbo.protocols import available_protocols, configure, get_protocol

#: the toy, one package: its messages, and its options, sides and protocol (:func:`toy` writes it)
TOY = {
    "__init__.py": '''
"""A toy federated protocol: each site releases a noised mean of its results; the coordinator
averages them; each site proposes random points."""

from toy_mean.protocol import ToyMean

__all__ = ["ToyMean"]
''',
    "messages.py": '''
"""The toy's messages."""

from typing import Literal

from labfbo.core.messages import Message, register


@register
class AskMean(Message):
    kind: Literal["toymean_ask"] = "toymean_ask"


@register
class Mean(Message):
    kind: Literal["toymean_mean"] = "toymean_mean"
    mean: float
    dp_noise_multiplier: float | None = None


@register
class GrandMean(Message):
    kind: Literal["toymean_grand"] = "toymean_grand"
    mean: float
''',
    "protocol.py": '''
"""The toy's options, its site and coordinator sides, and the protocol naming them."""

from typing import Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from labfbo.core.messages import Abstain, Message
from labfbo.core.release import Release
from labfbo.privacy import DP
from labfbo.protocols import Aggregator, Exchange, Finish, Protocol, SiteData, SiteLogic
from toy_mean.messages import AskMean, GrandMean, Mean


class ToyMeanOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    spread: float = Field(1.0, gt=0, le=1)
    privacy: DP | None = None


class ToyMeanSite(SiteLogic):
    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if data.n == 0:
            return Abstain(reason="no results yet")
        dp = self.options.privacy
        clip = 1.0 if dp is None else dp.clip
        mean = float(np.mean(np.clip(data.y, -clip, clip)))
        if dp is not None:
            mean += float(self.context.private_rng(round, "toymean").normal(0.0, dp.sigma * 2 * clip))
        return Mean(mean=mean, dp_noise_multiplier=None if dp is None else dp.sigma)

    def declare_release(self, kind, round, step, noised, sensitivity):
        dp = self.options.privacy
        if kind == "toymean_mean" and noised and dp is not None:
            return Release.gaussian(kind, round, dp, "Gaussian on a clipped mean", sensitivity=2 * dp.clip,
                                    noise_std=dp.sigma * 2 * dp.clip)
        return super().declare_release(kind, round, step, noised, sensitivity)

    def planned_releases(self, horizon: int) -> dict[str, int]:
        return {"toymean_mean": horizon}

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        rng = np.random.default_rng(self.context.seed_for(round, "toymean"))
        return 0.5 + self.options.spread * (rng.random((n, self.space.dim)) - 0.5)


class ToyMeanAggregator(Aggregator):
    def open_round(self, t: int) -> Exchange:
        return Exchange({s: AskMean() for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Finish:
        means = [m.mean for m in responses.values() if isinstance(m, Mean)]
        return Finish({s: GrandMean(mean=float(np.mean(means)) if means else 0.0) for s in self.sites})


class ToyMean(Protocol):
    """Sites share a noised mean of their results."""

    name = "toy-mean"
    Options = ToyMeanOptions
    site_logic = ToyMeanSite
    aggregator = ToyMeanAggregator
    supported_types = frozenset({"real", "integer", "discrete"})
''',
}

CONFORMANCE_MODULE = '''
import pytest

import labfbo
from labfbo.protocols import get_protocol
from labfbo.testing import (KeepsItsBudget, ProtocolConformance, RestoresItsAggregator, ResumesFromItsJournal,
                            SameOnEveryTransport)


class TestToyMean(ProtocolConformance, ResumesFromItsJournal, RestoresItsAggregator, KeepsItsBudget,
                  SameOnEveryTransport):
    @pytest.fixture
    def protocol(self):
        return get_protocol("toy-mean")(spread=0.5, privacy=labfbo.DP(noise_multiplier=2.0))
'''


class _Outcomes:
    """A pytest plugin that keeps each test's outcome."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid.split("::")[-1]] = report.outcome


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy package on ``sys.path`` and its one registry line (both undone after the test)."""
    (tmp_path / "toy_mean").mkdir()
    for name, source in TOY.items():
        (tmp_path / "toy_mean" / name).write_text(textwrap.dedent(source).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("toy_mean", "toy_mean.messages", "toy_mean.protocol"):  # imported afresh, forgotten after
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(Message, "_registry", dict(Message._registry))  # its message kinds too
    monkeypatch.setattr(labfbo.protocols, "_REGISTRY", dict(labfbo.protocols._REGISTRY))  # forgets the class after
    monkeypatch.setitem(labfbo.protocols._BUILTIN, "toy-mean", "toy_mean:ToyMean")
    return tmp_path


def _run_case(toy: Path, module: str) -> tuple[int, dict[str, str]]:
    """Run the conformance case on the toy through pytest (a test module of its own name)."""
    test_file = toy / f"{module}.py"
    test_file.write_text(textwrap.dedent(CONFORMANCE_MODULE))
    outcomes = _Outcomes()
    # -s and no logging plugin: the inner session leaves sys.stderr and the loggers as they are (a server
    # it starts configures its loggers on the stream it finds, which must outlive the inner session)
    args = [str(test_file), "-q", "-s", "-p", "no:cacheprovider", "-p", "no:logging", "--rootdir", str(toy)]
    code = pytest.main(args, plugins=[outcomes])
    sys.modules.pop(module, None)
    return int(code), outcomes.outcomes


def test_a_protocol_in_one_package_and_one_registry_line_passes_the_conformance_case(toy: Path) -> None:
    assert "toy-mean" in available_protocols()
    assert configure("toy-mean", {"spread": 0.5}) == get_protocol("toy-mean")(spread=0.5)
    assert labfbo.protocols.ToyMean is get_protocol("toy-mean")  # the registry line names the class
    code, outcomes = _run_case(toy, "test_toy_mean_conforms")
    cases = (labfbo.testing.ProtocolConformance, labfbo.testing.ResumesFromItsJournal,
             labfbo.testing.RestoresItsAggregator, labfbo.testing.KeepsItsBudget, labfbo.testing.SameOnEveryTransport)
    checks = {n for case in cases for n in dir(case) if n.startswith("test_")}
    assert code == 0, outcomes
    assert sorted(outcomes) == sorted(checks) and set(outcomes.values()) == {"passed"}


def test_a_broken_protocol_fails_the_conformance_case(toy: Path) -> None:
    """The case can fail: a toy whose options take any keyword silently is caught."""
    source = (toy / "toy_mean" / "protocol.py").read_text()
    (toy / "toy_mean" / "protocol.py").write_text(source.replace('extra="forbid"', 'extra="ignore"'))
    code, outcomes = _run_case(toy, "test_broken_toy_mean")
    assert code == 1
    assert outcomes["test_refuses_an_unknown_option_naming_the_closest"] == "failed"
    assert outcomes["test_is_registered_and_built_from_its_name_or_the_object"] == "passed"
