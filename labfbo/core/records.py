"""Typed journal records: what a site's journal holds, one pydantic model per ``op``.

A journal line is one :data:`Record` (a discriminated union on ``op``), written as JSON
with its schema version ``v``. :func:`parse_record` reads a line of any version this
labfbo knows and migrates it; :func:`dump_record` writes the current version. The site's
state is a fold of these records (:class:`labfbo.site.state.SiteState`).

Versions:

* **1** — a ``release`` record named the message kind and whether it carried DP noise
  (``kind``, ``dp``, ``steps``, ``secure_aggregation``, ``sensitivity``); what it
  released was worked out from the protocol's current options. It is read as a
  :class:`LegacyRelease`, which the site's protocol declares when the report asks
  (:meth:`labfbo.protocols.SiteLogic.legacy_release`).
* **2** (current) — a ``release`` record is the protocol's own declaration, a
  :class:`~labfbo.core.release.Release` (mechanism, sensitivity, noise, rows).
  Later additions to version 2 (a labfbo that predates them refuses them by name):
  ``traffic`` (each message's direction, kind, round and size) and ``guidance`` (the
  guidance a federated site received, summarized) — what a campaign report reads; and
  a ``release``'s ``reported`` (the option a randomized response reported: a restarted
  ``vote`` site repeats it instead of voting again); ``retract`` (a told result withdrawn);
  an ``ask``'s ``transfer`` (:class:`TransferEstimate`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError as PydanticValidationError

from labfbo.core.exceptions import JournalError
from labfbo.core.release import Release

JOURNAL_VERSION = 2
"""The schema version this labfbo writes (it reads every version up to it)."""

Metadata = dict[str, Any]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]  # a number: not true, not "1"
Count = Annotated[int, Field(strict=True)]  # an int: not true, not 2.0


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    v: int = JOURNAL_VERSION


class Header(_Record):
    """The first record: the study this journal belongs to, and the site's private seeds."""

    model_config = ConfigDict(extra="allow", frozen=True)  # readers ignore what later versions add
    op: Literal["header"] = "header"
    secret: int | None = None  # journals before site secrets: drawn on open
    # 32 bytes in hex; journals before secure aggregation have none: drawn on open
    key_seed: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    space_hash: str
    space: dict[str, Any] | None = None
    objective: Literal["minimize", "maximize"]
    protocol: str
    seed: int
    site: str
    n_init: int
    options: dict[str, Any] = {}
    outcomes: dict[str, Any] | None = None  # the OutcomeSpec (named objectives, outcome constraints)


class TrialEntry(BaseModel):
    """One proposed or enqueued trial: params in user units and its unit-cube point."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: StrictInt
    params: dict[str, Any]
    x: list[FiniteFloat]
    source: str
    round: Count
    metadata: Metadata = {}


class TransferEstimate(BaseModel):
    """What the partners' information was worth to this lab when it proposed
    (:mod:`labfbo.models.transfer`): its held-out prediction error without and with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    n: Count  # the lab's results it is estimated from
    alone: FiniteFloat  # leave-one-out RMSE on a constant prior mean (standardized units)
    shared: FiniteFloat  # ... with the partners' information in the prior mean
    gain: FiniteFloat  # 1 - shared / alone: the share of the held-out error it removes
    scale: FiniteFloat | None = None  # surface: the agreement scale c the lab's GP fitted
    agreement: FiniteFloat | None = None  # GLS coefficient of the lab's results on the partners' prediction
    agreement_se: FiniteFloat | None = None  # its standard error


class Ask(_Record):
    """A batch of trials from ``ask()``; federated asks add the clock's fields, and a protocol
    that estimates what the partners' information is worth adds ``transfer``."""

    op: Literal["ask"] = "ask"
    trials: list[TrialEntry]
    model_round: bool = False
    guidance_round: Count | None = None  # present (maybe None) on federated asks since the site clock
    seen: Count | None = None
    transfer: TransferEstimate | None = None


class Enqueue(_Record):
    op: Literal["enqueue"] = "enqueue"
    trials: list[TrialEntry]


class Historical(_Record):
    """Past experiments added with ``add_observations`` (params as given, values, standard errors)."""

    op: Literal["hist"] = "hist"
    params: list[dict[str, Any]]
    values: list[FiniteFloat]
    sems: list[FiniteFloat | None]
    outcomes: list[dict[str, tuple[FiniteFloat, FiniteFloat | None]]] | None = None  # with named outcomes


