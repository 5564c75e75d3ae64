r"""The HTTP site client: sites pull their work from a coordinator server; it never calls them.

``Optimizer(..., coordinator=HTTPCoordinator("https://coord.example:8750", token=...))``
or simply ``coordinator="https://..."`` with ``token=``. ``ask()`` says which round
it needs and long-polls for its work in the same call (``POST .../rounds/{t}/want?wait=s``,
≤ 25 s per poll), answers the round's requests from the site's local data, each answer's
reply being the next work (``POST .../answers/{seq}?wait=s``), until the guidance arrives:
two requests per round of one exchange, and none between rounds (a site takes part only in
the rounds it asked for). An ``ask()`` whose timeout runs out hands the round to a background
*agent* thread, which answers for the site until the round's guidance arrives.

Every call uses ``requests`` with a connect/read timeout and retries connection errors
and 5xx answers with exponential backoff and full jitter (0.5 s doubling, ≤ 8 s): 6 tries,
or within an ``ask(timeout=s)`` as many as fit before its deadline, so a coordinator that
restarts within ``s`` costs the site nothing but the wait. 4xx answers are not retried: they are the server refusing the
site (bad token,
wrong site, conflict) and raise :class:`~labfbo.core.exceptions.FederationError`.

(An operator who wants to review each outgoing message passes ``approve=`` to the
``Optimizer``; that works on every transport.)
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from labfbo.core import wire
from labfbo.core.exceptions import ConfigurationError, FederationError, RoundError
from labfbo.core.messages import JoinReply, JoinRequest, parse
from labfbo.transport.base import Handler, SiteLink

POLL_WAIT = 25.0
ACCEPT: str | None = wire.MEDIA_TYPE
"""What the site client asks ``GET .../work`` for: frames; None: the JSON envelope (and JSON answers)."""


class Refused(FederationError):
    """The coordinator answered 4xx: it refuses this request (not retried)."""


class Unreachable(FederationError):
    """No answer from the coordinator after every retry (network down, server restarting)."""


def _content_type(body: bytes | None) -> dict[str, str] | None:
    if body is None:
        return None
    return {"Content-Type": wire.MEDIA_TYPE if wire.is_frame(body) else "application/json"}


def check_token(token: Any) -> None:
    """Refuse a token that cannot travel in a bearer header, naming the problem (never the token)."""
    if not token:
        raise ConfigurationError("an HTTP coordinator needs this site's token (token=...)")
    if not isinstance(token, str):
        raise ConfigurationError(f"the site's token must be a string, got a {type(token).__name__}")
    if token != token.strip():
        end = "trailing" if token[-1].isspace() else "leading"
        raise ConfigurationError(f"the site's token has {end} whitespace (a newline kept from the file it was read "
                                 "from?): strip it, e.g. Path(...).read_text().strip()")
    bad = next((i for i, ch in enumerate(token) if not (33 <= ord(ch) <= 126)), None)
    if bad is not None:
        raise ConfigurationError(f"the site's token has a space, a control or a non-ASCII character at position "
                                 f"{bad + 1} of {len(token)}: a token is printable ASCII without spaces")


def _redacted(text: str, secret: str) -> str:
    """``text`` without ``secret`` (an error of the HTTP library may quote the header that carried it)."""
    return text.replace(secret, "<token>") if secret else text


class HTTPCoordinator:
    """A coordinator server at ``url``, reached with this site's bearer ``token``."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0, retries: int = 6, backoff: float = 0.5,
                 verify: bool | str = True, poll_wait: float = POLL_WAIT) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"coordinator url must start with http:// or https://, got {url!r}")
        check_token(token)
        self.url, self.token = url.rstrip("/"), token
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.verify, self.poll_wait = verify, poll_wait

    def connect(self, site: str) -> "HTTPLink":
        return HTTPLink(self, site)


