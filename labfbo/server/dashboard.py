"""The consortium operator's live dashboard: ``GET /dashboard`` on the coordinator server.

Read-only, for the admin token. The token is typed once into a login form (``POST
/dashboard/login``, form-encoded: never in a URL, and the guard never audits that body) and
exchanged for a random session id in an HttpOnly, SameSite=Strict cookie (``Secure`` over
TLS) that expires after ``dashboard_session`` seconds; the server keeps only the id's
SHA-256 and its expiry, in memory. ``/dashboard/logout`` ends the session. Refused logins are
counted per client address: after 5 in a minute, every login from that address waits
:data:`THROTTLED_DELAY` before its token is checked and a wrong one gets 429, so guessing stays
slow; the admin token itself is never refused, whatever any address got wrong before.

The page shows the study, the sites' states, the current round and whom it waits for, the
rounds' durations, the message bytes to and from each site, each site's cumulative epsilon
as the coordinator accounts it, its budget, what remains of it and the releases discarded
beyond it, and the recent audit-log entries (time, site,
route, status). It never shows what a message contains: the round engine keeps sizes and
times only, and the coordinator's privacy account keeps release counts and noise multipliers only. An
inline script (CSP nonce, no external resource) reloads ``GET /dashboard/status.json``
every two seconds.

**Epsilon**: :mod:`labfbo.server.dashboard_privacy`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel

from labfbo.core.messages import Message, NoGuidance
from labfbo.core.progress import human_bytes
from labfbo.server.dashboard_privacy import PrivacyView
from labfbo.server.served import Served
from labfbo.server.throttle import AddressThrottle

COOKIE = "labfbo_dashboard"
PAGE, LOGIN, LOGOUT, STATUS = "/dashboard", "/dashboard/login", "/dashboard/logout", "/dashboard/status.json"
PATHS = frozenset({PAGE, LOGIN, LOGOUT, STATUS})  # the guard lets them check their own cookie
SECRET_BODIES = frozenset({LOGIN})                  # the guard audits no trace of these bodies
MAX_BODY = 4096                                     # a login form: read before any credential is known
REFRESH_MS = 2000
THROTTLED_DELAY = 1.0  # seconds every login of an address with 5 refused logins in the last minute waits
TEMPLATES = Path(__file__).parent / "templates"

# the tables' columns: (key in the row, heading); the page and its script both read them
COLUMNS = {
    "sites": [("name", "site"), ("state", "state"), ("detail", "detail"), ("received_text", "received"),
              ("sent_text", "sent"), ("answers", "answers"), ("epsilon_text", "cumulative ε"),
              ("budget_text", "budget"), ("remaining_text", "remaining ε"), ("discarded", "discarded"),
              ("reported", "what it gains (its own estimate)")],
    "rounds": [("round", "round"), ("status", "status"), ("started", "started (UTC)"), ("duration", "duration"),
               ("participants", "participants")],
    "events": [("time", "time (UTC)"), ("site", "site"), ("route", "route"), ("round", "round"),
               ("status", "status")],
}


class SiteView(BaseModel):
    name: str
    index: int | None
    state: Literal["not joined", "joined", "waiting", "answered", "late", "failed", "left"]
    detail: str
    received: int       # bytes of the messages the coordinator accepted from the site
    sent: int           # bytes of the messages it addressed to the site
    received_text: str
    sent_text: str
    answers: int
    epsilon: float | None  # a finite cumulative epsilon (None: infinite, not known, or nothing yet)
    epsilon_text: str
    budget: float | None = None     # the budget the coordinator enforces (None: the site declared none)
    budget_text: str = "—"
    remaining: float | None = None  # budget - epsilon (None: no budget, or not known yet)
    remaining_text: str = "—"
    discarded: int = 0              # releases the coordinator discarded: beyond the budget
    reported: str = "kept at the lab"  # what the site chose to share of the federation's worth to it (opt-in)


class RoundView(BaseModel):
    round: int
    status: str
    started: str
    duration: str
    seconds: float | None
    participants: str


class EventView(BaseModel):
    time: str
    site: str
    route: str
    round: str
    status: int


class CurrentRound(BaseModel):
    round: int
    state: Literal["running", "waiting to start", "idle", "failed", "ended"]
    text: str
    waiting_for: list[str]


class DashboardStatus(BaseModel):
    """What ``GET /dashboard/status.json`` answers (and the page shows)."""

    study: str
    protocol: str
    time: str
    last_completed: int  # -1: none yet
    current: CurrentRound
    rules: str           # quorum and deadline
    sites: list[SiteView]
    rounds: list[RoundView]
    events: list[EventView]
    privacy_note: str
    audit: str
    counting_since: str = ""  # what the traffic, answers and round timings count from (they are not saved)


def _without_guidance(replies: dict[str, Message] | None, participants: list[str]) -> list[str]:
    """The round's participants its guidance gave nothing (no secure sum formed, a sum held back, ...)."""
    if not replies:
        return []
    return sorted(s for s in participants if isinstance(replies.get(s), NoGuidance))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s < 60 else f"{s / 60:.1f} min"


