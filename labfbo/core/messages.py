"""Every model that crosses a site boundary. This module *is* the privacy boundary.

A message is a pydantic model with a ``kind`` tag and a schema ``version``; arrays travel
as :class:`Array` (dtype, shape, base64 of little-endian bytes — never pickle; on the wire
the base64 becomes raw bytes, see :mod:`labfbo.core.wire`). Anything
a site sends is one of the classes registered here (protocol modules register their own
with :func:`register`), so ``opt.sent_messages()`` lists exactly what left the site, and
:func:`parse` refuses anything unknown.
"""

from __future__ import annotations

import base64
import math
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from labfbo.core import wire
from labfbo.core.exceptions import ProtocolError

SCHEMA_VERSION = 1
_ALLOWED_DTYPES = ("float64", "float32", "int64", "int32", "int8", "bool", "uint8", "uint64")


class Array(BaseModel):
    """A numeric array in a message: explicit dtype and shape, base64 payload."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    dtype: str
    shape: tuple[int, ...]
    data: str

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in _ALLOWED_DTYPES:
            raise ValueError(f"dtype {v!r} not allowed in messages")
        return v

    @classmethod
    def of(cls, a: Any, dtype: str = "float64") -> "Array":
        # (np.ascontiguousarray would turn a 0-d array into shape (1,))
        arr = np.array(np.asarray(a, dtype=np.dtype(dtype).newbyteorder("<")), order="C", copy=True)
        return cls(dtype=dtype, shape=tuple(int(s) for s in arr.shape),
                   data=base64.b64encode(arr.tobytes()).decode("ascii"))

    def numpy(self) -> np.ndarray:
        raw = base64.b64decode(self.data.encode("ascii"))
        arr = np.frombuffer(raw, dtype=np.dtype(self.dtype).newbyteorder("<"))
        if arr.size != math.prod(self.shape):
            raise ProtocolError(f"array payload has {arr.size} items, shape says {self.shape}")
        return arr.reshape(self.shape).astype(self.dtype)  # native byte order, writable copy

    @property
    def n_scalars(self) -> int:
        return math.prod(self.shape)  # exact (no int64 wrap), and no NumPy call per array


class Message(BaseModel):
    """Base of every cross-site message."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str
    version: int = SCHEMA_VERSION
    round: int = -1
    study: str = ""

    _registry: ClassVar[dict[str, type["Message"]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, data: Any) -> Any:
        """pydantic would read ``"weight": true`` as 1.0; a message field is a bool only if declared one."""
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if isinstance(data.get(name), bool) and "bool" not in str(field.annotation):
                    raise ValueError(f"{name} must be a {getattr(field.annotation, '__name__', field.annotation)}, "
                                     f"got {data[name]!r}")
        return data

    def to_wire(self) -> bytes:
        """The message as every transport sends it: a :mod:`labfbo.core.wire` frame (its JSON with
        the arrays as raw bytes)."""
        return wire.pack_doc(self.model_dump(mode="json"))  # the JSON document, without its text

    def nbytes(self) -> int:
        """Size of the message on the wire (its frame)."""
        return wire.frame_size(self.model_dump(mode="json"))

    def summary(self, max_items: int = 64) -> dict[str, Any]:
        """Its fields for a person to read: scalars and short lists as they are, each array as
        its shape (and its values when it has at most ``max_items``); nested models by field."""
        def brief(v: Any) -> Any:
            if isinstance(v, Array):
                out: dict[str, Any] = {"shape": list(v.shape)}
                if v.n_scalars <= max_items:
                    out["values"] = v.numpy().tolist()
                return out
            if isinstance(v, BaseModel):
                return {k: brief(getattr(v, k)) for k in type(v).model_fields}
            if isinstance(v, (list, tuple)):
                return [brief(x) for x in v] if len(v) <= max_items else {"length": len(v)}
            if isinstance(v, dict):
                return {str(k): brief(x) for k, x in v.items()} if len(v) <= max_items else {"length": len(v)}
            return v
        return {k: brief(getattr(self, k)) for k in type(self).model_fields if k not in ("kind", "version", "study")}


M = TypeVar("M", bound=type[Message])


def omit_unset(out: Any, message: BaseModel, *fields: str) -> Any:
    """A message's dump ``out`` without those of ``fields`` that ``message`` leaves None: a field added
    to a message later is left off the wire until used, so older messages keep their bytes."""
    if isinstance(out, dict):
        for key in fields:
            if getattr(message, key) is None:
                out.pop(key, None)
    return out


def register(cls: M) -> M:
    """Class decorator: make a message kind parseable (kinds must be unique)."""
    kind = cls.model_fields["kind"].default
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{cls.__name__} needs a Literal default for `kind`")
    existing = Message._registry.get(kind)
    if existing is not None and existing is not cls:
        raise TypeError(f"message kind {kind!r} already registered by {existing.__name__}")
    Message._registry[kind] = cls
    return cls


def parse(data: str | bytes | dict[str, Any]) -> Message:
    """Decode a message — a wire frame, its JSON text or that JSON's dict — into its registered class."""
    if wire.is_frame(data):
        data = wire.unpack(data)  # type: ignore[arg-type]
        if not isinstance(data, dict):
            raise ProtocolError("not a labfbo message (a frame's header must be a JSON object)")
    elif isinstance(data, (str, bytes)):
        import json

        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"not a labfbo message (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or "kind" not in data:
        raise ProtocolError("not a labfbo message (no 'kind')")
    if not isinstance(data["kind"], str):
        raise ProtocolError(f"a message's 'kind' is a string, got {type(data['kind']).__name__}")
    cls = Message._registry.get(data["kind"])
    if cls is None:
        raise ProtocolError(f"unknown message kind {data['kind']!r}")
    try:
        version = int(data.get("version", SCHEMA_VERSION))
    except (TypeError, ValueError):
        raise ProtocolError(f"message version must be an integer, got {data.get('version')!r}") from None
    if version > SCHEMA_VERSION:
        raise ProtocolError(f"message version {version} is newer than this labfbo ({SCHEMA_VERSION})")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError(f"malformed {data['kind']!r} message: {exc}") from None


# -- messages every protocol shares --------------------------------------------------
class PrivacyDeclaration(BaseModel):
    """A site's differential privacy as it joins: its campaign budget (``epsilon``; None: a noise
    multiplier alone, no budget), ``delta``, its configured ``noise_multiplier`` (None:
    calibrated to the budget) and the ``unit`` it protects. The consortium's privacy floor is checked
    against it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    epsilon: float | None = Field(None, gt=0, allow_inf_nan=False)
    delta: float = Field(gt=0, lt=1)
    noise_multiplier: float | None = Field(None, ge=0, allow_inf_nan=False)
    clip: float | None = Field(None, gt=0, allow_inf_nan=False)
    horizon: int | None = Field(None, ge=1, description="the BO rounds a budget yet to be calibrated is planned "
                                "over, when the site sets them (None: the study's horizon)")
    unit: Literal["site", "experiment"] = Field("site", description="what the guarantee protects: the site's whole "
                                                "dataset or one experiment (labfbo.DP(unit=...))")

    @model_serializer(mode="wrap")
    def _no_unset_horizon(self, handler: Any) -> Any:
        out = handler(self)
        if self.horizon is None and isinstance(out, dict):
            out.pop("horizon", None)  # byte for byte as before (and old coordinators read it)
        if self.unit == "site" and isinstance(out, dict):
            out.pop("unit", None)  # likewise for the default unit
        return out


@register
class JoinRequest(Message):
    """A site asks to join a study: the coordinator checks space and protocol."""

    kind: Literal["join"] = "join"
    site: str
    protocol: str
    space_hash: str
    space: dict[str, Any]
    n_init: int = Field(ge=0, le=100_000, default=0)
    shared_options: dict[str, Any] = Field(default_factory=dict)
    local_constraints: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=1000,
        description="names of the site's own nonlinear constraints (their code never leaves the site)")
    privacy: PrivacyDeclaration | None = Field(None, description="the site's DP settings (None: no DP)")

    @model_serializer(mode="wrap")
    def _no_unset_privacy(self, handler: Any) -> Any:
        out = handler(self)
        if self.privacy is None and isinstance(out, dict):
            out.pop("privacy", None)  # a join without DP is byte for byte as before (and old coordinators read it)
        return out


class SpentBudget(BaseModel):
    """A site's releases as the coordinator accounted them (every answer it received that carried
    data-derived information, declared by the protocol's own site side): what the site spent.

    ``gaussian``: ``[effective noise multiplier, releases]`` pairs; ``responses``: ``[buckets,
    epsilon, releases]`` of randomized responses; ``exposed``: one carried no DP noise (no finite
    epsilon); ``epsilon``: their PLD composition at ``delta`` (None: infinite or not known)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    releases: int = Field(0, ge=0)
    gaussian: list[tuple[float, int]] = Field(default_factory=list, max_length=100_000)
    responses: list[tuple[int, float, int]] = Field(default_factory=list, max_length=100_000)
    exposed: bool = False
    epsilon: float | None = Field(None, ge=0, allow_inf_nan=False)
    delta: float = Field(gt=0, lt=1)
    budget: float | None = Field(None, gt=0, allow_inf_nan=False, description="the smallest DP(epsilon=...) the "
                                 "site declared to this study (and the consortium's floor, if lower)")
    discarded: int = Field(0, ge=0, description="releases the coordinator discarded: over the budget")


@register
class JoinReply(Message):
    """The coordinator's answer: the site's index, the federation size and its design cells.

    ``design`` holds the site's rows of the collaborative Latin hypercube (unit cube). ``spent``:
    to a site with a privacy budget that the coordinator has accounted releases of (a rejoin),
    what it spent — the site plans from it when its own journal says less (lost, rolled back).
    """

    kind: Literal["join_reply"] = "join_reply"
    site_index: int
    n_sites: int
    design: Array
    horizon: int | None = None
    clock: int = -1  # the coordinator's last completed round when the site joined
    study_seed: int | None = None  # the study's seed: draws every site must share (ParEGO weights)
    spent: SpentBudget | None = None

    @model_serializer(mode="wrap")
    def _no_unset_spent(self, handler: Any) -> Any:
        out = handler(self)
        if self.spent is None and isinstance(out, dict):
            out.pop("spent", None)  # a first join is byte for byte as before (and older sites read it)
        return out


@register
class BudgetExhausted(Message):
    """The coordinator discarded ``site``'s release of this round: with it, the site's cumulative
    epsilon as the coordinator accounts it would exceed its budget (``reason`` says which). Sent in
    place of the round's guidance: the site proposes from its own model, releases nothing more,
    and plans from ``spent``."""

    kind: Literal["budget_exhausted"] = "budget_exhausted"
    site: str
    reason: str = Field(max_length=2000)
    spent: SpentBudget


@register
class Abstain(Message):
    """A site has nothing to contribute to this exchange (e.g. no data yet)."""

    kind: Literal["abstain"] = "abstain"
    reason: str = ""


@register
class NoGuidance(Message):
    """The coordinator has nothing for the site this round (protocol `independent`)."""

    kind: Literal["no_guidance"] = "no_guidance"
