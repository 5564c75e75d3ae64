r"""The MPI transport: the coordinator at rank 0, one site per rank 1..N.

Run under ``mpiexec -n N+1 python -m mpi4py script.py`` (the ``-m mpi4py`` form aborts
the whole job when one rank raises, instead of leaving the others waiting)::

    from mpi4py import MPI
    from labfbo.transport.mpi import MPICoordinator, serve

    if MPI.COMM_WORLD.Get_rank() == 0:
        serve(labfbo.Coordinator("distribution", sites=names, space=space, seed=0))
    else:
        opt = labfbo.Optimizer(space, protocol="distribution", coordinator=MPICoordinator(),
                               site=names[rank - 1], seed=0)
        ...  # ask / tell as usual

Messages travel as the same :mod:`labfbo.core.wire` frames as on every other transport, in
``uint8`` numpy buffers with mpi4py's buffer (uppercase) calls ``Send`` / ``Recv`` after an
``Iprobe`` for the size (small control messages — a guidance request, an error — are JSON). Collectives (``Bcast`` /
``Gatherv``) are not used: each site runs its own
lab script, rounds must tolerate stragglers (quorum and deadline), and a collective would
block every rank on the slowest one. Waiting uses ``Iprobe`` with short sleeps (1 ms,
growing to 20 ms), so an idle rank does not spin a core.

A site answers the coordinator's requests while it waits for its guidance (inside
``ask``). Envelopes carry a sequence number, so a straggler's late answer to a closed
exchange is recognised and dropped.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

import numpy as np

from labfbo.coordinator import Coordinator
from labfbo.core import wire
from labfbo.core.exceptions import FederationError, LabFBOError, RoundError
from labfbo.core.messages import JoinReply, JoinRequest, Message, parse
from labfbo.transport.base import Handler, SiteLink
from labfbo.transport.gate import RoundGate

TAG_JOIN, TAG_JOIN_REPLY, TAG_GUIDANCE, TAG_REPLY, TAG_REQUEST, TAG_RESPONSE, TAG_CLOSE = range(1, 8)
ROOT = 0


def _comm(comm: Any = None) -> Any:
    if comm is not None:
        return comm
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise LabFBOError("the MPI transport needs mpi4py: pip install 'labfbo[mpi]'") from exc
    return MPI.COMM_WORLD


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _send(comm: Any, data: bytes | str, dest: int, tag: int) -> None:
    comm.Send(np.frombuffer(_bytes(data), dtype=np.uint8), dest=dest, tag=tag)


class _Outbox:
    """Non-blocking sends (``Isend``): a busy site rank never stalls the coordinator.

    Keeps each buffer alive until its send completes.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.pending: list[tuple[Any, np.ndarray]] = []

    def send(self, data: bytes | str, dest: int, tag: int) -> None:
        buf = np.frombuffer(_bytes(data), dtype=np.uint8).copy()
        self.pending.append((self.comm.Isend(buf, dest=dest, tag=tag), buf))
        self.pending = [(r, b) for r, b in self.pending if not r.Test()]


def _recv(comm: Any, source: int, tag: int, timeout: float | None = None) -> tuple[bytes, int, int]:
    """Wait (probe + short sleeps) for one message; returns ``(bytes, source, tag)``."""
    from mpi4py import MPI

    status = MPI.Status()
    start, pause = time.monotonic(), 0.001
    while not comm.Iprobe(source=source, tag=tag, status=status):
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(f"no MPI message within {timeout:g} s")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.02)
    buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
    src, tg = status.Get_source(), status.Get_tag()
    comm.Recv(buf, source=src, tag=tg)
    return buf.tobytes(), src, tg


def _envelope(seq: int, body: bytes) -> bytes:
    return f"{seq}\n".encode() + body


def _open(data: bytes) -> tuple[int, bytes]:
    head, _, body = data.partition(b"\n")
    return int(head), body


def _error(exc: BaseException) -> bytes:
    return json.dumps({"error": type(exc).__name__, "message": str(exc)}).encode()


def _raise_if_error(body: bytes) -> bytes:
    if body.startswith(b'{"error"'):
        err = json.loads(body)
        raise FederationError(f"coordinator: {err['error']}: {err['message']}")
    return body


# -- site side -------------------------------------------------------------------------------
class MPICoordinator:
    """What a site rank passes as ``Optimizer(coordinator=...)``: the coordinator at rank 0."""

    def __init__(self, comm: Any = None, root: int = ROOT) -> None:
        self.comm = _comm(comm)
        self.root = root

    def connect(self, site: str) -> "MPILink":
        return MPILink(self.comm, site, self.root)


class MPILink(SiteLink):
    def __init__(self, comm: Any, site: str, root: int = ROOT) -> None:
        self.comm, self.site, self.root = comm, site, root
        self.handler: Handler | None = None

    def join(self, request: JoinRequest, handler: Handler) -> JoinReply:
        self.handler = handler
        _send(self.comm, request.to_wire(), self.root, TAG_JOIN)
        text, _, _ = _recv(self.comm, self.root, TAG_JOIN_REPLY)
        return parse(_raise_if_error(text))  # type: ignore[return-value]

    def guidance(self, round: int, timeout: float | None = None) -> bytes:
        from mpi4py import MPI

        _send(self.comm, json.dumps({"round": int(round)}), self.root, TAG_GUIDANCE)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            text, _, tag = _recv(self.comm, self.root, MPI.ANY_TAG, timeout=left)
            if tag == TAG_REPLY:
                body = _raise_if_error(text)
                if wire.header(body).get("round", round) < round:
                    continue  # the late reply of a round this site gave up on (ask(timeout=...))
                return body
            if tag == TAG_REQUEST:
                seq, body = _open(text)
                try:
                    if self.handler is None:
                        raise FederationError(f"site {self.site!r} has not joined")
                    answer = self.handler(body)
                except Exception as exc:  # the coordinator leaves this site out of the exchange
                    answer = _error(exc)
                _send(self.comm, _envelope(seq, answer), self.root, TAG_RESPONSE)

    def close(self) -> None:
        _send(self.comm, b"{}", self.root, TAG_CLOSE)


