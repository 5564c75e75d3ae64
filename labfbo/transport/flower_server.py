r"""The Flower transport, coordinator side: labfbo's coordinator as a Flower ``ServerApp``.

The ``ServerApp`` main loop (``labfbo/flower_app/labfbo_flower_server.py``) is the
extension point Flower offers for algorithms that are not FedAvg-shaped; labfbo does not
use Flower's ``Strategy``. :class:`FlowerServer` drives the study with the grid's
``push_messages`` / ``pull_messages``:

1. **poll**: one message to every connected SuperNode; it delivers what waits for that
   site (its join reply, its guidance, an error) and brings back the site's status (its
   name, a join request, the round it waits for, whether it left);
2. joins go to :meth:`Coordinator.join`; when :meth:`Coordinator.ready` lets the next round
   start (every site asked, or ``quorum`` of them and the ``deadline`` passed), the round
   runs with :meth:`gather` as its transport — each protocol exchange is one Flower
   exchange with the participating sites, closed by quorum and deadline exactly as on HTTP
   (a SuperNode that died answers with Flower's error reply, or not at all);
3. until every site of the study has joined and left.

A round therefore costs its protocol exchanges plus two polls (one delivers the guidance,
the next hears that the sites want the next round). Flower's SuperNodes pull every few
seconds, so each exchange takes seconds: see docs/deployment.md for each protocol's
count.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

from labfbo.coordinator import Coordinator, RoundGate
from labfbo.exceptions import ConfigurationError, FederationError
from labfbo.flower_app import labfbo_flower_relay as relay
from labfbo.messages import JoinRequest, Message, parse

POLL_TIMEOUT = 30.0
"""Seconds a poll waits for a SuperNode that does not answer (a dead one) before going on."""
PULL_PAUSE = 0.2


class FlowerServer:
    """Runs a :class:`~labfbo.coordinator.Coordinator` on a Flower ``Grid``.

    Args:
        coordinator: the study.
        grid: the ``ServerApp``'s grid.
        tokens: site name -> SHA-256 digest of its token (a join must present it); None:
            any site name of the study (Flower's node authentication admits the nodes).
        poll_timeout: see :data:`POLL_TIMEOUT`.
    """

    def __init__(self, coordinator: Coordinator, grid: Any, *, tokens: Mapping[str, str] | None = None,
                 poll_timeout: float = POLL_TIMEOUT, log: Any = None) -> None:
        from labfbo.server.config import TokenBook

        self.coord, self.grid = coordinator, grid
        self.tokens = None if tokens is None else TokenBook(dict(tokens), None)
        self.poll_timeout = poll_timeout
        self.gate = RoundGate(coordinator)
        self.node_of: dict[str, int] = {}          # site -> the node it last spoke from
        self.pending: dict[str, tuple[dict[str, Any], bytes]] = {}  # site -> what its next poll delivers
        self.join_pending: dict[int, tuple[dict[str, Any], bytes]] = {}  # node -> a refused join's answer
        self.closed: set[str] = set()
        self.online: set[str] = set()
        self.exchanges = 0
        self.log = log or (lambda *a: None)

    # -- one Flower exchange ----------------------------------------------------------------------
    def exchange(self, outgoing: Mapping[Any, tuple[int, Any]], quorum: int | None = None,
                 deadline: float | None = None, timeout: float | None = None,
                 group: str = "", ttl: float | None = None) -> dict[Any, tuple[dict[str, Any], bytes] | BaseException]:
        """Send ``{key: (node, content)}``; return ``{key: (control, body) | error}``.

        Waits for every answer — or, once ``quorum`` answered, until ``deadline`` seconds
        have passed; ``timeout`` bounds the whole wait (the rest are ``TimeoutError``).
        ``ttl``: the messages' lifetime in Flower (None: Flower's 12 h).
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
                    out[key] = relay.from_content(reply.content)
                except Exception as exc:  # noqa: BLE001 - a malformed answer leaves that site out
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
        answers = self.exchange(outgoing, quorum, deadline, group=str(self.coord.last_round + 1))
        for site, got in answers.items():
            if isinstance(got, BaseException):
                out[site] = got
                continue
            _, body = got
            try:
                if body.startswith(b'{"error"'):
                    err = json.loads(body)
                    raise FederationError(f"site {site!r}: {err['error']}: {err['message']}")
                out[site] = parse(body)
            except Exception as exc:  # noqa: BLE001
                out[site] = exc
        return out

    def poll(self) -> None:
        """One poll of every connected node: deliver what waits, hear every site's status."""
        nodes = sorted(int(n) for n in self.grid.get_node_ids())
        site_at = {node: site for site, node in self.node_of.items()}
        outgoing = {}
        for node in nodes:
            control, body = self.join_pending.get(node) or self.pending.get(site_at.get(node, ""), ({}, b""))
            outgoing[node] = (node, relay.to_content(body, op="poll", **control))
        if not outgoing:
            time.sleep(1.0)
            return
        # a poll nobody answered expires (a SuperNode back from the dead must not replay old deliveries)
        answers = self.exchange(outgoing, timeout=self.poll_timeout, group="poll", ttl=max(self.poll_timeout, 10.0))
        self.online = set()
        for node, got in answers.items():
            if isinstance(got, BaseException):
                self.log(f"node {node}: {got}")
                continue
            if self.join_pending.pop(node, None) is None:  # delivered: it leaves the queue
                self.pending.pop(site_at.get(node, ""), None)
            self.status(node, *got)

    def status(self, node: int, control: dict[str, Any], body: bytes) -> None:
        """A site's status (a poll's answer)."""
        site = str(control.get("site", ""))
        if control.get("join"):
            self.admit(node, site, str(control.get("token", "")), body)
            return
        if site not in self.coord.members or self.node_of.get(site) != node:
            return  # not admitted (yet), or it spoke from another node since
        self.online.add(site)
        if control.get("closed"):
            self.closed.add(site)
            return
        self.closed.discard(site)
        t = int(control.get("wants", -1))
        if t < 0 or site in self.pending:
            return
        try:
            self.coord.check_round(site, t)
            if t <= self.coord.last_round:
                self.pending[site] = ({"deliver": "guidance"}, self.coord.current_guidance(site).to_wire())
            else:
                self.gate.ask(site, t)
        except Exception as exc:  # noqa: BLE001 - the site's ask() hears why
            self.pending[site] = ({"deliver": "error", "round": t, "error": f"{type(exc).__name__}: {exc}"}, b"")

    def admit(self, node: int, site: str, token: str, body: bytes) -> None:
        try:
            if self.tokens is not None and self.tokens.site_of(token) != site:
                raise FederationError(f"site {site!r} did not present its token")
            request = parse(body)
            if not isinstance(request, JoinRequest) or request.site != site:
                raise FederationError(f"expected the join request of site {site!r}")
            reply = self.coord.join(request).to_wire()
        except Exception as exc:  # noqa: BLE001 - the site's join hears why
            self.join_pending[node] = ({"deliver": "error", "about": "join",
                                        "error": f"{type(exc).__name__}: {exc}"}, b"")
            return
        self.node_of[site] = node
        self.closed.discard(site)
        self.online.add(site)
        self.pending[site] = ({"deliver": "join"}, reply)
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
            for s in wanting:
                self.pending[s] = ({"deliver": "guidance"}, replies[s].to_wire())
            self.log(f"round {t} done in {time.monotonic() - started:.1f} s; contributions "
                     f"{json.dumps(self.coord.contributors.get(t, []))}")
        except Exception as exc:  # noqa: BLE001 - every participant's ask() hears why
            for s in wanting:
                self.pending[s] = ({"deliver": "error", "round": t, "error": f"{type(exc).__name__}: {exc}"}, b"")
            self.log(f"round {t} failed: {exc}")
        self.gate.started(t)
        return True

    def done(self) -> bool:
        roster = set(self.coord.roster)
        return bool(roster) and roster <= set(self.coord.members) and roster <= self.closed and not self.pending

    def serve(self, max_seconds: float | None = None) -> None:
        """Poll and run rounds until every site of the study has joined and left."""
        end = None if max_seconds is None else time.monotonic() + max_seconds
        while not self.done():
            if end is not None and time.monotonic() > end:
                raise FederationError(f"the study did not finish within {max_seconds:g} s")
            self.poll()
            self.start_round()


def serve_run(grid: Any, run_config: Mapping[str, Any]) -> FlowerServer:
    """The ``ServerApp``'s main: the study of ``run_config["consortium"]`` (a consortium.yaml)."""
    from labfbo.server.config import ServerConfig

    path = str(run_config.get("consortium", ""))
    if not path or not Path(path).exists():
        raise ConfigurationError(f"the labfbo ServerApp needs run config consortium=<path to consortium.yaml>, "
                                 f"got {path!r}")
    cfg = ServerConfig.load(path)
    tokens = cfg.sites if isinstance(cfg.sites, dict) else None
    server = FlowerServer(cfg.coordinator(), grid, tokens=tokens,
                          poll_timeout=float(run_config.get("poll-timeout", POLL_TIMEOUT)),
                          log=lambda text: print(f"labfbo: {text}", flush=True))
    limit = float(run_config.get("max-seconds", 0)) or None
    server.serve(limit)
    print(f"labfbo: study {cfg.study} done: {server.coord.last_round + 1} rounds, {server.exchanges} Flower exchanges",
          flush=True)
    return server
