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
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from labfbo import wire
from labfbo.exceptions import (ConfigurationError, ConstraintError, JournalError, LabFBOError, TrialError, ValidationError)
from labfbo.objectives import Outcome, OutcomeSpec
from labfbo.journal import JournalBackend, check_header, open_journal
from labfbo.keywords import resolve_checked
from labfbo.messages import Abstain, JoinRequest, Message, parse
from labfbo.progress import slow_notice
from labfbo.campaign_views import CampaignViews
from labfbo.privacy.budget import declaration, plan as plan_budget
from labfbo.records import (Ask, Enqueue, Fail, GuidanceReceived, Header, Historical, Join, Note, Released, Tell,
                            Traffic, dump_record, parse_record)
from labfbo.protocols import ConfiguredProtocol, SiteContext, SiteData, get_protocol, shared_of
from labfbo.seeding import rng, stable_hash
from labfbo.site import (SiteLedger, build_site_data, dedupe, design_rows, history_record, round_target,
                         study_design)
from labfbo.site_state import SiteState
from labfbo.space import SearchSpace
from labfbo.transport import connect
from labfbo.trial import Observation, Trial, TrialRecord, metadata_record, parse_value

# Model computations (GP fits, acquisition optimization) of every site in this process run one at
# a time: torch's RNG and Python's warning filters are process-global, and a transport thread
# answering the coordinator must not interleave with a lab script's proposal.
_COMPUTE = threading.RLock()

MAX_MODEL_BATCH = 64
"""The most points one ``ask(n)`` proposes from the model (a joint batch costs superlinearly in n)."""
TRAFFIC_BATCH = 256  # messages that may wait before their `traffic` record is written


