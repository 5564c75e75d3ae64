"""The Flower transport: a real SuperLink and three SuperNodes on 127.0.0.1, started here.

One deployment serves the module, with TLS (certificates made by ``cryptography``) and
SuperNode authentication on. Every Flower exchange takes seconds (SuperNodes pull every
3 s), so the campaigns are tiny; the same check for `gradient` and `vote` is a module of its
own (test_flower_gradient_vote.py), so that the suite's processes run them side by side.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import labfbo
from labfbo.core.messages import Array
from labfbo.protocols.gradient.protocol import ParticlesRequest

flwr = pytest.importorskip("flwr")

from flower_fixtures import check_same_proposals, deployment  # noqa: E402,F401 - the module's deployment fixture

from labfbo.flower_app import labfbo_flower_relay as relay  # noqa: E402


def test_a_frame_crosses_flower_records_bit_for_bit() -> None:
    """Arrays go as an ArrayRecord (dtype and shape kept), the rest as a ConfigRecord."""
    rng = np.random.default_rng(0)
    msg = ParticlesRequest(round=3, particles=Array.of(rng.normal(size=(4, 5))), step=2)
    frame = msg.to_wire()
    content = relay.to_content(frame, op="request")
    arrays = content.array_records[relay.ARRAYS]
    assert arrays["0"].shape == (4, 5) and arrays["0"].dtype == "float64"
    assert json.loads(content.config_records[relay.CONTROL]["header"])["particles"]["$buf"] == [0, 160]
    control, back = relay.from_content(content)
    assert control == {"op": "request"} and back == frame
    assert labfbo.core.messages.parse(back) == msg
    _, err = relay.from_content(relay.to_content(b'{"error": "X", "message": "y"}', op="answer"))
    assert err == b'{"error": "X", "message": "y"}'


pytestmark = pytest.mark.integration


@pytest.mark.parametrize("protocol", ["consensus", "distribution"])  # gradient, vote: test_flower_gradient_vote.py
def test_flower_gives_the_same_proposals_as_local(deployment, protocol: str) -> None:  # noqa: F811 - the fixture
    check_same_proposals(deployment, protocol)
