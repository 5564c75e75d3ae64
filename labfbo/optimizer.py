"""`Optimizer`: the ask/tell facade of one site over its journal and its protocol.

Every public call validates first, then appends one journal record, then applies it to
the in-memory state — the same code path replay uses — so an exception changes nothing
and a restarted optimizer is the one that crashed. Random streams are keyed by
``(seed, site index, BO round, purpose)`` and the BO round is a replayed counter, so a
resumed optimizer proposes what the uninterrupted one would have.
"""

from __future__ import annotations

import os
import secrets
import threading
import warnings
from contextlib import nullcontext
from typing import Any, Callable, Literal, Sequence

import numpy as np

from labfbo.exceptions import (ConfigurationError, JournalError, LabFBOError, TrialError, ValidationError)
from labfbo.journal import FileJournal, MemoryJournal, check_header, write_snapshot
from labfbo.messages import Abstain, JoinReply, JoinRequest, Message, parse
from labfbo.privacy import PrivacyLedger
from labfbo.progress import slow_notice
from labfbo.privacy.report import release_record
from labfbo.privacy.report import report as privacy_report
from labfbo.protocols import SiteContext, SiteData, get_protocol, parse_options
from labfbo.seeding import campaign_id, rng, stable_hash
from labfbo.site import SiteLedger, build_site_data, dedupe, history_record, history_rows, write_csv
from labfbo.site_clock import SiteClock
from labfbo.space import SearchSpace
from labfbo.transport import connect
from labfbo.trial import Observation, Trial, TrialRecord, metadata_record, parse_value

# Model computations (GP fits, acquisition optimization) of every site in this process run one at
# a time: torch's RNG and Python's warning filters are process-global, and a transport thread
# answering the coordinator must not interleave with a lab script's proposal.
_COMPUTE = threading.RLock()

MAX_MODEL_BATCH = 64
"""The most points one ``ask(n)`` proposes from the model (a joint batch costs superlinearly in n)."""

_NOT_RELEASES = ("abstain", "secagg_public_key", "secagg_self_mask")  # nothing computed from the data


