r"""The Flower transport, coordinator side: labfbo's coordinator as a Flower ``ServerApp``.

The ``ServerApp`` main loop (``labfbo/flower_app/labfbo_flower_server.py``) is the
extension point Flower offers for algorithms that are not FedAvg-shaped; labfbo does not
use Flower's ``Strategy``. :class:`FlowerServer` drives the study with the grid's
``push_messages`` / ``pull_messages``:

1. **poll**: one message to every connected SuperNode; it delivers what waits for that
   site (its join reply, its guidance, an error, "bye" once it left, "rejoin" to a node
   whose site this coordinator does not know there) and brings back the site's status
   (its name, a join request, the round it waits for, whether it left);
2. joins go to :meth:`Coordinator.join`; when :meth:`Coordinator.ready` lets the next round
   start (every site asked, or ``quorum`` of them and the ``deadline`` passed), the round
   runs with :meth:`gather` as its transport — each protocol exchange is one Flower
   exchange with the participating sites, closed by quorum and deadline exactly as on HTTP
   (a SuperNode that died answers with Flower's error reply, or not at all);
3. until every site of the study has joined and left (its leave acknowledged with "bye").

With a :class:`~labfbo.server.store.Store` (``state:`` in the consortium.yaml) the study is
as durable as on HTTP: every join, every completed round (before any site sees it), each
site's privacy account and each leave are written to it, and a ``ServerApp`` started again
on it resumes the study (:func:`labfbo.server.store.resume`). Its polls tell every node it
knows no site on to "rejoin"; each site's bridge answers with its join (the same member, the
same index; a site that has left, with its token: its leave is heard) and then says which
round it waits for, which the restored clock serves (the current guidance, or the next
round). The :class:`~labfbo.server.store.AuditLog`
(``audit_log:``) gets a line per site message the loop decides on: ``flower/join``,
``flower/want`` (a round asked for the first time), ``flower/answer`` / ``flower/failure``
(a protocol answer, or the error a site reported), ``flower/leave`` and ``flower/status``
(a status from a node this coordinator does not know, or one it could not read).

A round therefore costs its protocol exchanges plus two polls (one delivers the guidance,
the next hears that the sites want the next round). Flower's SuperNodes pull every few
seconds, so each exchange takes seconds: see docs/deployment.md for each protocol's
count.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any, Mapping

from labfbo.coordinator import Coordinator
from labfbo.core.exceptions import ConfigurationError, FederationError, LabFBOError
from labfbo.core.messages import JoinRequest, Message, parse
from labfbo.flower_app import labfbo_flower_relay as relay
from labfbo.server.store import AuditLog, Store, persist_round, resume, tokens_in_force
from labfbo.space.search import MAX_PARAMS
from labfbo.transport.gate import RoundGate

POLL_TIMEOUT = 30.0
"""Seconds a poll waits for a SuperNode that does not answer (a dead one) before going on."""
PULL_PAUSE = 0.2


class FlowerServer:
    """Runs a :class:`~labfbo.coordinator.Coordinator` on a Flower ``Grid``.

    Args:
        coordinator: the study.
        grid: the ``ServerApp``'s grid.
        tokens: site name -> SHA-256 digest of its token (a join must present it).
        poll_timeout: see :data:`POLL_TIMEOUT`.
        max_array_items, max_params: a message's arrays and a joining space's parameters at
            most (as on HTTP).
        store: the study's durable state; the coordinator resumes from it here (default: a
            store in memory).
        audit: the audit log (default: in memory only).
        retention_rounds: keep only the last N completed rounds (None: all).
    """

    def __init__(self, coordinator: Coordinator, grid: Any, *, tokens: Mapping[str, str],
                 poll_timeout: float = POLL_TIMEOUT, max_array_items: int = 2_000_000,
                 max_params: int = MAX_PARAMS, log: Any = None, store: Store | None = None,
                 audit: AuditLog | None = None, retention_rounds: int | None = None) -> None:
        from labfbo.server.config import TokenBook

        if retention_rounds is not None and retention_rounds < 1:
            raise ConfigurationError(f"retention_rounds must be at least 1, got {retention_rounds}")
        self.coord, self.grid = coordinator, grid
        self.store = Store(None) if store is None else store
        self.audit = AuditLog(None) if audit is None else audit
        self.retention_rounds = retention_rounds
        self.tokens = TokenBook(tokens_in_force(self.store, tokens), None)
        self.poll_timeout = poll_timeout
        self.max_array_items, self.max_params = max_array_items, min(max_params, MAX_PARAMS)
        self.nonce, self.seq = secrets.token_hex(8), 0  # every delivery's stamp: a bridge takes each once
        self.gate = RoundGate(coordinator)
        self.node_of: dict[str, int] = {}          # site -> the node it last spoke from
        self.pending: dict[str, tuple[dict[str, Any], bytes]] = {}  # site -> what its next poll delivers
        self.join_pending: dict[int, tuple[dict[str, Any], bytes]] = {}  # node -> a refused join's answer
        self.closed: set[str] = resume(coordinator, self.store)  # (a restarted ServerApp: the sites that had left)
        self.online: set[str] = set()
        self.exchanges = 0
        self.log = log or (lambda *a: None)

    # -- one Flower exchange ----------------------------------------------------------------------
    def exchange(self, outgoing: Mapping[Any, tuple[int, Any]], quorum: int | None = None,
                 deadline: float | None = None, timeout: float | None = None,
                 group: str = "", ttl: float | None = None, decode: Any = None) -> dict[Any, Any]:
        """Send ``{key: (node, content)}``; return ``{key: decode(control, body) | error}``.

        Waits for every answer — or, once ``quorum`` answers decoded, until ``deadline``
        seconds have passed; ``timeout`` bounds the whole wait (the rest are
        ``TimeoutError``). ``decode`` raises on an answer that does not count (an error
        the site reported); default: ``(control, body)``. ``ttl``: the messages' lifetime in
        Flower (None: Flower's 12 h).
        """
        from flwr.app import Message as FlowerMessage

        self.exchanges += 1
        keys = list(outgoing)
        msgs = [FlowerMessage(outgoing[k][1], dst_node_id=outgoing[k][0], message_type=relay.MESSAGE_TYPE,
                              group_id=group or None, ttl=ttl) for k in keys]
        ids = list(self.grid.push_messages(msgs))
        waiting = {mid: k for mid, k in zip(ids, keys) if mid}
        out: dict[Any, tuple[dict[str, Any], bytes] | BaseException] = {
            k: FederationError("Flower did not accept the message") for mid, k in zip(ids, keys) if not mid}
        start = time.monotonic()
        while waiting:
            for reply in self.grid.pull_messages(list(waiting)):
                key = waiting.pop(reply.metadata.reply_to_message_id, None)
                if key is None:
                    continue
                if reply.has_error():
                    out[key] = FederationError(f"Flower error {reply.error.code}: {reply.error.reason}")
                    continue
                try:
                    got = relay.from_content(reply.content)
                    out[key] = got if decode is None else decode(key, *got)
                except Exception as exc:  # noqa: BLE001 - a malformed or failed answer leaves that site out
                    out[key] = exc
            elapsed = time.monotonic() - start
            n_ok = sum(not isinstance(v, BaseException) for v in out.values())
            if not waiting or (deadline is not None and n_ok >= (quorum or 0) and elapsed > deadline):
                break
            if timeout is not None and elapsed > timeout:
                break
            time.sleep(PULL_PAUSE)
        for key in waiting.values():
            out[key] = TimeoutError(f"{key!r} did not answer in time")
        return out

    # -- the study ----------------------------------------------------------------------------
    def gather(self, requests: Mapping[str, Message], quorum: int,
               deadline: float | None) -> dict[str, Message | BaseException]:
        """One protocol exchange (the coordinator's gather) over Flower."""
        out: dict[str, Message | BaseException] = {}
        frames: dict[int, bytes] = {}
        outgoing: dict[str, tuple[int, Any]] = {}
        for site, request in requests.items():
            if site not in self.node_of or site in self.closed:
                out[site] = FederationError(f"site {site!r} is not connected")
                continue
            frame = frames.get(id(request)) or frames.setdefault(id(request), request.to_wire())
            outgoing[site] = (self.node_of[site], relay.to_content(frame, op="request"))
        out.update(self.exchange(outgoing, quorum, deadline, group=str(self.coord.last_round + 1), decode=self._answer))
        return out

    def _answer(self, site: str, control: dict[str, Any], body: bytes) -> Message:
        """A site's answer to a protocol request (raises: the site failed, or sent nonsense)."""
        from labfbo.server.app import check_payload

        t = self.coord.last_round + 1  # the round in progress
        if body.startswith(b'{"error"'):
            self.audit.write(site, "flower/failure", t, body, 200)
            err = json.loads(body)
            raise FederationError(f"site {site!r}: {err.get('error')}: {err.get('message')}")
        try:
            msg = parse(body)
            check_payload(msg, self.max_array_items)
        except Exception:
            self.audit.write(site, "flower/answer", t, body, 422)
            raise
        self.audit.write(site, "flower/answer", t, body, 200)
        return msg

    def _deliver(self, control: dict[str, Any], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
        self.seq += 1
        return {**control, "nonce": self.nonce, "seq": self.seq}, body

    def poll(self) -> None:
        """One poll of every connected node: deliver what waits, hear every site's status."""
        nodes = sorted(int(n) for n in self.grid.get_node_ids())
        site_at = {node: site for site, node in self.node_of.items()}
        outgoing = {}
        for node in nodes:
            if node in self.join_pending or node in site_at:
                control, body = self.join_pending.get(node) or self.pending.get(site_at[node], ({}, b""))
            else:  # no site known here: a bridge whose site joined before (a restarted ServerApp) joins again now
                control, body = self._deliver({"deliver": "rejoin"})
            outgoing[node] = (node, relay.to_content(body, op="poll", **control))
        if not outgoing:
            time.sleep(1.0)
            return
        # a poll nobody answered expires (a SuperNode back from the dead must not replay old deliveries)
        answers = self.exchange(outgoing, timeout=self.poll_timeout, group="poll", ttl=max(self.poll_timeout, 10.0))
        self.online = set()
        for node, got in answers.items():
            if isinstance(got, BaseException):
                if site_at.get(node) not in self.closed:  # (a site that left has no bridge any more)
                    self.log(f"node {node}: {got}")
                continue
            if self.join_pending.pop(node, None) is None:  # delivered: it leaves the queue
                self.pending.pop(site_at.get(node, ""), None)
            try:
                self.status(node, *got)
            except Exception as exc:  # noqa: BLE001 - one site's nonsense must not stop the study
                self.audit.write(None, "flower/status", None, got[1], 422)
                self.log(f"node {node}: a status that could not be read: {type(exc).__name__}: {exc}")

    def status(self, node: int, control: dict[str, Any], body: bytes) -> None:
        """A site's status (a poll's answer)."""
        site = str(control.get("site", ""))
        if control.get("join"):
            self.admit(node, site, str(control.get("token", "")), body)
            return
        if site not in self.coord.members or self.node_of.get(site) != node:
            if not (control.get("closed") and self.tokens.site_of(str(control.get("token", ""))) == site):
                # this coordinator does not know the site here: it joins again (a site that has left answers
                # with its token: it left while this coordinator did not know it here, a restarted ServerApp)
                self.audit.write(None, "flower/status", None, b"", 409)
                self.join_pending[node] = self._deliver({"deliver": "rejoin"})
                return
            if site not in self.coord.members:  # it left a study this coordinator does not know it in
                self.join_pending[node] = self._deliver({"deliver": "bye"})
                return
            self.node_of[site] = node
        self.online.add(site)
        if control.get("closed"):
            if site not in self.closed:
                self.log(f"site {site} left")
                self.store.add_leave(site)
                self.audit.write(site, "flower/leave", None, b"", 200)
            self.closed.add(site)
            self.pending[site] = self._deliver({"deliver": "bye"})
            return
        self.closed.discard(site)
        t = int(control.get("wants", -1))
        if t < 0 or site in self.pending:
            return
        try:
            self.coord.check_round(site, t)
            if t <= self.coord.last_round:  # behind the clock: the current guidance, filed under the round asked
                self.pending[site] = self._deliver({"deliver": "guidance", "round": t},
                                                   self.coord.current_guidance(site).to_wire())
                self.audit.write(site, "flower/want", t, b"", 200)
            elif self.gate.wants.get(site) != t:  # (a site waiting for it says so at every poll)
                self.gate.ask(site, t)
                self.audit.write(site, "flower/want", t, b"", 202)
        except Exception as exc:  # noqa: BLE001 - the site's ask() hears why
            self.audit.write(site, "flower/want", t, b"", 409)
            self.pending[site] = self._deliver(
                {"deliver": "error", "round": t, "error": f"{type(exc).__name__}: {exc}"}
            )

    def admit(self, node: int, site: str, token: str, body: bytes) -> None:
        """A join (or a join again, after a restart); audited with HTTP's codes: 401 a token not
        the site's, 422 a malformed join, 409 refused by the study."""
        from labfbo.server.app import check_payload

        code, who = 401, None
        try:
            if self.tokens.site_of(token) != site:
                raise FederationError(f"site {site!r} did not present its token")
            code, who = 422, site
            request = parse(body)
            if not isinstance(request, JoinRequest) or request.site != site:
                raise FederationError(f"expected the join request of site {site!r}")
            params = request.space.get("params")
            if isinstance(params, list) and len(params) > self.max_params:
                raise FederationError(f"the joining space has {len(params)} parameters (at most {self.max_params})")
            check_payload(request, self.max_array_items)
            code = 409
            reply = self.coord.join(request).to_wire()
        except Exception as exc:  # noqa: BLE001 - the site's join hears why
            self.audit.write(who, "flower/join", None, body, code if isinstance(exc, LabFBOError) else 422)
            self.join_pending[node] = self._deliver({"deliver": "error", "about": "join",
                                                     "error": f"{type(exc).__name__}: {exc}"})
            return
        self.store.add_join(site, request.model_dump_json())
        self.audit.write(site, "flower/join", None, body, 200)
        self.node_of[site] = node
        self.closed.discard(site)
        self.online.add(site)
        self.pending[site] = self._deliver({"deliver": "join"}, reply)
        self.log(f"site {site} joined from node {node}")

    def start_round(self) -> bool:
        """Run the next round if it may start; its guidance waits for the next poll."""
        opened = self.gate.open(set(self.coord.members) - self.closed)  # a silent site is waited for, as on HTTP
        if opened is None:
            return False
        t, wanting = opened
        started = time.monotonic()
        self.log(f"round {t} starts with {wanting}")
        try:
            replies = self.coord.run_round(t, self.gather, wanting)
            persist_round(self.coord, self.store, t, self.retention_rounds)  # before any site sees it
            for s in wanting:
                self.pending[s] = self._deliver({"deliver": "guidance", "round": t}, replies[s].to_wire())
            self.log(f"round {t} done in {time.monotonic() - started:.1f} s; contributions "
                     f"{json.dumps(self.coord.contributors.get(t, []))}")
        except Exception as exc:  # noqa: BLE001 - every participant's ask() hears why
            for s in wanting:
                self.pending[s] = self._deliver(
                    {"deliver": "error", "round": t, "error": f"{type(exc).__name__}: {exc}"}
                )
            self.log(f"round {t} failed: {exc}")
        self.gate.started(t)
        return True

    def done(self) -> bool:
        """Every site of the study has joined and left (its "bye" need not have arrived)."""
        roster = set(self.coord.roster)
        return bool(roster) and roster <= set(self.coord.members) and roster <= self.closed

    def serve(self, max_seconds: float | None = None) -> None:
        """Poll and run rounds until every site of the study has joined and left."""
        end = None if max_seconds is None else time.monotonic() + max_seconds
        while not self.done():
            if end is not None and time.monotonic() > end:
                raise FederationError(f"the study did not finish within {max_seconds:g} s")
            self.poll()
            self.start_round()
        if self.pending:
            self.poll()  # the last sites' "bye": their close() returns at once


def serve_run(grid: Any, run_config: Mapping[str, Any]) -> FlowerServer:
    """The ``ServerApp``'s main: the study of ``run_config["consortium"]`` (a consortium.yaml)."""
    from labfbo.server.config import ServerConfig

    path = str(run_config.get("consortium", ""))
    if not path or not Path(path).exists():
        raise ConfigurationError(f"the labfbo ServerApp needs run config consortium=<path to consortium.yaml>, "
                                 f"got {path!r}")
    cfg = ServerConfig.load(path)
    if isinstance(cfg.sites, list):
        raise ConfigurationError(f"{path}: under Flower every site needs a token (sites: {{name: sha256}}, "
                                 "`labfbo coordinator token`): Flower's node authentication admits a node, not a site")
    log = lambda text: print(f"labfbo: {text}", flush=True)  # noqa: E731 - the ServerApp's log (flwr log)
    if cfg.admin_token_sha256 is not None:
        log(f"{path}: admin_token_sha256 is not used under Flower (the dashboard and admin routes are HTTP-only)")
    state, audit_log = _beside(path, cfg.state), _beside(path, cfg.audit_log)
    store = Store(state)
    try:
        audit = AuditLog(audit_log, cfg.audit_retention_days, max_bytes=int(cfg.audit_max_mb * 2**20))
        server = FlowerServer(cfg.coordinator(), grid, tokens=cfg.sites, store=store, audit=audit,
                              retention_rounds=cfg.retention_rounds,
                              poll_timeout=float(run_config.get("poll-timeout", POLL_TIMEOUT)),
                              max_array_items=cfg.max_array_items, max_params=cfg.max_params, log=log)
        if state is not None:
            coord = server.coord
            log(f"state {state}: " + (f"resumed: {len(coord.members)} site(s) joined, last round {coord.last_round}, "
                                      f"{len(server.closed)} left" if coord.members else "a new study"))
        limit = float(run_config.get("max-seconds", 0)) or None
        server.serve(limit)
    finally:
        store.close()
    print(f"labfbo: study {cfg.study} done: {server.coord.last_round + 1} rounds, {server.exchanges} Flower exchanges",
          flush=True)
    return server


def _beside(config: str | Path, path: str | None) -> str | None:
    """``path`` (a file the consortium.yaml names) relative to that file's folder: a ServerApp's working
    directory is Flower's, not the operator's."""
    return None if path is None else str(Path(config).resolve().parent / Path(path).expanduser())
