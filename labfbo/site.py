"""Site-side bookkeeping: what crossed the site's boundary, and history export."""

from __future__ import annotations

import csv
import json
import threading
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from labfbo.exceptions import LabFBOError, ValidationError
from labfbo.messages import Message
from labfbo.protocols.base import SiteData
from labfbo.records import MessageEntry
from labfbo.trial import parse_value

if TYPE_CHECKING:
    from labfbo.optimizer import Optimizer
    from labfbo.objectives import OutcomeSpec
    from labfbo.space import SearchSpace
    from labfbo.trial import Observation, TrialRecord


class SiteLedger:
    """Every message a site sent and received (in order) and the bytes up/down per BO round.

    Setup messages (join) are listed under round ``-1``. Each message's direction, kind,
    round and size also wait in :attr:`unjournaled` until the optimizer journals them (a
    ``traffic`` record, :meth:`take`).
    """

    def __init__(self, log_path: str | None = None) -> None:
        self.sent: list[Message] = []
        self.received: list[Message] = []
        self.bytes_up: dict[int, int] = defaultdict(int)
        self.bytes_down: dict[int, int] = defaultdict(int)
        self.log_path = log_path
        self.unjournaled: list[MessageEntry] = []
        self._guard = threading.Lock()  # an HTTP site answers requests from its agent's thread

    def record_sent(self, msg: Message, nbytes: int | None = None) -> int:
        """Record an outgoing message (``nbytes``: its frame's size, if the caller has the frame); its size."""
        self.sent.append(msg)
        n = msg.nbytes() if nbytes is None else nbytes
        self.bytes_up[msg.round] += n
        with self._guard:
            self.unjournaled.append(MessageEntry(direction="sent", kind=msg.kind, round=msg.round, nbytes=n))
        if self.log_path:
            with open(self.log_path, "a") as fh:
                fh.write(msg.model_dump_json() + "\n")
        return n

    def record_received(self, msg: Message, nbytes: int | None = None) -> int:
        """Record an incoming message (``nbytes``: as :meth:`record_sent`); its size in bytes."""
        self.received.append(msg)
        n = msg.nbytes() if nbytes is None else nbytes
        self.bytes_down[msg.round] += n
        with self._guard:
            self.unjournaled.append(MessageEntry(direction="received", kind=msg.kind, round=msg.round, nbytes=n))
        return n

    def take(self) -> list[MessageEntry]:
        """The entries not journaled yet (and forget them)."""
        with self._guard:
            out, self.unjournaled = self.unjournaled, []
        return out

    def round_bytes(self, round: int) -> tuple[int, int]:
        return self.bytes_up.get(round, 0), self.bytes_down.get(round, 0)


_BOOK_KEEPING = ("trial_id", "source", "state", "value", "sem", "reason")


def _param_columns(params: dict[str, Any]) -> dict[str, Any]:
    """Params as columns; a name that clashes with a bookkeeping column gets ``params_``."""
    return {(f"params_{k}" if k in _BOOK_KEEPING else k): v for k, v in params.items()}


def history_rows(opt: "Optimizer") -> list[dict[str, Any]]:
    """One row per historical observation and per trial (any state), params flattened."""
    rows: list[dict[str, Any]] = []
    names = opt.outcomes.names if opt.outcomes is not None else []

    taken = set(opt.space.names) | set(_BOOK_KEEPING)

    def columns(means: dict[str, float] | None) -> dict[str, Any]:  # a column per named outcome
        return {(f"outcome_{n}" if n in taken else n): None if means is None else means.get(n) for n in names}

    for o in opt.state.historical:
        rows.append({"trial_id": None, "source": "historical", "state": "complete", **_param_columns(o.params),
                     "value": o.value, "sem": o.sem, **columns(o.outcomes), "reason": None})
    for t in opt.state.trials.values():
        means = None if t.outcomes is None else {k: v[0] for k, v in t.outcomes.items()}
        rows.append({"trial_id": t.id, "source": t.source, "state": t.state, **_param_columns(t.params),
                     "value": t.value, "sem": t.sem, **columns(means), "reason": t.reason})
    return rows


def write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    fields = ["trial_id", "source", "state"]
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()})


def build_site_data(space: "SearchSpace", sign: float, hist_x: list[np.ndarray], historical: list["Observation"],
                    trials: list["TrialRecord"], hist_at: list[int] | None = None,
                    upto: int | None = None, spec: "OutcomeSpec | None" = None) -> SiteData:
    """A site's data in model coordinates: historical then completed trials (``sign`` makes every
    objective a maximization), their variances when every one has a standard error, and the
    pending points — as of journal position ``upto`` (None: now; ``hist_at`` gives the
    historical observations' positions)."""
    if upto is not None:
        keep = [p <= upto for p in (hist_at or [0] * len(historical))]
        hist_x = [x for x, k in zip(hist_x, keep) if k]
        historical = [o for o, k in zip(historical, keep) if k]
        trials = [t for t in trials if t.asked_at <= upto]
    states = [t.state_at(upto) for t in trials]
    done = [t for t, s in zip(trials, states) if s == "complete"]
    X = np.array(hist_x + [t.x for t in done]).reshape(-1, space.dim)
    values = [o.value for o in historical] + [t.value for t in done]
    sems = [o.sem for o in historical] + [t.sem for t in done]
    y = sign * np.asarray(values, dtype=np.float64)
    yvar = None if not sems or any(s is None for s in sems) else np.square(np.asarray(sems, dtype=np.float64))
    pending = np.array([t.x for t, s in zip(trials, states) if s == "pending"]).reshape(-1, space.dim)
    failed = np.array([t.x for t, s in zip(trials, states) if s == "failed"]).reshape(-1, space.dim)
    Y = Yvar = None
    if spec is not None:
        rows = [o.outcomes for o in historical] + [{k: v[0] for k, v in (t.outcomes or {}).items()} for t in done]
        Y = spec.outcome_matrix(rows)  # type: ignore[arg-type]
        sem_rows = [o.outcome_sems or {} for o in historical] + [{k: v[1] for k, v in (t.outcomes or {}).items()}
                                                                 for t in done]
        Yvar = spec.variance_matrix(sem_rows)
    return SiteData(space=space, X=X, y=y, yvar=yvar, pending=pending, failed=failed, Y=Y, Yvar=Yvar)


