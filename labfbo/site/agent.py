"""`SiteAgent`: a site's side of the federation — it joins, plans the privacy budget, builds
the protocol's site logic, and answers the coordinator's requests.

An answer leaves the site through a chain of wrappers, each a function
``wrapper(request, call_next) -> Outgoing`` (as Flower's mods wrap a client app), listed
from the outermost::

    journal ∘ budget gate ∘ privacy release ∘ approval ∘ [extra wrappers] ∘ answer

``answer`` computes the protocol's message from the data the site had when it asked for
the round; ``approval`` lets the operator decline it (an ``Abstain`` goes instead);
``privacy release`` asks the protocol what the message discloses; ``budget gate`` holds it
back when it would exceed ``DP(epsilon=...)``; ``journal`` writes the release before the
message leaves. A deployment adds its own wrappers (``Optimizer(wrappers=[...])``, closest
to the answer), e.g. to log or redact.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from labfbo.core import wire
from labfbo.core.exceptions import JournalError, LabFBOError
from labfbo.core.messages import Abstain, BudgetExhausted, JoinRequest, Message, SpentBudget, parse
from labfbo.core.objectives import OutcomeSpec
from labfbo.core.records import Join, Released
from labfbo.core.release import Release
from labfbo.core.seeding import stable_hash
from labfbo.privacy.budget import Budget, declaration
from labfbo.protocols import Protocol, SiteContext, SiteData
from labfbo.protocols.planning import plan as plan_budget
from labfbo.site.compute import COMPUTE
from labfbo.site.data import LocalData
from labfbo.site.ledger import SiteLedger
from labfbo.site.store import TRAFFIC_BATCH, SiteStore
from labfbo.space.design import study_design
from labfbo.space.search import SearchSpace


@dataclass
class Outgoing:
    """An answer on its way out: the request it answers, the message, and the release of
    data-derived information it makes (None: none, e.g. an ``Abstain``)."""

    request: Message
    answer: Message
    release: Release | None = None


Handler = Callable[[Message], Outgoing]
Wrapper = Callable[[Message, Handler], Outgoing]


@dataclass(frozen=True)
class SiteSetup:
    """What a site is: its name, space, objective, protocol and the settings it joins with."""

    site: str
    space: SearchSpace
    objective: str
    outcomes: OutcomeSpec | None
    protocol: Protocol  # the configured protocol
    seed: int
    n_init: int
    secret: int
    key_seed: bytes


class SiteAgent:
    """Joins the coordinator over ``link`` (None: a site on its own) and answers its requests."""

    def __init__(self, setup: SiteSetup, store: SiteStore, data: LocalData, link: Any, horizon: int | None,
                 approve: Callable[[Message], bool] | None = None, wrappers: Sequence[Wrapper] = ()) -> None:
        self.setup, self.store, self.data, self.link = setup, store, data, link
        self.ledger: SiteLedger = store.ledger
        self.horizon = horizon
        self._approve = approve
        self._extra = list(wrappers)
        self.budget: Budget | None = None
        self.logic: Any = None
        self.context: SiteContext | None = None
        self._ready = threading.Event()  # set once the protocol logic is built and resumed
        self._told: Message | None = None  # the last BudgetExhausted the coordinator sent

    # -- joining -------------------------------------------------------------------------
    def join(self) -> SiteContext:
        """Join the coordinator (if any), then build the site logic; the site's context."""
        s, st, protocol = self.setup, self.store.state, self.setup.protocol
        kind = type(protocol)
        if self.link is not None:
            shared = s.space.shared()  # the study's part: the lab's stock (allowed) is never sent
            req = JoinRequest(site=s.site, protocol=protocol.name, study="", space_hash=shared.fingerprint(),
                              space=shared.model_dump(mode="json"), n_init=s.n_init,
                              local_constraints=[g.name for g in s.space.local_constraints],
                              privacy=declaration(protocol.privacy, self.horizon), shared_options=protocol.shared)
            self.ledger.record_sent(req)
            reply = self.link.join(req, self.handle)
            self.ledger.record_received(reply)
            if st.join_reply is None:
                self.store.commit(Join(reply=reply.model_dump(mode="json")))
            elif reply.site_index != st.join_reply.site_index:
                raise JournalError(f"the coordinator now gives {s.site!r} index {reply.site_index}, "
                                   f"the journal has {st.join_reply.site_index}")
            if kind.federated and st.clock.rebase(reply.clock):
                warnings.warn(f"site {s.site!r}: the coordinator has completed {reply.clock + 1} round(s), this "
                              f"site's journal is at round {st.round}: the coordinator lost its rounds (re-created "
                              "without its state?); continuing on the coordinator's clock", stacklevel=4)
                st.round = st.clock.next_round
        # a site on its own seeds its streams by its name, so two labs with seed=0 differ
        index, n_sites = stable_hash(s.site) % 2**31, 1
        if st.join_reply is not None:
            index, n_sites = st.join_reply.site_index, st.join_reply.n_sites
            self.horizon = self.horizon if self.horizon is not None else st.join_reply.horizon
        uses_design = kind.site_logic.uses_study_design
        self.context = SiteContext(site=s.site, site_index=index, n_sites=n_sites, seed=s.seed,
                                   horizon=self.horizon, objective=s.objective, secret=s.secret,
                                   key_seed=s.key_seed, outcomes=s.outcomes,
                                   study_design=study_design(s.space, s.n_init, st.join_reply) if uses_design else None)
        # DP(epsilon=...): the noise calibrated to the campaign's planned releases, and its enforcer
        logic_options, self.budget = plan_budget(protocol, s.space, self.context, self.horizon)
        logic = kind.site_logic(s.space, logic_options, self.context)
        logic.resume(journaled_releases(self.store, logic))  # what it sent before a restart
        logic.resume_transfer(st.last_transfer())
        self.logic = logic
        spent = reply.spent if self.link is not None else None
        if spent is not None and self.budget is not None:
            self.adopt(spent, "rejoins")
        self._ready.set()  # the transport may now hand it requests (handle)
        return self.context

    def adopt(self, spent: SpentBudget, when: str) -> None:
        """Plan from the larger of the journal's releases and the coordinator's account ``spent``
        (:meth:`labfbo.privacy.budget.Budget.adopt`); warn when the coordinator's is larger."""
        releases = journaled_releases(self.store, self.logic)
        missing = self.budget.adopt(spent, releases) if self.budget is not None else None
        if missing:
            eps = "∞" if spent.epsilon is None else f"{spent.epsilon:.3g}"
            warnings.warn(f"site {self.setup.site!r} {when}: the coordinator has accounted {spent.releases} release(s) "
                          f"of this site (epsilon {eps} at delta {spent.delta:g}), {sum(missing.values())} more than "
                          f"its journal holds ({len(releases)}): the journal was lost, truncated or rolled back. The "
                          f"site plans its budget from the coordinator's account (spent: epsilon "
                          f"{self.budget.spent(releases):.3g} of {self.budget.epsilon:g})", stacklevel=4)

    def failed(self) -> None:
        """Joining failed: a transport that got :meth:`handle` now fails at once."""
        self._ready.set()

    def close(self) -> None:
        """Leave the coordinator."""
        link, self.link = self.link, None
        if link is not None:
            link.close()

    # -- what the site says ----------------------------------------------------------------
    def releases(self) -> list[Release]:
        """Every release the site made, as its protocol declared it (journaled before it left)."""
        return journaled_releases(self.store, self.logic)

    def study_seed(self) -> int:
        """The seed every site of the study shares (federated), else the site's own."""
        reply = self.store.state.join_reply
        return reply.study_seed if reply is not None and reply.study_seed is not None else self.setup.seed

    def round_data(self, data: SiteData, round: int) -> SiteData:
        """``data`` as the model of BO round ``round`` sees it (several objectives: its ParEGO target)."""
        return self.data.for_round(data, self.study_seed(), round)

    def guidance(self, timeout: float | None) -> tuple[Message | None, str, dict[str, Any]]:
        """The guidance to propose from (:meth:`labfbo.site.clock.SiteClock.guidance`)."""
        if self.link is None:
            raise LabFBOError(f"site {self.setup.site!r} was closed; reopen it from its journal to continue")
        st = self.store.state
        msg, source, record = st.clock.guidance(self.link, self.ledger, self.setup.site, st.results(), st.position,
                                                timeout)
        if isinstance(msg, BudgetExhausted) and msg is not self._told:  # the coordinator discarded a release
            self._told = msg
            warnings.warn(f"site {self.setup.site!r}, round {msg.round}: the coordinator discarded this site's "
                          f"release ({msg.reason}); it proposes from its own model and releases nothing more",
                          stacklevel=4)
            if self.budget is not None:
                self.adopt(msg.spent, "was told its budget is exhausted")
        return msg, source, record

    # -- answering the coordinator ---------------------------------------------------------
    def chain(self) -> Handler:
        """The request handler: the wrappers around :meth:`_answer` (see the module docstring)."""
        handler: Handler = self._answer
        for wrapper in reversed([self._journal, self._budget_gate, self._declare, self._approval, *self._extra]):
            handler = _wrap(wrapper, handler)
        return handler

    def handle(self, request_bytes: bytes | str) -> bytes:
        """Answer a coordinator request (a wire frame, or its JSON) from local data — called by the
        transport, maybe from its thread; the answer's frame."""
        request = parse(request_bytes)
        if not self._ready.wait(60.0) or self.logic is None:  # still joining, or it failed
            raise LabFBOError(f"site {self.setup.site!r} cannot answer {request.kind!r}: it has not finished joining")
        with self.store.lock:
            self.ledger.record_received(request, len(request_bytes) if wire.is_frame(request_bytes) else None)
            out = self.chain()(request)
            frame = out.answer.to_wire()  # encoded once: sized for the ledger, then sent
            self.ledger.record_sent(out.answer, len(frame))
            self.logic.sent(out.answer)
            self.store.flush_traffic(at_least=TRAFFIC_BATCH)  # a long exchange (gradient's warm-up)
        return frame

    def _answer(self, request: Message) -> Outgoing:
        with COMPUTE:
            # the data the site had when it asked for this round (all of it if it has not asked)
            cut = self.store.state.clock.cuts.get(request.round)
            data = self.round_data(self.data.upto(cut), request.round)
            answer = self.logic.answer(request, data, request.round)
        return Outgoing(request, answer.model_copy(update={"round": request.round, "study": request.study}))

    def _approval(self, request: Message, call_next: Handler) -> Outgoing:
        out = call_next(request)  # the operator's review runs outside the process-wide compute lock
        if self._approve is not None and not self._approve(out.answer):
            out.answer = Abstain(reason="declined by the site's operator", round=request.round, study=request.study)
        return out

    def _declare(self, request: Message, call_next: Handler) -> Outgoing:
        out = call_next(request)
        out.release = None if isinstance(out.answer, Abstain) else self.logic.release(out.answer)
        return out

    def _budget_gate(self, request: Message, call_next: Handler) -> Outgoing:
        out = call_next(request)
        if out.release is not None and self.budget is not None:  # DP(epsilon=...): never beyond it
            out.answer, out.release, held = self.budget.gate(out.answer, out.release, self.releases(),
                                                             self.store.state.withheld, self.setup.site)
            if held is not None:
                self.store.commit(held)
        return out

    def _journal(self, request: Message, call_next: Handler) -> Outgoing:
        out = call_next(request)
        if out.release is not None:
            self.store.commit(Released(**out.release.model_dump()))  # accounted before it leaves
        return out


def _wrap(wrapper: Wrapper, inner: Handler) -> Handler:
    return lambda request: wrapper(request, inner)


def journaled_releases(store: SiteStore, logic: Any) -> list[Release]:
    """The journal's releases; version-1 records as ``logic`` (the site's protocol logic) declares them."""
    return [r for r in (rel if isinstance(rel, Release) else logic.legacy_release(rel.model_dump())
                        for rel in store.state.releases) if r is not None]
