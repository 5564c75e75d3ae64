"""Cross-site messages: arrays, parsing, versions, immutability."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError as PydanticValidationError

import labfbo
from labfbo.core.messages import SCHEMA_VERSION, Abstain, Array, JoinReply, JoinRequest, Message, NoGuidance, parse


@pytest.mark.parametrize("dtype", ["float64", "int64"])
@pytest.mark.parametrize("shape", [(), (0, 3), (5,), (2, 3), (2, 1, 4)])
def test_array_round_trip(dtype, shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 1e6).astype(dtype)
    if dtype == "float64" and a.size:
        a.flat[0] = -0.0
        a.flat[-1] = 1e-300
    msg = Array.of(a, dtype=dtype)
    assert msg.shape == shape and msg.dtype == dtype and msg.n_scalars == a.size
    for back in (msg.numpy(), Array.model_validate_json(msg.model_dump_json()).numpy()):
        assert back.shape == shape and back.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(back, a)
        assert back.tobytes() == a.tobytes()  # bit-exact (signed zeros, subnormals)
        assert back.flags.writeable  # a copy, not a read-only view of the payload


def test_array_from_non_contiguous_and_big_endian():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(Array.of(a).numpy(), a)
    b = np.arange(5, dtype=">i8")
    back = Array.of(b, dtype="int64").numpy()
    np.testing.assert_array_equal(back, b)
    assert back.dtype == np.dtype("int64")


def test_array_refuses_bad_payloads():
    with pytest.raises(PydanticValidationError):
        Array(dtype="object", shape=(1,), data="")
    bad = Array.of(np.zeros(3)).model_copy(update={"shape": (4,)})
    with pytest.raises(labfbo.ProtocolError):
        bad.numpy()


def test_messages_round_trip_through_parse():
    msgs = [
        JoinRequest(site="a", protocol="independent", space_hash="abc", space={"params": []}, n_init=3),
        JoinReply(site_index=1, n_sites=3, design=Array.of(np.eye(2)), horizon=10, study="s"),
        Abstain(reason="no data", round=4), NoGuidance(round=2),
    ]
    for m in msgs:
        assert m.version == SCHEMA_VERSION
        for wire in (m.model_dump_json(), m.model_dump_json().encode(), json.loads(m.model_dump_json()), m.to_wire()):
            back = parse(wire)
            assert type(back) is type(m) and back == m
        assert m.nbytes() == len(m.to_wire()) > 0


def test_parse_refuses_unknown_kinds_and_newer_versions():
    with pytest.raises(labfbo.ProtocolError, match="unknown message kind"):
        parse('{"kind": "pickle", "version": 1}')
    ok = json.loads(NoGuidance(round=1).model_dump_json())
    with pytest.raises(labfbo.ProtocolError, match="newer"):
        parse({**ok, "version": SCHEMA_VERSION + 1})
    assert parse({**ok, "version": SCHEMA_VERSION}) == NoGuidance(round=1)
    with pytest.raises(labfbo.ProtocolError):
        parse('{"version": 1}')
    with pytest.raises(labfbo.ProtocolError):
        parse("[1, 2, 3]")


def test_parse_refuses_malformed_messages_with_protocol_error():
    with pytest.raises(labfbo.ProtocolError):
        parse("{not json")
    with pytest.raises(labfbo.ProtocolError):  # a missing field
        parse({"kind": "join_reply", "version": 1, "n_sites": 2})
    with pytest.raises(labfbo.ProtocolError):  # an extra field: nothing unlisted crosses
        parse({**json.loads(NoGuidance().model_dump_json()), "raw_values": [1.0, 2.0]})


def test_a_boolean_is_not_a_number_and_a_kind_is_a_string():
    from labfbo.protocols.distribution.protocol import OptimumBelief

    belief = json.loads(OptimumBelief(weight=0.5, mean=Array.of([0.2]), variance=Array.of([0.01]), value=0.1,
                                      round=0).model_dump_json())
    assert parse(belief).weight == 0.5
    for field in ("weight", "value", "round", "version"):
        with pytest.raises(labfbo.ProtocolError, match=field):  # pydantic alone reads true as 1
            parse({**belief, field: True})
    for kind in (["abstain"], {"k": 1}, 3):
        with pytest.raises(labfbo.ProtocolError, match="'kind' is a string"):
            parse({"kind": kind, "reason": "x"})


def test_messages_are_frozen():
    m = NoGuidance(round=1)
    with pytest.raises(PydanticValidationError):
        m.round = 2
    arr = Array.of(np.zeros(2))
    with pytest.raises(PydanticValidationError):
        arr.data = ""
    with pytest.raises(PydanticValidationError):
        NoGuidance(unexpected=1)
    assert m.model_copy(update={"round": 3}).round == 3 and m.round == 1


def test_kinds_are_unique():
    from labfbo.core.messages import register

    class Impostor(Message):
        kind: str = "join"

    with pytest.raises(TypeError):
        register(Impostor)
    assert Message._registry["join"] is JoinRequest
