"""A request body read as a labfbo message: UTF-8 JSON or a wire frame, finite, within the array limits (422 else)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from fastapi import HTTPException
from pydantic import BaseModel

from labfbo.core import wire
from labfbo.core.exceptions import ProtocolError
from labfbo.core.messages import Array, Message, parse


def check_payload(msg: Message, max_items: int) -> None:
    """Refuse NaN/inf anywhere and arrays over ``max_items`` (422)."""
    def walk(v: Any, where: str) -> None:
        if isinstance(v, Array):
            if v.n_scalars > max_items:
                raise ProtocolError(f"{where}: {v.n_scalars} items, the limit is {max_items}")
            a = v.numpy()
            if a.dtype.kind == "f" and not bool(np.isfinite(a).all()):
                raise ProtocolError(f"{where}: NaN or infinite values")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ProtocolError(f"{where}: NaN or infinite value")
        elif isinstance(v, BaseModel):
            for k in type(v).model_fields:
                walk(getattr(v, k), f"{where}.{k}")
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}.{k}")
    walk(msg, msg.kind)


def _reject_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in labfbo messages")


def read_json(body: bytes) -> Any:
    """The JSON of a request body (422 for invalid JSON, NaN/inf, anything but UTF-8, too deep)."""
    try:  # json.loads would also accept UTF-16/32 bytes; the protocol is UTF-8 (RFC 8259)
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        return json.loads(text, parse_constant=_reject_constants)
    except ValueError as exc:  # covers UnicodeDecodeError
        raise HTTPException(422, str(exc)) from None
    except RecursionError:
        raise HTTPException(422, "message nested too deeply") from None


def read_document(body: bytes) -> Any:
    """The JSON document of a request body: a wire frame's (422 if damaged or not an object) or
    the JSON's (:func:`read_json`)."""
    if not wire.is_frame(body):
        return read_json(body)
    try:
        data = wire.unpack(body)
    except ProtocolError as exc:
        raise HTTPException(422, str(exc)) from None
    if not isinstance(data, dict):
        raise HTTPException(422, "not a labfbo message (a frame's header must be a JSON object)")
    return data


def read_message(body: bytes | Any, max_items: int) -> Message:
    """A checked message from a request body — a wire frame, JSON, or already-loaded JSON; 422
    if it is not one."""
    data = read_document(body) if isinstance(body, (bytes, str)) else body
    try:
        msg = parse(data)
        check_payload(msg, max_items)
    except (ValueError, ProtocolError, OverflowError) as exc:  # ValueError covers UnicodeDecodeError
        raise HTTPException(422, str(exc)) from None
    except RecursionError:
        raise HTTPException(422, "message nested too deeply") from None
    return msg