# -- coordinator side (rank 0) ------------------------------------------------------------------
class MPIServer:
    """Rank 0: answers joins and guidance requests, starts rounds when the sites ask for them."""

    def __init__(self, coordinator: Coordinator, comm: Any = None) -> None:
        self.coordinator = coordinator
        self.comm = _comm(comm)
        self.rank_of: dict[str, int] = {}
        self.closed: set[int] = set()
        self.queue: list[tuple[bytes, int, int]] = []  # messages that arrived during an exchange
        self.gate = RoundGate(coordinator)  # who waits for the next round, and may it start
        self.seq = 0
        self.n_ranks = self.comm.Get_size() - 1
        self.outbox = _Outbox(self.comm)

    def serve(self) -> None:
        """Until every site rank has closed its link."""
        from mpi4py import MPI

        while len(self.closed) < self.n_ranks:
            if self.queue:
                msg = self.queue.pop(0)
            else:
                try:  # with sites waiting, wake up now and then: a deadline may start the round
                    msg = _recv(self.comm, MPI.ANY_SOURCE, MPI.ANY_TAG, timeout=0.05 if self.gate.wants else None)
                except TimeoutError:
                    self.start_round()
                    continue
            self.dispatch(*msg)
            self.start_round()

    def dispatch(self, text: bytes, src: int, tag: int) -> None:
        if tag == TAG_JOIN:
            try:
                request = parse(text)
                if not isinstance(request, JoinRequest):
                    raise FederationError(f"expected a join request, got {request.kind!r}")
                reply = self.coordinator.join(request).to_wire()
                self.rank_of[request.site] = src
                self.closed.discard(src)
            except Exception as exc:
                reply = _error(exc)
            _send(self.comm, reply, src, TAG_JOIN_REPLY)
        elif tag == TAG_GUIDANCE:
            t = int(json.loads(text)["round"])
            site = next((s for s, r in self.rank_of.items() if r == src), None)
            try:
                if site is None:
                    raise FederationError(f"rank {src} asked for guidance before joining")
                self.coordinator.check_round(site, t)
                if t > self.coordinator.last_round:  # the next round: it starts when the sites are there
                    self.gate.ask(site, t)
                    return
                body = self.coordinator.current_guidance(site).to_wire()
            except Exception as exc:
                body = _error(exc)
            _send(self.comm, body, src, TAG_REPLY)
        elif tag == TAG_CLOSE:
            self.closed.add(src)
        # a response outside an exchange is a straggler's late answer: dropped

    def start_round(self) -> None:
        """Run the next round if the coordinator says it may start, and send its guidance."""
        opened = self.gate.open({s for s, r in self.rank_of.items() if r not in self.closed})
        if opened is None:
            return
        t, wanting = opened
        try:
            replies = self.coordinator.run_round(t, self.gather, sorted(wanting))
            bodies = {s: replies[s].to_wire() for s in wanting}
        except Exception as exc:  # every participant's ask() hears why
            bodies = {s: _error(exc) for s in wanting}
        self.gate.started(t)
        for s in wanting:
            _send(self.comm, bodies[s], self.rank_of[s], TAG_REPLY)

    def gather(self, requests: Mapping[str, Message], quorum: int,
               deadline: float | None) -> dict[str, Message | BaseException]:
        from mpi4py import MPI

        self.seq += 1
        out: dict[str, Message | BaseException] = {}
        waiting: dict[int, str] = {}
        for site, request in requests.items():
            rank = self.rank_of.get(site)
            if rank is None or rank in self.closed:
                out[site] = FederationError(f"site {site!r} is not connected")
                continue
            self.outbox.send(_envelope(self.seq, request.to_wire()), rank, TAG_REQUEST)
            waiting[rank] = site
        start = time.monotonic()
        while waiting:
            n_ok = sum(isinstance(m, Message) for m in out.values())
            if deadline is not None and n_ok >= quorum and time.monotonic() - start > deadline:
                break
            try:
                text, src, tag = _recv(self.comm, MPI.ANY_SOURCE, MPI.ANY_TAG, timeout=0.05)
            except TimeoutError:
                continue
            if tag == TAG_RESPONSE:
                seq, body = _open(text)
                if seq != self.seq or src not in waiting:
                    continue  # a late answer to an exchange that closed without it
                site = waiting.pop(src)
                try:
                    out[site] = parse(_raise_if_error(body))
                except Exception as exc:
                    out[site] = exc
            elif tag == TAG_CLOSE:
                self.closed.add(src)
                if src in waiting:
                    out[waiting.pop(src)] = FederationError(f"rank {src} left during the exchange")
            else:
                self.queue.append((text, src, tag))
        for site in waiting.values():
            out[site] = TimeoutError(f"site {site!r} did not answer before the deadline")
        return out


def serve(coordinator: Coordinator, comm: Any = None) -> None:
    """Run the coordinator at this rank until every site rank has closed (usually rank 0)."""
    MPIServer(coordinator, comm).serve()


def world() -> tuple[int, int]:
    """``(rank, size)`` of ``MPI.COMM_WORLD``."""
    comm = _comm()
    return int(comm.Get_rank()), int(comm.Get_size())


__all__ = ["MPICoordinator", "MPILink", "MPIServer", "RoundError", "serve", "world"]
