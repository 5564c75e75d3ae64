r"""The site's ``ClientApp`` under Flower: a relay from the SuperNode to the running site.

Flower starts a fresh ``ClientApp`` process for every message, and the lab script's
:class:`labfbo.Optimizer` must stay the only writer of the site's journal. So the
``ClientApp`` computes nothing: it forwards the coordinator's request over a local socket
to the running site (the *bridge* the Optimizer opens with
``coordinator="flower://127.0.0.1:PORT"``, see :mod:`labfbo.transport.flower`), and sends
back what the site answered. Its SuperNode's node config says where the bridge is and
the site's token::

    flower-supernode ... --node-config 'labfbo-site="127.0.0.1:9500" labfbo-token-file="/etc/labfbo/token"'

(``labfbo-token-file``: a file only the SuperNode's user can read; ``labfbo-token="..."``
also works but puts the token on the command line, where every local user can read it.)

This module is loaded from the Flower App Bundle and imports only the standard library,
numpy and flwr (importing :mod:`labfbo` would cost seconds on every message).

**A labfbo message inside a Flower ``Message``.** A labfbo wire frame (``LFBW``, a JSON
header, the arrays' raw bytes; :mod:`labfbo.core.wire`) becomes a ``RecordDict`` with

* ``"labfbo"``: a ``ConfigRecord`` — ``op`` (``poll``, ``request``, ``answer``, ...), the
  frame's JSON ``header`` (each array is ``{"dtype", "shape", "$buf": [offset, length]}``)
  and the exchange's control fields;
* ``"arrays"``: an ``ArrayRecord`` with the message's arrays in header order, keys
  ``"0"``, ``"1"``, ..., each a NumPy ``Array`` of its dtype and shape.

A JSON body (an error) travels as ``ConfigRecord["json"]``. The conversion is lossless:
the coordinator and the site rebuild the same frame bytes and validate them with the
message's pydantic model as on every other transport.

**The bridge protocol** (127.0.0.1 TCP, one call per connection): each side sends two
length-prefixed parts (uint32 little-endian), a JSON object of control fields (the
relay's carries the site's ``token``, checked before the body is read) and a body (a
frame, JSON, or empty).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

import numpy as np

MAGIC = b"LFBW\x01"
_LEN = struct.Struct("<I")
CONTROL = "labfbo"
ARRAYS = "arrays"
MESSAGE_TYPE = "query.labfbo"
BRIDGE_TIMEOUT = 600.0
"""Seconds the relay waits for the site's answer (a gradient step at a busy site takes long)."""
MAX_CONTROL = 1 << 20
MAX_BODY = 1 << 29
"""The largest body a bridge reads (512 MiB; a gradient request of the defaults is a few MB)."""


class RelayError(RuntimeError):
    """The site's bridge is unreachable or refused the relay."""


