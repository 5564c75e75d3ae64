r"""The binary wire: a message as a JSON header plus its arrays' raw bytes.

A message's JSON form carries each :class:`~labfbo.core.messages.Array` as base64, a third more
bytes than the array itself. Every transport sends the *frame* instead::

    b"LFBW" 0x01 | header length (uint32, little-endian) | header (UTF-8 JSON) | buffers

The header is the message's JSON with each array's ``"data"`` replaced by
``"$buf": [offset, length]`` into the buffers that follow (little-endian, as
``Array.of`` wrote them). Unpacking restores the JSON document exactly and the message
is validated by its pydantic model as before: the frame changes the bytes on the wire,
never what a message may contain. It is lossless (the same bits), so distributed and
centralized runs stay equal.

The JSON form stays what a person reads, what the journal and ``sent_messages`` keep, and
what a JSON-only client (``curl``, a light benchmark client) may still send and receive.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from labfbo.core.exceptions import ProtocolError

MAGIC = b"LFBW\x01"
MEDIA_TYPE = "application/x-labfbo-frame"
_LEN = struct.Struct("<I")
_ARRAY_KEYS = {"dtype", "shape", "data"}
_BUF_KEYS = {"dtype", "shape", "$buf"}


def is_frame(data: Any) -> bool:
    """Whether ``data`` is a frame (bytes starting with the magic), not JSON text."""
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:len(MAGIC)]) == MAGIC


def _b64_len(text: str) -> int:
    """The decoded length of padded base64 ``text``."""
    return len(text) // 4 * 3 - (text[-2:].count("=") if text else 0)


def _split(doc: Any, buffers: list[bytes] | None, offset: list[int]) -> Any:
    """``doc`` with every array's base64 payload moved into ``buffers`` (None: only measured)."""
    if isinstance(doc, dict):
        if doc.keys() == _ARRAY_KEYS and isinstance(doc["data"], str):
            if buffers is None:
                n = _b64_len(doc["data"])
            else:
                raw = base64.b64decode(doc["data"], validate=True)
                buffers.append(raw)
                n = len(raw)
            ref = {"dtype": doc["dtype"], "shape": doc["shape"], "$buf": [offset[0], n]}
            offset[0] += n
            return ref
        return {k: _split(v, buffers, offset) for k, v in doc.items()}
    if isinstance(doc, list):
        # a list of names or numbers (a message's lists are of one type: a list of arrays starts with one) is
        # not walked item by item: a cohort's member list costs nothing here (an array left inline in a list
        # that started otherwise would stay base64 in the header: the same message, less compact)
        if not doc or not isinstance(doc[0], (dict, list)):
            return doc
        return [_split(v, buffers, offset) for v in doc]
    return doc


def _header(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def pack_json(text: str | bytes) -> bytes:
    """The frame of a message's JSON text."""
    return pack_doc(json.loads(text))


def pack_doc(doc: Any) -> bytes:
    """The frame of a message's JSON document (its JSON text, loaded; or ``model_dump(mode="json")``)."""
    buffers: list[bytes] = []
    header = _header(_split(doc, buffers, [0]))
    return b"".join([MAGIC, _LEN.pack(len(header)), header, *buffers])


def frame_size(text: str | bytes | Any) -> int:
    """``len(pack_json(text))`` without building the frame (``text`` may be the loaded document)."""
    offset = [0]
    header = _header(_split(json.loads(text) if isinstance(text, (str, bytes)) else text, None, offset))
    return len(MAGIC) + _LEN.size + len(header) + offset[0]


def _parts(frame: bytes | bytearray | memoryview) -> tuple[Any, memoryview]:
    view = memoryview(frame)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise ProtocolError("not a labfbo frame (bad magic)")
    start = len(MAGIC) + _LEN.size
    if len(view) < start:
        raise ProtocolError("truncated labfbo frame")
    (n,) = _LEN.unpack(view[len(MAGIC):start])
    if start + n > len(view):
        raise ProtocolError(f"truncated labfbo frame: header of {n} bytes, {len(view) - start} present")
    try:
        header = json.loads(bytes(view[start:start + n]).decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"labfbo frame with an invalid header: {exc}") from None
    return header, view[start + n:]


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in labfbo messages")


def header(frame: bytes | bytearray | memoryview) -> Any:
    """The frame's header alone (arrays as ``$buf`` references): a cheap look at a message's
    kind and round without decoding its arrays."""
    return _parts(frame)[0]


def unpack(frame: bytes | bytearray | memoryview) -> Any:
    """The JSON document of a frame (arrays back as base64), ready for ``messages.parse``."""
    doc, payload = _parts(frame)
    used = [0]

    def join(v: Any) -> Any:
        if isinstance(v, dict):
            if v.keys() == _BUF_KEYS:
                ref = v["$buf"]
                if (not isinstance(ref, list) or len(ref) != 2 or not all(type(i) is int for i in ref)
                        or ref[0] < 0 or ref[1] < 0 or ref[0] + ref[1] > len(payload)):
                    raise ProtocolError(f"labfbo frame: array reference {ref!r} outside its {len(payload)} bytes")
                used[0] += ref[1]
                raw = payload[ref[0]:ref[0] + ref[1]]
                return {"dtype": v["dtype"], "shape": v["shape"], "data": base64.b64encode(raw).decode("ascii")}
            return {k: join(x) for k, x in v.items()}
        if isinstance(v, list):
            return [join(x) for x in v]
        return v

    try:
        out = join(doc)
    except RecursionError:
        raise ProtocolError("labfbo frame nested too deeply") from None
    if used[0] != len(payload):
        raise ProtocolError(f"labfbo frame: {len(payload) - used[0]} payload bytes belong to no array")
    return out
