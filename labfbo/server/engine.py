r"""The coordinator's round engine for pull-based transports (HTTP).

The coordinator never connects to a site. A round runs in a background thread; its
``gather`` puts each site's request in that site's mailbox and waits (a condition
variable, no polling) until every site has answered — or, with ``quorum``/``deadline``,
until the quorum has answered and the deadline has passed. Sites long-poll
:meth:`RoundEngine.poll` for work: a pending request to answer, their guidance of the
round they asked for, or "nothing yet".

Submissions are idempotent per ``(seq, site)``: the identical body again is accepted, a
different body (or any body for an exchange that has closed) is a conflict.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from labfbo.coordinator import Coordinator
from labfbo.core import wire
from labfbo.core.exceptions import FederationError, RoundError
from labfbo.core.messages import JoinReply, JoinRequest, Message, parse
from labfbo.transport.gate import RoundGate

#: seconds the round thread waits for the next round's first want before it ends
LINGER = 2.0


def _set_all(events: list[Any]) -> None:
    """Set ``events`` (on their loop: one wake-up for all the polls an exchange or a round ends)."""
    for event in events:
        event.set()


class Conflict(FederationError):
    """A submission that contradicts an earlier one, or arrives for a closed exchange."""


@dataclass
class _Exchange:
    seq: int
    round: int
    requests: dict[str, bytes]                     # site -> the request's wire frame
    answers: dict[str, bytes] = field(default_factory=dict)  # site -> the answer's body as received (idempotency)
    parsed: dict[str, Message] = field(default_factory=dict)  # site -> the same, parsed once
    failures: dict[str, str] = field(default_factory=dict)  # site -> why it could not answer
    closed: bool = False


@dataclass
class SiteTraffic:
    """What passed between the coordinator and one site (sizes only, never contents)."""

    received: int = 0      # bytes of the messages the coordinator accepted from it (join, answers)
    sent: int = 0          # bytes of the messages addressed to it (join reply, requests, guidance)
    answers: int = 0       # answers accepted
    last: tuple[int, str] | None = None  # (round, "answered" | "late" | "failed") of its last exchange
    guided: int = -1       # the last round whose guidance was counted


@dataclass
class RoundTiming:
    """When a round ran (wall-clock seconds) and who took part."""

    start: float
    participants: list[str]
    end: float | None = None
    status: str = "running"  # "running" | "done" | "failed"


class RoundEngine:
    """Thread-safe rounds over mailboxes; one round thread at a time."""

    def __init__(self, coordinator: Coordinator, on_round: Callable[[int], None] | None = None) -> None:
        self.coord = coordinator
        lock = threading.RLock()
        self.cv = threading.Condition(lock)
        # the round thread waits on its own condition (same lock): a poll or a site's newest poll does not
        # wake it, and it re-checks its exchange only on what can change it (answers, failures, leaves)
        self.round_cv = threading.Condition(lock)
        self.started = time.time()  # the traffic, answers and round timings count from here (not saved)
        self.seq = time.time_ns() // 1000  # unique across restarts: an old answer never matches a new exchange
        self.exchanges: dict[int, _Exchange] = {}
        self.asked: dict[str, int] = {}         # site -> the round whose guidance it waits for
        self.gate = RoundGate(coordinator)      # who asked for the next round, and may it start
        self.errors: dict[int, str] = {}        # round -> why it failed
        self.thread: threading.Thread | None = None
        self.on_round = on_round                # called (in the round thread) after each completed round
        self.stopped = False
        self.waiters: dict[str, set[tuple[Any, Any]]] = {}  # site -> (event loop, asyncio.Event) of its polls
        # site -> its newest poll: a site polls from one agent, so an older poll still waiting is a dead
        # process's (killed mid-poll) and must not take the work of the process that replaced it
        self.poll_gen: dict[str, int] = {}
        self.published: set[int] = set(coordinator.rounds)  # rounds persisted and visible to sites
        self.gone: set[str] = set()             # sites that left (closed their optimizer)
        # for the operator's dashboard: sizes and times only (labfbo.server.dashboard)
        self.traffic: dict[str, SiteTraffic] = {}
        self.timings: dict[int, RoundTiming] = {}  # round -> its times (this process's rounds, the last 500)
        self.on_answer: Callable[[str, Message], None] | None = None  # called (cv held) per accepted answer
        self.quorum = 0  # answers after which the open exchange may close (its deadline permitting)

    def _site(self, site: str) -> SiteTraffic:
        return self.traffic.setdefault(site, SiteTraffic())

    # -- membership -------------------------------------------------------------------------
    def join(self, request: JoinRequest) -> JoinReply:
        with self.cv:
            reply = self.coord.join(request)
            self.gone.discard(request.site)
            stats = self._site(request.site)
            stats.received += request.nbytes()
            stats.sent += reply.nbytes()
            self._notify([])
            return reply

    def leave(self, site: str) -> None:
        """``site`` closed its optimizer: open and later exchanges stop waiting for it."""
        with self.cv:
            self.gone.add(site)
            self.asked.pop(site, None)
            self._notify([site])  # its agent's long poll ends now

    def done(self) -> int:
        """The last round completed and published (-1: none)."""
        return max(self.published) if self.published else -1

    # -- what a site sees -----------------------------------------------------------------------
    def want(self, t: int, site: str, retry: bool = True) -> None:
        """``site`` waits for round ``t`` (``retry``: run it again if it failed).

        The coordinator owns the clock (:mod:`labfbo.coordinator`): a round already run
        gives the current guidance; the next round starts once every site has asked for it
        (or the quorum has, and the deadline has passed); a later round is a conflict.
        """
        t = int(t)
        with self.cv:
            try:
                self.coord.check_round(site, t)
            except (FederationError, RoundError) as exc:
                raise Conflict(str(exc)) from None
            self.asked[site] = t
            self._notify([site], round_thread=False)  # its agent may be inside a long poll
            if t <= self.coord.last_round or (t in self.errors and not retry):
                return
            self.errors.pop(t, None)
            if self.gate.ask(site, t) and self.gate.may_open(t, len(self.coord.members) - len(self.gone)):
                self.round_cv.notify_all()
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="labfbo-rounds", daemon=True)
                self.thread.start()

    def check(self, site: str, t: int | None) -> dict[str, Any] | None:
        """Work for ``site`` right now, or None (call with ``self.cv`` held)."""
        if site in self.gone:
            return {"type": "wait"}  # it left: end its poll
        for ex in self.exchanges.values():
            if not ex.closed and site in ex.requests and site not in ex.answers and site not in ex.failures:
                return {"type": "request", "seq": ex.seq, "round": ex.round, "message": ex.requests[site]}
        t = self.asked.get(site) if t is None else t
        if t is None:
            return None
        message: bytes | str
        if t <= self.done():  # the current guidance (a site behind the clock catches up)
            kind, message = "guidance", self.coord.rounds[self.done()][site].to_wire()
        elif t in self.errors:
            kind, message = "error", self.errors[t]
        else:
            return None
        if self.asked.get(site) == t:
            del self.asked[site]
        stats = self._site(site)
        if kind == "guidance" and stats.guided != self.done():  # once per round, as the site's ledger counts
            stats.sent, stats.guided = stats.sent + len(message), self.done()
        return {"type": kind, "round": t, "message": message}

    def poll(self, site: str, t: int | None, wait: float) -> dict[str, Any]:
        """Work for ``site``: ``{"type": "request"|"guidance"|"error"|"wait", ...}`` (blocking).

        Without ``t``, the guidance returned is that of the round the site last asked for.
        """
        if t is not None:
            self.want(t, site, retry=False)
        end = time.monotonic() + max(wait, 0.0)
        with self.cv:
            gen = self._newest_poll(site)
            while True:
                if self.poll_gen.get(site) != gen:
                    return {"type": "wait"}  # superseded by a newer poll of the same site
                work = self.check(site, t)
                if work is not None:
                    return work
                left = end - time.monotonic()
                if left <= 0 or self.stopped:
                    return {"type": "wait"}
                self.cv.wait(left)

    async def apoll(self, site: str, t: int | None, wait: float) -> dict[str, Any]:
        """:meth:`poll` for an event loop: waits without holding a thread (many idle sites)."""
        import asyncio

        if t is not None and self.asked.get(site) != t:  # (a want of the same round: already registered)
            self.want(t, site, retry=False)  # a poll never restarts a failed round; POST .../want does
        loop = asyncio.get_running_loop()
        end = loop.time() + max(wait, 0.0)
        with self.cv:
            gen = self._newest_poll(site)
        while True:
            event = asyncio.Event()
            with self.cv:
                self.waiters.setdefault(site, set()).add((loop, event))  # before the check: no lost wake-up
                work = {"type": "wait"} if self.poll_gen.get(site) != gen else self.check(site, t)
            try:
                if work is not None:
                    return work
                left = end - loop.time()
                if left <= 0 or self.stopped:
                    return {"type": "wait"}
                try:
                    async with asyncio.timeout(left):  # not wait_for: no task per wait
                        await event.wait()
                except TimeoutError:
                    pass
            finally:
                with self.cv:
                    self.waiters.get(site, set()).discard((loop, event))

    def _newest_poll(self, site: str) -> int:
        """Register a poll of ``site`` as its newest and end the older ones still waiting (``self.cv`` held)."""
        gen = self.poll_gen[site] = self.poll_gen.get(site, 0) + 1
        self._notify([site], round_thread=False)
        return gen

    def _notify(self, sites: Any = None, round_thread: bool = True) -> None:
        """Wake the blocking waiters, the round thread (``round_thread``) and the event-loop polls of
        ``sites`` (all: None).

        Call with ``self.cv`` held. Waking only the sites concerned keeps a round O(N).
        """
        import asyncio

        self.cv.notify_all()
        if round_thread:
            self.round_cv.notify_all()
        try:
            here = asyncio.get_running_loop()  # on a poll's own loop: set its event now, no wake-up of the loop
        except RuntimeError:
            here = None
        other: dict[Any, list[tuple[str, Any]]] = {}  # another thread's loop -> its events: one wake-up each
        for site in (list(self.waiters) if sites is None else sites):
            for loop, event in list(self.waiters.get(site, ())):
                if loop is here:
                    event.set()
                else:
                    other.setdefault(loop, []).append((site, event))
        for loop, events in other.items():
            try:
                loop.call_soon_threadsafe(_set_all, [e for _, e in events])
            except RuntimeError:  # its loop has closed
                for site, event in events:
                    self.waiters[site].discard((loop, event))

    def submit(self, site: str, seq: int, body: bytes | str, msg: Message | None = None) -> bool:
        """Record ``site``'s answer to exchange ``seq`` (its frame or JSON); True if new, False if
        a repeat.

        ``msg`` is ``body`` already parsed (and checked) by the caller, if it was.
        """
        body = body.encode() if isinstance(body, str) else bytes(body)
        with self.cv:
            ex = self.exchanges.get(seq)
            if ex is None or site not in ex.requests:
                raise Conflict(f"exchange {seq} has no request for site {site!r}")
            if site in ex.answers:
                if ex.answers[site] == body:
                    return False
                raise Conflict(f"site {site!r} already answered exchange {seq} with a different body")
            if ex.closed:
                raise Conflict(f"exchange {seq} of round {ex.round} has closed")
            msg = parse(body) if msg is None else msg  # a malformed message is refused before it is stored
            if msg.round != ex.round:  # an answer names its round (a missing one parses as -1)
                raise Conflict(f"the answer is for round {msg.round}, exchange {seq} is round {ex.round}")
            # accounted (and persisted) as it arrives; beyond the site's budget it is discarded: an Abstain goes on
            msg = self.coord.admit(site, msg)
            ex.answers[site] = body
            ex.parsed[site] = msg
            stats = self._site(site)
            stats.received += len(body) if wire.is_frame(body) else msg.nbytes()  # as a frame, whatever was sent
            stats.answers += 1
            if self.on_answer is not None:
                self.on_answer(site, msg)
            self._closing(ex)
            return True

    def fail(self, site: str, seq: int, reason: str) -> None:
        """``site`` reports it cannot answer exchange ``seq``: it is left out of it at once."""
        with self.cv:
            ex = self.exchanges.get(seq)
            if ex is None or site not in ex.requests or ex.closed:
                raise Conflict(f"exchange {seq} is not open for site {site!r}")
            if site not in ex.answers:
                ex.failures[site] = reason[:500]
                self._closing(ex)

    def _closing(self, ex: _Exchange) -> None:
        """Wake the round thread if ``ex`` may close now (``self.cv`` held): complete, or its quorum
        reached (the round thread then waits for the deadline itself). Not on every answer: a
        thread wake-up per site would cost the coordinator a context switch per answer."""
        if self._complete(ex) or len(ex.answers) >= self.quorum:
            self.cv.notify_all()
            self.round_cv.notify_all()

    # -- the round thread -------------------------------------------------------------------------
    def _start(self) -> tuple[int, list[str]] | None:
        """Wait (``self.cv`` held) until the next round may start: ``(t, participants)``, or
        None when no site waits for it (or the engine stopped, or the round failed)."""
        idle_until = time.monotonic() + LINGER
        while True:
            active = set(self.coord.members) - self.gone
            if self.stopped or self.coord.last_round + 1 in self.errors:
                return None
            if not self.gate.asked(active):  # nobody waits yet: the next round's first want usually follows
                left = idle_until - time.monotonic()  # at once, so linger rather than end and start a thread
                if left <= 0:
                    return None
                self.round_cv.wait(left)
                continue
            opened = self.gate.open(active)
            if opened is not None:
                return opened
            self.round_cv.wait(self.gate.retry_in() or 1.0)

    def _run(self) -> None:
        """Start rounds as sites ask for them; each is persisted before sites can see it."""
        while True:
            with self.cv:
                start = self._start()
                if start is None:
                    self.thread = None  # under the lock: a later want() starts a new thread
                    return
            t, participants = start
            self._started(t, participants)
            try:
                self.coord.run_round(t, self.gather, participants)
                if self.on_round is not None:
                    self.on_round(t)  # persisted before it is published
                with self.cv:
                    self.published.add(t)
                    self.gate.started(t)
                    self._ended(t, "done")
                    self._notify()
            except Exception as exc:  # the sites waiting for t get the error, and may ask again
                with self.cv:
                    self.errors[t] = f"{type(exc).__name__}: {exc}"
                    self._ended(t, "failed")
                    self._notify()

    def _started(self, t: int, participants: list[str]) -> None:
        with self.cv:
            self.timings[t] = RoundTiming(time.time(), list(participants))
            while len(self.timings) > 500:
                del self.timings[min(self.timings)]
            for site in set(self.coord.members) - self.gone - set(participants):
                self._site(site).last = (t, "late")  # a quorum started the round without it

    def _ended(self, t: int, status: str) -> None:
        if t in self.timings:
            self.timings[t].end, self.timings[t].status = time.time(), status

    def gather(self, requests: Mapping[str, Message], quorum: int,
               deadline: float | None) -> dict[str, Message | BaseException]:
        with self.cv:
            self.quorum = quorum if deadline is not None else len(requests)
            self.seq += 1
            t = next(iter(requests.values())).round if requests else -1
            frames: dict[int, bytes] = {}  # one encoding of a request broadcast to every site
            ex = _Exchange(self.seq, t, {s: frames.get(id(m)) or frames.setdefault(id(m), m.to_wire())
                                         for s, m in requests.items()})
            for s, frame in ex.requests.items():
                self._site(s).sent += len(frame)
            self.exchanges = {k: v for k, v in self.exchanges.items() if not v.closed or k > self.seq - 64}
            self.exchanges[ex.seq] = ex
            self._notify(list(ex.requests))
            start = time.monotonic()
            while not self._complete(ex) and not self.stopped:
                if deadline is not None and len(ex.answers) >= quorum:
                    left = deadline - (time.monotonic() - start)
                    if left <= 0:
                        break
                    self.round_cv.wait(left)
                else:
                    self.round_cv.wait(1.0)
            ex.closed = True
            out: dict[str, Message | BaseException] = {}
            for site in ex.requests:
                stats = self._site(site)
                if site in ex.parsed:
                    out[site] = ex.parsed[site]
                    stats.last = (t, "answered")
                elif site in ex.failures:
                    out[site] = FederationError(f"site {site!r} could not answer: {ex.failures[site]}")
                    stats.last = (t, "failed")
                elif site in self.gone:
                    out[site] = FederationError(f"site {site!r} has left")
                else:
                    out[site] = TimeoutError(f"site {site!r} did not answer exchange {ex.seq} in time")
                    stats.last = (t, "late")
            self._notify([])
            return out

    def _complete(self, ex: _Exchange) -> bool:
        """Every site of ``ex`` has answered, failed or left (``self.cv`` held); the count first: O(1)
        while sites are still missing, so a round stays O(N) however many times its thread wakes."""
        n = len(ex.requests)
        if len(ex.answers) + len(ex.failures) + len(self.gone) < n:
            return False
        return len(set(ex.answers) | set(ex.failures) | (set(ex.requests) & self.gone)) >= n

    def waiting(self) -> dict[str, list[str]]:
        """Open exchanges (``"round/seq"``) and the sites they still wait for, and the sites
        the next round waits for before it starts (``"round/start"``) (operator status)."""
        with self.cv:
            out = {f"{ex.round}/{ex.seq}": sorted(set(ex.requests) - set(ex.answers))
                   for ex in self.exchanges.values() if not ex.closed}
            t = self.coord.last_round + 1
            asked = {s for s, r in self.gate.wants.items() if r == t}
            missing = sorted(set(self.coord.roster) - self.gone - asked)
            if asked and missing:
                out[f"{t}/start"] = missing
            return out

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self._notify()