# -- frames inside Flower records ------------------------------------------------------------
def _refs(doc: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The header's array references (``$buf``) in document order."""
    if isinstance(doc, dict):
        if "$buf" in doc:
            out.append(doc)
        else:
            for v in doc.values():
                _refs(v, out)
    elif isinstance(doc, list):
        for v in doc:
            _refs(v, out)
    return out


def split_frame(frame: bytes) -> tuple[str, list[np.ndarray]]:
    """``(header text, arrays)`` of a labfbo frame (the arrays as little-endian NumPy arrays)."""
    view = memoryview(frame)
    if bytes(view[:len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + _LEN.size:
        raise ValueError("not a labfbo frame")
    start = len(MAGIC) + _LEN.size
    (n,) = _LEN.unpack(view[len(MAGIC):start])
    text = bytes(view[start:start + n]).decode("utf-8")
    payload = view[start + n:]
    arrays = []
    for ref in _refs(json.loads(text), []):
        offset, length = ref["$buf"]
        dtype = np.dtype(ref["dtype"]).newbyteorder("<")
        arrays.append(np.frombuffer(payload[offset:offset + length], dtype=dtype).reshape(ref["shape"]))
    return text, arrays


def join_frame(header: str, arrays: list[np.ndarray]) -> bytes:
    """The frame of a header and its arrays (the inverse of :func:`split_frame`)."""
    head = header.encode("utf-8")
    raw = [np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes() for a in arrays]
    return b"".join([MAGIC, _LEN.pack(len(head)), head, *raw])


def to_content(body: bytes | None, **control: Any) -> Any:
    """A Flower ``RecordDict`` carrying ``body`` (a frame, JSON or nothing) and ``control``."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    fields = {k: v for k, v in control.items() if v is not None}
    records: dict[str, Any] = {}
    if body and body[:len(MAGIC)] == MAGIC:
        header, arrays = split_frame(body)
        fields["header"] = header
        records[ARRAYS] = ArrayRecord({str(i): Array(a) for i, a in enumerate(arrays)})
    elif body:
        fields["json"] = body.decode("utf-8")
    records[CONTROL] = ConfigRecord(fields)
    return RecordDict(records)


def from_content(content: Any) -> tuple[dict[str, Any], bytes]:
    """``(control fields, body)`` of a ``RecordDict`` made by :func:`to_content`."""
    if CONTROL not in content.config_records:
        raise ValueError("a Flower message without labfbo's control record")
    fields = dict(content.config_records[CONTROL])
    header, text = fields.pop("header", None), fields.pop("json", None)
    if header is not None:
        record = content.array_records.get(ARRAYS)
        arrays = [] if record is None else [record[str(i)].numpy() for i in range(len(record))]
        return fields, join_frame(str(header), arrays)
    return fields, b"" if text is None else str(text).encode("utf-8")


# -- the bridge protocol --------------------------------------------------------------------
def send_parts(sock: socket.socket, control: dict[str, Any], body: bytes) -> None:
    head = json.dumps(control).encode()
    sock.sendall(b"".join([_LEN.pack(len(head)), head, _LEN.pack(len(body)), body]))


def _read(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (``time.monotonic()``), all of them by then (a trickle times out)."""
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError("the bridge connection was too slow")
            sock.settimeout(wait)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the bridge connection closed mid-message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_control(sock: socket.socket, within: float | None = None) -> dict[str, Any]:
    """The first part: the control fields (a JSON object of at most :data:`MAX_CONTROL` bytes),
    all of it within ``within`` seconds when given."""
    deadline = None if within is None else time.monotonic() + within
    (n,) = _LEN.unpack(_read(sock, _LEN.size, deadline))
    if n > MAX_CONTROL:
        raise ValueError(f"control part of {n} bytes")
    control = json.loads(_read(sock, n, deadline))
    if not isinstance(control, dict):
        raise ValueError("the control part must be a JSON object")
    return control


def recv_body(sock: socket.socket, max_body: int = MAX_BODY) -> bytes:
    """The second part: the body (at most ``max_body`` bytes)."""
    (m,) = _LEN.unpack(_read(sock, _LEN.size))
    if m > max_body:
        raise ValueError(f"body of {m} bytes (at most {max_body})")
    return _read(sock, m)


def recv_parts(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    return recv_control(sock), recv_body(sock)


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a bridge address is host:port, got {address!r}")
    return host.strip("[]"), int(port)


def call_site(address: str, token: str, control: dict[str, Any], body: bytes,
              timeout: float = BRIDGE_TIMEOUT) -> tuple[dict[str, Any], bytes]:
    """One call to the site's bridge: ``(its control fields, its body)``."""
    try:
        with socket.create_connection(parse_address(address), timeout=timeout) as sock:
            send_parts(sock, {**control, "token": token}, body)
            answer, out = recv_parts(sock)
    except OSError as exc:
        raise RelayError(f"the site's labfbo bridge at {address} is unreachable: {exc}") from None
    if "refused" in answer:
        raise RelayError(f"the site's labfbo bridge refused the relay: {answer['refused']}")
    return answer, out


def node_token(config: Any) -> str:
    """The site's token from the SuperNode's node config (``labfbo-token-file`` or ``labfbo-token``)."""
    if "labfbo-site" not in config or not ("labfbo-token-file" in config or "labfbo-token" in config):
        raise RelayError("this SuperNode has no labfbo bridge: start it with --node-config "
                         "'labfbo-site=\"127.0.0.1:PORT\" labfbo-token-file=\"/path/to/token\"'")
    if "labfbo-token-file" in config:
        try:
            with open(str(config["labfbo-token-file"]), encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise RelayError(f"cannot read labfbo-token-file: {exc}") from None
    return str(config["labfbo-token"])


# -- the ClientApp ----------------------------------------------------------------------------
def _make_client_app() -> Any:
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.query("labfbo")
    def relay(msg: Message, context: Any) -> Message:
        config = context.node_config
        control, body = from_content(msg.content)
        answer, out = call_site(str(config.get("labfbo-site", "")), node_token(config), control, body)
        return Message(to_content(out, **answer), reply_to=msg)

    return app


try:  # the relay's codec also serves the coordinator, which may run without flwr's ClientApp
    client_app = _make_client_app()
except ImportError:  # pragma: no cover - flwr missing
    client_app = None
