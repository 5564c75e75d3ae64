"""What a protocol is: site-side logic plus coordinator-side aggregation over messages.

A BO round ``t`` of a federated protocol runs like this (the transport only moves the
messages; it knows nothing of what is in them)::

    step = aggregator.open_round(t)                 # Exchange(requests) or Finish(replies)
    while isinstance(step, Exchange):               # zero, one or many exchanges per round
        responses = {s: site_logic[s].answer(req, data_s, t) for s, req in step.requests}
        step = aggregator.on_responses(t, responses)  # only sites that answered are in it
    guidance = step.replies[s]                      # the site's reply for round t
    X_next = site_logic[s].propose(data_s, guidance, n, t)

``answer`` reads only the site's own data; ``on_responses`` reads only messages. A site
that has nothing to contribute answers :class:`~labfbo.core.messages.Abstain`; aggregators must
use the number of sites that actually contributed.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ValidationError as PydanticValidationError

from labfbo.core.exceptions import ConfigurationError, ProtocolError
from labfbo.core.messages import Abstain, Message
from labfbo.core.records import TransferEstimate
from labfbo.core.release import Release
from labfbo.core.seeding import int_seed, stable_hash
from labfbo.core.suggest import did_you_mean
from labfbo.privacy.dp import DP
from labfbo.privacy.streams import NoiseStreams
from labfbo.space.search import SearchSpace

if TYPE_CHECKING:
    from labfbo.core.objectives import OutcomeSpec


@dataclass(frozen=True)
class SiteData:
    """A site's local data in model coordinates (never leaves the site).

    ``X`` are unit-cube inputs of the completed observations, ``y`` their values in the
    *maximization* orientation, ``yvar`` the known noise variances (``None`` unless every
    observation has a standard error), ``pending`` the unit-cube points in flight, ``failed`` those of failed trials.
    """

    space: SearchSpace
    X: np.ndarray
    y: np.ndarray
    yvar: np.ndarray | None
    pending: np.ndarray
    failed: np.ndarray | None = None  # unit-cube points of failed trials (not proposed again where avoidable)
    Y: np.ndarray | None = None  # (n, k) with named outcomes: OutcomeSpec.outcome_matrix of the same rows
    Yvar: np.ndarray | None = None  # (n, k) their known noise variances, NaN where no standard error was given

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    def key(self) -> bytes:
        """Identifies the observations (for caching fitted models)."""
        parts = [self.X.tobytes(), self.y.tobytes(), b"" if self.yvar is None else self.yvar.tobytes()]
        return b"|".join(parts)

    def digest(self, also: np.ndarray | None = None) -> str:
        """A short hash of :meth:`key` (and ``also``, e.g. every outcome a release protects): names the
        query a DP draw answers, so an answer recomputed from the same data repeats its bytes and one
        from other data draws fresh noise (:mod:`labfbo.privacy.streams`)."""
        return hashlib.sha256(self.key() + (b"" if also is None else also.tobytes())).hexdigest()[:16]


@dataclass(frozen=True)
class SiteContext:
    """Who the site is in its federation and how its random streams are seeded."""

    site: str
    site_index: int = 0
    n_sites: int = 1
    seed: int = 0
    horizon: int | None = None
    objective: Literal["minimize", "maximize"] = "minimize"
    secret: int = 0  # site-private: seeds draws the coordinator must not predict (DP noise)
    key_seed: bytes = b""  # site-private, 32 random bytes: secure-aggregation keys and self masks
    outcomes: "OutcomeSpec | None" = None  # named objectives and outcome constraints (site-local)
    # (n_sites, n_init, d): the study's collaborative design (public), for site logic with ``uses_study_design``
    study_design: np.ndarray | None = None

    def seed_for(self, round: int, purpose: str) -> int:
        return int_seed(self.seed, self.site_index, round, purpose)

    def private_rng(self, round: int, purpose: str) -> np.random.Generator:
        """A generator keyed by the site's secret: unpredictable to the coordinator and peers."""
        return np.random.default_rng(np.random.SeedSequence([self.secret, int(round), stable_hash(purpose)]))


@dataclass(frozen=True)
class Exchange:
    """The coordinator asks sites for something: one request per site."""

    requests: Mapping[str, Message]


