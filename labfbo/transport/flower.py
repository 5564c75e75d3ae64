r"""The Flower transport, site side: the lab script's bridge to its SuperNode.

Under ``transport="flower"`` the consortium runs Flower's deployment engine: one
SuperLink, one SuperNode per site, and labfbo's coordinator as a Flower ``ServerApp``
(:mod:`labfbo.transport.flower_server`). Flower starts a ``ClientApp`` process for each
message a SuperNode receives; labfbo's ``ClientApp`` is a relay
(``labfbo/flower_app/labfbo_flower_relay.py``) that forwards the message over a local
socket to the running lab script and returns its answer. So the site's
:class:`~labfbo.Optimizer` stays the only reader and writer of its journal, exactly as on
HTTP::

    opt = labfbo.Optimizer(space, protocol="distribution", site="lab-a", seed=0,
                           coordinator="flower://127.0.0.1:9500", token=TOKEN)

``flower://HOST:PORT`` is where this site's *bridge* listens (127.0.0.1: only processes on
this machine can reach it); the site's SuperNode is started with the same address and
token in its node config (``labfbo-site``, ``labfbo-token``). Every relayed call must carry
the token (compared in constant time), and the token goes on to the coordinator with the
join, where ``consortium.yaml`` may hold its SHA-256 digest as for HTTP sites.

What the bridge answers:

* a **poll** (the coordinator's pull loop, one Flower exchange for every site): it first
  takes what the poll delivers — the join reply, a round's guidance (filed under the round
  the site asked for), an error, "rejoin" (the coordinator does not know this site on
  this node, e.g. a restarted ServerApp: send the join again; a site that has left sends
  its token instead, so that its leave is heard) or "bye" (the coordinator heard that the
  site left) —
  then says who the site is, the join request it wants admitted, the round it waits for
  and whether it has left. Every delivery carries the coordinator's ``(nonce, seq)``: a
  poll whose answer was lost delivers again, and the bridge takes each delivery once;
* a **request** (a protocol exchange): the site's handler answers it from the site's local
  data, in the bridge's thread, while the lab script may be waiting on its instrument (as
  the HTTP agent does).
"""

from __future__ import annotations

import hmac
import json
import socket
import socketserver
import threading
import time
from collections import deque
from typing import Any

from labfbo.core.exceptions import ConfigurationError, FederationError, LabFBOError, RoundError
from labfbo.core.messages import JoinReply, JoinRequest, parse
from labfbo.flower_app import labfbo_flower_relay as relay
from labfbo.transport.base import Handler, SiteLink

SCHEME = "flower://"
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
IO_TIMEOUT = 120.0
"""Seconds a relay connection may take for each read or write, once it has shown the site's token."""
CONTROL_TIMEOUT = 5.0
"""Seconds a connection may take to send its control part (with the token): the relay sends it at once,
so a connection that trickles it is not the relay and holds its thread no longer than this."""
MAX_BRIDGE_CONNECTIONS = 16
"""Connections a bridge serves at once (the relay uses one or two); beyond, a new one is closed at once."""


class FlowerCoordinator:
    """A coordinator reached through this site's Flower SuperNode.

    Args:
        address: ``flower://HOST:PORT`` or ``HOST:PORT``, where this site's bridge listens
            (its SuperNode's ``labfbo-site`` node config); HOST is a loopback address.
        token: the site's token: the relay must present it, and the coordinator checks it.
        close_wait: seconds :meth:`FlowerLink.close` waits for the coordinator to hear that the
            site left (its next poll: after the round in progress, if one runs).
        linger: after a poll delivered the join reply or a round's guidance, seconds the
            bridge waits for the lab script to ask for its next round (or leave) before it
            answers the poll — so that poll already starts the next round instead of the
            next one (each Flower exchange costs seconds). 0: answer at once.
        join_timeout: seconds the join waits for the coordinator's polls (None: for ever).
    """

    def __init__(self, address: str, token: str, *, close_wait: float = 300.0, linger: float = 5.0,
                 join_timeout: float | None = 900.0) -> None:
        address = address[len(SCHEME):] if address.startswith(SCHEME) else address
        try:
            self.host, self.port = relay.parse_address(address.rstrip("/"))
        except ValueError as exc:
            raise ConfigurationError(f"flower coordinator: {exc} (e.g. flower://127.0.0.1:9500)") from None
        if self.host not in LOOPBACK:
            raise ConfigurationError(f"flower coordinator: the bridge listens on this machine only (127.0.0.1, ::1 "
                                     f"or localhost), got {self.host!r}: the SuperNode runs beside the lab script")
        if not token:
            raise ConfigurationError("a Flower site needs its token (token=...): its SuperNode's relay presents it")
        self.token = token
        self.close_wait, self.linger, self.join_timeout = close_wait, linger, join_timeout
        self.links: list[FlowerLink] = []

    def connect(self, site: str) -> "FlowerLink":
        link = FlowerLink(self, site)
        self.links.append(link)
        return link

    def abort(self, reason: str) -> None:
        """Make every waiting ``join``/``ask`` of this coordinator's links raise (the run ended)."""
        for link in self.links:
            link.abort(reason)


