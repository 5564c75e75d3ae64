"""What every protocol must do, as a pytest test case a protocol's own tests subclass.

::

    import pytest
    from labfbo.testing import ProtocolConformance

    class TestMyProtocol(ProtocolConformance):
        @pytest.fixture
        def protocol(self):
            return MyProtocol(n_particles=4)  # a configured protocol, quick options

The checks are fast: the protocol built from its name and keywords and from the object, an
unknown option refused with a did-you-mean, its options through JSON, ``check_space`` on a
tiny mixed space, and one short local campaign (three sites if federated, one if not; a 2-D
space; two model rounds) run twice from the same seed: every proposal in bounds and meeting
the space, the same proposals both times, every message a site sent or received parses back
from its wire form, and the releases the site journaled are those its protocol declares for
what it sent.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from labfbo.coordinator import Coordinator
from labfbo.core.exceptions import ConfigurationError, ProtocolError
from labfbo.core.messages import Abstain, JoinRequest, Message, parse
from labfbo.optimizer import Optimizer
from labfbo.protocols import Protocol, SiteContext, configure, get_protocol, resolve
from labfbo.space.search import Categorical, Discrete, Integer, Real, SearchSpace

SEED = 5
N_INIT = 3
ROUNDS = 2


@dataclass
class CampaignRun:
    """What a short campaign left: the proposals per round and site, and the closed sites."""

    proposals: list[list[dict[str, Any]]]
    sites: list[Optimizer]


def objective(space: SearchSpace, i: int, params: dict[str, Any]) -> float:
    """A smooth function of the unit-cube point, its optimum shifted a little per site ``i``."""
    u = space.encode([params])[0]
    return float(sum((x - 0.3 - 0.1 * i) ** 2 for x in u))


def run_campaign(protocol: Protocol, space: SearchSpace, seed: int = SEED, n_init: int = N_INIT,
                 rounds: int = ROUNDS, *, horizon: int | None = None, journals: Path | None = None,
                 reopen_after: int | None = None, restore_coordinator: bool = False,
                 after_round: Callable[[list[Optimizer], Any], None] | None = None) -> CampaignRun:
    """A lock-step local campaign: every site evaluates its design, then in each model round every
    site asks before any tells (three sites if the protocol is federated, one if not).

    ``journals``: each site journals to ``<journals>/<site>.jsonl``; ``reopen_after=k``: after
    ``k`` model rounds every site is closed and reopened from its journal (``restore_coordinator``:
    the coordinator too, from the JSON of its rounds' snapshots); ``after_round(sites, coordinator)``
    is called after each model round; ``horizon`` (default ``rounds``) is the planned one."""
    names = ["site-a", "site-b", "site-c"] if protocol.federated else ["site-a"]
    horizon = rounds if horizon is None else horizon

    def coordinator(**pinned: Any) -> Coordinator | None:
        return Coordinator(protocol, sites=names, seed=seed, horizon=horizon, **pinned) if protocol.federated else None

    def site(i: int, name: str) -> Optimizer:
        storage = None if journals is None else str(journals / f"{name}.jsonl")
        return Optimizer(space, protocol=protocol, coordinator=coord, site=name, seed=seed, n_init=n_init,
                         horizon=horizon, secret=100 + i, storage=storage)

    coord = coordinator()
    sites = [site(i, s) for i, s in enumerate(names)]
    proposals: list[list[dict[str, Any]]] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, opt in enumerate(sites):
                for t in opt.ask(n=n_init):
                    opt.tell(t, objective(space, i, t.params))
            for r in range(rounds):
                if r == reopen_after:
                    for opt in sites:
                        opt.close()
                    if restore_coordinator and coord is not None:
                        snapshots = json.loads(json.dumps([coord.snapshot(t) for t in sorted(coord.rounds)]))
                        coord = coordinator(space=space)  # a durable coordinator pins the study's space
                        coord.restore(snapshots)  # type: ignore[union-attr]
                    sites = [site(i, s) for i, s in enumerate(names)]
                trials = [opt.ask() for opt in sites]
                proposals.append([t.params for t in trials])
                for i, (opt, t) in enumerate(zip(sites, trials)):
                    opt.tell(t, objective(space, i, t.params))
                if after_round is not None:
                    after_round(sites, coord)
    finally:
        for opt in sites:
            opt.close()
    return CampaignRun(proposals, sites)


_RUNS: dict[tuple[Protocol, str], CampaignRun] = {}


def _misspelt(name: str) -> str:
    return name[:-1] + ("x" if name[-1] != "x" else "y")


def _key(message: Any) -> tuple[str, int, int | None]:
    step = message.step if "step" in type(message).model_fields else None
    return message.kind, int(message.round), step


class ConformanceFixtures:
    """The fixtures every conformance class reads. Override ``protocol`` (and ``space`` for a
    protocol that does not take two real parameters)."""

    @pytest.fixture
    def protocol(self) -> Protocol:
        raise NotImplementedError("override the `protocol` fixture: return the configured protocol to check")

    @pytest.fixture
    def space(self) -> SearchSpace:
        """The campaign's 2-D space."""
        return SearchSpace([Real("x", -1.0, 2.0), Real("rate", 1e-3, 1.0, log=True)])

    @pytest.fixture
    def campaign(self, protocol: Protocol, space: SearchSpace) -> CampaignRun:
        """One short campaign per protocol and space (shared by the checks that read it)."""
        key = (protocol, space.fingerprint())
        if key not in _RUNS:
            _RUNS[key] = run_campaign(protocol, space)
        return _RUNS[key]


class ProtocolConformance(ConformanceFixtures):
    """The checks every protocol must pass (the promises of the house beside them:
    :mod:`labfbo.testing.capabilities`)."""

    # -- configuration ---------------------------------------------------------------------
    def test_is_registered_and_built_from_its_name_or_the_object(self, protocol: Protocol) -> None:
        cls = type(protocol)
        assert isinstance(protocol, Protocol) and get_protocol(protocol.name) is cls
        keywords = protocol.keywords()
        by_name = configure(protocol.name, keywords)
        assert by_name == protocol and hash(by_name) == hash(protocol) and type(by_name) is cls
        assert configure(protocol, {}) is protocol and cls(**keywords) == protocol
        assert cls.from_options(protocol.options) == protocol
        assert resolve(protocol, {}) == (protocol.name, protocol.options) == resolve(protocol.name, dict(keywords))
        assert repr(protocol).startswith(f"{cls.__name__}(")
        if keywords:  # options are given once: on the object or as keywords
            with pytest.raises(ConfigurationError, match="set on the object"):
                configure(protocol, keywords)

    def test_refuses_an_unknown_option_naming_the_closest(self, protocol: Protocol) -> None:
        fields = [f for f in type(protocol).Options.model_fields if len(f) >= 5]
        wrong = _misspelt(fields[0]) if fields else "no_such_option"
        with pytest.raises(ConfigurationError, match=f"unknown option '{wrong}'") as caught:
            configure(protocol.name, {wrong: 1})
        if fields:
            assert f"did you mean '{fields[0]}'" in str(caught.value)
        with pytest.raises(ConfigurationError, match="unknown option"):
            type(protocol)(**{wrong: 1})

    def test_options_round_trip_through_json(self, protocol: Protocol) -> None:
        cls = type(protocol)
        text = protocol.options.model_dump_json()
        assert cls.Options.model_validate_json(text) == protocol.options
        assert cls(**json.loads(text)) == protocol
        assert json.loads(json.dumps(protocol.shared)) == protocol.shared
        assert set(protocol.shared) <= set(cls.shared_options) <= set(cls.Options.model_fields)

    def test_check_space_accepts_what_it_supports_and_names_what_it_does_not(self, protocol: Protocol) -> None:
        cls = type(protocol)
        mixed = SearchSpace([Real("x", 0.0, 1.0), Integer("n", 1, 4),
                                    Discrete("d", [0.1, 0.2, 0.5]), Categorical("c", ["a", "b"])])
        for param in mixed.params:
            one = SearchSpace([Real("r", 0.0, 1.0), param])
            if param.type in cls.supported_types:
                cls.check_space(one)
            else:
                with pytest.raises(ProtocolError, match=param.type):
                    cls.check_space(one)
        if mixed.kinds() <= cls.supported_types:
            cls.check_space(mixed)
        else:
            with pytest.raises(ProtocolError):
                cls.check_space(mixed)

    # -- a short campaign --------------------------------------------------------------------
    def test_a_short_campaign_proposes_in_the_space(self, campaign: CampaignRun, space: SearchSpace) -> None:
        assert len(campaign.proposals) == ROUNDS and all(len(r) == len(campaign.sites) for r in campaign.proposals)
        for opt in campaign.sites:
            assert len(opt.trials) == N_INIT + ROUNDS
            for trial in opt.trials:
                clean, outside = space.validate_params(trial.params, strict=True)
                assert not outside and space.is_allowed(clean) and not space.violations(clean), trial.params
                assert all(math.isfinite(v) for v in clean.values() if isinstance(v, float))

    def test_the_same_seed_gives_the_same_proposals(self, campaign: CampaignRun, protocol: Protocol,
                                                    space: SearchSpace) -> None:
        again = run_campaign(protocol, space)
        assert again.proposals == campaign.proposals
        assert [[t.params for t in o.trials] for o in again.sites] == [[t.params for t in o.trials]
                                                                       for o in campaign.sites]

    def test_every_message_parses_back_from_its_wire_form(self, campaign: CampaignRun, protocol: Protocol) -> None:
        for opt in campaign.sites:
            sent, received = opt.ledger.sent, opt.ledger.received
            assert (len(sent) > 1) == protocol.federated  # its join, then its answers
            for message in [*sent, *received]:
                assert isinstance(message, Message)
                assert parse(message.to_wire()) == message, message.kind
                assert parse(message.model_dump_json()) == message, message.kind

    def test_the_journaled_releases_are_those_declared_for_what_was_sent(
            self, campaign: CampaignRun, protocol: Protocol, space: SearchSpace) -> None:
        cls = type(protocol)
        for index, opt in enumerate(campaign.sites):
            answers = [m for m in opt.ledger.sent if not isinstance(m, (JoinRequest, Abstain))]
            with warnings.catch_warnings():  # e.g. a vote without the study's design: only its declarations are read
                warnings.simplefilter("ignore")
                logic = cls.site_logic(space, opt.options, SiteContext(site=opt.site, site_index=index,
                                                                       n_sites=len(campaign.sites), horizon=ROUNDS))
            declared = [(m, logic.release(m)) for m in answers]
            want = [(_key(m), r.private) for m, r in declared if r is not None]
            journaled = [((r.message, r.round, r.step), r.private) for r in opt.releases()]
            assert journaled == want
            for m, r in declared:  # a message that states DP noise is declared as a protected release
                if "dp_noise_multiplier" in type(m).model_fields and m.dp_noise_multiplier is not None:
                    assert r is not None and r.private, m.kind
            if protocol.privacy is not None and protocol.federated:  # DP on: its releases are protected ones
                assert journaled and all(private for _, private in journaled), journaled
                # and no more of them than the budget plans for
                planned = logic.planned_releases(ROUNDS)
                made = Counter(key[0] for key, private in journaled if private)
                assert all(n <= planned.get(kind, n) for kind, n in made.items()), (made, planned)