@dataclass(frozen=True)
class Finish:
    """The round is over: the guidance each site receives (sites may be missing)."""

    replies: Mapping[str, Message] = field(default_factory=dict)


Step = Exchange | Finish


class SiteLogic(ABC):
    """The site side of a protocol: answers requests from local data, proposes points."""

    #: the optimizer puts the study's collaborative design (every site's initial points, public)
    #: into :attr:`SiteContext.study_design` only for site logic that uses it
    uses_study_design: ClassVar[bool] = False

    def __init__(self, space: SearchSpace, options: BaseModel, context: SiteContext) -> None:
        self.space = space
        self.options = options
        self.context = context

    def expect(self, n: int) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """The site is about to ask for ``n`` points (called before its round's guidance)."""

    def alone(self) -> str | None:
        """Why the last proposal took nothing from the partners although its round's guidance arrived (no
        secure sum formed, DP noise swamped it, ...): the optimizer names it in a warning and the trial's
        source (``model-alone``). None: it used the guidance, or this protocol does not say."""
        return None

    def transfer(self) -> TransferEstimate | None:
        """What the partners' information was worth to the last proposal, estimated from this
        site's data (:mod:`labfbo.models.transfer`), journaled with the ask and shown in the
        campaign report; None: this protocol does not estimate it, or the proposal used none."""
        return None

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        """Answer one coordinator request from local data only."""
        raise ProtocolError(f"{type(self).__name__} does not handle {request.kind!r} requests")

    def sent(self, message: Message) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """``message`` left the site: the answer as the operator and the privacy budget let it go
        (an :class:`Abstain` when either held it back). Called after its release was journaled."""

    @property
    def noise_streams(self) -> NoiseStreams:
        """Which site-private stream each DP draw takes (:mod:`labfbo.privacy.streams`)."""
        if "_noise_streams" not in self.__dict__:
            self._noise_streams = NoiseStreams()
        return self._noise_streams

    def noise_rng(self, round: int, purpose: str, query: str) -> np.random.Generator:
        """The site-private generator of one DP draw answering ``query`` (a digest of what the noise
        protects and answers): ``purpose``'s first stream this round for the first query, the same
        stream for the same query again, a fresh one for another (:mod:`labfbo.privacy.streams`)."""
        k = self.noise_streams.index(round, purpose, query)
        return self.context.private_rng(round, f"{purpose}/stream-{k}")

    def resume(self, releases: Sequence[Release]) -> None:
        """The site restarted from its journal: ``releases`` are those it made before (in order),
        for logic that must remember what it already sent (e.g. a vote made once a campaign).
        Overrides call this first: it replays the noise streams the releases drew from."""
        self.noise_streams.resume((r.round, r.streams) for r in releases)

    def resume_transfer(self, estimate: TransferEstimate | None) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """The site restarted from its journal: the transfer estimate of its last model proposal (None:
        it made none), for logic whose answers depend on it (``surface``'s upload weight)."""

    def release(self, message: Message) -> Release | None:
        """What sending ``message`` (an answer, its ``round`` set) discloses about the site's data;
        ``None`` if it carries nothing computed from the data. Journaled before it is sent."""
        if isinstance(message, Abstain):
            return None
        out = self.declare_release(message.kind, message.round, getattr(message, "step", None),
                                   noised=getattr(message, "dp_noise_multiplier", None) is not None,
                                   sensitivity=getattr(message, "dp_sensitivity", None))
        streams = self.noise_streams.drawn(message.round)
        return out if out is None or not streams else out.model_copy(update={"streams": tuple(streams)})

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        """The release of a message of this ``kind`` (``noised``: it carried DP noise; ``sensitivity``:
        as the message stated it). Protocols that add noise or send key material override this;
        the default is conservative: released as it is, without a finite guarantee."""
        return Release.unprotected(kind, round, step)

    def planned_releases(self, horizon: int) -> dict[str, int]:
        """How many DP releases of each message kind a campaign of ``horizon`` BO rounds makes
        (:mod:`labfbo.privacy.budget` calibrates the noise to them). None by default."""
        return {}

    def legacy_release(self, record: Mapping[str, Any]) -> Release | None:
        """A release journaled before protocols declared them (``kind``, ``round``, ``step``,
        ``dp``, ``sensitivity``; the oldest had no ``kind``: they were `gradient`'s DP scores)."""
        return self.declare_release(record.get("kind", "score"), int(record["round"]), record.get("step"),
                                    noised=bool(record.get("dp", True)), sensitivity=record.get("sensitivity"))

    @abstractmethod
    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        """Return ``(n, d)`` unit-cube points to evaluate next (``data.n >= 1``)."""

    def predict(self, data: SiteData, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and std (maximization orientation) at unit-cube ``X``."""
        raise ProtocolError(f"{type(self).__name__} has no predictive model")

    def predict_outcomes(self, data: SiteData, X: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """With named outcomes: ``outcome -> (mean, std)`` in the lab's units at unit-cube ``X``."""
        raise ProtocolError(f"{type(self).__name__} has no model of named outcomes")


class Aggregator(ABC):
    """The coordinator side of a protocol: a deterministic state machine over messages."""

    def __init__(self, options: BaseModel, sites: Sequence[str], seed: int,
                 horizon: int | None, space: SearchSpace | None) -> None:
        self.options = options
        self.sites = list(sites)
        self.seed = seed
        self.horizon = horizon
        self.space = space

    @abstractmethod
    def open_round(self, t: int) -> Step:
        """First step of round ``t``."""

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        """Next step given the responses of the sites that answered the last exchange."""
        raise ProtocolError(f"{type(self).__name__} sent no requests in round {t}")

    def admit(self, site: str, message: Message) -> Message:
        """``message`` as this protocol can use it: returned as it is, or a copy with its bounded
        scalars clipped to their range; :class:`~labfbo.core.exceptions.Inadmissible` (naming what is
        wrong) for a contribution that cannot be used this round. The coordinator then treats the
        site as abstaining, so the others' round is the one they would have had without it.
        The default admits everything (a protocol's message schemas check what they can alone)."""
        return message

    def site_reports(self) -> dict[str, str]:
        """What sites chose to tell the operator about the federation's worth to them (site -> a
        short text for the coordinator's dashboard; a lab's opt-in, e.g. ``surface``'s
        ``share_agreement``); empty by default."""
        return {}

    def retire(self, site: str) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """``site`` has spent its privacy budget and will release nothing more: leave it out of
        what needs every member (e.g. a secure sum's cohort). Nothing by default."""

    def abstained(self, site: str, reason: str) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """``site`` abstained from the last exchange, for ``reason`` (its answer is not among the
        responses). Nothing by default."""

    def state(self) -> dict[str, Any]:
        """What the aggregator carries from round to round (JSON-able), for durable coordinators."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Continue from :meth:`state` (after a coordinator restart)."""


class Protocol:
    """A protocol. The class holds what the core reads of it; an instance is the protocol
    configured: ``labfbo.protocols.Surface(privacy=labfbo.DP(epsilon=2.0))`` validates its
    keywords into :attr:`options` (its :attr:`Options` model). The same object is given to every
    site's :class:`~labfbo.Optimizer` and to the :class:`~labfbo.Coordinator`; the name plus
    keywords (``protocol="surface", privacy=...``) is the shorthand for it.

    A new protocol subclasses this with its ``name``, ``Options``, ``site_logic`` and (federated)
    ``aggregator``, overrides the facts below that differ from the defaults, and adds one line
    to ``_BUILTIN`` in :mod:`labfbo.protocols`. :class:`labfbo.testing.ProtocolConformance`
    checks it does what every protocol must.
    """

    name: ClassVar[str]
    #: it has coordinator rounds (False: the site optimizes alone and sends nothing)
    federated: ClassVar[bool] = True
    #: it sends the site's observations themselves (a non-private reference such as ``pooled``)
    shares_raw_data: ClassVar[bool] = False
    #: part of ``labfbo bench demo-suite`` (the privacy-preserving protocols)
    demo: ClassVar[bool] = True
    supported_types: ClassVar[frozenset[str]] = frozenset({"real", "integer", "discrete", "categorical"})
    Options: ClassVar[type[BaseModel]]
    site_logic: ClassVar[type[SiteLogic]]
    aggregator: ClassVar[type[Aggregator] | None] = None  # None: no coordinator rounds
    needs_horizon: ClassVar[bool] = False       # the coordinator needs the planned number of rounds
    shared_options: ClassVar[tuple[str, ...]] = ()  # options every site must share with the coordinator
    # shared options added after the first release: a join leaves them out while they are at their default,
    # so it reads as before (and a coordinator fills in the default of one a site does not send)
    later_shared_options: ClassVar[tuple[str, ...]] = ()
    #: options that keep a small test campaign fast (fewer particles, candidates, steps): for
    #: :mod:`labfbo.testing` and the test suite, not for real campaigns
    quick_options: ClassVar[Mapping[str, Any]] = {}

    options: BaseModel

    def __init__(self, **options: Any) -> None:
        self.options = parse_options(type(self), options)

    @classmethod
    def from_options(cls, options: "BaseModel | Mapping[str, Any]") -> "Protocol":
        """The configured protocol of an options model already validated (or of keywords)."""
        if isinstance(options, cls.Options):
            configured = cls.__new__(cls)
            configured.options = options
            return configured
        if isinstance(options, BaseModel):
            options = options.model_dump(exclude_unset=True)
        return cls(**options)

    # -- what the core asks of a protocol --------------------------------------------------
    @classmethod
    def supports_privacy(cls) -> bool:
        """It has a differential-privacy mechanism: a ``privacy`` option (``DP`` or None)."""
        return "privacy" in cls.Options.model_fields

    @classmethod
    def takes_acquisition(cls) -> bool:
        """Its sites maximize a configurable acquisition function (an ``acquisition`` option)."""
        return "acquisition" in cls.Options.model_fields

    @property
    def privacy(self) -> DP | None:
        """Its DP settings (the ``privacy`` option); None without DP or without a DP mechanism."""
        return self.options.privacy if self.supports_privacy() else None  # type: ignore[attr-defined]

    @property
    def acquisition(self) -> str | None:
        """The acquisition its sites maximize; None for a protocol without the option."""
        return self.options.acquisition if self.takes_acquisition() else None  # type: ignore[attr-defined]

    @property
    def dp_colluders(self) -> int:
        """How many sites may collude against the others' distributed DP noise shares (0: local noise)."""
        return 0

    @property
    def distributed_noise(self) -> bool:
        """Each site adds a share of the DP noise of the sum (True) rather than its own full noise."""
        return False

    @property
    def shared(self) -> dict[str, Any]:
        """The options a site sends in its join for the coordinator to compare (``shared_options``;
        a ``later_shared_options`` one only when it is not at its default)."""
        fields = type(self.options).model_fields
        return {k: v for k, v in self.options.model_dump(mode="json").items() if k in self.shared_options
                and not (k in self.later_shared_options and k in fields and v == fields[k].default)}

    def keywords(self) -> dict[str, Any]:
        """The options given (the shorthand's keywords): ``type(self)(**p.keywords()) == p``."""
        return {k: v for k, v in self.options if k in self.options.model_fields_set}

    @classmethod
    def check_study(cls, options: BaseModel, n_sites: int) -> None:
        """Refuse a study these options cannot run (called when the coordinator is created)."""

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        """Refuse a space with parameter types the protocol does not support."""
        bad = sorted(space.kinds() - cls.supported_types)
        if bad:
            raise ProtocolError(
                f"protocol {cls.name!r} does not support {', '.join(bad)} parameters "
                f"(it supports: {', '.join(sorted(cls.supported_types))})")

    def __repr__(self) -> str:
        given = self.options.model_dump(exclude_unset=True)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in given.items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Protocol) and other.name == self.name and other.options == self.options

    def __hash__(self) -> int:
        return hash((self.name, self.options.model_dump_json()))


def parse_options(protocol: type[Protocol], options: Mapping[str, Any]) -> BaseModel:
    """Validate protocol keywords; unknown or invalid ones raise a ConfigurationError (naming the
    closest valid option of a misspelt one)."""
    try:
        return protocol.Options(**options)
    except PydanticValidationError as exc:
        fields = list(protocol.Options.model_fields)

        def problem(e: Any) -> str:
            where = ".".join(str(p) for p in e["loc"]) or "options"
            if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:  # a misspelt option name
                return (f"unknown option {where!r}{did_you_mean(where, fields)} (its options: "
                        f"{', '.join(sorted(fields)) or 'none'})")
            return f"{where}: {e['msg']}"
        problems = "; ".join(problem(e) for e in exc.errors())
        raise ConfigurationError(f"invalid options for protocol {protocol.name!r}: {problems}") from None
