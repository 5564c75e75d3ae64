"""The consortium's coordinator: membership, the collaborative design, and rounds.

The coordinator owns the protocol's :class:`~labfbo.protocols.base.Aggregator` and runs
BO rounds through a *gather* function supplied by the transport::

    gather(requests: {site: Message}, quorum: int, deadline: float | None)
        -> {site: Message | Exception}

**The round clock.** The coordinator owns it: rounds run in order, ``0, 1, 2, ...``, and
:attr:`Coordinator.last_round` is the last one completed. A site asks for round ``t``:

* ``t <= last_round``: it gets the *current* guidance (that of ``last_round``) — a site
  that fell behind, restarted or joined late catches up without re-running anything;
* ``t == last_round + 1``: it waits for that round; the round *starts* when every site
  of the study has asked for it (with ``quorum=q`` and ``deadline=s``: once ``q`` have,
  ``s`` seconds after the first asked), and only the sites that asked take part — each
  answers from the data it had when it asked (see :mod:`labfbo.optimizer`);
* ``t > last_round + 1`` is refused (:class:`~labfbo.core.exceptions.RoundError`): no site
  can skip rounds for everyone.

Within a round, every exchange waits for every participant; with ``quorum``/``deadline``
it closes once ``q`` have answered and the deadline has passed, and stragglers and
failed sites are left out of that exchange (aggregations see only the sites that
contributed). Fewer than ``q`` answers is a :class:`~labfbo.core.exceptions.RoundError`.
Transports that run sites concurrently (MPI, HTTP) wait at the start of a round
(:meth:`Coordinator.ready`); the in-process transport cannot wait for a site that has
not asked yet, so it runs a round when the first site asks and every site answers from
the data it has then (in one thread, what it would have asked with in a lock-step loop).

**Collaborative design.** When a site joins, the coordinator sends its cells of one
scrambled Latin hypercube of ``n_sites * n_init`` points (seeded by the study seed), so
the sites' initial designs together stratify the space and every protocol gets the same
initial designs for the same seed.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

from labfbo.core.dp import DP
from labfbo.core.exceptions import ConfigurationError, FederationError, Inadmissible, RoundError
from labfbo.core.messages import (
    Abstain,
    Array,
    BudgetExhausted,
    JoinReply,
    JoinRequest,
    Message,
    NoGuidance,
    PrivacyDeclaration,
)
from labfbo.privacy.accounts import BUDGET_DISCARDED, PrivacyLedger
from labfbo.privacy.budget import BUDGET_SPENT, PrivacyFloor
from labfbo.protocols import Exchange, Finish, Protocol, get_protocol
from labfbo.protocols.keywords import resolve_checked
from labfbo.protocols.releases import ReleaseReader
from labfbo.space.design import collaborative_design
from labfbo.space.diff import study_difference
from labfbo.space.search import SearchSpace

Gather = Callable[[Mapping[str, Message], int, "float | None"], "dict[str, Message | BaseException]"]

MAX_EXCHANGES_PER_ROUND = 100_000
#: the largest collaborative design (sites x n_init x parameters) a join may ask for: its Latin
#: hypercube is built at every join (and replayed after a restart)
MAX_DESIGN_CELLS = 2_000_000


class Coordinator:
    """Runs a study for a fixed set of sites under one protocol.

    Args:
        protocol: a registered protocol name, or a configured protocol such as
            ``labfbo.protocols.Distribution(privacy=labfbo.DP())`` (the object the sites get).
        sites: the site names (their order fixes site indices), or a number of sites
            (indices then follow join order).
        space: the federation's search space; by default the first site to join fixes it.
        seed: the study seed (collaborative design, aggregator randomness).
        horizon: planned number of BO rounds (for schedules).
        quorum, deadline: relaxed round closing (see the module docstring).
        privacy_floor: a :class:`labfbo.PrivacyFloor`: sites join only with a DP budget at least
            as strict (``DP(epsilon<=...)``).
        transport: ``"local"`` (in-process). MPI and HTTP come with their own modules.
        **protocol_options: the protocol's coordinator-side options.
    """

    def __init__(self, protocol: "str | Protocol" = "independent", sites: int | Sequence[str] = 1, *,
                 space: SearchSpace | None = None, seed: int = 0, horizon: int | None = None,
                 quorum: int | None = None, deadline: float | None = None, transport: str = "local",
                 study: str = "labfbo-study", privacy_floor: PrivacyFloor | Mapping[str, float] | None = None,
                 **protocol_options: Any):
        self.protocol, self.options = resolve_checked(Coordinator.__init__, protocol, protocol_options)
        if isinstance(privacy_floor, Mapping):
            privacy_floor = PrivacyFloor(**privacy_floor)
        if privacy_floor is not None and not isinstance(privacy_floor, PrivacyFloor):
            raise ConfigurationError(f"privacy_floor must be a labfbo.PrivacyFloor, got {type(privacy_floor).__name__}")
        self.privacy_floor = privacy_floor
        self.protocol_cls = get_protocol(self.protocol)
        self.configured: Protocol = self.protocol_cls.from_options(self.options)  # the study's configured protocol
        if privacy_floor is not None and not self.protocol_cls.supports_privacy():
            raise ConfigurationError(f"protocol {self.protocol!r} has no differential privacy mechanism: no site "
                                     "could meet a privacy floor")
        if isinstance(sites, int):
            if sites < 1:
                raise ConfigurationError("a study needs at least one site")
            self.expected: list[str] | None = None
            self.n_sites = sites
        else:
            names = [str(s) for s in sites]
            if not names or len(set(names)) != len(names):
                raise ConfigurationError("sites must be a non-empty list of unique names")
            self.expected = names
            self.n_sites = len(names)
        self.quorum = self.n_sites if quorum is None else int(quorum)
        if not 1 <= self.quorum <= self.n_sites:
            raise ConfigurationError(f"quorum must be in [1, {self.n_sites}], got {quorum}")
        if deadline is not None and deadline < 0:
            raise ConfigurationError("deadline must be >= 0 seconds")
        if transport != "local":
            raise ConfigurationError(
                f"transport {transport!r}: a Coordinator object serves sites in this process ('local'). Over HTTP, "
                "run `labfbo coordinator serve --config consortium.yaml` and give each site its URL and token; "
                "over MPI, serve it with labfbo.transport.mpi.serve (docs/deployment.md)")
        self.deadline = deadline
        self.seed = int(seed)
        self.horizon = horizon
        self.study = study
        # the study's part of a space: a lab's stock (allowed) and nonlinear constraints (code) stay with the lab
        self.space = None if space is None else space.shared()
        self.space_set_by: str | None = None  # the site whose join set the space (None: pinned or none yet)
        if space is not None:
            self.protocol_cls.check_space(space)
        self.protocol_cls.check_study(self.options, self.n_sites)
        if self.protocol_cls.needs_horizon and not horizon:
            raise ConfigurationError(f"protocol {self.protocol!r} needs the planned number of rounds: "
                                     "Coordinator(..., horizon=T) (simulate sets it to budget)")
        self.members: dict[str, int] = {}
        self.local_constraints: dict[str, list[str]] = {}  # each site's nonlinear constraints, by name only
        self.privacy: dict[str, PrivacyDeclaration | None] = {}  # each site's DP settings as it declared them
        self.rounds: dict[int, dict[str, Message]] = {}
        # why each site could not answer a failed round, for the operator only (the round's error,
        # which every site receives, names the sites and the kind of failure, never a site's text)
        self.failures: dict[int, dict[str, str]] = {}
        # contributions the protocol could not use (Aggregator.admit), round -> site -> why: left out
        self.rejected: dict[int, dict[str, str]] = {}
        self.last_round = -1  # the round clock: the last completed round
        self.contributors: dict[int, list[list[str]]] = {}
        self._aggregator = None
        # each site's releases as received, composed by the PLD accountant; its budget enforced (privacy/accounts.py)
        study_dp = self.configured.privacy
        delta = study_dp.delta if isinstance(study_dp, DP) else DP().delta
        self.ledger = PrivacyLedger(ReleaseReader(self.protocol_cls, self.options, lambda: self.space, delta),
                                    floor=privacy_floor, default_delta=delta)
        # the noise the study declares: every release is accounted at it, and one stating less is refused
        self.declared_noise = study_dp.noise_multiplier if isinstance(study_dp, DP) else None
        self._admitted: dict[int, Message] = {}  # answers a transport admitted as they arrived (admit)
        self.discards: dict[int, dict[str, str]] = {}  # round -> site -> why its release was discarded

    # -- membership -------------------------------------------------------------------
    def join(self, request: JoinRequest) -> JoinReply:
        """Admit a site (or re-admit it after a restart) and send its design cells.

        Every check comes first (protocol, shared options, space, privacy floor, horizon,
        membership): a refused site changes nothing, not even the space of a study that has
        none pinned yet (the first site admitted sets it)."""
        sent = SearchSpace.model_validate(request.space)
        if request.space_hash != sent.fingerprint():
            raise FederationError(f"site {request.site!r}: the space it sent does not match its space_hash "
                                  "(a join is checked against the space it carries)")
        space = sent.shared()  # a join from an older site may carry its stock: the study never keeps it
        if request.protocol != self.protocol:
            raise FederationError(f"site {request.site!r} runs protocol {request.protocol!r}, "
                                  f"the study runs {self.protocol!r}")
        study_space = self.space
        if study_space is None:
            self.protocol_cls.check_space(space)
            study_space = space
        self._check_options(request)
        if space.fingerprint() != study_space.fingerprint():
            raise FederationError(self._space_refusal(request, space, study_space))
        if self.privacy_floor is not None:
            self.privacy_floor.check(request.site, request.privacy)
        self._check_horizon(request.site, request.privacy)
        cells = self.n_sites * request.n_init * study_space.dim
        if cells > MAX_DESIGN_CELLS:
            raise FederationError(f"site {request.site!r}: a collaborative design of {self.n_sites} sites x n_init "
                                  f"{request.n_init} x {study_space.dim} parameters is {cells:,} values, over the "
                                  f"limit of {MAX_DESIGN_CELLS:,}: lower n_init")
        if request.site not in self.members:
            if self.expected is not None:
                if request.site not in self.expected:
                    raise FederationError(f"unknown site {request.site!r}; expected {self.expected}")
                index = self.expected.index(request.site)
            else:
                if len(self.members) >= self.n_sites:
                    raise FederationError(f"the study is full ({self.n_sites} sites)")
                index = len(self.members)
            self.members[request.site] = index
        if self.space is None:
            self.space, self.space_set_by = study_space, request.site
        index = self.members[request.site]
        self.local_constraints[request.site] = list(request.local_constraints)
        self.privacy[request.site] = request.privacy
        self.ledger.declare(request.site, request.privacy)
        design = collaborative_design(self.space, self.n_sites, request.n_init, self.seed)[index]
        return JoinReply(site_index=index, n_sites=self.n_sites, design=Array.of(design),
                         horizon=self.horizon, study=self.study, clock=self.last_round, study_seed=self.seed,
                         spent=self._spent_for(request))

    def _spent_for(self, request: JoinRequest) -> Any:
        """What a site with a budget has spent, if the coordinator accounted anything of it (None: a
        first join, or no budget: the reply is as before)."""
        if request.privacy is None or request.privacy.epsilon is None:
            return None
        acc = self.ledger.accounts.get(request.site)
        if acc is None or not (acc.releases or acc.discarded or acc.events or acc.exposed):
            return None
        return self.ledger.spent(request.site)

    def admit(self, site: str, msg: Message) -> Message:
        """Account ``site``'s answer ``msg`` as it arrives (a transport that receives answers one by
        one calls this; the round calls it for the others): ``msg`` itself, or — a release beyond the
        site's budget — an ``Abstain`` with reason ``BUDGET_DISCARDED``, counted, never aggregated.
        Where the study declares its DP noise (``privacy=DP(noise_multiplier=...)``), a release is
        accounted at that noise whatever it states, and one stating less is refused as inadmissible
        (a warning names the site; neither accounted nor aggregated)."""
        counted, declared = msg, self.declared_noise
        if declared is not None and "dp_noise_multiplier" in type(msg).model_fields:
            stated = msg.dp_noise_multiplier or 0.0  # type: ignore[attr-defined]
            if stated < declared:
                return self._reject(max(int(msg.round), 0), site, f"it states DP noise multiplier {stated:g}, less "
                                    f"than the {declared:g} the study declares", msg)
            if stated > declared:  # a site's claim of more noise buys no budget: the study's noise is the rule
                counted = msg.model_copy(update={"dp_noise_multiplier": declared})
        out, why = self.ledger.admit(site, counted)
        out = msg if out is counted else out
        with self.ledger.lock:
            if why is not None:
                self.discards.setdefault(max(int(msg.round), 0), {})[site] = why
            else:
                self._admitted[id(out)] = out
        return out

    def admits_lightly(self, site: str) -> bool:
        """Whether :meth:`admit` of ``site``'s answers is cheap (no budget to check against the PLD
        ledger): a transport may then admit it on its event loop."""
        return self.ledger.unbudgeted(site)

    def _account(self, site: str, msg: Message) -> Message:
        with self.ledger.lock:
            if self._admitted.pop(id(msg), None) is msg or (
                isinstance(msg, Abstain) and msg.reason == BUDGET_DISCARDED
            ):
                return msg  # admitted when it arrived
        return self.admit(site, msg)

    def _check_options(self, request: JoinRequest) -> None:
        ours = {k: v for k, v in self.options.model_dump(mode="json").items()
                if k in self.protocol_cls.shared_options}
        fields = type(self.options).model_fields  # an option a site does not send has its default (older sites)
        sent = {**{k: fields[k].default for k in ours if k not in request.shared_options and k in fields
                   and fields[k].default == ours[k]}, **request.shared_options}
        if sent != ours:
            theirs = {k: sent.get(k, "<not set>") for k in {*ours, *sent}}
            ours = {k: ours.get(k, "<not set>") for k in theirs}
            diff = sorted(k for k in theirs if theirs[k] != ours[k])
            raise FederationError(f"site {request.site!r} has protocol options that differ from the study's: "
                                  + ", ".join(f"{k}={theirs[k]!r} (the study: {ours[k]!r})" for k in diff))

    def _space_refusal(self, request: JoinRequest, space: SearchSpace, study: SearchSpace) -> str:
        """Why ``request``'s space is not the study's: each difference, the study's side and the lab's."""
        if self.space_set_by is None:
            origin = ("the study's space is pinned in its configuration "
                      "(space: in consortium.yaml, or Coordinator(space=...))")
        else:
            origin = (f"the study's space was set by {self.space_set_by!r}, the first site to join, because the "
                      "study pins none: pin the agreed space in its configuration (`labfbo coordinator init "
                      "--space`, or Coordinator(space=...))")
        return (f"site {request.site!r} has a different search space than the study: {study_difference(study, space)}"
                f". Change this lab's space to the study's, or ask the operator; {origin} "
                f"(space hash: the study {study.fingerprint()}, this lab {space.fingerprint()})")

    def _check_horizon(self, site: str, privacy: PrivacyDeclaration | None) -> None:
        """A site whose DP budget is yet to be calibrated plans its releases over a horizon: its own
        (declared in its join) or the study's. Without either it is refused before it is admitted."""
        if privacy is None or privacy.epsilon is None or privacy.noise_multiplier is not None:
            return
        if self.horizon is None and privacy.horizon is None:
            raise FederationError(
                f"site {site!r} has a privacy budget, DP(epsilon={privacy.epsilon:g}), and no horizon to plan its "
                "releases over, and the study sets none: set the study's horizon (`horizon:` in consortium.yaml, "
                "Coordinator(..., horizon=T)) or give the site one (Optimizer(..., horizon=T))")

    @property
    def site_names(self) -> list[str]:
        """The sites that have joined, in index order."""
        return sorted(self.members, key=self.members.__getitem__)

    @property
    def roster(self) -> list[str]:
        """The study's sites in index order (a named study: all of them, joined or not)."""
        return list(self.expected) if self.expected is not None else self.site_names

    # -- rounds -----------------------------------------------------------------------
    def _stamp(self, msg: Message, t: int) -> Message:
        return msg.model_copy(update={"round": t, "study": self.study})

    def site_reports(self) -> dict[str, str]:
        """What sites chose to tell the operator (the protocol's :meth:`Aggregator.site_reports`; empty
        before round 0)."""
        return {} if self._aggregator is None else dict(self._aggregator.site_reports())

    def aggregator(self) -> Any:
        if self._aggregator is None:
            if self.protocol_cls.aggregator is None:
                raise FederationError(f"protocol {self.protocol!r} has no coordinator rounds")
            if self.expected is None and len(self.members) < self.n_sites:
                raise RoundError(f"waiting for {self.n_sites - len(self.members)} more site(s) to join before round 0")
            self._aggregator = self.protocol_cls.aggregator(
                self.options, self.roster, self.seed, self.horizon, self.space)
        return self._aggregator

    # -- the round clock ----------------------------------------------------------------
    def check_round(self, site: str, t: int) -> None:
        """Refuse a request for round ``t`` that would skip rounds (or comes from a stranger)."""
        if site not in self.members:
            raise FederationError(f"site {site!r} asked for round {t} before joining")
        if t < 0 or t > self.last_round + 1:
            raise RoundError(f"round {t} cannot be asked for: the last completed round is {self.last_round}, "
                             f"so the next is {self.last_round + 1}")

    def current_guidance(self, site: str) -> Message:
        """``site``'s guidance of the last completed round (what a site behind the clock gets)."""
        return self.rounds[self.last_round][site]

    def ready(self, wanting: set[str], active: set[str], waited: float) -> bool:
        """May the next round start? ``wanting``: the sites that asked for it; ``active``:
        the sites that have joined and not left; ``waited``: seconds since the first asked.

        Every site of the study must have joined and asked — or, with a quorum and a
        deadline, ``quorum`` of them have asked and the deadline has passed.
        """
        if not wanting:
            return False
        if len(self.members) >= self.n_sites and set(self.roster) & active <= wanting:
            return True
        return self.deadline is not None and len(wanting) >= self.quorum and waited >= self.deadline

    def run_round(self, t: int, gather: Gather, participants: Sequence[str] | None = None) -> dict[str, Message]:
        """Run round ``t`` (the next on the clock) with ``participants`` (default: every site);
        return its replies. A round already run returns its kept replies."""
        if t in self.rounds:
            return self.rounds[t]
        if t != self.last_round + 1:
            raise RoundError(f"round {t} cannot run: the last completed round is {self.last_round}")
        self._run_one(t, gather, None if participants is None else set(participants))
        return self.rounds[t]

    def snapshot(self, t: int) -> dict[str, Any]:
        """Round ``t``'s replies, contributors, the aggregator's carried state and (when any) the
        sites' privacy accounts (JSON-able)."""
        snap = {"round": t, "replies": {s: m.model_dump(mode="json") for s, m in self.rounds[t].items()},
                "contributors": self.contributors.get(t, []), "aggregator": self.aggregator().state()}
        accounts = self.ledger.state()
        if accounts:
            snap["privacy"] = accounts
        return snap

    def restore(self, snapshots: Sequence[dict[str, Any]]) -> None:
        """Continue after a restart from the snapshots of completed rounds (in round order)."""
        from labfbo.core.messages import parse

        for snap in sorted(snapshots, key=lambda s: s["round"]):
            t = int(snap["round"])
            self.rounds[t] = {s: parse(m) for s, m in snap["replies"].items()}
            self.contributors[t] = snap["contributors"]
            self.aggregator().restore(snap["aggregator"])
            self.last_round = max(self.last_round, t)
            if "privacy" in snap:
                self.ledger.restore(snap["privacy"])

    def _run_one(self, t: int, gather: Gather, participants: set[str] | None) -> None:
        with self.ledger.lock:
            self._admitted.clear()  # (an answer admitted for an exchange that closed without it)
        agg = self.aggregator()
        step = agg.open_round(t)
        contributions: list[list[str]] = []
        for _ in range(MAX_EXCHANGES_PER_ROUND):
            if isinstance(step, Finish):
                break
            if not isinstance(step, Exchange) or not step.requests:
                raise RoundError(f"round {t}: the aggregator returned an empty step")
            stamped: dict[int, Message] = {}  # one copy of a request broadcast to every site (encoded once)
            for m in step.requests.values():
                if id(m) not in stamped:
                    stamped[id(m)] = self._stamp(m, t)
            requests = {
                s: stamped[id(m)] for s, m in step.requests.items() if participants is None or s in participants
            }
            answers = gather(requests, min(self.quorum, len(requests)), self.deadline)
            # accounted before it is used; a release beyond the site's budget becomes an Abstain
            answered = {s: self._account(s, m) for s, m in answers.items() if isinstance(m, Message)}
            if len(answered) < min(self.quorum, len(requests)):
                failed = {s: e for s, e in answers.items() if not isinstance(e, Message)}
                self.failures[t] = {s: repr(e)[:500] for s, e in failed.items()}
                while len(self.failures) > 100:
                    del self.failures[min(self.failures)]
                raise RoundError(f"round {t}: {len(answered)} of {len(requests)} sites answered, "
                                 f"quorum is {self.quorum}; failed: "
                                 f"{ {s: type(e).__name__ for s, e in sorted(failed.items())} }")
            contrib = {s: m for s, m in answered.items() if not isinstance(m, Abstain)}
            for s in sorted(contrib):
                try:
                    contrib[s] = agg.admit(s, contrib[s])
                except Inadmissible as e:  # that site's contribution only: the round goes on without it
                    del contrib[s]
                    answered[s] = self._reject(t, s, str(e))
            for s, m in answered.items():
                if isinstance(m, Abstain):
                    agg.abstained(s, m.reason)
                    if m.reason in (BUDGET_SPENT, BUDGET_DISCARDED):
                        agg.retire(s)  # it releases nothing more: no secure sum waits for it again
            contributions.append(sorted(contrib))
            step = agg.on_responses(t, contrib)
        else:
            raise RoundError(f"round {t} exceeded {MAX_EXCHANGES_PER_ROUND} exchanges")
        replies = {s: self._stamp(step.replies.get(s, NoGuidance()), t) for s in self.roster}
        for s, why in self.discards.get(t, {}).items():  # told why, in place of its guidance: it goes on alone
            replies[s] = self._stamp(BudgetExhausted(site=s, reason=why[:2000], spent=self.ledger.spent(s)), t)
        self.rounds[t] = replies
        self.contributors[t] = contributions
        self.last_round = t

    def _reject(self, t: int, site: str, why: str, msg: Message | None = None) -> Abstain:
        """``site``'s contribution to round ``t`` left out (``why``, with a warning naming it): its ``Abstain``."""
        out = Abstain(reason=f"rejected: {why[:300]}", **({} if msg is None else {"round": msg.round,
                                                                                "study": msg.study}))
        with self.ledger.lock:
            self.rejected.setdefault(t, {})[site] = why[:500]
            while len(self.rejected) > 100:
                del self.rejected[min(self.rejected)]
            if msg is not None:
                self._admitted[id(out)] = out  # refused as it arrived: the round takes it as it is
        warnings.warn(f"round {t}: the contribution of site {site!r} was left out: {why[:300]}", stacklevel=3)
        return out