class Sessions:
    """Dashboard logins: random ids, kept as their SHA-256 with an expiry (memory only)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.lock = threading.Lock()
        self.live: dict[str, float] = {}  # sha256(id) -> expiry (time.time())

    @staticmethod
    def _key(sid: str) -> str:
        return hashlib.sha256(sid.encode()).hexdigest()

    def new(self) -> str:
        sid = secrets.token_urlsafe(32)
        now = time.time()
        with self.lock:
            self.live = {k: e for k, e in self.live.items() if e > now}
            self.live[self._key(sid)] = now + self.ttl
        return sid

    def valid(self, sid: str | None) -> bool:
        if not sid:
            return False
        with self.lock:
            return self.live.get(self._key(sid), 0.0) > time.time()

    def end(self, sid: str | None) -> None:
        if sid:
            with self.lock:
                self.live.pop(self._key(sid), None)


class Dashboard:
    """The routes, sessions and views of the dashboard of one :class:`~labfbo.server.app.CoordinatorServer`."""

    def __init__(self, server: Served) -> None:
        from jinja2 import Environment, FileSystemLoader, select_autoescape

        self.server = server
        self.sessions = Sessions(server.config.dashboard_session)
        self.throttle = AddressThrottle(limit=5)  # refused logins per address and minute before it is slowed
        self.throttled_delay = THROTTLED_DELAY
        self.privacy = PrivacyView(server)  # the coordinator accounts every accepted answer (its ledger)
        self.templates = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]))

    # -- what the page shows ------------------------------------------------------------------------
    def status(self) -> DashboardStatus:
        srv, eng, coord, cfg = self.server, self.server.engine, self.server.coordinator, self.server.config
        with eng.cv:  # the round thread changes these
            open_ex = [ex for ex in eng.exchanges.values() if not ex.closed]
            missing = {s for ex in open_ex for s in ex.requests if s not in ex.answers and s not in ex.failures}
            answered = {s for ex in open_ex for s in ex.answers}
            t_next = coord.last_round + 1
            asked = {s for s, r in eng.gate.wants.items() if r == t_next}
            running = next((t for t, tm in eng.timings.items() if tm.status == "running"), None)
            active = [s for s in coord.roster if s in coord.members and s not in eng.gone]
            to_ask = sorted(set(active) - asked) if running is None and asked else []
            current = self._current(running, sorted(missing), t_next, eng.errors.get(t_next), asked, to_ask)
            if running is None:
                current = self._ended(coord, eng.gone) or current
            traffic = {s: (st.received, st.sent, st.answers, st.last) for s, st in eng.traffic.items()}
            sites = [self._site(s, coord, eng.gone, missing, answered, to_ask, t_next, traffic.get(s))
                     for s in [*coord.roster, *sorted(set(coord.members) - set(coord.roster))]]
            timings = sorted(eng.timings.items(), reverse=True)[:20]
            rounds = [self._round(t, tm.start, tm.end, tm.status, tm.participants, eng.errors.get(t),
                                  _without_guidance(coord.rounds.get(t), tm.participants))
                      for t, tm in timings]
            last = coord.last_round
            reports = coord.site_reports()
        for row in sites:
            b = self.privacy.budget(row.name)
            row.epsilon, row.epsilon_text, row.budget, row.budget_text = (
                b.epsilon,
                b.epsilon_text,
                b.budget,
                b.budget_text,
            )
            row.remaining, row.remaining_text, row.discarded = b.remaining, b.remaining_text, b.discarded
            row.reported = reports.get(row.name, row.reported)
        with srv.audit.lock:
            recent = list(srv.audit.recent)
        events = [EventView(time=_clock(e["time"]), site=e["site"], route=e["route"],
                            round="-" if e["round"] is None else str(e["round"]), status=e["decision"])
                  for e in reversed(recent) if not (e["route"] == f"GET {STATUS}" and e["decision"] == 200)][:25]
        rules = ("every site, every exchange" if cfg.quorum is None else
                 f"quorum {cfg.quorum}" + ("" if cfg.deadline is None else f", deadline {cfg.deadline:g} s"))
        return DashboardStatus(study=cfg.study, protocol=cfg.protocol, time=_clock(time.time()), last_completed=last,
                               current=current, rules=rules, sites=sites, rounds=rounds, events=events,
                               privacy_note=self.privacy.note(),
                               audit=f"audit log: {cfg.audit_log}" if cfg.audit_log else "audit log: off (memory only)",
                               counting_since=self._counting_since(eng.started, last))

    @staticmethod
    def _counting_since(started: float, last: int) -> str:
        """Where the site table's bytes and answers and the rounds table start counting (this process)."""
        day = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))
        return (f"bytes, answers and round timings count since the coordinator started at {day} UTC"
                + (f", after round {last} (a restart from the saved state: the rounds and ε before it are kept, "
                   "their traffic is not)" if last >= 0 else ""))

    @staticmethod
    def _current(running: int | None, missing: list[str], t_next: int, error: str | None, asked: set[str],
                 to_ask: list[str]) -> CurrentRound:
        if running is not None:
            text = (f"round {running} is running: waiting for the answer of {', '.join(missing)}" if missing
                    else f"round {running} is running: the coordinator is aggregating")
            return CurrentRound(round=running, state="running", text=text, waiting_for=missing)
        if error is not None:
            return CurrentRound(round=t_next, state="failed", waiting_for=[],
                                text=f"round {t_next} failed ({error[:200]}); it runs again when a site asks")
        if asked:
            text = (f"round {t_next} waits for {', '.join(to_ask)} to ask for it" if to_ask
                    else f"round {t_next} starts at its deadline or when the others ask")
            return CurrentRound(round=t_next, state="waiting to start", text=text, waiting_for=to_ask)
        return CurrentRound(round=t_next, state="idle", waiting_for=[],
                            text=f"round {t_next} starts when the sites ask for it")

    @staticmethod
    def _ended(coord: Any, gone: set[str]) -> CurrentRound | None:
        """The study's end, once every site of it has joined and then left (None before)."""
        members = set(coord.members)
        if not members or len(members) < coord.n_sites or not members <= gone:
            return None
        last = coord.last_round
        who = "the only site" if len(members) == 1 else f"all {len(members)} sites"
        when = "before any round ran" if last < 0 else f"after round {last}"
        planned = "" if coord.horizon is None or last < 0 else f" ({last + 1} of {coord.horizon} planned rounds)"
        return CurrentRound(round=last, state="ended", waiting_for=[], text=f"study ended: {who} left {when}{planned}")

    @staticmethod
    def _site(name: str, coord: Any, gone: set[str], missing: set[str], answered: set[str], to_ask: list[str],
              t_next: int, traffic: tuple[int, int, int, tuple[int, str] | None] | None) -> SiteView:
        received, sent, answers, last = traffic or (0, 0, 0, None)
        if name not in coord.members:
            state, detail = "not joined", "has not joined the study"
        elif name in gone:
            state, detail = "left", "closed its optimizer"
        elif name in missing:
            state, detail = "waiting", "the coordinator waits for its answer"
        elif name in answered:
            state, detail = "answered", "answered the open exchange"
        elif name in to_ask:
            state, detail = "waiting", f"round {t_next} waits for it to ask"
        elif last is not None:
            state = last[1]
            detail = {"answered": f"answered in round {last[0]}",
                      "late": f"missed round {last[0]} (its deadline or quorum)",
                      "failed": f"could not answer in round {last[0]}"}[last[1]]
        else:
            state, detail = "joined", "no exchange yet"
        return SiteView(name=name, index=coord.members.get(name), state=state, detail=detail, received=received,
                        sent=sent, received_text=human_bytes(received), sent_text=human_bytes(sent), answers=answers,
                        epsilon=None, epsilon_text="")

    @staticmethod
    def _round(t: int, start: float, end: float | None, status: str, participants: list[str],
               error: str | None, alone: list[str] | None = None) -> RoundView:
        seconds = None if end is None else end - start
        duration = f"{_seconds(time.time() - start)} so far" if seconds is None else _seconds(seconds)
        if status == "failed" and error is not None:
            status = f"failed: {error[:120]}"
        elif status == "done" and alone:  # e.g. no secure sum formed: those labs propose from their own data
            status = f"done; no guidance for {', '.join(alone)} (they propose alone)"
        return RoundView(round=t, status=status, started=_clock(start), duration=duration, seconds=seconds,
                         participants=", ".join(participants))

    # -- HTTP -------------------------------------------------------------------------------------------
    @staticmethod
    def _harden(response: Response, nonce: str = "") -> Response:
        src = f"'nonce-{nonce}'" if nonce else "'none'"
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src {src}; style-src {src}; connect-src 'self'; img-src data:; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    def _page(self, status: DashboardStatus | None = None, message: str = "", code: int = 200) -> Response:
        nonce = secrets.token_urlsafe(16)
        html = self.templates.get_template("dashboard.html").render(
            s=status, message=message, nonce=nonce, columns=COLUMNS, refresh_ms=REFRESH_MS, login=LOGIN,
            logout=LOGOUT, status_url=STATUS, study=self.server.config.study,
            admin=self.server.tokens.admin is not None)
        return self._harden(HTMLResponse(html, status_code=code), nonce)

    def _secure(self, request: Request) -> bool:
        """The cookie's ``Secure`` flag: the operator's setting, else whether this request came over TLS."""
        setting = self.server.config.dashboard_secure_cookie
        return request.url.scheme == "https" if setting is None else setting

    def _session(self, request: Request) -> bool:
        if self.sessions.valid(request.cookies.get(COOKIE)):
            request.state.site = "admin"  # the audit log's site
            return True
        return False

    def mount(self, app: FastAPI) -> None:
        """Add the dashboard's routes (outside the OpenAPI schema: they are for a browser)."""

        @app.get(PAGE, include_in_schema=False)
        def page(request: Request) -> Response:
            if self._session(request):
                return self._page(self.status())
            expired = request.cookies.get(COOKIE) is not None
            return self._page(message="Your session has ended: log in again." if expired else "")

        @app.post(LOGIN, include_in_schema=False)
        async def login(request: Request) -> Response:
            address = request.client.host if request.client else "?"
            throttled = self.throttle.blocked(address) > 0
            if throttled:  # every attempt of a throttled address waits: guesses stay slow, the right token gets in
                await asyncio.sleep(self.throttled_delay)
            form = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
            token = (form.get("token") or [""])[0].strip()
            if not self.server.tokens.is_admin(token):
                self.throttle.refuse(address)
                wait = self.throttle.blocked(address)
                if throttled and wait > 0:
                    response = self._page(message=f"Too many refused logins from this address: each login from it "
                                                  f"is slowed down for {math.ceil(wait)} s.", code=429)
                    response.headers["Retry-After"] = str(math.ceil(wait))
                    return response
                why = ("This server has no admin token (admin_token_sha256 in its configuration): the dashboard "
                       "is off." if self.server.tokens.admin is None else "Enter the admin token." if not token else
                       "Refused: not the admin token. The dashboard takes only the consortium's admin token; "
                       "site tokens are refused.")
                return self._page(message=why, code=401)
            request.state.site = "admin"
            response = RedirectResponse(PAGE, status_code=303)
            response.set_cookie(COOKIE, self.sessions.new(), max_age=int(self.sessions.ttl), path=PAGE,
                                httponly=True, samesite="strict", secure=self._secure(request))
            return self._harden(response)

        @app.get(LOGIN, include_in_schema=False)
        def login_form() -> Response:
            return self._harden(RedirectResponse(PAGE, status_code=303))

        @app.post(LOGOUT, include_in_schema=False)  # POST only: a link or an image cannot log the operator out
        def logout(request: Request) -> Response:
            self._session(request)
            self.sessions.end(request.cookies.get(COOKIE))
            response = RedirectResponse(PAGE, status_code=303)
            response.delete_cookie(COOKIE, path=PAGE, httponly=True, samesite="strict",
                                   secure=self._secure(request))
            return self._harden(response)

        @app.get(STATUS, response_model=DashboardStatus, include_in_schema=False)
        def status(request: Request, response: Response) -> DashboardStatus:
            if not self._session(request):
                raise HTTPException(401, "no dashboard session: log in at /dashboard",
                                    headers={"Cache-Control": "no-store"})
            self._harden(response)
            return self.status()
