"""The binary wire: frames carry exactly the message, arrays as raw bytes, and refuse damage."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import labfbo
from labfbo.core import wire
from labfbo.core.messages import Array, JoinReply, parse
from labfbo.protocols.gradient.protocol import ParticlesRequest


def _reply(n: int = 50) -> JoinReply:
    rows = np.random.default_rng(0).normal(size=(n, 3)) * 10.0 ** np.arange(-150, 150, 100)
    return JoinReply(site_index=1, n_sites=3, design=Array.of(rows), horizon=10, study="s", round=4)


def test_frame_round_trips_every_bit_and_is_a_quarter_smaller():
    m = _reply(4000)
    frame = m.to_wire()
    back = parse(frame)
    assert back == m and back.model_dump_json() == m.model_dump_json()
    assert np.array_equal(back.design.numpy().view(np.uint64), m.design.numpy().view(np.uint64))
    assert m.nbytes() == len(frame)
    payload = 4000 * 3 * 8
    assert payload < len(frame) < payload + 400  # the raw array plus a short header
    assert len(m.model_dump_json().encode()) > 4 / 3 * payload  # what base64-in-JSON costs


def test_header_names_kind_and_round_without_the_arrays():
    head = wire.header(_reply().to_wire())
    assert head["kind"] == "join_reply" and head["round"] == 4
    assert head["design"] == {"dtype": "float64", "shape": [50, 3], "$buf": [0, 50 * 3 * 8]}


def test_frames_of_messages_without_arrays_and_of_several_arrays():
    req = ParticlesRequest(round=2, step=7, particles=Array.of(np.arange(6.0).reshape(2, 3)),
                           cohort={"a": "key-a", "b": "key-b"})
    assert parse(req.to_wire()) == req
    plain = labfbo.core.messages.NoGuidance(round=3)
    assert parse(plain.to_wire()) == plain and wire.header(plain.to_wire())["kind"] == "no_guidance"


@pytest.mark.parametrize("damage", ["truncated", "extra", "magic", "reference", "header"])
def test_damaged_frames_are_refused_with_a_protocol_error(damage):
    frame = _reply().to_wire()
    (n,) = struct.unpack("<I", frame[5:9])
    head = json.loads(frame[9:9 + n])
    if damage == "truncated":
        bad = frame[:-1]
    elif damage == "extra":
        bad = frame + b"\x00"
    elif damage == "magic":
        bad = b"LFBX" + frame[4:]
    elif damage == "reference":
        head["design"]["$buf"] = [8, 50 * 3 * 8]
        h = json.dumps(head).encode()
        bad = frame[:5] + struct.pack("<I", len(h)) + h + frame[9 + n:]
    else:
        bad = frame[:9] + b"}" + frame[10:]
    with pytest.raises(labfbo.ProtocolError):
        parse(bad)


def test_a_frame_still_validates_the_message():
    frame = _reply().to_wire()
    (n,) = struct.unpack("<I", frame[5:9])
    head = json.loads(frame[9:9 + n])
    head["design"]["dtype"] = "object"  # never pickle, on the wire as in JSON
    h = json.dumps(head).encode()
    with pytest.raises(labfbo.ProtocolError, match="not allowed"):
        parse(frame[:5] + struct.pack("<I", len(h)) + h + frame[9 + n:])
