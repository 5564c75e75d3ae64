"""`Optimizer`: the ask/tell facade of one site over its journal and its protocol.

Every public call validates first, then appends one journal record, then applies it to
the in-memory state — the same code path replay uses — so an exception changes nothing
and a restarted optimizer is the one that crashed. Random streams are keyed by
``(seed, site index, BO round, purpose)`` and the BO round is a replayed counter, so a
resumed optimizer proposes what the uninterrupted one would have.

The work is done beside it, in :mod:`labfbo.site`: the journal (:class:`~labfbo.site.store.SiteStore`),
the federation (:class:`~labfbo.site.agent.SiteAgent`), the state and the data.
"""

from __future__ import annotations

import os
import secrets
import warnings
from contextlib import nullcontext
from typing import Any, Callable, Sequence

import numpy as np

from labfbo.core.exceptions import ConfigurationError, ConstraintError, LabFBOError, TrialError, ValidationError
from labfbo.core.journal import JournalBackend
from labfbo.core.messages import Message
from labfbo.core.objectives import Outcome, OutcomeSpec
from labfbo.core.progress import slow_notice
from labfbo.core.records import Ask, Enqueue, Fail, GuidanceReceived, Header, Historical, Note, Retract, Tell
from labfbo.core.release import Release
from labfbo.core.seeding import campaign_id, rng
from labfbo.core.trial import Observation, Trial, TrialRecord, metadata_record, parse_value
from labfbo.models.outcomes import pareto_front
from labfbo.privacy.report import cumulative_epsilon, report as privacy_report
from labfbo.protocols import Protocol, SiteContext, SiteData
from labfbo.protocols.keywords import configure_checked
from labfbo.site.agent import SiteAgent, SiteSetup, Wrapper
from labfbo.site.compute import COMPUTE
from labfbo.site.data import LocalData, dedupe, history_record
from labfbo.site.ledger import SiteLedger
from labfbo.site.state import SiteState
from labfbo.site.store import SiteStore, read_snapshot
from labfbo.site.views import budget_summary, history_rows, write_csv
from labfbo.space.design import design_rows
from labfbo.space.search import SearchSpace
from labfbo.transport import connect

MAX_MODEL_BATCH = 64
"""The most points one ``ask(n)`` proposes from the model (a joint batch costs superlinearly in n)."""