def dedupe(space: "SearchSpace", X: np.ndarray, pending: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """Replace proposals that repeat a pending point (or each other) by random points from ``gen``."""
    taken = [p for p in pending]
    for i in range(len(X)):
        for _ in range(100):
            if not any(np.max(np.abs(X[i] - p)) < 1e-9 for p in taken):
                break
            X[i] = space.snap(gen.random((1, space.dim)))[0]
        taken.append(X[i])
    return X


def history_record(space: "SearchSpace", params_list: Any, values: Any,
                   spec: "OutcomeSpec | None" = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The journal record of historical observations (None if there are none) and the rows
    outside the bounds (kept as given; the model clips them). Anything else invalid raises.
    With ``spec`` each value is a dict of every outcome (the record's value: the first objective)."""
    if isinstance(params_list, dict) or len(params_list) != len(values):
        raise ValidationError("add_observations needs a list of params dicts and a list of values of the same length")
    clean, sems, vals, oob_rows, outcomes = [], [], [], [], []
    for i, (params, value) in enumerate(zip(params_list, values)):
        try:
            c, oob = space.validate_params(params, strict=False)
            if spec is not None:
                outcomes.append(spec.parse(value))
                v, s = outcomes[-1][spec.objectives[0].name]
            else:
                v, s = parse_value(value)
        except LabFBOError as exc:
            raise type(exc)(f"observation {i}: {exc}") from None
        if oob:
            oob_rows.append(f"{i} ({', '.join(oob)})")
        plain = {k: params[k].item() if isinstance(params[k], np.generic) else params[k] for k in oob}
        clean.append({k: plain[k] if k in oob else c[k] for k in space.names})
        vals.append(v)
        sems.append(s)
    record = {"op": "hist", "params": clean, "values": vals, "sems": sems}
    if spec is not None:
        record["outcomes"] = outcomes
    return (record if clean else None), oob_rows


def collaborative_design(space: "SearchSpace", n_sites: int, n_init: int, seed: int) -> np.ndarray:
    """``(n_sites, n_init, d)``: one scrambled LHS of ``n_sites * n_init`` points, dealt to sites.

    Site ``i`` receives rows ``perm[i*n_init:(i+1)*n_init]`` of a seeded random
    permutation, so each site's cells are spread over the whole space.
    """
    if n_init <= 0:
        return np.zeros((n_sites, 0, space.dim))
    from scipy.stats import qmc

    from labfbo.seeding import rng

    gen = rng(seed, 0, 0, f"collaborative-lhs/{n_sites}/{n_init}")
    pts = qmc.LatinHypercube(space.dim, scramble=True, seed=gen).random(n_sites * n_init)
    pts = space.design(pts[gen.permutation(n_sites * n_init)], int(gen.integers(2**31)))
    return pts.reshape(n_sites, n_init, space.dim)


def study_design(space: "SearchSpace", n_init: int, join_reply: Any) -> np.ndarray | None:
    """The whole collaborative design of the study a site joined, as the coordinator dealt it to
    sites with this site's ``n_init`` (``(n_sites, n_init, d)``; public: a function of the study's
    seed), or None when it cannot be known: no federation, no design, or a coordinator that does
    not say its seed or dealt this site other rows."""
    if join_reply is None or join_reply.study_seed is None or n_init <= 0:
        return None
    from labfbo.space import SearchSpace

    shared = SearchSpace.model_validate(space.model_dump(mode="json"))  # as the coordinator holds it: no local constraints
    full = collaborative_design(shared, join_reply.n_sites, n_init, join_reply.study_seed)
    mine = join_reply.design.numpy().reshape(-1, space.dim)
    if mine.shape != full[join_reply.site_index].shape or not np.allclose(mine, full[join_reply.site_index]):
        return None
    return full


def design_rows(space: "SearchSpace", n_init: int, seed: int, join_reply: Any, repair_seed: int) -> np.ndarray:
    """The site's initial design in model coordinates: the coordinator's (repaired to the site's
    own constraints with ``repair_seed``) when it joined a federation, else a scrambled Latin
    hypercube of ``n_init`` points drawn from ``(seed, 0, 0, "design")``."""
    if join_reply is not None:
        rows = join_reply.design.numpy().reshape(-1, space.dim)
        return space.repair(rows, repair_seed) if space.local_constraints else rows
    if not n_init:
        return np.zeros((0, space.dim))
    from scipy.stats import qmc

    from labfbo.seeding import rng

    gen = rng(seed, 0, 0, "design")
    return space.design(qmc.LatinHypercube(space.dim, scramble=True, seed=gen).random(n_init),
                        int(gen.integers(2**31)))


def round_target(outcomes: "OutcomeSpec | None", data: SiteData, seed: int, round: int) -> SiteData:
    """Several objectives: ``data`` with ``y`` the ParEGO (Chebyshev) target of BO round ``round``
    (:meth:`labfbo.objectives.OutcomeSpec.chebyshev`, weights drawn from ``seed``); else ``data``."""
    if outcomes is None or not outcomes.multi or data.Y is None or not data.n:
        return data
    return replace(data, y=outcomes.chebyshev(data.Y[:, :len(outcomes.objectives)], seed, round), yvar=None)