class _Bridge(socketserver.ThreadingTCPServer):
    """One thread per connection, at most :data:`MAX_BRIDGE_CONNECTIONS` at once."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_BRIDGE_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # a flood of connections, not the relay
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class FlowerLink(SiteLink):
    """A site's side of the Flower transport: the bridge server and the round waits."""

    def __init__(self, cfg: FlowerCoordinator, site: str) -> None:
        self.cfg, self.site = cfg, site
        self.handler: Handler | None = None
        self.lock = threading.Condition()
        self.join_request: bytes | None = None        # the site's join (sent again when told to rejoin)
        self.join_frame: bytes | None = None          # the join waiting to be admitted
        self.join_result: tuple[str, bytes] | None = None
        self.results: dict[int, tuple[str, bytes]] = {}  # asked round -> ("guidance", frame) | ("error", why)
        self.waiting: int | None = None
        self.taken: deque[tuple[str, int]] = deque(maxlen=1024)  # the (nonce, seq) of the deliveries taken
        self.closed = False
        self.left_heard = False  # the coordinator acknowledged the leave ("bye")
        self.show_token = False  # a leave the coordinator must authenticate (it told a closed site to rejoin)
        self.failure: str | None = None
        self.server: _Bridge | None = None

    # -- the bridge ---------------------------------------------------------------------------
    def _start(self) -> None:
        if self.server is not None:
            return
        link = self

        class Handle(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                link._serve(self.request)

        try:
            self.server = _Bridge((self.cfg.host, self.cfg.port), Handle)
        except OSError as exc:
            raise FederationError(f"site {self.site!r}: cannot open the Flower bridge on "
                                  f"{self.cfg.host}:{self.cfg.port}: {exc}") from None
        threading.Thread(target=self.server.serve_forever, name=f"labfbo-bridge-{self.site}", daemon=True).start()

    def _shutdown(self) -> None:
        with self.lock:
            server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        try:
            control = relay.recv_control(sock, within=CONTROL_TIMEOUT)
            if not hmac.compare_digest(str(control.get("token", "")).encode(), self.cfg.token.encode()):
                relay.send_parts(sock, {"refused": "wrong token"}, b"")  # before its body is read
                return
            sock.settimeout(IO_TIMEOUT)
            body = relay.recv_body(sock)
            op = control.get("op")
            if op == "poll":
                relay.send_parts(sock, *self._poll(control, body))
            elif op == "request":
                relay.send_parts(sock, {"op": "answer"}, self._answer(body))
            else:
                relay.send_parts(sock, {"refused": f"unknown op {op!r}"}, b"")
        except (OSError, ValueError, LabFBOError):
            pass  # a broken or malformed relay call: Flower reports the failed message to the coordinator

    def _answer(self, body: bytes) -> bytes:
        try:
            if self.handler is None or self.closed:
                raise FederationError(f"site {self.site!r} is not in the study")
            return self.handler(body)
        except Exception as exc:  # noqa: BLE001 - the exchange must not wait for us
            return json.dumps({"error": type(exc).__name__, "message": str(exc)[:500]}).encode()

    def _take(self, control: dict[str, Any], body: bytes) -> bool:
        """Take a poll's delivery (lock held); True if it was new guidance or a join reply."""
        what = control.get("deliver")
        if what is None:
            return False
        stamp = (str(control.get("nonce", "")), int(control.get("seq", 0)))
        if stamp in self.taken:
            return False  # delivered again after a lost answer
        self.taken.append(stamp)
        if what == "join" and self.join_frame is not None:
            self.join_result, self.join_frame = ("ok", body), None
            return True
        if what == "guidance":
            self.results[int(control["round"])] = ("guidance", body)
            return True
        if what == "error":
            why = str(control.get("error", "the coordinator refused"))
            if control.get("about") == "join":
                if self.join_frame is not None:
                    self.join_result, self.join_frame = ("error", why.encode()), None
            elif int(control.get("round", -1)) == self.waiting:
                self.results[int(control["round"])] = ("error", why.encode())
        elif what == "rejoin" and self.closed:
            self.show_token = True  # the coordinator does not know us here: the token makes the leave heard
        elif what == "rejoin" and self.join_request is not None and self.join_frame is None:
            self.join_frame = self.join_request  # the coordinator restarted, or the SuperNode did
        elif what == "bye":
            self.left_heard = True
        return False

    def _poll(self, control: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        with self.lock:
            fresh = self._take(control, body)
            self.lock.notify_all()
            if fresh:  # the lab script is about to ask for its next round: tell the coordinator in this poll
                end = time.monotonic() + self.cfg.linger
                while not self._settled() and time.monotonic() < end:
                    self.lock.wait(min(end - time.monotonic(), 0.5))
            wants = self.waiting if self.waiting is not None and self.waiting not in self.results else -1
            status = {"op": "status", "site": self.site, "wants": wants, "closed": self.closed,
                      "join": self.join_frame is not None}
            if self.closed and self.show_token:
                status["token"] = self.cfg.token
            if self.join_frame is not None:
                status["token"] = self.cfg.token
                return status, self.join_frame
            return status, b""

    def _settled(self) -> bool:
        """The lab script waits for a round it has no answer for, or has left (lock held)."""
        return self.closed or (self.waiting is not None and self.waiting not in self.results)

    def abort(self, reason: str) -> None:
        with self.lock:
            self.failure = reason
            self.lock.notify_all()

    def _check(self) -> None:
        if self.failure is not None:
            raise FederationError(f"site {self.site!r}: {self.failure}")

    # -- SiteLink -------------------------------------------------------------------------------
    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        """Open the bridge and wait until the coordinator's polls admit the site."""
        self._start()
        end = None if self.cfg.join_timeout is None else time.monotonic() + self.cfg.join_timeout
        try:
            with self.lock:
                self.handler = handler
                self.closed = self.left_heard = self.show_token = False
                self.join_result, self.join_request = None, request.to_wire()
                self.join_frame = self.join_request
                while self.join_result is None:
                    self._check()
                    if end is not None and time.monotonic() > end:
                        raise FederationError(
                            f"site {self.site!r}: no poll from the coordinator within {self.cfg.join_timeout:g} s — is "
                            f"this site's SuperNode running with labfbo-site=\"{self.cfg.host}:{self.cfg.port}\", and "
                            "the study's ServerApp (flwr run)?")
                    self.lock.wait(1.0)
                kind, body = self.join_result
            if kind == "error":
                raise FederationError(f"coordinator refused the join: {body.decode()}")
            reply = parse(body)
            if not isinstance(reply, JoinReply):
                raise FederationError(f"unexpected join answer {reply.kind!r}")
            return reply
        except BaseException:
            self._shutdown()  # a refused site keeps no bridge open (a retry may open it again)
            raise

    def guidance(self, round: int, timeout: float | None = None) -> bytes:
        """Wait for round ``round``'s guidance (the coordinator's next polls deliver it)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            if self.results.get(round, ("",))[0] == "error":
                del self.results[round]  # a failed round: ask again
            self.waiting = round
            self.lock.notify_all()  # a lingering poll tells the coordinator now
            try:
                while round not in self.results:
                    self._check()
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"no guidance for round {round} within {timeout:g} s")
                    self.lock.wait(1.0 if left is None else min(left, 1.0))
                kind, body = self.results.pop(round)
                for old in [t for t in self.results if t < round]:
                    del self.results[old]
            finally:
                self.waiting = None
        if kind == "error":
            raise RoundError(f"coordinator: round {round} failed: {body.decode()}")
        return body

    def close(self) -> None:
        """Leave: wait (at most ``close_wait`` s) until the coordinator acknowledged it, then
        close the bridge."""
        with self.lock:
            self.closed = True
            self.lock.notify_all()
            end = time.monotonic() + self.cfg.close_wait
            while (not self.left_heard and self.server is not None and self.handler is not None
                   and self.failure is None and time.monotonic() < end):
                self.lock.wait(0.5)
        self._shutdown()