class Optimizer:
    """Ask/tell Bayesian optimization for one site, alone or in a federation.

    Args:
        space: the search space.
        objective: ``"minimize"`` or ``"maximize"``.
        protocol: ``"independent"`` (default, no coordinator) or a federated protocol.
        coordinator: a :class:`labfbo.Coordinator` (in-process), an ``"https://..."`` URL of a
            coordinator server (with ``token=``), or a transport's connector such as
            :class:`labfbo.transport.mpi.MPICoordinator`.
        site: this site's name in the federation.
        seed: the study seed.
        storage: path of an append-only journal; an existing one is resumed.
        n_init: initial-design size (historical observations count towards it);
            default ``max(5, 2 d)``.
        horizon: planned number of BO rounds (schedules use it).
        secret: the site-private seed of draws the coordinator must not predict (DP noise).
            Default: drawn from the OS once and kept in the journal (``storage=``), so a
            resumed site continues the same stream. Fix it only for reproducible simulations.
        token: this site's bearer token for an HTTP coordinator.
        approve: called with every message before it leaves the site; returning False
            sends an ``Abstain`` instead (an operator's review of outgoing messages).
        **protocol_options: the protocol's options, e.g. ``acquisition="ei"``.
    """

    def __init__(self, space: SearchSpace, objective: Literal["minimize", "maximize"] = "minimize",
                 protocol: str = "independent", coordinator: Any = None, site: str | None = None,
                 seed: int = 0, storage: str | None = None, n_init: int | None = None,
                 horizon: int | None = None, secret: int | None = None, token: str | None = None,
                 approve: Callable[[Message], bool] | None = None, **protocol_options: Any) -> None:
        if not isinstance(space, SearchSpace):
            raise ConfigurationError("space must be a labfbo.SearchSpace")
        if objective not in ("minimize", "maximize"):
            raise ConfigurationError(f"objective must be 'minimize' or 'maximize', got {objective!r}")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigurationError(f"seed must be a non-negative integer, got {seed!r}")
        if n_init is not None and n_init < 0:
            raise ConfigurationError("n_init must be >= 0")
        self.space = space
        self.objective = objective
        self.protocol_name = protocol
        self.protocol = get_protocol(protocol)
        self.protocol.check_space(space)
        self.options = parse_options(self.protocol, protocol_options)
        self.seed = int(seed)
        self.site = site or "site-0"
        self.n_init = max(5, 2 * space.dim) if n_init is None else int(n_init)
        self.horizon = horizon
        self._sign = 1.0 if objective == "maximize" else -1.0  # model targets are maximized
        self._trials: dict[int, TrialRecord] = {}
        self._historical: list[Observation] = []
        self._hist_x: list[np.ndarray] = []
        self._next_id = 0
        self._design_used = 0
        self._round = 0  # the BO round of the next proposal (federated: the clock's next round)
        self._clock = SiteClock()
        self._position = 0  # journal position of the last applied record (cuts of the site's data)
        self._hist_at: list[int] = []
        self._data_cache: SiteData | None = None
        self._own_design: np.ndarray | None = None
        self.ledger = SiteLedger()
        self._lock = threading.RLock()  # the HTTP agent answers requests from another thread
        self._approve = approve
        dp = getattr(self.options, "privacy", None)
        self._privacy = PrivacyLedger(dp, getattr(self.options, "n_particles", 1)) if dp is not None else None
        self._releases: list[dict[str, Any]] = []
        self._link = connect(coordinator, self.site, self.protocol.federated, protocol, token)
        existed = storage is not None and os.path.exists(storage)
        self._journal = MemoryJournal() if storage is None else FileJournal(storage)
        records = list(self._journal.records())
        self._secret = secrets.randbits(63) if secret is None else int(secret)
        self._key_seed = secrets.token_bytes(32)  # secure-aggregation key material, never derived from a seed
        self._header = {"op": "header", "secret": self._secret, "key_seed": self._key_seed.hex(),
                        "space_hash": space.fingerprint(),
                        "space": space.model_dump(mode="json"), "objective": objective, "protocol": protocol, "seed": self.seed, "site": self.site,
                        "n_init": self.n_init, "options": self.options.model_dump(mode="json")}
        try:
            if records:
                check_header(records[0], self._header)
                if secret is not None and records[0].get("secret") not in (None, secret):
                    raise JournalError("secret= differs from the one in the journal")
                self._secret = records[0].get("secret", self._secret)
                self._key_seed = bytes.fromhex(records[0].get("key_seed", self._key_seed.hex()))
            else:
                self._journal.append(self._header)
            self._join_reply: JoinReply | None = None
            self._replay(records[1:], lambda i: self._journal.where(i + 1))
            self._join()
        except BaseException:
            # refused (e.g. by the coordinator): leave the storage as it was
            self._journal.close()
            if storage is not None and not records:
                if existed:
                    os.truncate(storage, 0)
                else:
                    os.unlink(storage)
            raise

    # -- construction helpers ------------------------------------------------------------
    def _join(self) -> None:
        # a site on its own seeds its streams by its name, so two labs with seed=0 differ
        ctx_index, n_sites = stable_hash(self.site) % 2**31, 1
        if self._link is not None:
            req = JoinRequest(site=self.site, protocol=self.protocol_name, study="",
                              space_hash=self.space.fingerprint(), space=self.space.model_dump(mode="json"),
                              n_init=self.n_init,
                              shared_options={k: v for k, v in self.options.model_dump(mode="json").items()
                                              if k in self.protocol.shared_options})
            self.ledger.record_sent(req)
            reply = self._link.join(req, self._handle)
            self.ledger.record_received(reply)
            if self._join_reply is None:
                self._commit({"op": "join", "reply": reply.model_dump(mode="json")})
            elif reply.site_index != self._join_reply.site_index:
                raise JournalError(f"the coordinator now gives {self.site!r} index {reply.site_index}, "
                                   f"the journal has {self._join_reply.site_index}")
            if self.protocol.federated and self._clock.rebase(reply.clock):
                warnings.warn(f"site {self.site!r}: the coordinator has completed {reply.clock + 1} round(s), this "
                              f"site's journal is at round {self._round}: the coordinator lost its rounds (re-created "
                              "without its state?); continuing on the coordinator's clock", stacklevel=3)
                self._round = self._clock.next_round
        if self._join_reply is not None:
            ctx_index, n_sites = self._join_reply.site_index, self._join_reply.n_sites
            self.horizon = self.horizon if self.horizon is not None else self._join_reply.horizon
        self.context = SiteContext(site=self.site, site_index=ctx_index, n_sites=n_sites, seed=self.seed,
                                   horizon=self.horizon, objective=self.objective, secret=self._secret,
                                   key_seed=self._key_seed)
        self._logic = self.protocol.site_logic(self.space, self.options, self.context)

    # -- journal ---------------------------------------------------------------------------
    def _commit(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._journal.append(record)
            self._apply(record)

    def _replay(self, records: Sequence[dict[str, Any]], where: Callable[[int], str]) -> None:
        """Apply journaled records; one that cannot be accounted for is a JournalError at
        ``where(i)`` (its file and line)."""
        for i, rec in enumerate(records):
            try:
                self._apply(rec, replay=True)
            except JournalError as exc:
                raise JournalError(f"{where(i)}: {exc}") from None
            except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
                raise JournalError(f"{where(i)}: {rec.get('op')!r} record does not replay "
                                   f"({type(exc).__name__}: {exc})") from None

    def _apply(self, rec: dict[str, Any], replay: bool = False) -> None:
        op = rec["op"]
        self._data_cache = None  # every record may change the site's data or its pending points
        self._position += 1
        if op == "hist":
            for params, value, sem in zip(rec["params"], rec["values"], rec["sems"], strict=True):
                if replay:
                    value, sem = parse_value(value if sem is None else (value, sem))
                self._historical.append(Observation(params=params, value=value, sem=sem))
                self._hist_x.append(self.space.encode([self._clean(params, strict=False)])[0])
                self._hist_at.append(self._position)
        elif op in ("ask", "enqueue"):
            for t in rec["trials"]:
                if replay and (isinstance(t["id"], bool) or not isinstance(t["id"], int) or t["id"] in self._trials):
                    raise JournalError(f"trial id {t['id']!r} appears twice (another journal appended to this one?)")
                self._trials[t["id"]] = TrialRecord(id=t["id"], params=t["params"], x=np.asarray(t["x"]),
                                                    source=t["source"], round=t["round"],
                                                    metadata=t.get("metadata", {}), asked_at=self._position)
                self._next_id = max(self._next_id, t["id"] + 1)
                self._design_used += t["source"] == "design"
            if self.protocol.federated and op == "ask":
                self._clock.replay(rec)
                self._round = self._clock.next_round
            else:
                self._round += bool(rec.get("model_round", False))
        elif op in ("tell", "fail", "note"):
            tr = self._trials.get(rec["id"])
            if tr is None:
                raise JournalError(f"a {op!r} for trial {rec['id']!r}, which was never asked")
            if replay and tr.state != "pending":
                raise JournalError(f"a {op!r} for trial {rec['id']}, which is already {tr.state}")
            if op == "tell" and replay:
                parse_value(rec["value"] if rec.get("sem") is None else (rec["value"], rec["sem"]))
            tr.metadata.update(rec.get("metadata", {}))
            if op != "note":
                tr.finished_at = self._position
            if op == "tell":
                tr.state, tr.value, tr.sem = "complete", rec["value"], rec.get("sem")
            elif op == "fail":
                tr.state, tr.reason = "failed", rec["reason"]
        elif op == "release":
            self._releases.append(rec)
            if self._privacy is not None and rec.get("dp", True):
                self._privacy.record(rec["round"], rec.get("steps", 1))
        elif op == "join":
            self._join_reply = JoinReply.model_validate(rec["reply"])
        elif op == "header":
            raise JournalError("a second header (another journal appended to this one?)")
        else:
            raise JournalError(f"unknown journal record {op!r}")

    # -- validation helpers ----------------------------------------------------------------
    def _clean(self, params: Any, strict: bool) -> dict[str, Any]:
        return self.space.validate_params(params, strict=strict)[0]

    def _record(self, trial_or_id: Trial | int, *, pending: bool = True) -> TrialRecord:
        tid = trial_or_id.id if isinstance(trial_or_id, Trial) else trial_or_id
        if isinstance(tid, (bool, np.bool_)) or not isinstance(tid, (int, np.integer)):
            raise TrialError(f"a trial id is an int or a Trial, got {type(trial_or_id).__name__}")
        rec = self._trials.get(int(tid))
        if rec is None:
            raise TrialError(f"unknown trial id {tid}")
        if pending and rec.state != "pending":
            raise TrialError(f"trial {tid} is already {rec.state}")
        return rec

    # -- the public API --------------------------------------------------------------------
    def add_observations(self, params_list: Sequence[dict[str, Any]], values: Sequence[Any]) -> None:
        """Add historical data (the site's past experiments, S_i^(0)).

        Numeric values outside the bounds are kept as given (warning) and clipped for the
        model; any other problem raises and nothing is added.
        """
        record, oob_rows = history_record(self.space, params_list, values)
        if oob_rows:
            warnings.warn(f"{len(oob_rows)} historical observation(s) outside the bounds: rows "
                          f"{'; '.join(oob_rows)} — kept as given, clipped for the model", stacklevel=2)
        if record is not None:
            self._commit(record)

    def enqueue(self, params: dict[str, Any]) -> Trial:
        """Register an experiment the scientist chose; returns it as a pending Trial."""
        clean = self._clean(params, strict=True)
        if not self.space.is_allowed(clean):
            warnings.warn(f"enqueued {clean} is not one of the space's allowed combinations; it is run as asked",
                          stacklevel=2)
        x = self.space.encode([clean])[0]
        rec = {"id": self._next_id, "params": clean, "x": x.tolist(), "source": "enqueued", "round": self._round}
        self._commit({"op": "enqueue", "trials": [rec]})
        return self._trials[rec["id"]].trial()

    def ask(self, n: int | None = None, *, timeout: float | None = None) -> Trial | list[Trial]:
        """Propose the next experiment (``n=None``) or a list of ``n`` (pending-aware)."""
        k = 1 if n is None else n
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValidationError(f"n must be a positive integer, got {n!r}")
        rows: list[tuple[np.ndarray, str]] = []
        design = self._design_rows()
        while len(rows) < k and self._design_used + len(rows) < len(design) and self._needs_design(len(rows)):
            rows.append((design[self._design_used + len(rows)], "design"))
        model_round = len(rows) < k
        if k - len(rows) > MAX_MODEL_BATCH:
            raise ValidationError(f"ask(n={k}) would propose {k - len(rows)} points from the model in one call "
                                  f"(at most {MAX_MODEL_BATCH}); ask for smaller batches")
        clock: dict[str, Any] = {}
        if model_round:
            extra = np.array([r[0] for r in rows]).reshape(-1, self.space.dim)
            X, source, clock = self._propose(k - len(rows), extra, timeout)
            rows += [(x, source) for x in X]
            if self.protocol.federated and not clock:  # no data yet: random, off the clock
                clock = self._clock.record(None, self._results())
        trials = []
        for j, (x, source) in enumerate(rows):
            params = self.space.decode(x[None])[0]
            at = clock.get("guidance_round") if source.startswith("model") else None
            trials.append({"id": self._next_id + j, "params": params, "x": self.space.encode([params])[0].tolist(),
                           "source": source, "round": self._round if at is None else at})
        self._commit({"op": "ask", "trials": trials, "model_round": model_round, **clock})
        out = [self._trials[t["id"]].trial() for t in trials]
        return out[0] if n is None else out

    def tell(self, trial_or_id: Trial | int, value: Any, metadata: dict[str, Any] | None = None) -> None:
        """Report a measurement: a float, or ``(mean, sem)``; ``metadata`` is kept with the trial."""
        rec = self._record(trial_or_id)
        mean, sem = parse_value(value)
        self._commit({"op": "tell", "id": rec.id, "value": mean, "sem": sem, **metadata_record(metadata)})

    def tell_failed(self, trial_or_id: Trial | int, reason: str = "", metadata: dict[str, Any] | None = None) -> None:
        """Mark a trial as failed (it is never proposed as pending again)."""
        rec = self._record(trial_or_id)
        if not isinstance(reason, str):
            raise ValidationError("reason must be a string")
        self._commit({"op": "fail", "id": rec.id, "reason": reason, **metadata_record(metadata)})

    def annotate(self, trial_or_id: Trial | int, **metadata: Any) -> Trial:
        """Journal JSON metadata on a pending trial (e.g. an instrument's run handle); returns it updated."""
        rec = self._record(trial_or_id)
        self._commit({"op": "note", "id": rec.id, **metadata_record(metadata)})
        return rec.trial()

    @property
    def observations(self) -> tuple[Observation, ...]:
        """Completed records (historical and told), in order; failed and pending excluded."""
        told = [Observation(params=dict(t.params), value=t.value, sem=t.sem, trial_id=t.id, source=t.source)
                for t in self._trials.values() if t.state == "complete"]
        hist = [o.model_copy(update={"params": dict(o.params)}) for o in self._historical]  # no aliasing
        return tuple(hist) + tuple(told)

    @property
    def best(self) -> Observation | None:
        """The best completed observation (``None`` before any)."""
        obs = self.observations
        if not obs:
            return None
        return max(obs, key=lambda o: self._sign * o.value)

    @property
    def pending(self) -> list[Trial]:
        return [t.trial() for t in self._trials.values() if t.state == "pending"]

    @property
    def trials(self) -> list[Trial]:
        return [t.trial() for t in self._trials.values()]

    def predict(self, params_list: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the objective (user units)."""
        X = self.space.encode([self._clean(p, strict=False) for p in params_list])
        data = self.site_data()
        if data.n == 0:
            raise LabFBOError("predict needs at least one completed observation")
        mean, std = self._logic.predict(data, X)
        return self._sign * mean, std

    @property
    def campaign_id(self) -> str:
        """A stable id of this site's campaign (its journal): a hash of the site and its private secret."""
        return campaign_id(self.site, self._secret)

    def sent_messages(self) -> list[Message]:
        """Exactly what this site has sent across its boundary, in order."""
        return list(self.ledger.sent)

    def received_messages(self) -> list[Message]:
        """Everything this site received from the coordinator (requests and guidance), in order."""
        return list(self.ledger.received)

    def epsilon(self) -> float | None:
        """Cumulative epsilon of this site's DP releases at the configured delta (None without DP)."""
        return None if self._privacy is None else self._privacy.epsilon()

    def privacy_report(self) -> list[dict[str, Any]]:
        """Every release of data-derived information (journaled, so across restarts): round, message,
        mechanism and parameters, sensitivity, neighbouring relation, secure aggregation, and the
        cumulative (epsilon, delta) — infinite once a release carried no DP noise."""
        return privacy_report(self._releases, getattr(self.options, "privacy", None),
                              getattr(self.options, "n_particles", 1), self.space.dim)

    def to_dataframe(self) -> Any:
        """The history as a pandas DataFrame (needs ``labfbo[dataframe]``)."""
        import pandas as pd

        return pd.DataFrame(history_rows(self))

    def to_csv(self, path: str) -> None:
        """Export the history (historical, told, failed and pending trials) as CSV."""
        write_csv(path, history_rows(self))

    def save(self, path: str) -> None:
        """Write a snapshot (a complete journal) that :meth:`load` restores."""
        write_snapshot(path, list(self._journal.records()))

    @classmethod
    def load(cls, path: str, coordinator: Any = None, storage: str | None = None, **options: Any) -> "Optimizer":
        """Restore an optimizer from :meth:`save` (``storage`` journals what follows)."""
        from labfbo.snapshot import load_snapshot

        return load_snapshot(cls, path, coordinator, storage, options)

    def close(self) -> None:
        """Leave the coordinator and close the journal (the optimizer can be resumed from it later)."""
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self._journal.close()

    def __enter__(self) -> "Optimizer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------
    def site_data(self, extra_pending: np.ndarray | None = None, upto: int | None = None) -> SiteData:
        """The site's local data in model coordinates (as of journal position ``upto``: None, now).

        Cached until the next journal record (a gradient round reads it once per SVGD
        step); the arrays are shared, so callers must not modify them in place.
        """
        if upto is not None and upto < self._position:
            return build_site_data(self.space, self._sign, self._hist_x, self._historical,
                                   list(self._trials.values()), self._hist_at, upto)
        cached = self._data_cache
        if cached is None:
            cached = self._data_cache = self._build_site_data()
        if extra_pending is None or not len(extra_pending):
            return cached
        return SiteData(space=cached.space, X=cached.X, y=cached.y, yvar=cached.yvar,
                        pending=np.vstack([cached.pending, extra_pending]), failed=cached.failed)

    def _build_site_data(self) -> SiteData:
        return build_site_data(self.space, self._sign, self._hist_x, self._historical, list(self._trials.values()))

    def _design_rows(self) -> np.ndarray:
        if self._join_reply is not None:
            return self._join_reply.design.numpy().reshape(-1, self.space.dim)
        if self._own_design is None:  # drawn once: a function of (seed, n_init)
            from scipy.stats import qmc

            gen = rng(self.seed, 0, 0, "design")
            self._own_design = (self.space.design(qmc.LatinHypercube(self.space.dim, scramble=True, seed=gen)
                                                  .random(self.n_init), int(gen.integers(2**31))) if self.n_init
                                else np.zeros((0, self.space.dim)))
        return self._own_design

    def _needs_design(self, in_batch: int) -> bool:
        enqueued = sum(t.source == "enqueued" for t in self._trials.values())
        return len(self._historical) + self._design_used + enqueued + in_batch < self.n_init

    def _results(self) -> int:
        """Results the site has: historical, told and failed (what makes a new round worth asking)."""
        return len(self._historical) + sum(t.state != "pending" for t in self._trials.values())

    def _propose(self, m: int, extra: np.ndarray, timeout: float | None) -> tuple[np.ndarray, str, dict[str, Any]]:
        """``m`` model proposals, their source, and the ask record's clock fields (federated)."""
        data = self.site_data(extra_pending=extra)
        if data.n == 0:
            gen = rng(self.seed, self.context.site_index, self._round, "random")
            return self.space.snap(gen.random((m, self.space.dim))), "random", {}
        guidance, source, clock, t, uses = None, "model", {}, self._round, 0
        self._logic.expect(m)
        if self.protocol.federated:
            guidance, source, clock = self._guidance(timeout)
            if clock.get("guidance_round") is not None:
                t = clock["guidance_round"]
                uses = self._clock.uses if t == self._clock.guided else 0
        notice = slow_notice(f"{self.site}: proposing a batch of {m} from the model") if m > 1 else nullcontext()
        with self._lock, _COMPUTE, notice:
            X = np.asarray(self._logic.propose(data, guidance, m, t), dtype=np.float64)
        if X.shape != (m, self.space.dim):
            raise LabFBOError(f"protocol {self.protocol_name!r} proposed shape {X.shape}, expected {(m, self.space.dim)}")
        gen = rng(self.seed, self.context.site_index, t, "dedupe" if not uses else f"dedupe/{uses}")
        return dedupe(self.space, self.space.snap(X), data.pending, gen), source, clock

    def _guidance(self, timeout: float | None) -> tuple[Message | None, str, dict[str, Any]]:
        if self._link is None:
            raise LabFBOError(f"site {self.site!r} was closed; reopen it from its journal to continue")
        return self._clock.guidance(self._link, self.ledger, self.site, self._results(), self._position, timeout)

    def _handle(self, request_json: str) -> str:
        """Answer a coordinator request from local data (called by the transport, maybe from its thread)."""
        request = parse(request_json)
        with self._lock:
            with _COMPUTE:
                self.ledger.record_received(request)
                # the data the site had when it asked for this round (all of it if it has not asked)
                data = self.site_data(upto=self._clock.cuts.get(request.round))
                answer = self._logic.answer(request, data, request.round)
            answer = answer.model_copy(update={"round": request.round, "study": request.study})
            # the operator's review runs outside the process-wide compute lock
            if self._approve is not None and not self._approve(answer):
                answer = Abstain(reason="declined by the site's operator", round=request.round, study=request.study)
            if answer.kind not in _NOT_RELEASES:
                self._commit(release_record(answer))  # accounted before it leaves
            self.ledger.record_sent(answer)
        return answer.model_dump_json()

    def __repr__(self) -> str:
        return (f"Optimizer(site={self.site!r}, protocol={self.protocol_name!r}, objective={self.objective!r}, "
                f"observations={len(self.observations)}, pending={len(self.pending)})")
