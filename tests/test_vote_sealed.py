"""Sealed votes: the coordinator relays votes it cannot read; each recipient opens and counts them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import labfbo
from labfbo.core.exceptions import ProtocolError
from labfbo.privacy import sealed, secagg
from labfbo.protocols.base import Finish, SiteContext
from labfbo.protocols.secure_sum import KeyRequest, PublicKeyShare
from labfbo.protocols.vote.protocol import OptimumVote, VoteAggregator, VoteOptions, VoteRequest, VoteSite
from labfbo.protocols.vote.sealed import TOKEN_CHARS, SealedVote, context, open_votes, pack, relay, seal_vote, unpack

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])
KEYS = {s: bytes([i + 1]) * 32 for i, s in enumerate("abcd")}
PUBLIC = {s: secagg.public_key(k) for s, k in KEYS.items()}


def test_a_sealed_payload_opens_only_for_its_recipient_round_and_sender() -> None:
    token = sealed.seal(b"vote 7", "a", KEYS["a"], "b", PUBLIC["b"], b"r0")
    assert sealed.unseal(token, "b", KEYS["b"], "a", PUBLIC["a"], b"r0") == b"vote 7"
    assert token == sealed.seal(b"vote 7", "a", KEYS["a"], "b", PUBLIC["b"], b"r0")  # the same bytes on any transport
    assert token != sealed.seal(b"vote 8", "a", KEYS["a"], "b", PUBLIC["b"], b"r0")
    for who, sender, ctx in [("c", "a", b"r0"), ("b", "a", b"r1"), ("b", "c", b"r0")]:  # another reader, round, sender
        with pytest.raises(ProtocolError, match="does not authenticate"):
            sealed.unseal(token, who, KEYS[who], sender, PUBLIC[sender], ctx)
    tampered = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    with pytest.raises(ProtocolError):
        sealed.unseal(tampered, "b", KEYS["b"], "a", PUBLIC["a"], b"r0")


def test_a_sealed_vote_has_one_size_whatever_it_says() -> None:
    cohort = {s: PUBLIC[s] for s in "abc"}
    plain = OptimumVote(index=0, codebook=12).model_dump()
    noisy = OptimumVote(index=4093, codebook=4096, dp_noise_multiplier=0.5, choices=5, release_every=30).model_dump()
    votes = [seal_vote(v, i, "a", KEYS["a"], cohort, "study", 3) for i, v in enumerate([plain, noisy])]
    assert {len(t) for v in votes for t in v.sealed.values()} == {TOKEN_CHARS}
    assert set(votes[0].sealed) == {"b", "c"} and votes[0].public_key == PUBLIC["a"]
    assert votes[1].dp_noise_multiplier == 0.5 and votes[1].release_every == 30  # configuration, in the clear
    fields, voter = unpack(pack(noisy, 1))
    assert voter == 1 and OptimumVote(**fields) == OptimumVote(**noisy)
    with pytest.raises(ValueError):
        SealedVote(public_key=PUBLIC["a"], sealed={"b": "short"})


def test_the_coordinator_relays_each_site_only_the_tokens_sealed_for_it() -> None:
    agg = VoteAggregator(VoteOptions(), ["a", "b", "c"], 0, 4, SPACE)
    step = agg.open_round(0)  # no key yet: the keys first
    assert all(isinstance(m, KeyRequest) for m in step.requests.values()) and len(step.requests) == 3
    step = agg.on_responses(0, {s: PublicKeyShare(public_key=PUBLIC[s]) for s in "abc"})
    request = step.requests["a"]
    assert isinstance(request, VoteRequest) and request.cohort == {s: PUBLIC[s] for s in "abc"}
    votes = {s: seal_vote(OptimumVote(index=3 * i, codebook=9, release_every=4).model_dump(), i, s, KEYS[s],
                          request.cohort, "st", 0).model_copy(update={"round": 0, "study": "st"})
             for i, s in enumerate("abc")}
    done = agg.on_responses(0, votes)
    assert isinstance(done, Finish)
    for s in "abc":
        tally = done.replies[s].model_copy(update={"study": "st"})
        assert sorted(e.sender for e in tally.votes) == sorted(set("abc") - {s})
        opened = open_votes(tally, s, KEYS[s])
        assert {o: v[0]["index"] for o, v in opened.items()} == {o: 3 * "abc".index(o) for o in set("abc") - {s}}
    assert agg.open_round(1).requests["a"].cohort == request.cohort  # keys are kept: one exchange a round
    again = VoteAggregator(VoteOptions(), ["a", "b", "c"], 0, 4, SPACE)
    again.restore(agg.state())
    assert again.sealed.keys == agg.sealed.keys
    again.open_round(2)  # the held votes (release_every=4) survive the restore and still open
    held = again.on_responses(2, {})
    assert open_votes(held.replies["c"].model_copy(update={"study": "st"}), "c", KEYS["c"]).keys() == {"a", "b"}


def test_a_newcomer_is_asked_its_key_beside_the_others_votes_and_a_rekeyed_member_again() -> None:
    """After round 0 a key request never stands alone (an absent keyless site cannot hold a round up);
    a member that answers with a new key instead of its vote is asked again in the same round."""
    agg = VoteAggregator(VoteOptions(), ["a", "b", "c", "d"], 0, 4, SPACE)
    agg.open_round(0)
    step = agg.on_responses(0, {s: PublicKeyShare(public_key=PUBLIC[s]) for s in "abc"})  # d is away
    assert set(step.requests) == set("abc")
    agg.on_responses(0, {})
    step = agg.open_round(1)
    assert isinstance(step.requests["d"], KeyRequest) and isinstance(step.requests["a"], VoteRequest)
    new_b = secagg.public_key(b"\x09" * 32)
    with pytest.warns(UserWarning, match="invalid public key"):
        step = agg.on_responses(1, {"b": PublicKeyShare(public_key=new_b), "c": PublicKeyShare(public_key="A" * 44)})
    assert set(step.requests) == {"b"} and step.requests["b"].cohort["b"] == new_b
    assert isinstance(agg.on_responses(1, {}), Finish)  # asked again once, then the round ends


def test_a_site_with_a_stale_key_sends_its_current_one_and_a_lone_site_does_not_vote() -> None:
    ctx = SiteContext(site="a", n_sites=3, key_seed=KEYS["a"], study_design=np.random.default_rng(0).random((3, 2, 2)))
    site = VoteSite(SPACE, VoteOptions(), ctx)
    X = np.random.default_rng(1).random((4, 2))
    data = labfbo.protocols.base.SiteData(SPACE, X, -X.sum(1), None, np.zeros((0, 2)))
    stale = site.answer(VoteRequest(cohort={"a": PUBLIC["b"], "b": PUBLIC["b"]}), data, 0)
    assert isinstance(stale, PublicKeyShare) and stale.public_key == PUBLIC["a"]
    alone = site.answer(VoteRequest(cohort={"a": PUBLIC["a"]}), data, 0)
    assert alone.kind == "abstain" and "no other site" in alone.reason
    assert site.answer(VoteRequest(), data, 0).kind == "abstain"  # an unsealed coordinator
    assert site.declare_release("secagg_public_key", 0, None, False, None) is None  # key material is no release


def test_a_recipient_leaves_out_a_vote_that_does_not_open_or_is_not_the_voters_row() -> None:
    design = np.random.default_rng(0).random((3, 2, 2))
    site = VoteSite(SPACE, VoteOptions(), SiteContext(site="c", site_index=2, n_sites=3, key_seed=KEYS["c"],
                                                      study_design=design))
    cohort = {s: PUBLIC[s] for s in "abc"}
    good = seal_vote(OptimumVote(index=1, codebook=6).model_dump(), 0, "a", KEYS["a"], cohort, "st", 0)
    foreign = seal_vote(OptimumVote(index=0, codebook=6).model_dump(), 1, "b", KEYS["b"], cohort, "st", 0)  # a's row
    tally = relay({"a": good.model_copy(update={"round": 0}), "b": foreign.model_copy(update={"round": 0})},
                  ["a", "b", "c"])["c"].model_copy(update={"study": "st"})
    with pytest.warns(UserWarning, match=r"ignoring the sealed votes of \['b'\]"):
        counted = site.open(tally)
    assert counted is not None and counted.counts.numpy().tolist() == [0, 1, 0, 0, 0, 0]
    with pytest.warns(UserWarning, match="does not authenticate"):
        assert site.open(tally.model_copy(update={"study": "another study"})) is None
    assert context("st", 0) != context("st", 1)


@pytest.mark.integration  # multi-site campaigns
def test_sealing_changes_no_proposal() -> None:
    runs = [labfbo.simulate("branin", protocol="vote", n_sites=3, n_init=4, budget=3, seed=0, num_restarts=2,
                            raw_samples=64, sealed=flag) for flag in (True, False)]
    assert np.array_equal(runs[0].proposals, runs[1].proposals)


def test_the_coordinator_of_a_sealed_campaign_holds_no_vote() -> None:
    names = ["a", "b", "c"]
    coord = labfbo.Coordinator("vote", sites=names, seed=2, horizon=3)
    sites = {s: labfbo.Optimizer(SPACE, protocol="vote", coordinator=coord, site=s, seed=2, n_init=3, horizon=3,
                                 privacy=labfbo.DP(epsilon=2.0), num_restarts=2, raw_samples=64) for s in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(5):
            trials = {s: o.ask() for s, o in sites.items()}
            for s, t in trials.items():
                sites[s].tell(t, float(sum((v - 0.3) ** 2 for v in t.params.values())))
    sent = [m for o in sites.values() for m in o.ledger.sent]
    assert not any(isinstance(m, OptimumVote) for m in sent)
    assert sum(isinstance(m, SealedVote) for m in sent) == 3
    assert all(o.epsilon() <= 2.0 for o in sites.values())


def test_a_vote_is_sealed_again_for_a_newcomer_without_a_new_release() -> None:
    """Under a budget a site votes once; a site that joins later gets that same vote, sealed for it."""
    design = np.random.default_rng(0).random((4, 3, 2))
    opts = VoteOptions(privacy=labfbo.DP(epsilon=2.0, noise_multiplier=0.5))
    site = VoteSite(SPACE, opts, SiteContext(site="a", n_sites=4, horizon=10, secret=3, key_seed=KEYS["a"],
                                             study_design=design))
    X = np.random.default_rng(1).random((4, 2))
    data = labfbo.protocols.base.SiteData(SPACE, X, -X.sum(1), None, np.zeros((0, 2)))
    three = {s: PUBLIC[s] for s in "abc"}
    first = site.answer(VoteRequest(cohort=three, study="st"), data, 0).model_copy(update={"round": 0, "study": "st"})
    assert isinstance(first, SealedVote) and first.resealed_from is None and site.release(first) is not None
    site.sent(first)  # it left (accounted): the vote to seal again for newcomers
    assert site.answer(VoteRequest(cohort=three, study="st"), data, 1).kind == "abstain"  # nobody new: nothing
    again = site.answer(VoteRequest(cohort={**three, "d": PUBLIC["d"]}, study="st"), data, 2)
    assert isinstance(again, SealedVote) and again.resealed_from == 0 and set(again.sealed) == {"b", "c", "d"}
    assert site.release(again) is None  # the same randomized response: post-processing, no new release
    site.sent(again)
    rekeyed_c = secagg.public_key(b"\x07" * 32)  # c came back with a new key: sealed again for it
    assert site.answer(VoteRequest(cohort={**three, "c": rekeyed_c, "d": PUBLIC["d"]}, study="st"), data,
                       3).resealed_from == 0
    # past the window (10 rounds) no reseal: that round is a release round, so a fresh vote (a new release)
    assert site.answer(VoteRequest(cohort={**three, "e": PUBLIC["d"]}, study="st"), data, 10).resealed_from is None
    site.sent(labfbo.core.messages.Abstain(reason="declined by the site's operator"))  # that one did not leave
    late = site.answer(VoteRequest(cohort={**three, "f": PUBLIC["d"]}, study="st"), data, 11)
    assert late.kind == "abstain"  # the round-0 vote's window is over, and the round-10 vote never left
    again = again.model_copy(update={"round": 2, "study": "st"})
    said = {}
    for who, msg in (("b", first), ("d", again)):
        tally = relay({"a": msg}, ["a", who])[who].model_copy(update={"study": "st"})
        said[who] = open_votes(tally, who, KEYS[who])["a"]
    assert said["b"] == said["d"]
    agg = VoteAggregator(opts, ["a", "b", "c", "d"], 0, 10, SPACE)
    agg.keys = dict(PUBLIC)
    agg.asking_keys = False
    agg.on_responses(0, {"a": first})
    agg.on_responses(2, {"a": again})
    assert agg.reuse.held["a"] == (0, again)  # held for the first release's window, not a new one


def test_a_vote_that_did_not_leave_is_never_sealed_again() -> None:
    """A vote the operator declined or the budget withheld (an abstention left instead) is forgotten."""
    design = np.random.default_rng(0).random((4, 3, 2))
    site = VoteSite(SPACE, VoteOptions(privacy=labfbo.DP(epsilon=2.0, noise_multiplier=0.5)),
                    SiteContext(site="a", n_sites=4, horizon=10, secret=3, key_seed=KEYS["a"], study_design=design))
    X = np.random.default_rng(1).random((4, 2))
    data = labfbo.protocols.base.SiteData(SPACE, X, -X.sum(1), None, np.zeros((0, 2)))
    three = {s: PUBLIC[s] for s in "abc"}
    assert isinstance(site.answer(VoteRequest(cohort=three, study="st"), data, 0), SealedVote)
    site.sent(labfbo.core.messages.Abstain(reason="declined by the site's operator"))
    assert site.answer(VoteRequest(cohort={**three, "d": PUBLIC["d"]}, study="st"), data, 1).kind == "abstain"


def _site_c_asked(**request: object) -> tuple[VoteSite, dict[str, str]]:
    """Site c of a, b, c after its vote request (``request``'s extra fields), and the cohort's keys."""
    design = np.random.default_rng(0).random((3, 2, 2))
    site = VoteSite(SPACE, VoteOptions(), SiteContext(site="c", site_index=2, n_sites=3, key_seed=KEYS["c"],
                                                      study_design=design))
    X = np.random.default_rng(1).random((4, 2))
    data = labfbo.protocols.base.SiteData(SPACE, X, -X.sum(1), None, np.zeros((0, 2)))
    cohort = {s: PUBLIC[s] for s in "abc"}
    site.answer(VoteRequest(cohort=cohort, study="st", **request), data, 0)
    return site, cohort


def test_a_vote_under_a_key_the_site_was_not_given_is_left_out() -> None:
    """A recipient holds the voters' keys from its own vote request: an envelope with another key (a
    coordinator sealing in a site's name) is refused."""
    site, cohort = _site_c_asked()
    mallory = bytes([42]) * 32
    forged = seal_vote(OptimumVote(index=1, codebook=6).model_dump(), 0, "a", mallory,
                       {**cohort, "a": secagg.public_key(mallory)}, "st", 0).model_copy(update={"round": 0})
    tally = relay({"a": forged}, ["a", "b", "c"])["c"].model_copy(update={"study": "st"})
    with pytest.warns(UserWarning, match="a key other than the cohort's"):
        assert site.open(tally) is None


def test_a_peer_cannot_cast_a_vote_for_another_sites_rows() -> None:
    """b seals a vote that names a's row and claims a's roster index: the recipient knows the roster
    from its request, so the index inside must be that of the site that sealed it."""
    site, cohort = _site_c_asked(roster=["a", "b", "c"])
    honest = seal_vote(OptimumVote(index=3, codebook=6).model_dump(), 1, "b", KEYS["b"], cohort, "st", 0)
    posing = seal_vote(OptimumVote(index=1, codebook=6).model_dump(), 0, "b", KEYS["b"], cohort, "st", 0)
    for vote, kept in ((honest, [0, 0, 0, 1, 0, 0]), (posing, None)):
        tally = relay({"b": vote.model_copy(update={"round": 0})}, ["a", "b", "c"])["c"].model_copy(
            update={"study": "st"})
        if kept is None:
            with pytest.warns(UserWarning, match=r"ignoring the sealed votes of \['b'\]"):
                assert site.open(tally) is None
        else:
            assert site.open(tally).counts.numpy().tolist() == kept
    agg = labfbo.protocols.vote.protocol.VoteAggregator(VoteOptions(), ["a", "b", "c"], 0, 3, SPACE)
    assert agg.sealed.request({}).roster == ["a", "b", "c"]


def test_a_restarted_voter_remembers_its_vote_from_the_journaled_release() -> None:
    """The journaled release states the reported row; a site logic resumed from it does not vote
    again and seals that same vote for a newcomer, still without a new release."""
    design = np.random.default_rng(0).random((4, 3, 2))
    opts = VoteOptions(privacy=labfbo.DP(epsilon=2.0, noise_multiplier=0.5))

    def fresh() -> VoteSite:
        return VoteSite(SPACE, opts, SiteContext(site="a", n_sites=4, horizon=10, secret=3, key_seed=KEYS["a"],
                                                 study_design=design))

    X = np.random.default_rng(1).random((4, 2))
    data = labfbo.protocols.base.SiteData(SPACE, X, -X.sum(1), None, np.zeros((0, 2)))
    three = {s: PUBLIC[s] for s in "abc"}
    site = fresh()
    first = site.answer(VoteRequest(cohort=three, study="st"), data, 0).model_copy(update={"round": 0, "study": "st"})
    release = site.release(first)
    site.sent(first)
    voted = open_votes(relay({"a": first}, ["a", "b"])["b"].model_copy(update={"study": "st"}), "b", KEYS["b"])["a"]
    assert release is not None and release.reported == voted[0]["index"]
    restarted = fresh()
    restarted.resume([release])
    again = restarted.answer(VoteRequest(cohort={**three, "d": PUBLIC["d"]}, study="st"), data, 2)
    assert isinstance(again, SealedVote) and again.resealed_from == 0 and restarted.release(again) is None
    again = again.model_copy(update={"round": 2, "study": "st"})
    assert open_votes(relay({"a": again}, ["a", "d"])["d"].model_copy(update={"study": "st"}), "d",
                      KEYS["d"])["a"] == voted
    restarted.sent(again)
    four = {**three, "d": PUBLIC["d"]}
    assert restarted.answer(VoteRequest(cohort=four, study="st"), data, 3).kind == "abstain"  # sealed for all
    assert restarted.answer(VoteRequest(cohort=four, study="st"), data, 10).resealed_from is None  # a new vote's turn
    for bad in ({"reported": 5}, {"pure_epsilon": 1.0}):  # not one of its rows; not what these options release
        other = fresh()
        with pytest.warns(UserWarning, match="will not seal its round-0 vote again"):
            other.resume([release.model_copy(update=bad)])
        assert other.answer(VoteRequest(cohort=four, study="st"), data, 2).kind == "abstain"  # nor vote again


@pytest.mark.integration  # multi-site campaigns
def test_a_restarted_vote_site_proposes_what_the_uninterrupted_one_did(tmp_path) -> None:
    """Under a budget a site votes once; restarted from its journal it neither tries again (no
    withheld record) nor changes anyone's proposals."""
    names = ["a", "b", "c"]

    def campaign(restart_at: int | None) -> tuple[dict, dict]:
        coord = labfbo.Coordinator("vote", sites=names, seed=1, horizon=8)
        run = tmp_path / f"r{restart_at}"
        run.mkdir()

        def site(s: str) -> labfbo.Optimizer:
            return labfbo.Optimizer(SPACE, protocol="vote", coordinator=coord, site=s, seed=1, n_init=3, horizon=8,
                                    privacy=labfbo.DP(epsilon=2.0), storage=str(run / f"{s}.jsonl"), num_restarts=2,
                                    raw_samples=64, secret=names.index(s) + 11)  # the same randomized responses

        sites = {s: site(s) for s in names}
        proposed = {s: [] for s in names}
        for r in range(6):
            if r == restart_at:
                sites["a"].close()
                sites["a"] = site("a")
            trials = {s: opt.ask() for s, opt in sites.items()}
            for s, trial in trials.items():
                proposed[s].append(trial.params)
                sites[s].tell(trial, (trial.params["x"] - 0.3) ** 2 + (trial.params["y"] - 0.6) ** 2)
        budget = sites["a"].privacy_budget()
        budget["resealed"] = [m.resealed_from for m in sites["a"].ledger.sent if isinstance(m, SealedVote)]
        budget["journaled"] = [r.reported for r in sites["a"].releases()]
        for opt in sites.values():
            opt.close()
        return proposed, budget

    plain, _ = campaign(None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, budget = campaign(4)
    assert resumed == plain
    assert not [w for w in caught if "budget spent" in str(w.message)]
    assert budget["releases"] == 1 and budget["withheld"] == 0 and not budget["exhausted"]
    assert budget["journaled"][0] is not None  # the vote left before the restart, its row journaled
    assert budget["resealed"] == [0]  # the restarted process sealed that round-0 vote again, once, not a new one
