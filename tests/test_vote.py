"""Protocol ``vote``: randomized response over a public codebook, its accounting and its budget."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import labfbo
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.messages import Array, parse
from labfbo.core.release import Release
from labfbo.privacy import DP
from labfbo.privacy.dp import composed_epsilon
from labfbo.privacy.randomized_response import epsilon_of, keep_probability, noise_parameter, respond
from labfbo.protocols.vote.protocol import OptimumVote, VoteOptions, VoteTally, codebook, tallies

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])


def test_randomized_response_reports_the_truth_as_often_as_its_epsilon_allows() -> None:
    eps, k = 2.0, 8
    keep = keep_probability(eps, k)
    assert keep == pytest.approx(math.exp(2) / (math.exp(2) + 7))
    assert epsilon_of(noise_parameter(eps, k), k) == pytest.approx(eps)
    gen = np.random.default_rng(0)
    out = np.array([respond(3, k, eps, gen) for _ in range(20000)])
    assert out.min() >= 0 and out.max() < k
    assert abs(np.mean(out == 3) - keep) < 0.01
    others = np.bincount(out[out != 3], minlength=k)[[i for i in range(k) if i != 3]]
    # every other option equally likely: the likelihood ratio of any two inputs is exactly e^eps
    assert others.min() / others.max() > 0.85
    assert abs(np.mean(out == 0) - (1 - keep) / (k - 1)) < 0.01
    assert keep_probability(math.inf, k) == 1.0
    with pytest.raises(ValueError):
        respond(8, k, eps, gen)


def test_responses_compose_one_by_one() -> None:
    """dp-accounting's PLD accountant takes SelfComposedDpEvent(RandomizedResponseDpEvent, n) as one
    response; labfbo lists them, so n responses cost about n times one (never more)."""
    one = composed_epsilon({(8, 0.5): 1}, 1e-5)
    three = composed_epsilon({(8, 0.5): 3}, 1e-5)
    assert one == pytest.approx(0.5, abs=1e-3)
    assert 1.3 < three <= 1.5 + 1e-9
    # with a Gaussian in the same ledger: more than either alone
    both = composed_epsilon({(8, 0.5): 3, 2.0: 1}, 1e-5)
    assert both > max(three, composed_epsilon({2.0: 1}, 1e-5))


def test_a_randomized_response_release_is_declared_completely() -> None:
    rel = Release.randomized_response("optimum_vote", 0, DP(noise_multiplier=0.5), "rr", buckets=8, epsilon=2.0)
    assert rel.private and rel.event == (8, 2.0)
    assert not Release.randomized_response("optimum_vote", 0, DP(noise_multiplier=0.0), "rr", 8, math.inf).private
    with pytest.raises(ValueError, match="buckets and pure_epsilon"):
        Release(round=0, message="optimum_vote", buckets=8)
    with pytest.raises(ValueError, match="mechanism"):
        Release(round=0, message="optimum_vote", delta=1e-5)


def test_the_codebook_is_public_and_every_party_computes_the_same() -> None:
    a, b = codebook(SPACE, 8), codebook(SPACE, 8)
    assert a.shape == (8, 2) and np.array_equal(a, b)
    other = labfbo.SearchSpace([labfbo.Real("x", 0.0, 2.0), labfbo.Real("y", 0.0, 1.0)])
    assert not np.array_equal(a, codebook(other, 8))


def test_messages_are_checked() -> None:
    with pytest.raises(ValueError, match="not in a codebook"):
        OptimumVote(index=8, codebook=8)
    with pytest.raises(ValueError):
        VoteTally(counts=Array.of(np.array([1, -1, 0]), "int64"))
    vote = OptimumVote(index=3, codebook=8, dp_noise_multiplier=0.5, round=2)
    assert parse(vote.model_dump_json()) == vote
    with pytest.raises(ConfigurationError):
        labfbo.Optimizer(SPACE, protocol="vote", prior={"x": labfbo.models.priors.Normal(0.5, 0.1)})


def test_a_site_gets_the_others_votes_never_its_own() -> None:
    votes = {"a": OptimumVote(index=1, codebook=4), "b": OptimumVote(index=1, codebook=4),
             "c": OptimumVote(index=3, codebook=4, dp_noise_multiplier=0.5)}
    out = tallies(votes, ["a", "b", "c", "d"], 4)
    assert out["a"].counts.numpy().tolist() == [0, 1, 0, 1]
    assert out["c"].counts.numpy().tolist() == [0, 2, 0, 0]
    assert out["d"].counts.numpy().tolist() == [0, 2, 0, 1]
    with pytest.raises(ValueError):
        VoteTally(counts=Array.of(np.array([1.0, 0.5])))  # counts are integers


def _campaign(budget: int, **options) -> labfbo.SimulationResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return labfbo.simulate("branin", protocol="vote", n_sites=3, n_init=4, budget=budget, seed=0,
                               num_restarts=2, raw_samples=64, **options)


@pytest.mark.integration  # a multi-site campaign
def test_votes_shape_the_proposals_and_are_reproducible() -> None:
    plain = _campaign(3)
    again = _campaign(3)
    assert np.array_equal(plain.proposals, again.proposals)
    alone = labfbo.simulate("branin", protocol="independent", n_sites=3, n_init=4, budget=3, seed=0,
                            num_restarts=2, raw_samples=64)
    assert not np.array_equal(plain.proposals, alone.proposals)  # the others' votes moved them


@pytest.mark.integration  # a multi-site campaign
def test_a_campaign_budget_is_never_exceeded_even_past_the_horizon() -> None:
    space = SPACE
    names = ["a", "b", "c"]
    coord = labfbo.Coordinator("vote", sites=names, seed=0, horizon=4, release_every=2)
    dp = DP(epsilon=2.0)
    sites = {s: labfbo.Optimizer(space, protocol="vote", coordinator=coord, site=s, seed=0, n_init=3, horizon=4,
                                 release_every=2, privacy=dp, num_restarts=2, raw_samples=64) for s in names}
    budget = sites["a"].privacy_budget()
    assert budget["planned_releases"] == 2
    assert 1 / budget["noise_multiplier"] == pytest.approx(1.0, rel=0.02)  # two votes of epsilon ~1 each
    for opt in sites.values():
        for trial in opt.ask(n=opt.n_init):
            opt.tell(trial, float(sum((v - 0.3) ** 2 for v in trial.params.values())))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(7):  # past the horizon of 4
            trials = {s: opt.ask() for s, opt in sites.items()}
            for s, trial in trials.items():
                sites[s].tell(trial, float(sum((v - 0.3) ** 2 for v in trial.params.values())))
    for opt in sites.values():
        assert opt.epsilon() <= 2.0
        rows = opt.privacy_report()
        assert len(rows) == 2 and all(r["message"] == "sealed_vote" for r in rows)  # key shares are no release
        assert rows[-1]["epsilon"] <= 2.0 and rows[0]["buckets"] == 3  # the site's 3 dealt rows
        assert opt.privacy_budget()["exhausted"]
    assert any("privacy budget spent" in str(w.message) for w in caught)


def test_options() -> None:
    assert VoteOptions().codebook == "design" and VoteOptions(codebook=8).codebook == 8
    with pytest.raises(ValueError, match="Thompson"):
        VoteOptions(acquisition="ts")


@pytest.mark.integration  # a multi-site campaign
def test_the_vote_audit_compares_the_coordinators_guess_with_chance() -> None:
    from labfbo.apps.attacks.votes import audit_votes, table

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = audit_votes("sphere", [None], [0], n_sites=3, n_init=3, budget=2)
        plain = audit_votes("sphere", [None], [0], n_sites=3, n_init=3, budget=2, sealed=False)
    for rows in (out[None, "peer"], plain[None, "coordinator"], plain[None, "peer"]):  # readers of the votes
        assert len(rows) == 3
        for r in rows:
            assert 0 <= r["guess"] <= math.sqrt(2) and r["hit"] in (0.0, 1.0) and r["hit_chance"] == 1 / 3
            assert 0.2 < r["chance_uniform"] < 0.9 and not math.isnan(r["others"])
    assert [r["guess"] for r in out[None, "peer"]] == [r["guess"] for r in plain[None, "coordinator"]]
    # sealed: the coordinator reads no vote, so its guess is a uniform draw of the site's rows
    for r in out[None, "coordinator"]:
        assert r["guess"] == pytest.approx(r["chance_codebook"]) and r["hit"] == pytest.approx(1 / 3)
        assert math.isnan(r["others"])
    assert "| no DP | coordinator | 3 |" in table(out) and "reads no vote" in table(out)


def test_calibrating_randomized_responses_to_a_budget() -> None:
    from labfbo.privacy.budget import calibrate_events

    sigma = calibrate_events(lambda s: {(8, 1.0 / s): 4}, 2.0, 1e-5)
    assert composed_epsilon({(8, 1.0 / sigma): 4}, 1e-5) <= 2.0
    assert composed_epsilon({(8, 1.0 / (sigma * 0.999)): 4}, 1e-5) > 2.0 - 1e-3  # the smallest that fits
    assert 1 / sigma == pytest.approx(0.5, rel=0.05)  # four pure-DP votes: about 2 / 4 each


def test_a_site_is_told_when_its_votes_would_be_barely_better_than_a_guess() -> None:
    coord = labfbo.Coordinator("vote", sites=["a", "b"], seed=0, horizon=30)
    with pytest.warns(UserWarning, match="truthfully only"):
        labfbo.Optimizer(SPACE, protocol="vote", coordinator=coord, site="a", seed=0, horizon=30, release_every=1,
                         privacy=DP(epsilon=2.0))  # 30 votes of epsilon 0.07: 13 % against 12.5 %
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labfbo.Optimizer(SPACE, protocol="vote", coordinator=coord, site="b", seed=0, horizon=30,
                         privacy=DP(epsilon=2.0))  # one vote: 51 %


def test_the_votes_prior_is_uniform_over_the_named_cells() -> None:
    import torch

    from labfbo.models.priors import CellPrior

    space = labfbo.SearchSpace([labfbo.Real(f"x{i}", 0.0, 1.0) for i in range(3)])
    points = codebook(space, 8)
    prior = CellPrior(space, points, np.array([0, 2, 0, 0, 1, 0, 0, 0]), floor=0.1)
    U = torch.rand(20000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert float(torch.exp(prior.log_density(U)).mean()) == pytest.approx(1.0, abs=0.03)  # a density
    draws = prior.sample(200, seed=1)
    nearest = np.argmin(((draws[:, None, :] - points[None]) ** 2).sum(-1), axis=1)
    assert set(nearest) <= {1, 4} and np.mean(nearest == 1) > 0.5  # twice the votes, twice the mass
    assert prior.in_region(draws).all() and not prior.in_region(points[[0, 2]]).any()
    # uniform inside a cell: its codepoint is no likelier than another point of the cell
    inside = torch.as_tensor(draws[nearest == 1][:20])
    dens = prior.log_density(inside).numpy()
    assert dens.max() - dens.min() < 0.7
    with pytest.raises(ConfigurationError):
        CellPrior(space, points, np.zeros(8))


def test_under_a_budget_a_site_votes_in_the_first_round_it_can() -> None:
    from labfbo.protocols.base import SiteContext, SiteData
    from labfbo.protocols.vote.protocol import VoteRequest, VoteSite

    opts = VoteOptions(codebook=8, sealed=False, privacy=DP(epsilon=2.0, noise_multiplier=0.5))
    site = VoteSite(SPACE, opts, SiteContext(site="a", horizon=10, secret=3))

    def data(n: int) -> SiteData:
        X = np.random.default_rng(n).random((n, 2))
        return SiteData(SPACE, X, -((X - 0.3) ** 2).sum(1), None, np.zeros((0, 2)))

    assert site.answer(VoteRequest(), data(1), 0).kind == "abstain"  # one observation: not yet
    vote = site.answer(VoteRequest(), data(3), 1)  # round 1, not a multiple of the horizon: it votes now
    assert isinstance(vote, OptimumVote) and vote.dp_noise_multiplier == 0.5 and vote.release_every == 10
    assert site.answer(VoteRequest(), data(4), 2).kind == "abstain"  # once per horizon


def test_vote_refuses_outcome_constraints() -> None:
    from labfbo.core.objectives import Outcome

    with pytest.raises(ConfigurationError, match="outcome constraints"):
        labfbo.Optimizer(SPACE, protocol="vote", outcome_constraints=[Outcome("impurity", "<=", 0.5)], seed=0)


@pytest.mark.integration  # a multi-site campaign
@pytest.mark.parametrize("sealed", [True, False])
def test_a_design_vote_names_one_of_the_sites_own_dealt_rows(sealed: bool) -> None:
    """codebook='design': the codebook is the study's collaborative design, which every site can
    compute from its join reply; a site's randomized response chooses among the n_init rows it
    was dealt (k = n_init), and a vote made once under a budget is reused in every later tally
    (sealed: every tally's tokens open to the same votes)."""
    from labfbo.coordinator import collaborative_design
    from labfbo.protocols.vote.sealed import SealedTally, SealedVote

    names, n_init = ["a", "b", "c", "d"], 3
    coord = labfbo.Coordinator("vote", sites=names, seed=5, horizon=4, codebook="design", sealed=sealed)
    sites = {s: labfbo.Optimizer(SPACE, protocol="vote", coordinator=coord, site=s, seed=5, n_init=n_init, horizon=4,
                                 codebook="design", sealed=sealed, privacy=DP(epsilon=2.0), num_restarts=2,
                                 raw_samples=64) for s in names}
    design = collaborative_design(SPACE, len(names), n_init, 5)
    for opt in sites.values():
        assert np.array_equal(opt.context.study_design, design)
        assert opt.privacy_budget()["planned_releases"] == 1
    for _ in range(n_init + 3):
        trials = {s: opt.ask() for s, opt in sites.items()}
        for s, trial in trials.items():
            sites[s].tell(trial, float(sum((v - 0.3) ** 2 for v in trial.params.values())))
    for i, (s, opt) in enumerate(sites.items()):
        votes = [m for m in opt.ledger.sent if isinstance(m, (SealedVote, OptimumVote))]
        assert len(votes) == 1 and all(isinstance(v, SealedVote if sealed else OptimumVote) for v in votes)
        if sealed:  # a peer opens its token: the same packed vote
            peer = names[(i + 1) % len(names)]
            token = sites[peer].agent.logic.open(SealedTally(study=votes[0].study, votes=[
                {"sender": s, "public_key": votes[0].public_key, "round": votes[0].round,
                 "token": votes[0].sealed[peer]}]))
            assert token is not None and set(votes[0].sealed) == set(names) - {s}
            vote = OptimumVote(index=int(np.flatnonzero(token.counts.numpy())[0]), codebook=len(token.counts.numpy()))
            assert len({len(t) for t in votes[0].sealed.values()}) == 1  # one size whatever the vote
        else:
            vote = votes[0]
        assert vote.codebook == len(names) * n_init
        assert i * n_init <= vote.index < (i + 1) * n_init  # one of its own rows, even when randomized
        rows = opt.privacy_report()
        assert len(rows) == 1 and rows[0]["buckets"] == n_init and rows[0]["epsilon"] <= 2.0
        got = [m for m in opt.ledger.received if isinstance(m, (SealedTally, VoteTally))]
        tallies_got = [opt.agent.logic.open(m) if sealed else m for m in got]
        assert len(tallies_got) >= 3  # round 0's votes, held for every later round
        assert all(m.counts.numpy().sum() == len(names) - 1 for m in tallies_got)


def test_a_design_vote_needs_the_study_design() -> None:
    from labfbo.protocols.base import SiteContext, SiteData
    from labfbo.protocols.vote.protocol import VoteRequest, VoteSite
    from labfbo.space.design import study_design

    site = VoteSite(SPACE, VoteOptions(codebook="design"), SiteContext(site="a"))  # not in a study
    X = np.random.default_rng(0).random((4, 2))
    answer = site.answer(VoteRequest(), SiteData(SPACE, X, -X.sum(1), None, np.zeros((0, 2))), 0)
    assert answer.kind == "abstain" and "collaborative design" in answer.reason
    coord = labfbo.Coordinator("vote", sites=["a", "b", "c"], seed=1)
    reply = coord.join(
        labfbo.core.messages.JoinRequest(
            site="a",
            protocol="vote",
            study="",
            space_hash=SPACE.fingerprint(),
            space=SPACE.model_dump(mode="json"),
            n_init=4,
        )
    )
    assert study_design(SPACE, 4, reply).shape == (3, 4, 2)
    assert study_design(SPACE, 5, reply) is None  # another n_init: the rows dealt are not that design's
    assert study_design(SPACE, 4, reply.model_copy(update={"study_seed": None})) is None
    # a site's own nonlinear constraints do not change the study's design (the coordinator never sees them)
    local = labfbo.SearchSpace(SPACE.params, constraints=[labfbo.NonlinearConstraint("disc", lambda p: 1.0 - p["x"])])
    assert np.array_equal(study_design(local, 4, reply), study_design(SPACE, 4, reply))
    with pytest.warns(UserWarning, match="will not vote"):
        one_row = VoteSite(SPACE, VoteOptions(codebook="design"),
                           SiteContext(site="a", n_sites=3, study_design=np.random.default_rng(0).random((3, 1, 2))))
    assert one_row.points is None  # one dealt row is no choice: the site does not vote
    with pytest.raises(ValueError):
        VoteOptions(codebook="grid")


def test_design_votes_of_another_size_are_left_out() -> None:
    """Sites with another n_init computed another design: the coordinator counts the majority's."""
    from labfbo.protocols.base import Finish
    from labfbo.protocols.vote.protocol import VoteAggregator

    agg = VoteAggregator(VoteOptions(sealed=False), ["a", "b", "c", "d"], 0, 4, SPACE)
    votes = {"a": OptimumVote(index=1, codebook=12), "b": OptimumVote(index=4, codebook=12),
             "c": OptimumVote(index=9, codebook=16)}
    with pytest.warns(UserWarning, match=r"ignoring the votes of \['c'\] \(not over"):
        step = agg.on_responses(0, votes)
    assert isinstance(step, Finish)
    assert step.replies["d"].counts.numpy().tolist() == [0, 1, 0, 0, 1] + [0] * 7
    assert step.replies["c"].counts.numpy().sum() == 2 and step.replies["a"].counts.numpy()[4] == 1
    # a vote for a row dealt to another site is left out (site d holds rows 9..11 of 12)
    with pytest.warns(UserWarning, match=r"ignoring the votes of \['d'\] \(not one of the design rows"):
        step = VoteAggregator(VoteOptions(sealed=False), ["a", "b", "c", "d"], 0, 4, SPACE).on_responses(
            0, {"a": OptimumVote(index=1, codebook=12), "d": OptimumVote(index=0, codebook=12)})
    assert step.replies["b"].counts.numpy().tolist() == [0, 1] + [0] * 10


def test_randomized_votes_count_by_their_truth_weight() -> None:
    """A randomized response is the truth with probability q = (e^eps - 1)/(e^eps + k - 1), else a
    uniform draw: the tally carries the summed q per point, and the prior leaves the rest uniform."""
    from labfbo.protocols.base import SiteContext
    from labfbo.protocols.vote.protocol import VoteSite

    plain = OptimumVote(index=2, codebook=8)
    noisy = OptimumVote(index=2, codebook=8, dp_noise_multiplier=0.5, choices=5)  # eps 2 among 5
    q = (math.exp(2) - 1) / (math.exp(2) + 4)
    assert plain.truth_weight == 1.0 and noisy.truth_weight == pytest.approx(q)
    assert OptimumVote(index=2, codebook=8, dp_noise_multiplier=0.5).truth_weight == pytest.approx(
        (math.exp(2) - 1) / (math.exp(2) + 7))  # without `choices`: among the whole codebook
    with pytest.raises(ValueError, match="among 9 points"):
        OptimumVote(index=2, codebook=8, choices=9)
    assert tallies({"a": plain, "b": plain}, ["a", "b", "c"], 8)["c"].evidence is None  # no DP: counts alone
    t = tallies({"a": plain, "b": noisy}, ["a", "b", "c"], 8)["c"]
    assert t.counts.numpy()[2] == 2 and t.evidence.numpy()[2] == pytest.approx(1 + q)
    with pytest.raises(ValueError, match="evidence"):
        VoteTally(counts=Array.of(np.array([1, 0], dtype=np.int64), "int64"), evidence=Array.of(np.array([2.0, 0.0])))
    site = VoteSite(SPACE, VoteOptions(codebook=8, prior_floor=0.1), SiteContext(site="c"))
    truthful, randomized = site.prior(tallies({"a": plain}, ["a", "c"], 8)["c"]), site.prior(
        tallies({"b": noisy}, ["b", "c"], 8)["c"])
    assert truthful.floor == pytest.approx(0.1) and randomized.floor == pytest.approx(1 - 0.9 * q)