class Optimizer(CampaignViews):
    """Ask/tell Bayesian optimization for one site, alone or in a federation.

    Args:
        space: the search space.
        objective: ``"minimize"`` or ``"maximize"`` (one unnamed value), a
            :class:`labfbo.Objective`, or a list of them (several objectives: ``best`` refers to
            the first; :meth:`pareto_front` gives the trade-off).
        outcome_constraints: :class:`labfbo.Outcome` constraints on measured outcomes; ``best`` is
            the best feasible observation. With named objectives or outcome constraints ``tell``
            takes a dict with every outcome.
        protocol: ``"independent"`` (default, no coordinator), a federated protocol's name, or a
            configured protocol such as ``labfbo.protocols.Distribution(privacy=labfbo.DP())``.
        coordinator: a :class:`labfbo.Coordinator` (in-process), an ``"https://..."`` URL of a
            coordinator server (with ``token=``), or a transport's connector such as
            :class:`labfbo.transport.mpi.MPICoordinator`.
        site: this site's name in the federation.
        seed: the study seed.
        storage: path of an append-only journal, or a journal backend object (``append``,
            ``records``, ``close``); an existing one is resumed.
        n_init: initial-design size (historical observations count towards it);
            default ``max(5, 2 d)``.
        horizon: planned number of BO rounds (schedules use it).
        secret: the site-private seed of draws the coordinator must not predict (DP noise).
            Default: drawn from the OS once and kept in the journal (``storage=``), so a
            resumed site continues the same stream. Fix it only for reproducible simulations.
        token: this site's bearer token for an HTTP coordinator.
        approve: called with every message before it leaves the site; returning False
            sends an ``Abstain`` instead (an operator's review of outgoing messages).
        **protocol_options: the protocol's options, e.g. ``acquisition="ei"`` (with a protocol name).
    """

    def __init__(self, space: SearchSpace, objective: Any = "minimize",
                 protocol: str | ConfiguredProtocol = "independent", coordinator: Any = None, site: str | None = None,
                 seed: int = 0, storage: str | os.PathLike[str] | JournalBackend | None = None,
                 n_init: int | None = None,
                 horizon: int | None = None, secret: int | None = None, token: str | None = None,
                 approve: Callable[[Message], bool] | None = None,
                 outcome_constraints: Sequence[Outcome] | None = None, **protocol_options: Any) -> None:
        if not isinstance(space, SearchSpace):
            raise ConfigurationError("space must be a labfbo.SearchSpace")
        if isinstance(objective, str) and objective not in ("minimize", "maximize"):
            raise ConfigurationError(f"objective must be 'minimize' or 'maximize', got {objective!r}")
        self.outcomes = OutcomeSpec.build(objective, outcome_constraints)
        objective = self.outcomes.direction if self.outcomes is not None else objective
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigurationError(f"seed must be a non-negative integer, got {seed!r}")
        if n_init is not None and n_init < 0:
            raise ConfigurationError("n_init must be >= 0")
        self.space = space
        self.objective = objective
        self.protocol, self.options = resolve_checked(Optimizer.__init__, protocol, protocol_options)
        self.protocol_cls = get_protocol(self.protocol)
        self.protocol_cls.check_space(space)
        if self.outcomes is not None and getattr(self.options, "acquisition", "nei") not in ("nei", "ei"):
            raise ConfigurationError(f"named outcomes (outcome constraints, several objectives) need a log-"
                                     f"acquisition, 'nei' (the default) or 'ei'; got {self.options.acquisition!r}")
        self.seed = int(seed)
        self.site = site or "site-0"
        self.n_init = max(5, 2 * space.dim) if n_init is None else int(n_init)
        self.horizon = horizon
        self._to_max = 1.0 if objective == "maximize" else -1.0  # user value x this = the maximized model target
        self._state = SiteState(space, self.protocol_cls.federated)
        self._data_cache: SiteData | None = None
        self._own_design: np.ndarray | None = None
        self.ledger = SiteLedger()
        self._lock = threading.RLock()  # the HTTP agent answers requests from another thread
        self._ready = threading.Event()  # set once the protocol logic is built and resumed
        self._approve = approve
        self._link = connect(coordinator, self.site, self.protocol_cls.federated, self.protocol, token)
        existed = isinstance(storage, (str, os.PathLike)) and os.path.exists(storage)
        self._journal: JournalBackend = open_journal(storage)
        raw = list(self._journal.records())
        self._secret = secrets.randbits(63) if secret is None else int(secret)
        self._key_seed = secrets.token_bytes(32)  # secure-aggregation key material, never derived from a seed
        self._header = Header(secret=self._secret, key_seed=self._key_seed.hex(), space_hash=space.fingerprint(),
                              space=space.model_dump(mode="json"), objective=objective, protocol=self.protocol,
                              seed=self.seed, site=self.site, n_init=self.n_init,
                              options=self.options.model_dump(mode="json"),
                              outcomes=None if self.outcomes is None else self.outcomes.model_dump(mode="json"))
        self._unwritten: Header | None = None  # a new journal's header: written with its first record
        try:
            if raw:
                head = parse_record(raw[0], self._where(0))
                if not isinstance(head, Header):
                    raise JournalError(f"{self._where(0)}: the journal does not start with a header record")
                check_header(head, self._header)
                if secret is not None and head.secret not in (None, secret):
                    raise JournalError("secret= differs from the one in the journal")
                self._secret = self._secret if head.secret is None else head.secret
                self._key_seed = self._key_seed if head.key_seed is None else bytes.fromhex(head.key_seed)
                self._header = self._header.model_copy(update={"secret": self._secret,
                                                               "key_seed": self._key_seed.hex()})
            else:
                self._unwritten = self._header  # a refused join leaves a new journal empty
            self._replay(raw[1:], lambda i: self._where(i + 1))
            self._join()
            self._write_header()
        except BaseException:
            # refused (e.g. by the coordinator): leave the storage as it was
            self._ready.set()  # a transport that got our handler: it now fails at once (_handle)
            self._journal.close()
            if isinstance(storage, (str, os.PathLike)) and not raw:
                if existed:
                    os.truncate(storage, 0)
                else:
                    os.unlink(storage)
            raise

    @property
    def state(self) -> SiteState:
        """The site's state: the fold of its journal (read it, never modify it)."""
        return self._state

    def _where(self, index: int) -> str:
        where = getattr(self._journal, "where", None)
        return where(index) if where is not None else f"journal record {index + 1}"

    # -- construction helpers ------------------------------------------------------------
    def _join(self) -> None:
        # a site on its own seeds its streams by its name, so two labs with seed=0 differ
        ctx_index, n_sites = stable_hash(self.site) % 2**31, 1
        if self._link is not None:
            req = JoinRequest(site=self.site, protocol=self.protocol, study="",
                              space_hash=self.space.fingerprint(), space=self.space.model_dump(mode="json"),
                              n_init=self.n_init, local_constraints=[g.name for g in self.space.local_constraints],
                              privacy=declaration(getattr(self.options, "privacy", None), self.horizon),
                              shared_options=shared_of(self.protocol_cls, self.options))
            self.ledger.record_sent(req)
            reply = self._link.join(req, self._handle)
            self.ledger.record_received(reply)
            st = self._state
            if st.join_reply is None:
                self._commit(Join(reply=reply.model_dump(mode="json")))
            elif reply.site_index != st.join_reply.site_index:
                raise JournalError(f"the coordinator now gives {self.site!r} index {reply.site_index}, "
                                   f"the journal has {st.join_reply.site_index}")
            if self.protocol_cls.federated and st.clock.rebase(reply.clock):
                warnings.warn(f"site {self.site!r}: the coordinator has completed {reply.clock + 1} round(s), this "
                              f"site's journal is at round {st.round}: the coordinator lost its rounds (re-created "
                              "without its state?); continuing on the coordinator's clock", stacklevel=3)
                st.round = st.clock.next_round
        if self._state.join_reply is not None:
            ctx_index, n_sites = self._state.join_reply.site_index, self._state.join_reply.n_sites
            self.horizon = self.horizon if self.horizon is not None else self._state.join_reply.horizon
        self.context = SiteContext(site=self.site, site_index=ctx_index, n_sites=n_sites, seed=self.seed,
                                   horizon=self.horizon, objective=self.objective, secret=self._secret,
                                   key_seed=self._key_seed, outcomes=self.outcomes,
                                   study_design=study_design(self.space, self.n_init, self._state.join_reply)
                                   if getattr(self.protocol_cls.site_logic, "uses_study_design", False) else None)
        # DP(epsilon=...): the noise calibrated to the campaign's planned releases, and its enforcer
        logic_options, self._budget = plan_budget(self.protocol_cls.site_logic, self.space, self.options,
                                                  self.context, self.horizon)
        logic = self.protocol_cls.site_logic(self.space, logic_options, self.context)
        logic.resume(self._journaled_releases(logic))  # what it sent before a restart
        self._logic = logic
        self._ready.set()  # the transport may now hand it requests (_handle)

    # -- journal ---------------------------------------------------------------------------
    def _write_header(self) -> None:
        if self._unwritten is not None:
            self._journal.append(dump_record(self._unwritten))
            self._unwritten = None

    def _commit(self, record: Any) -> None:
        """Journal a typed record, then apply it (an exception before the append changes nothing);
        the messages that crossed the site's boundary since the last record go first."""
        with self._lock:
            self._write_header()
            # a DP release per step (gradient): its messages wait for a later record (one fsync, not two)
            busy = isinstance(record, Released) and len(self.ledger.unjournaled) < TRAFFIC_BATCH
            traffic = [] if busy else self.ledger.take()
            if traffic:
                self._journal.append(dump_record(Traffic(messages=traffic)))
                self._state.apply(Traffic(messages=traffic))
            self._journal.append(dump_record(record))
            self._data_cache = None  # every record may change the site's data or its pending points
            self._state.apply(record)

    def _replay(self, raw: Sequence[dict[str, Any]], where: Callable[[int], str]) -> None:
        """Apply journaled records; one that cannot be accounted for is a JournalError at
        ``where(i)`` (its file and line)."""
        for i, rec in enumerate(raw):
            typed = parse_record(rec, where(i))
            try:
                self._state.apply(typed, replay=True)
            except JournalError as exc:
                raise JournalError(f"{where(i)}: {exc}") from None
            except (KeyError, ValueError, TypeError, IndexError, AttributeError, LabFBOError) as exc:
                raise JournalError(f"{where(i)}: {rec.get('op')!r} record does not replay "
                                   f"({type(exc).__name__}: {exc})") from None
        self._data_cache = None

    # -- validation helpers ----------------------------------------------------------------
    def _clean(self, params: Any, strict: bool) -> dict[str, Any]:
        return self.space.validate_params(params, strict=strict)[0]

    def _record(self, trial_or_id: Trial | int, *, pending: bool = True) -> TrialRecord:
        tid = trial_or_id.id if isinstance(trial_or_id, Trial) else trial_or_id
        if isinstance(tid, (bool, np.bool_)) or not isinstance(tid, (int, np.integer)):
            raise TrialError(f"a trial id is an int or a Trial, got {type(trial_or_id).__name__}")
        rec = self._state.trials.get(int(tid))
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
        record, oob_rows = history_record(self.space, params_list, values, self.outcomes)
        if oob_rows:
            warnings.warn(f"{len(oob_rows)} historical observation(s) outside the bounds: rows "
                          f"{'; '.join(oob_rows)} — kept as given, clipped for the model", stacklevel=2)
        if record is not None:
            self._commit(Historical(**record))

    def enqueue(self, params: dict[str, Any]) -> Trial:
        """Register an experiment the scientist chose; returns it as a pending Trial."""
        clean = self._clean(params, strict=True)
        broken = self.space.violations(clean)
        if broken:
            raise ConstraintError(f"enqueued {clean} breaks {'; '.join(broken)} (an experiment already run goes in "
                                  "with add_observations)")
        x = self.space.encode([clean])[0]
        entry = {"id": self._state.next_id, "params": clean, "x": x.tolist(), "source": "enqueued",
                 "round": self._state.round}
        self._commit(Enqueue(trials=[entry]))
        return self._state.trials[entry["id"]].trial()

    def ask(self, n: int | None = None, *, timeout: float | None = None) -> Trial | list[Trial]:
        """Propose the next experiment (``n=None``) or a list of ``n`` (pending-aware)."""
        k = 1 if n is None else n
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValidationError(f"n must be a positive integer, got {n!r}")
        rows: list[tuple[np.ndarray, str]] = []
        design = self._design_rows()
        while len(rows) < k and self._state.design_used + len(rows) < len(design) and self._needs_design(len(rows)):
            rows.append((design[self._state.design_used + len(rows)], "design"))
        model_round = len(rows) < k
        if k - len(rows) > MAX_MODEL_BATCH:
            raise ValidationError(f"ask(n={k}) would propose {k - len(rows)} points from the model in one call "
                                  f"(at most {MAX_MODEL_BATCH}); ask for smaller batches")
        clock: dict[str, Any] = {}
        if model_round:
            extra = np.array([r[0] for r in rows]).reshape(-1, self.space.dim)
            X, source, clock = self._propose(k - len(rows), extra, timeout)
            rows += [(x, source) for x in X]
            if self.protocol_cls.federated and not clock:  # no data yet: random, off the clock
                clock = self._state.clock.record(None, self._state.results())
        trials = []
        for j, (x, source) in enumerate(rows):
            params = self.space.decode(x[None])[0]
            at = clock.get("guidance_round") if source.startswith("model") else None
            trials.append({"id": self._state.next_id + j, "params": params, "x": self.space.encode([params])[0].tolist(),
                           "source": source, "round": self._state.round if at is None else at})
        self._commit(Ask(trials=trials, model_round=model_round, **clock))
        out = [self._state.trials[t["id"]].trial() for t in trials]
        return out[0] if n is None else out

    def tell(self, trial_or_id: Trial | int, value: Any, metadata: dict[str, Any] | None = None) -> None:
        """Report a measurement: a float, or ``(mean, sem)`` — with named outcomes a dict of them,
        e.g. ``{"yield": 81.2, "impurity": (0.3, 0.02)}``; ``metadata`` is kept with the trial."""
        rec = self._record(trial_or_id)
        if self.outcomes is not None:
            outcomes = self.outcomes.parse(value)
            mean, sem = outcomes[self.outcomes.objectives[0].name]
            self._commit(Tell(id=rec.id, value=mean, sem=sem, outcomes=outcomes, **metadata_record(metadata)))
            return
        if isinstance(value, dict):
            raise ValidationError("tell got a dict, but this campaign measures one unnamed value; name the "
                                  "outcomes with objective=labfbo.Objective(...) to report several")
        mean, sem = parse_value(value)
        self._commit(Tell(id=rec.id, value=mean, sem=sem, **metadata_record(metadata)))

    def tell_failed(self, trial_or_id: Trial | int, reason: str = "", metadata: dict[str, Any] | None = None) -> None:
        """Mark a trial as failed (it is never proposed as pending again)."""
        rec = self._record(trial_or_id)
        if not isinstance(reason, str):
            raise ValidationError("reason must be a string")
        self._commit(Fail(id=rec.id, reason=reason, **metadata_record(metadata)))

    def annotate(self, trial_or_id: Trial | int, **metadata: Any) -> Trial:
        """Journal JSON metadata on a pending trial (e.g. an instrument's run handle); returns it updated."""
        rec = self._record(trial_or_id)
        self._commit(Note(id=rec.id, **metadata_record(metadata)))
        return rec.trial()

    @property
    def observations(self) -> tuple[Observation, ...]:
        """Completed records (historical and told), in order; failed and pending excluded."""
        return self._state.observations()

    @property
    def best(self) -> Observation | None:
        """The best completed observation (``None`` before any): with outcome constraints the best
        *feasible* one (``None`` while there is none); with several objectives, by the first."""
        obs = self.observations if self.outcomes is None else self.outcomes.feasible_only(self.observations)
        return max(obs, key=lambda o: self._to_max * o.value) if obs else None

    def pareto_front(self) -> list[Observation]:
        """The feasible observations no other feasible one dominates on every objective
        (all of them at once), in observation order."""
        if self.outcomes is None:
            return [self.best] if self.best is not None else []
        return self.outcomes.pareto_front(self.observations)

    @property
    def pending(self) -> list[Trial]:
        return [t.trial() for t in self._state.trials.values() if t.state == "pending"]

    @property
    def trials(self) -> list[Trial]:
        return [t.trial() for t in self._state.trials.values()]

    def predict(self, params_list: Sequence[dict[str, Any]]) -> Any:
        """Posterior mean and standard deviation of the objective (user units); with named outcomes
        a dict ``outcome -> (mean, std)`` from the site's own model of each."""
        X = self.space.encode([self._clean(p, strict=False) for p in params_list])
        data = self.site_data()
        if data.n == 0:
            raise LabFBOError("predict needs at least one completed observation")
        if self.outcomes is not None:
            with self._lock, _COMPUTE:
                return self._logic.predict_outcomes(data, X)
        mean, std = self._logic.predict(data, X)
        return self._to_max * mean, std

    def close(self) -> None:
        """Leave the coordinator and close the journal (the optimizer can be resumed from it later)."""
        link, self._link = self._link, None
        if link is not None:
            link.close()
        if self.ledger.unjournaled and (self._unwritten is None or self._state.position):
            self._commit(Traffic(messages=self.ledger.take()))
        self._journal.close()

    # -- internals -------------------------------------------------------------------------
    def site_data(self, extra_pending: np.ndarray | None = None, upto: int | None = None) -> SiteData:
        """The site's local data in model coordinates (as of journal position ``upto``: None, now).

        Cached until the next journal record (a gradient round reads it once per SVGD
        step); the arrays are shared, so callers must not modify them in place.
        """
        if upto is not None and upto < self._state.position:
            return build_site_data(self.space, self._to_max, self._state.hist_x, self._state.historical,
                                   list(self._state.trials.values()), self._state.hist_at, upto, spec=self.outcomes)
        cached = self._data_cache
        if cached is None:
            cached = self._data_cache = build_site_data(self.space, self._to_max, self._state.hist_x,
                                                        self._state.historical, list(self._state.trials.values()),
                                                        spec=self.outcomes)
        if extra_pending is None or not len(extra_pending):
            return cached
        return replace(cached, pending=np.vstack([cached.pending, extra_pending]))

    def _for_round(self, data: SiteData, round: int) -> SiteData:
        """Several objectives: the data with ``y`` the ParEGO target of BO round ``round``."""
        reply = self._state.join_reply  # federated: the study's seed, so every site draws the same weights
        seed = reply.study_seed if reply is not None and reply.study_seed is not None else self.seed
        return round_target(self.outcomes, data, seed, round)

    def _design_rows(self) -> np.ndarray:
        if self._own_design is None:  # drawn (or repaired to the local constraints) once
            self._own_design = design_rows(self.space, self.n_init, self.seed, self._state.join_reply,
                                           self.context.seed_for(0, "design-repair"))
        return self._own_design

    def _needs_design(self, in_batch: int) -> bool:
        enqueued = sum(t.source == "enqueued" for t in self._state.trials.values())
        return len(self._state.historical) + self._state.design_used + enqueued + in_batch < self.n_init

    def _propose(self, m: int, extra: np.ndarray, timeout: float | None) -> tuple[np.ndarray, str, dict[str, Any]]:
        """``m`` model proposals, their source, and the ask record's clock fields (federated)."""
        data = self.site_data(extra_pending=extra)
        if data.n == 0:
            gen = rng(self.seed, self.context.site_index, self._state.round, "random")
            return self.space.repair(gen.random((m, self.space.dim)), int(gen.integers(2**31))), "random", {}
        guidance, source, clock, t, uses = None, "model", {}, self._state.round, 0
        self._logic.expect(m)
        if self.protocol_cls.federated:
            held = self._state.clock.held
            guidance, source, clock = self._guidance(timeout)
            got = clock.get("guidance_round", getattr(guidance, "round", None))
            seen = self._state.guidance[-1].round if self._state.guidance else None
            if guidance is not None and guidance is not held and got is not None and seen != got:
                # new guidance (not the held round asked again after a restart): the site's report shows it
                self._commit(GuidanceReceived(round=got, kind=guidance.kind, nbytes=guidance.nbytes(),
                                              summary=guidance.summary()))
            if clock.get("guidance_round") is not None:
                t = clock["guidance_round"]
                uses = self._state.clock.uses if t == self._state.clock.guided else 0
        data = self._for_round(data, t)
        notice = slow_notice(f"{self.site}: proposing a batch of {m} from the model") if m > 1 else nullcontext()
        with self._lock, _COMPUTE, notice:
            X = np.asarray(self._logic.propose(data, guidance, m, t), dtype=np.float64)
        if X.shape != (m, self.space.dim):
            raise LabFBOError(f"protocol {self.protocol!r} proposed shape {X.shape}, expected {(m, self.space.dim)}")
        gen = rng(self.seed, self.context.site_index, t, "dedupe" if not uses else f"dedupe/{uses}")
        X = dedupe(self.space, self.space.snap(X), data.pending, gen)
        if self.space.local_constraints:  # the protocol's own points (e.g. a consensus average) meet them too
            X = self.space.repair(X, self.context.seed_for(t, "repair"), avoid=data.pending)
        return X, source, clock

    def _guidance(self, timeout: float | None) -> tuple[Message | None, str, dict[str, Any]]:
        if self._link is None:
            raise LabFBOError(f"site {self.site!r} was closed; reopen it from its journal to continue")
        st = self._state
        return st.clock.guidance(self._link, self.ledger, self.site, st.results(), st.position, timeout)

    def _handle(self, request_bytes: bytes | str) -> bytes:
        """Answer a coordinator request (a wire frame, or its JSON) from local data (called by the
        transport, maybe from its thread); the answer's frame."""
        request = parse(request_bytes)
        if not self._ready.wait(60.0) or getattr(self, "_logic", None) is None:  # still joining, or it failed
            raise LabFBOError(f"site {self.site!r} cannot answer {request.kind!r}: it has not finished joining")
        with self._lock:
            with _COMPUTE:
                self.ledger.record_received(request, len(request_bytes) if wire.is_frame(request_bytes) else None)
                # the data the site had when it asked for this round (all of it if it has not asked)
                data = self._for_round(self.site_data(upto=self._state.clock.cuts.get(request.round)), request.round)
                answer = self._logic.answer(request, data, request.round)
            answer = answer.model_copy(update={"round": request.round, "study": request.study})
            # the operator's review runs outside the process-wide compute lock
            if self._approve is not None and not self._approve(answer):
                answer = Abstain(reason="declined by the site's operator", round=request.round, study=request.study)
            release = None if isinstance(answer, Abstain) else self._logic.release(answer)
            if release is not None and self._budget is not None:  # DP(epsilon=...): never beyond it
                answer, release, held = self._budget.gate(answer, release, self.releases(), self._state.withheld,
                                                          self.site)
                if held is not None:
                    self._commit(held)
            if release is not None:
                self._commit(Released(**release.model_dump()))  # accounted before it leaves
            frame = answer.to_wire()  # encoded once: sized for the ledger, then sent
            self.ledger.record_sent(answer, len(frame))
            self._logic.sent(answer)
            if len(self.ledger.unjournaled) >= TRAFFIC_BATCH:  # a long exchange (gradient's warm-up)
                self._commit(Traffic(messages=self.ledger.take()))
        return frame

    def __repr__(self) -> str:
        return (f"Optimizer(site={self.site!r}, protocol={self.protocol!r}, objective={self.objective!r}, "
                f"observations={len(self.observations)}, pending={len(self.pending)})")