class HTTPLink(SiteLink):
    def __init__(self, cfg: HTTPCoordinator, site: str) -> None:
        import requests

        self.cfg, self.site = cfg, site
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {cfg.token}"
        self.handler: Handler | None = None
        self.lock = threading.Condition()
        self.results: dict[int, tuple[str, bytes | str]] = {}  # round -> ("guidance", frame) | ("error", why)
        self.agent: threading.Thread | None = None
        self.closed = False
        self.waiting: int | None = None  # the round whose guidance ask() waits for (its thread polls)
        self.orphan: int | None = None  # a round asked for whose ask() gave up: the agent polls for it
        self.mid_study = False  # joined a study under way: a request left for this site is answered at once
        self.handling = threading.Lock()  # the site's handler answers one request at a time

    # -- plumbing ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, body: bytes | None = None,
              params: dict[str, Any] | None = None, read_timeout: float | None = None,
              accept: str | None = None, deadline: float | None = None) -> Any:
        """The answer's JSON, or — a frame — ``{"type", "seq", "round", "message": frame}``.

        Connection errors and 5xx answers are retried: ``retries`` times, or with a ``deadline``
        (``time.monotonic()``), until it passes, however many tries that takes (an ``ask(timeout=s)``
        rides out a coordinator restart of up to ``s``)."""
        import requests

        # Not urllib3's Retry on the session: a closing link must stop retrying at once (a Retry
        # keeps sleeping through its schedule), a 4xx is a refusal with the server's detail, and
        # the backoff is full jitter (uniform in [0, delay]) rather than a doubling plus noise.
        url = self.cfg.url + path
        delay = self.cfg.backoff
        attempt = -1
        while True:
            attempt += 1
            try:
                resp = self.session.request(
                    method, url, data=body, params=params,
                    headers={**(_content_type(body) or {}), **({"Accept": accept} if accept else {})},
                    timeout=(self.cfg.timeout, (read_timeout or 0) + self.cfg.timeout), verify=self.cfg.verify)
            except requests.RequestException as exc:
                err: BaseException = exc
            else:
                if resp.status_code < 400:
                    if resp.headers.get("content-type", "").startswith(wire.MEDIA_TYPE):
                        h = resp.headers
                        return {"type": h.get("X-Labfbo-Work"), "round": int(h.get("X-Labfbo-Round", -1)),
                                "seq": int(h["X-Labfbo-Seq"]) if "X-Labfbo-Seq" in h else None,
                                "message": resp.content}
                    return resp.json()
                if resp.status_code < 500:
                    detail = resp.json().get("detail", resp.text) if resp.headers.get(
                        "content-type", "").startswith("application/json") else resp.text
                    raise Refused(f"coordinator refused {method} {path}: {resp.status_code} "
                                  f"{_redacted(str(detail), self.cfg.token)}")
                err = FederationError(f"coordinator error {resp.status_code} on {method} {path}")
            left = None if deadline is None else deadline - time.monotonic()
            if self.closed or (attempt >= self.cfg.retries - 1 if left is None else left <= 0):
                raise Unreachable(f"coordinator unreachable at {self.cfg.url} after {attempt + 1} tries: "
                                  f"{_redacted(str(err), self.cfg.token)}") from None
            pause = random.uniform(0, delay)  # full jitter
            time.sleep(pause if left is None else min(pause, left))
            delay = min(delay * 2, 8.0)

    # -- SiteLink ---------------------------------------------------------------------------------
    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        reply = parse(self._call("POST", "/v1/join", body=request.to_wire())["message"])
        if not isinstance(reply, JoinReply):
            raise FederationError(f"unexpected join answer {reply.kind!r}")
        self.handler = handler
        with self.lock:
            self.mid_study = reply.clock >= 0  # a restart, or a journal lost: the round under way may wait for us
            self.lock.notify_all()
        if self.agent is None:
            self.agent = threading.Thread(target=self._agent, name=f"labfbo-agent-{self.site}", daemon=True)
            self.agent.start()
        return reply

    def guidance(self, round: int, timeout: float | None = None) -> bytes:
        """Round ``round``'s guidance: this thread asks for it and answers the round's requests.

        ``POST .../rounds/{t}/want?wait=s`` says the site needs round ``t`` and long-polls for
        its work; each request is answered with ``POST .../answers/{seq}?wait=s``, whose answer is
        the next work — so a round of one exchange costs the coordinator two requests. While the
        coordinator is unreachable, ``ask()`` without a timeout keeps waiting; a refusal (4xx)
        raises. A ``timeout`` that runs out leaves the round to the agent thread, which answers
        for the site until the round's guidance arrives (the next ``ask()`` finds it).
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if self.results.get(round, ("",))[0] == "error":
                del self.results[round]  # a failed round: ask again
            held = self.results.pop(round, None)  # received by the agent after an earlier ask() gave up
            self.waiting = round  # the agent leaves the polling to this thread
            self.lock.notify_all()
        try:
            kind, text = held if held is not None else self._drive(round, end, timeout)
        finally:
            with self.lock:
                self.waiting = None
                self.lock.notify_all()
        if kind == "error":
            raise RoundError(f"coordinator: round {round} failed: {text!s}")
        return text if isinstance(text, bytes) else text.encode()

    def _drive(self, round: int, end: float | None, timeout: float | None) -> tuple[str, bytes | str]:
        """Want ``round``, answer its requests and return its ``(kind, guidance or error)``."""
        work: dict[str, Any] | None = None
        wanted = False
        while True:
            if self.closed:
                raise FederationError(f"site {self.site!r} has left the study")
            wait = self.cfg.poll_wait if end is None else min(self.cfg.poll_wait, end - time.monotonic())
            if wait <= 0:
                with self.lock:
                    self.orphan = round  # the round may still need this site: the agent answers for it
                    self.lock.notify_all()
                raise TimeoutError(f"no guidance for round {round} within {timeout:g} s")
            try:
                if work is None and not wanted:  # the first call restarts a failed round; later polls do not
                    work = self._call("POST", f"/v1/sites/{self.site}/rounds/{int(round)}/want", accept=ACCEPT,
                                      params={"wait": wait}, read_timeout=wait, deadline=end)
                    wanted = True
                elif work is None:
                    work = self._poll(round, wait, end)
                if work.get("type") == "request":
                    work = self._answer(work, round, wait, end)
                    continue
            except Unreachable:
                if timeout is not None:
                    if wanted:  # the coordinator may come back and run the round with this site
                        with self.lock:
                            self.orphan = round
                            self.lock.notify_all()
                    raise
                wanted, work = True, None
                continue
            kind = work.get("type")
            if kind in ("guidance", "error"):
                if int(work["round"]) == round:
                    with self.lock:
                        if self.orphan is not None and self.orphan <= round:
                            self.orphan = None  # an earlier ask()'s round is over too
                    return kind, work["message"]
                with self.lock:
                    self.results[int(work["round"])] = (kind, work["message"])
            work = None

    def close(self) -> None:
        """Leave: the coordinator stops waiting for this site; the agent stops."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.lock.notify_all()
        try:
            self.cfg.retries, retries = 1, self.cfg.retries
            self._call("POST", f"/v1/sites/{self.site}/leave")
        except FederationError:
            pass  # the coordinator is gone anyway
        finally:
            self.cfg.retries = retries
        if self.agent is not None and self.agent is not threading.current_thread():
            self.agent.join(timeout=self.cfg.poll_wait + self.cfg.timeout + 1)
        self.session.close()

    # -- polls and answers ----------------------------------------------------------------------------
    def _poll(self, round: int | None, wait: float, deadline: float | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"wait": wait, **({"round": round} if round is not None else {})}
        return self._call("GET", f"/v1/sites/{self.site}/work", params=params, read_timeout=wait, accept=ACCEPT,
                          deadline=deadline)

    def _answer(self, work: dict[str, Any], round: int | None, wait: float | None,
                end: float | None = None) -> dict[str, Any] | None:
        """Answer the request ``work``; with ``wait``, long-poll for the next work in the same
        call, until ``end`` at the latest (None: the exchange had closed without this site, or
        already had its answer)."""
        if self.handler is None:
            raise FederationError(f"site {self.site!r} has not joined")
        with self.handling:  # one answer at a time, whichever thread got the request
            try:
                answer = self.handler(work["message"])
            except Exception as exc:  # noqa: BLE001 - report it: the exchange must not wait for us
                answer = json.dumps({"error": type(exc).__name__, "message": str(exc)[:500]}).encode()
        if wait is not None and end is not None:
            wait = max(0.0, min(wait, end - time.monotonic()))
        if isinstance(work["message"], str) and wire.is_frame(answer):  # a server that speaks JSON only
            answer = parse(answer).model_dump_json().encode()
        params = None if wait is None else {"wait": wait, **({"round": round} if round is not None else {})}
        try:
            got = self._call("POST", f"/v1/sites/{self.site}/answers/{int(work['seq'])}", body=answer, params=params,
                             read_timeout=wait, accept=ACCEPT if wait is not None else None, deadline=end)
        except Refused as exc:
            if "409" not in str(exc):
                raise
            return None  # 409: the exchange closed without us (we were late) or already has our answer
        return got if wait is not None else None

    def _answer_left_request(self) -> None:
        """Right after a join mid-study: a request the round under way left for this site (its former
        process asked for the round, then stopped) is answered now, from the data the site has (a site
        whose journal was lost abstains), so the others do not wait until this site's next ``ask()``."""
        try:
            work = self._poll(None, 0.0)
            if work.get("type") == "request":
                self._answer(work, None, None)
            elif work.get("type") in ("guidance", "error"):  # the round its former process asked for: kept
                with self.lock:
                    self.results[int(work["round"])] = (work["type"], work["message"])
        except FederationError:
            pass  # nothing left for it, or the coordinator is away: the next ask() finds the round

    # -- the agent thread ---------------------------------------------------------------------------
    def _agent(self) -> None:
        """Answer for the site while a round it asked for runs without an ``ask()`` waiting on it (the
        ask timed out): poll until that round's guidance arrives, keep it for the next ``ask()``."""
        while True:
            with self.lock:
                while not self.closed and not self.mid_study and (self.orphan is None or self.waiting is not None):
                    self.lock.wait()
                if self.closed:
                    return
                pending, self.mid_study = self.mid_study, False
            if pending:
                self._answer_left_request()
                continue
            with self.lock:
                if self.orphan is None or self.waiting is not None:
                    continue
                t = self.orphan
            try:
                work = self._poll(t, self.cfg.poll_wait)
                while work is not None and work.get("type") == "request" and not self.closed:
                    with self.lock:  # an ask() has begun meanwhile: answer, and leave the polling to it
                        wait = None if self.waiting is not None else self.cfg.poll_wait
                    work = self._answer(work, t, wait)
                if work is not None and work.get("type") in ("guidance", "error"):
                    with self.lock:
                        self.results[int(work["round"])] = (work["type"], work["message"])
                        if int(work["round"]) == t and self.orphan == t:
                            self.orphan = None
                        self.lock.notify_all()
            except Refused:  # the round is over for this site (the clock moved on, or it left)
                with self.lock:
                    self.orphan = None if self.orphan == t else self.orphan
            except Exception:  # noqa: BLE001 - unreachable: the next poll retries
                time.sleep(1.0)
