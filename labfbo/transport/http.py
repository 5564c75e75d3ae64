r"""The HTTP site client: sites pull their work from a coordinator server; it never calls them.

``Optimizer(..., coordinator=HTTPCoordinator("https://coord.example:8750", token=...))``
or simply ``coordinator="https://..."`` with ``token=``. After the join, one background
*agent* thread per site long-polls ``GET /v1/sites/{site}/work`` (≤ 25 s per poll) and
answers the coordinator's requests from the site's local data — also while the lab
script waits on its instrument, which the ``gradient`` protocol needs (every site answers
every SVGD step). ``ask()`` tells the agent which round it needs and waits for its
guidance.

Every call uses ``requests`` with a connect/read timeout and retries connection errors
and 5xx answers with exponential backoff and full jitter (0.5 s doubling, ≤ 8 s, 6
tries). 4xx answers are not retried: they are the server refusing the site (bad token,
wrong site, conflict) and raise :class:`~labfbo.exceptions.FederationError`.

(An operator who wants to review each outgoing message passes ``approve=`` to the
``Optimizer``; that works on every transport.)
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from labfbo import wire
from labfbo.exceptions import ConfigurationError, FederationError, RoundError
from labfbo.messages import JoinReply, JoinRequest, parse
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


class HTTPCoordinator:
    """A coordinator server at ``url``, reached with this site's bearer ``token``."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0, retries: int = 6, backoff: float = 0.5,
                 verify: bool | str = True, poll_wait: float = POLL_WAIT) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"coordinator url must start with http:// or https://, got {url!r}")
        if not token:
            raise ConfigurationError("an HTTP coordinator needs this site's token (token=...)")
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
        self.agent_error: BaseException | None = None
        self.waiting: int | None = None  # the round whose guidance ask() waits for

    # -- plumbing ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, body: bytes | None = None,
              params: dict[str, Any] | None = None, read_timeout: float | None = None,
              accept: str | None = None) -> Any:
        """The answer's JSON, or — a frame — ``{"type", "seq", "round", "message": frame}``."""
        import requests

        # Not urllib3's Retry on the session: a closing link must stop retrying at once (a Retry
        # keeps sleeping through its schedule), a 4xx is a refusal with the server's detail, and
        # the backoff is full jitter (uniform in [0, delay]) rather than a doubling plus noise.
        url = self.cfg.url + path
        delay = self.cfg.backoff
        for attempt in range(self.cfg.retries):
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
                    raise Refused(f"coordinator refused {method} {path}: {resp.status_code} {detail}")
                err = FederationError(f"coordinator error {resp.status_code} on {method} {path}")
            if attempt == self.cfg.retries - 1 or self.closed:
                raise Unreachable(f"coordinator unreachable at {self.cfg.url}: {err}") from None
            time.sleep(random.uniform(0, delay))  # full jitter
            delay = min(delay * 2, 8.0)
        raise FederationError("unreachable")  # pragma: no cover

    # -- SiteLink ---------------------------------------------------------------------------------
    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        reply = parse(self._call("POST", "/v1/join", body=request.to_wire())["message"])
        if not isinstance(reply, JoinReply):
            raise FederationError(f"unexpected join answer {reply.kind!r}")
        self.handler = handler
        if self.agent is None:
            self.agent = threading.Thread(target=self._agent, name=f"labfbo-agent-{self.site}", daemon=True)
            self.agent.start()
        return reply

    def guidance(self, round: int, timeout: float | None = None) -> bytes:
        """Wait for round ``round``'s guidance (the agent receives it).

        The agent polls with this round on every poll, so a restarted coordinator learns
        again that the site waits for it. While the coordinator is unreachable, ``ask()``
        without a timeout keeps waiting; a refusal (4xx) raises.
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if self.results.get(round, ("",))[0] == "error":
                del self.results[round]  # a failed round: ask again
            self.waiting = round
            self.lock.notify_all()
        try:
            # tell the coordinator now (the agent may be inside a long poll): it starts the round
            self._call("POST", f"/v1/sites/{self.site}/rounds/{int(round)}/want")
        except Unreachable:
            if timeout is not None:
                raise
        with self.lock:
            try:
                while round not in self.results:
                    err = self.agent_error
                    if isinstance(err, Refused) or (err is not None and timeout is not None):
                        raise FederationError(f"site agent: {err}")
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"no guidance for round {round} within {timeout:g} s")
                    self.lock.wait(left if left is not None else 1.0)
                kind, text = self.results.pop(round)
            finally:
                self.waiting = None
        if kind == "error":
            raise RoundError(f"coordinator: round {round} failed: {text!s}")
        return text if isinstance(text, bytes) else text.encode()

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

    # -- the agent thread ---------------------------------------------------------------------------
    def _agent(self) -> None:
        while True:
            with self.lock:
                if self.closed:
                    return
                waiting = self.waiting
            params: dict[str, Any] = {"wait": self.cfg.poll_wait}
            if waiting is not None:
                params["round"] = waiting
            try:
                work = self._call("GET", f"/v1/sites/{self.site}/work", params=params, read_timeout=self.cfg.poll_wait,
                                  accept=ACCEPT)
                self._do(work)
            except Exception as exc:  # noqa: BLE001 - reported to the waiting ask(), then retried
                with self.lock:
                    if self.closed:
                        return
                    self.agent_error = exc
                    self.lock.notify_all()
                time.sleep(1.0)
            else:
                with self.lock:
                    self.agent_error = None

    def _do(self, work: dict[str, Any]) -> None:
        kind = work.get("type")
        if self.closed:
            return  # the site has left: it answers nothing more
        if kind == "request":
            if self.handler is None:
                raise FederationError(f"site {self.site!r} has not joined")
            try:
                answer = self.handler(work["message"])
            except Exception as exc:  # noqa: BLE001 - report it: the exchange must not wait for us
                answer = json.dumps({"error": type(exc).__name__, "message": str(exc)[:500]}).encode()
            if isinstance(work["message"], str) and wire.is_frame(answer):  # a server that speaks JSON only
                answer = parse(answer).model_dump_json().encode()
            try:
                self._call("POST", f"/v1/sites/{self.site}/answers/{int(work['seq'])}", body=answer)
            except Refused as exc:
                if "409" not in str(exc):
                    raise
                # 409: the exchange closed without us (we were late) or already has our answer
        elif kind in ("guidance", "error"):
            with self.lock:
                self.results[int(work["round"])] = (kind, work["message"])
                self.lock.notify_all()