class Tell(_Record):
    op: Literal["tell"] = "tell"
    id: StrictInt
    value: FiniteFloat
    sem: FiniteFloat | None = None
    outcomes: dict[str, tuple[FiniteFloat, FiniteFloat | None]] | None = None  # with named outcomes: all of them
    metadata: Metadata = {}


class Fail(_Record):
    op: Literal["fail"] = "fail"
    id: StrictInt
    reason: str
    metadata: Metadata = {}


class Retract(_Record):
    """A told result withdrawn by the lab (a wrong number): the models leave it out from here on."""

    op: Literal["retract"] = "retract"
    id: StrictInt
    reason: str = ""


class Note(_Record):
    op: Literal["note"] = "note"
    id: StrictInt
    metadata: Metadata = {}


class Join(_Record):
    """The coordinator's join reply (index, design, horizon, clock), as received."""

    op: Literal["join"] = "join"
    reply: dict[str, Any]


class Released(_Record, Release):
    """A release the protocol declared before the message left (version 2)."""

    op: Literal["release"] = "release"

    def release(self) -> Release:
        return Release.model_validate(self.model_dump(exclude={"op", "v"}))


class LegacyRelease(_Record):
    """A version-1 release record: what the message was, not yet what it released."""

    op: Literal["release_v1"] = "release_v1"
    round: Count
    steps: Count = 1
    kind: str = "score"  # the oldest records had no kind: they were `gradient`'s DP scores
    step: int | None = None
    dp: bool = True
    secure_aggregation: bool = False
    sensitivity: float | None = None


class MessageEntry(BaseModel):
    """One message that crossed the site's boundary: which way, its kind and round, and its size."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    direction: Literal["sent", "received"]
    kind: str
    round: int  # the message's round (-1: setup, e.g. the join)
    nbytes: Count  # its size on the wire (a frame; journals of earlier builds hold JSON sizes)


class Traffic(_Record):
    """Messages sent and received since the last record, in order (sizes only, never contents)."""

    op: Literal["traffic"] = "traffic"
    messages: list[MessageEntry]


class GuidanceReceived(_Record):
    """The coordinator's guidance for one BO round, as the site received it: its kind, size and
    a summary (scalars, array shapes, small arrays in full) — the site's own copy, for its report."""

    op: Literal["guidance"] = "guidance"
    round: int
    kind: str
    nbytes: Count
    summary: dict[str, Any] = {}


class Withheld(_Record):
    """A message the site did not send because its release would have gone beyond the privacy
    budget (``DP(epsilon=...)``): it answered ``Abstain`` instead. ``spent``: epsilon so far."""

    op: Literal["withheld"] = "withheld"
    round: Count
    message: str
    step: int | None = None
    spent: float = Field(ge=0)
    budget: float = Field(gt=0)


Record = Annotated[Union[Header, Ask, Enqueue, Historical, Tell, Fail, Retract, Note, Join, Released, LegacyRelease,
                         Traffic, GuidanceReceived, Withheld],
                   Field(discriminator="op")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Record)


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A record of any known version as the current schema reads it."""
    version = raw.get("v", 0)
    if version < 2 and raw.get("op") == "release":
        return {**raw, "op": "release_v1"}
    return raw


def parse_record(raw: Any, where: str = "journal record") -> Any:
    """The typed record of one journal line (migrated); a malformed one is a JournalError at ``where``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("op"), str):
        raise JournalError(f"{where}: not a journal record")
    version = raw.get("v", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise JournalError(f"{where}: record version {version!r} is not an integer")
    if version > JOURNAL_VERSION:
        raise JournalError(f"{where}: record version {version} is newer than this labfbo ({JOURNAL_VERSION})")
    try:
        return _ADAPTER.validate_python(migrate(raw))
    except PydanticValidationError as exc:
        if any(e["type"] == "union_tag_invalid" for e in exc.errors()):
            raise JournalError(f"{where}: unknown journal record {raw['op']!r}") from None
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or raw['op']}: {e['msg']}"
                             for e in exc.errors())
        raise JournalError(f"{where}: {raw['op']!r} record does not replay ({problems})") from None


def dump_record(record: Any) -> dict[str, Any]:
    """The JSON object of a record at the current version (fields never set stay absent, so an
    old ``ask`` without the clock's fields is re-journaled as it was)."""
    return {"v": JOURNAL_VERSION, "op": record.op,
            **record.model_dump(mode="json", exclude_unset=True, exclude={"v", "op"})}