class Optimizer:
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
        verify: how an ``https://`` coordinator's certificate is checked: ``True`` (the system's CAs),
            the path of a CA bundle (the consortium's own CA), or ``False`` (no check: tests only).
        approve: called with every message before it leaves the site; returning False
            sends an ``Abstain`` instead (an operator's review of outgoing messages).
        wrappers: extra wrappers of the site's answers to the coordinator, each
            ``wrapper(request, call_next) -> Outgoing`` (:mod:`labfbo.site.agent`), e.g. to log them.
        **protocol_options: the protocol's options, e.g. ``acquisition="ei"`` (with a protocol name).
    """

    def __init__(self, space: SearchSpace, objective: Any = "minimize",
                 protocol: str | Protocol = "independent", coordinator: Any = None, site: str | None = None,
                 seed: int = 0, storage: str | os.PathLike[str] | JournalBackend | None = None,
                 n_init: int | None = None,
                 horizon: int | None = None, secret: int | None = None, token: str | None = None,
                 verify: bool | str | os.PathLike[str] = True,
                 approve: Callable[[Message], bool] | None = None,
                 outcome_constraints: Sequence[Outcome] | None = None, wrappers: Sequence[Wrapper] = (),
                 **protocol_options: Any) -> None:
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
        if isinstance(storage, (str, os.PathLike)) and os.path.isdir(storage):
            raise ConfigurationError(f"storage={os.fspath(storage)!r} is a directory; give the path of the journal "
                                     f"file, e.g. {os.path.join(os.fspath(storage), 'site.jsonl')!r}")
        self.space = space
        self.objective = objective
        self.configured = configure_checked(Optimizer.__init__, protocol, protocol_options)
        self.protocol, self.options = self.configured.name, self.configured.options
        self.protocol_cls = type(self.configured)
        self.protocol_cls.check_space(space)
        if self.outcomes is not None and self.configured.acquisition not in (None, "nei", "ei"):
            raise ConfigurationError(f"named outcomes (outcome constraints, several objectives) need a log-"
                                     f"acquisition, 'ei' (the default) or 'nei'; got {self.options.acquisition!r}")
        self.seed = int(seed)
        self.site = site or "site-0"
        self.n_init = max(5, 2 * space.dim) if n_init is None else int(n_init)
        self._to_max = 1.0 if objective == "maximize" else -1.0  # user value x this = the maximized model target
        self._own_design: np.ndarray | None = None
        self.ledger = SiteLedger()
        key_seed = secrets.token_bytes(32)  # secure-aggregation key material, never derived from a seed
        header = Header(secret=secrets.randbits(63) if secret is None else int(secret), key_seed=key_seed.hex(),
                        space_hash=space.fingerprint(), space=space.model_dump(mode="json"), objective=objective,
                        protocol=self.protocol, seed=self.seed, site=self.site, n_init=self.n_init,
                        options=self.options.model_dump(mode="json"),
                        outcomes=None if self.outcomes is None else self.outcomes.model_dump(mode="json"))
        link = connect(coordinator, self.site, self.protocol_cls.federated, self.protocol, token, verify)
        self._store = SiteStore(storage, header, SiteState(space, self.protocol_cls.federated), self.ledger, secret)
        self._data = LocalData(space, self._to_max, self._store.state, self.outcomes)
        head = self._store.header
        setup = SiteSetup(site=self.site, space=space, objective=objective, outcomes=self.outcomes,
                          protocol=self.configured,
                          seed=self.seed, n_init=self.n_init, secret=int(head.secret),
                          key_seed=bytes.fromhex(head.key_seed))
        self.agent = SiteAgent(setup, self._store, self._data, link, horizon, approve, wrappers)
        try:
            self.context: SiteContext = self.agent.join()
            self._store.write_header()
        except BaseException:  # refused (e.g. by the coordinator): leave the storage as it was
            self.agent.failed()
            self.agent.close()
            self._store.discard()
            raise

    @property
    def state(self) -> SiteState:
        """The site's state: the fold of its journal (read it, never modify it)."""
        return self._store.state

    @property
    def horizon(self) -> int | None:
        """The planned number of BO rounds (given, or the coordinator's)."""
        return self.agent.horizon

    @property
    def campaign_id(self) -> str:
        """A stable id of this site's campaign (its journal): a hash of the site and its private secret."""
        return campaign_id(self.site, self.agent.setup.secret)

    # -- validation helpers ----------------------------------------------------------------
    def _clean(self, params: Any, strict: bool) -> dict[str, Any]:
        return self.space.validate_params(params, strict=strict)[0]

    def _record(self, trial_or_id: Trial | int, *, pending: bool = True) -> TrialRecord:
        tid = trial_or_id.id if isinstance(trial_or_id, Trial) else trial_or_id
        if isinstance(tid, (bool, np.bool_)) or not isinstance(tid, (int, np.integer)):
            raise TrialError(f"a trial id is an int or a Trial, got {type(trial_or_id).__name__}")
        rec = self.state.trials.get(int(tid))
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
            self._store.commit(Historical(**record))

    def enqueue(self, params: dict[str, Any]) -> Trial:
        """Register an experiment the scientist chose; returns it as a pending Trial."""
        clean = self._clean(params, strict=True)
        broken = self.space.violations(clean)
        if broken:
            raise ConstraintError(f"enqueued {clean} breaks {'; '.join(broken)} (an experiment already run goes in "
                                  "with add_observations)")
        x = self.space.encode([clean])[0]
        entry = {"id": self.state.next_id, "params": clean, "x": x.tolist(), "source": "enqueued",
                 "round": self.state.round}
        self._store.commit(Enqueue(trials=[entry]))
        return self.state.trials[entry["id"]].trial()

    def ask(self, n: int | None = None, *, timeout: float | None = None) -> Trial | list[Trial]:
        """Propose the next experiment (``n=None``) or a list of ``n`` (pending-aware)."""
        k = 1 if n is None else n
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValidationError(f"n must be a positive integer, got {n!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.number))
                                    or not timeout > 0):
            raise ValidationError(f"timeout must be a number of seconds > 0 (None: wait as long as it takes), "
                                  f"got {timeout!r}")
        rows: list[tuple[np.ndarray, str]] = []
        design = self._design_rows()
        while len(rows) < k and self.state.design_used + len(rows) < len(design) and self._needs_design(len(rows)):
            rows.append((design[self.state.design_used + len(rows)], "design"))
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
                clock = self.state.clock.record(None, self.state.results())
        trials = []
        for j, (x, source) in enumerate(rows):
            params = self.space.decode(x[None])[0]
            at = clock.get("guidance_round") if source.startswith("model") else None
            trials.append({"id": self.state.next_id + j, "params": params, "x": self.space.encode([params])[0].tolist(),
                           "source": source, "round": self.state.round if at is None else at})
        self._store.commit(Ask(trials=trials, model_round=model_round, **clock))
        out = [self.state.trials[t["id"]].trial() for t in trials]
        return out[0] if n is None else out

    def tell(self, trial_or_id: Trial | int, value: Any, metadata: dict[str, Any] | None = None) -> None:
        """Report a measurement: a float, or ``(mean, sem)`` — with named outcomes a dict of them,
        e.g. ``{"yield": 81.2, "impurity": (0.3, 0.02)}``; ``metadata`` is kept with the trial."""
        rec = self._record(trial_or_id)
        if self.outcomes is not None:
            outcomes = self.outcomes.parse(value)
            mean, sem = outcomes[self.outcomes.objectives[0].name]
            self._store.commit(Tell(id=rec.id, value=mean, sem=sem, outcomes=outcomes, **metadata_record(metadata)))
            return
        if isinstance(value, dict):
            raise ValidationError("tell got a dict, but this campaign measures one unnamed value; name the "
                                  "outcomes with objective=labfbo.Objective(...) to report several")
        mean, sem = parse_value(value)
        self._store.commit(Tell(id=rec.id, value=mean, sem=sem, **metadata_record(metadata)))

    def tell_failed(self, trial_or_id: Trial | int, reason: str = "", metadata: dict[str, Any] | None = None) -> None:
        """Mark a trial as failed (it is never proposed as pending again)."""
        rec = self._record(trial_or_id)
        if not isinstance(reason, str):
            raise ValidationError("reason must be a string")
        self._store.commit(Fail(id=rec.id, reason=reason, **metadata_record(metadata)))

    def retract(self, trial_or_id: Trial | int, reason: str = "") -> None:
        """Withdraw a told result (a wrong number, a mislabelled sample): journaled; the models
        and every later release leave it out, ``observations`` and ``best`` no longer show it, and
        the report lists it. What a release sent before cannot be unsent. To record the right
        value, ``enqueue`` the same settings and tell it."""
        rec = self._record(trial_or_id, pending=False)
        if rec.state != "complete":
            raise TrialError(f"trial {rec.id} is {rec.state}: only a told result can be retracted")
        if not isinstance(reason, str):
            raise ValidationError("reason must be a string")
        self._store.commit(Retract(id=rec.id, reason=reason))

    def annotate(self, trial_or_id: Trial | int, **metadata: Any) -> Trial:
        """Journal JSON metadata on a pending trial (e.g. an instrument's run handle); returns it updated."""
        rec = self._record(trial_or_id)
        self._store.commit(Note(id=rec.id, **metadata_record(metadata)))
        return rec.trial()

    @property
    def observations(self) -> tuple[Observation, ...]:
        """Completed records (historical and told), in order; failed and pending excluded."""
        return self.state.observations()

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
        return pareto_front(self.outcomes, self.observations)

    @property
    def pending(self) -> list[Trial]:
        return [t.trial() for t in self.state.trials.values() if t.state == "pending"]

    @property
    def trials(self) -> list[Trial]:
        return [t.trial() for t in self.state.trials.values()]

    def predict(self, params_list: Sequence[dict[str, Any]]) -> Any:
        """Posterior mean and standard deviation of the objective (user units); with named outcomes
        a dict ``outcome -> (mean, std)`` from the site's own model of each."""
        X = self.space.encode([self._clean(p, strict=False) for p in params_list])
        data = self.site_data()
        if data.n == 0:
            raise LabFBOError("predict needs at least one completed observation")
        if self.outcomes is not None:
            with self._store.lock, COMPUTE:
                return self.agent.logic.predict_outcomes(data, X)
        mean, std = self.agent.logic.predict(data, X)
        return self._to_max * mean, std

    def close(self) -> None:
        """Leave the coordinator and close the journal (the optimizer can be resumed from it later)."""
        self.agent.close()
        self._store.close()

    # -- what crossed the site's boundary, and its privacy accounting ------------------------
    def sent_messages(self) -> list[Message]:
        """Exactly what this site has sent across its boundary, in order."""
        return list(self.ledger.sent)

    def transfer_estimates(self) -> list[tuple[int, Any]]:
        """``(round, TransferEstimate)`` for each proposal whose protocol estimated what the partners'
        information was worth to this lab (``surface``; :mod:`labfbo.models.transfer`)."""
        return list(self.state.transfer)

    def received_messages(self) -> list[Message]:
        """Everything this site received from the coordinator (requests and guidance), in order."""
        return list(self.ledger.received)

    def releases(self) -> list[Release]:
        """Every release of data-derived information this site made, as its protocol declared it
        (journaled before the message left, so across restarts)."""
        return self.agent.releases()

    def epsilon(self) -> float | None:
        """Cumulative epsilon of this site's releases at the configured delta (None without DP;
        infinite once a release carried no DP noise)."""
        return None if self.configured.privacy is None else cumulative_epsilon(self.releases())

    def privacy_report(self) -> list[dict[str, Any]]:
        """One row per release (:meth:`releases`): round, message, mechanism and parameters,
        sensitivity, neighbouring relation, secure aggregation, and the cumulative
        (epsilon, delta) — infinite once a release carried no DP noise."""
        return privacy_report(self.releases())

    def privacy_budget(self) -> dict[str, Any] | None:
        """The campaign's privacy budget (None without ``DP(epsilon=...)``): ``epsilon`` and
        ``delta`` (the budget), the ``noise_multiplier`` calibrated to it (and the plan's smallest
        ``effective_noise_multiplier``: a release's noise std over its sensitivity), ``planned_releases``,
        ``releases`` made, ``spent`` and ``remaining`` epsilon, and once a release was withheld
        ``exhausted`` with the round it happened (``exhausted_at_round``) and how many messages
        were withheld (one count per round and message kind)."""
        return budget_summary(self.agent.budget, self.releases(), self.state.withheld)

    # -- exports -----------------------------------------------------------------------------
    def to_dataframe(self) -> Any:
        """The history as a pandas DataFrame (needs ``labfbo[dataframe]``)."""
        import pandas as pd

        return pd.DataFrame(history_rows(self.space, self.outcomes, self.state))

    def to_csv(self, path: str) -> None:
        """Export the history (historical, told, failed and pending trials) as CSV."""
        write_csv(path, history_rows(self.space, self.outcomes, self.state))

    def journal_records(self) -> list[dict[str, Any]]:
        """The journal's records as written (JSON objects), header first."""
        return self._store.records()

    def report(self, path: str = "report.html", objective_label: str | None = None) -> Any:
        """Write this site's campaign report (:func:`labfbo.report.write_report`)."""
        from labfbo.report import write_report

        return write_report(self, path, objective_label=objective_label)

    def save(self, path: str) -> None:
        """Write a snapshot (a complete journal) that :meth:`load` restores."""
        self._store.save(path)

    @classmethod
    def load(cls, path: str, coordinator: Any = None, storage: str | None = None, **options: Any) -> "Optimizer":
        """Restore an optimizer from :meth:`save` (``storage`` journals what follows). Pass ``space=``
        (the same space) to bring back its nonlinear constraints: their code is not in the snapshot.
        The snapshot is read, never modified; what it cannot account for is a JournalError naming
        its file and line."""
        head, records = read_snapshot(path)
        saved = {k: v for k, v in head.get("options", {}).items() if v is not None}
        # ``space=``: the site's own space object, to re-attach its nonlinear constraints (code is not journaled)
        space = options.pop("space", None) or SearchSpace.model_validate(head["space"])
        objective: Any = head["objective"]
        if head.get("outcomes") is not None:  # named objectives and outcome constraints, as declared
            spec = OutcomeSpec.model_validate(head["outcomes"])
            objective = list(spec.objectives)
            options.setdefault("outcome_constraints", list(spec.constraints) or None)
        opt = cls(space, objective=objective, protocol=head["protocol"], site=head["site"], seed=head["seed"],
                  n_init=head["n_init"], storage=storage, secret=options.pop("secret", head.get("secret")),
                  coordinator=coordinator, **{**saved, **options})
        try:
            opt._store.import_snapshot(path, records)
        except BaseException:
            opt.close()
            raise
        return opt

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
        return self._data.upto(upto) if upto is not None else self._data.now(extra_pending)

    def _design_rows(self) -> np.ndarray:
        if self._own_design is None:  # drawn (or repaired to the local constraints) once
            self._own_design = design_rows(self.space, self.n_init, self.seed, self.state.join_reply,
                                           self.context.seed_for(0, "design-repair"))
        return self._own_design

    def _needs_design(self, in_batch: int) -> bool:
        enqueued = sum(t.source == "enqueued" for t in self.state.trials.values())
        return len(self.state.historical) + self.state.design_used + enqueued + in_batch < self.n_init

    def _propose(self, m: int, extra: np.ndarray, timeout: float | None) -> tuple[np.ndarray, str, dict[str, Any]]:
        """``m`` model proposals, their source, and the ask record's clock fields (federated)."""
        data = self.site_data(extra_pending=extra)
        if data.n == 0:
            gen = rng(self.seed, self.context.site_index, self.state.round, "random")
            return self.space.repair(gen.random((m, self.space.dim)), int(gen.integers(2**31))), "random", {}
        guidance, source, clock, t, uses = None, "model", {}, self.state.round, 0
        self.agent.logic.expect(m)
        if self.protocol_cls.federated:
            held = self.state.clock.held
            guidance, source, clock = self.agent.guidance(timeout)
            got = clock.get("guidance_round", None if guidance is None else guidance.round)
            seen = self.state.guidance[-1].round if self.state.guidance else None
            if guidance is not None and guidance is not held and got is not None and seen != got:
                # new guidance (not the held round asked again after a restart): the site's report shows it
                self._store.commit(GuidanceReceived(round=got, kind=guidance.kind, nbytes=guidance.nbytes(),
                                                    summary=guidance.summary()))
            if clock.get("guidance_round") is not None:
                t = clock["guidance_round"]
                uses = self.state.clock.uses if t == self.state.clock.guided else 0
        data = self.agent.round_data(data, t)
        notice = slow_notice(f"{self.site}: proposing a batch of {m} from the model") if m > 1 else nullcontext()
        with self._store.lock, COMPUTE, notice:
            X = np.asarray(self.agent.logic.propose(data, guidance, m, t), dtype=np.float64)
        if X.shape != (m, self.space.dim):
            raise LabFBOError(f"protocol {self.protocol!r} proposed shape {X.shape}, expected {(m, self.space.dim)}")
        if (transfer := self.agent.logic.transfer()) is not None:
            clock = {**clock, "transfer": transfer}
        if source == "model" and self.protocol_cls.federated and (why := self.agent.logic.alone()) is not None:
            source = "model-alone"  # the round ran, but nothing of it reached this proposal: say so
            warnings.warn(f"site {self.site!r}, round {t}: {why}; proposing from this lab's own data", stacklevel=3)
        gen = rng(self.seed, self.context.site_index, t, "dedupe" if not uses else f"dedupe/{uses}")
        X = dedupe(self.space, self.space.snap(X), data.pending, gen)
        if self.space.local_constraints:  # the protocol's own points (e.g. a consensus average) meet them too
            X = self.space.repair(X, self.context.seed_for(t, "repair"), avoid=data.pending)
        return X, source, clock

    def __repr__(self) -> str:
        return (f"Optimizer(site={self.site!r}, protocol={self.protocol!r}, objective={self.objective!r}, "
                f"observations={len(self.observations)}, pending={len(self.pending)})")
