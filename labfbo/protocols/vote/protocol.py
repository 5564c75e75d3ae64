r"""Protocol ``vote``: each site says, in a few bits, where it believes the optimum lies.

Not from one of the seed papers: it is the mechanism for a small privacy budget. Under
task-level DP a site's whole dataset is the unit protected, so at :math:`\varepsilon \approx 2`
for a campaign every continuous release (scores, beliefs, statistics) is mostly noise
(``docs/benchmarks/privacy.md``). A *choice among a few public options* is different: k-ary
randomized response (:mod:`labfbo.privacy.randomized_response`) reports it truthfully with
probability :math:`e^{\varepsilon}/(e^{\varepsilon} + k - 1)` — 65 % for 5 options at
:math:`\varepsilon = 2` — and costs exactly :math:`\varepsilon`, with no :math:`\delta`.

**The codebook** (public, :func:`choice_set`). By default (``codebook="design"``) the
study's collaborative design: the :math:`B = n \cdot n_0` points :math:`c_1..c_B` the
coordinator deals to the :math:`n` sites as their initial designs, which every site computes
from the study's seed (:func:`labfbo.space.design.study_design`); site :math:`i` may name only the
:math:`n_0` rows :math:`R_i` dealt to it. With ``codebook=B``: :math:`B` scrambled Sobol
points of the unit cube, snapped to the space, from a seed that is a function of the search
space (:func:`codebook`), any of which a site may name. None of the points depends on
anyone's data.

**Site → coordinator** (:class:`OptimumVote`, one integer). In a release round the site
votes for the point of :math:`R_i` its local GP's posterior mean ranks best,
:math:`b_i = \arg\max_{b \in R_i} \mu_i(c_b)`; with ``privacy`` it reports :math:`b_i` by
randomized response over :math:`R_i` (:math:`k = |R_i|`) at the per-vote
:math:`\varepsilon_v` (a campaign budget :math:`\varepsilon` over :math:`V` planned votes,
composed by the PLD accountant; one vote under a budget: :math:`\varepsilon_v = \varepsilon`).

**Sealed** (``sealed=True``, the default; :mod:`labfbo.protocols.vote.sealed`): the vote is
encrypted for each other site and the coordinator only relays it; each site counts the votes
it opens as below. Otherwise:

**Coordinator** (:func:`tallies`). Each site gets the other sites' votes counted per
codebook point, :math:`n_{-i,b} = \#\{j \ne i: b_j = b\}` (:class:`VoteTally`): its own vote
is never sent back, and nothing says who voted for what. When votes were randomized the
tally also carries each point's *evidence* :math:`e_{-i,b} = \sum_{j \ne i: b_j = b} q_j`:
a randomized response is the truth with probability
:math:`q = (e^{\varepsilon_v} - 1)/(e^{\varepsilon_v} + k - 1)` and otherwise a uniform draw
of the :math:`k` points (a vote without DP has :math:`q = 1`).

**Site proposal.** The tally becomes a location prior spread over the named codebook
cells (:class:`labfbo.models.priors.CellPrior`: :math:`V_b` the volume of :math:`c_b`'s Voronoi
cell, :math:`a_b` a soft assignment to it), the randomized votes' untruthful share left
uniform (:math:`N = \sum_b n_{-i,b}`, :math:`E = \sum_b e_{-i,b}`):

.. math:: \tilde\pi_i(u) = (1 - \epsilon)\frac{E}{N}\sum_b \frac{e_{-i,b}}{E}\,
          \frac{a_b(u)}{V_b} + 1 - (1 - \epsilon)\frac{E}{N},

and the site maximizes its acquisition on its local GP weighted by
:math:`\tilde\pi_i^{\gamma_t}` — labfbo's expert-prior machinery (:mod:`labfbo.models.priors`): the
decay or πBO exponent, the uniform floor :math:`\epsilon` (``prior_floor``), and the
falsification and patience rules that drop a prior the site's own data contradict, which is
what protects a site from the others' false votes (a randomized response, or a different
optimum). With ``trust="agreement"`` (the default) :math:`\gamma_t` is further multiplied by
:math:`P = \Phi(\hat c/\mathrm{se}(\hat c))`, :math:`\hat c` the GLS slope of the site's results on
:math:`\log\tilde\pi_i` at its experiments (:func:`labfbo.models.transfer.guidance_agreement`): a
site that does worse where the votes point weighs them less. A vote says "nearer this point
than any other", so the prior is uniform over that cell rather than a bump at the point,
which in higher dimensions lies far from where the optimum is.

**Fewer releases** (``release_every=k``): a site votes in rounds :math:`t \equiv 0 \pmod k`
and the coordinator reuses its last vote for :math:`k - 1` rounds (post-processing). By
default a site votes every round, and under a campaign budget ``DP(epsilon=...)`` once
(:math:`k = T`), in the first round it can (round 0, or when it joins or has two
observations): the whole budget buys the one vote the others need most, before their own
data can locate anything.
"""

from __future__ import annotations

import math
import warnings
from typing import Annotated, Any, Iterable, Literal, Mapping, Sequence

import numpy as np
import torch
from pydantic import Field, model_validator
from scipy.stats import qmc

from labfbo.core.exceptions import ConfigurationError, Inadmissible
from labfbo.core.messages import Abstain, Array, Message
from labfbo.core.release import Release
from labfbo.core.seeding import int_seed
from labfbo.models.gp import predict
from labfbo.models.priors import CellPrior, prior_exponent
from labfbo.models.transfer import guidance_agreement
from labfbo.privacy import DP, secagg
from labfbo.privacy.randomized_response import respond
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.held import HeldReleases, ReusesReleases
from labfbo.protocols.independent import LocalGPSite, ModelOptions
from labfbo.protocols.secure_sum import KeyRequest, PublicKeyShare
from labfbo.protocols.vote.messages import MAX_CODEBOOK, OptimumVote, VoteRequest, VoteTally
from labfbo.protocols.vote.sealed import SealedRelay, SealedTally, SealedVote, open_votes, seal_vote
from labfbo.space.search import SearchSpace


# -- options -------------------------------------------------------------------------------
class VoteOptions(ModelOptions):
    """``vote``: the shared acquisition, surrogate and prior-weighting options, plus the vote's own."""

    prior_mode: Literal["decay", "pibo"] = Field("pibo", description="the votes' prior weighs the acquisition "
                                                 "with exponent beta/n (piBO: the site's own data take over as they "
                                                 "grow); 'decay': PMCBO's slowly decaying exponent")
    codebook: Annotated[int, Field(ge=2, le=MAX_CODEBOOK)] | Literal["design"] = Field(
        "design", description="'design': the study's collaborative design is the codebook, and each site votes "
        "among the n_init rows it was dealt; or B: public Sobol points every site votes among")
    release_every: int | None = Field(None, ge=1, description="k: vote only in rounds t with t % k == 0 "
                                      "(ceil(T/k) votes; the coordinator reuses a vote in between). None: every "
                                      "round, or under a campaign budget DP(epsilon=...) once, in round 0")
    privacy: DP | None = Field(None, description="randomized response on the vote; for this protocol "
                               "noise_multiplier is 1 / (each vote's epsilon)")
    trust: Literal["agreement", "off"] = Field("agreement", description="agreement: the prior's exponent times the "
                                              "probability that the lab's results are better where the votes' prior "
                                              "is denser (labfbo.models.transfer.guidance_agreement), so a lab unlike "
                                              "its partners falls back to its local GP; off: the exponent alone")
    sealed: bool = Field(
        True,
        description="seal each vote for the other sites (X25519 + ChaCha20-Poly1305): the "
        "coordinator relays votes it cannot read (labfbo.protocols.vote.sealed); False: it counts them",
    )

    @model_validator(mode="after")
    def _federated_prior(self) -> "VoteOptions":
        if self.prior:
            raise ValueError("the vote protocol builds each site's location prior from the other sites' votes; "
                             "an expert prior cannot be combined with it")
        if self.acquisition == "ts":
            raise ValueError("the vote's prior weighs ucb, ei or nei; not Thompson sampling")
        return self


def codebook(space: SearchSpace, size: int) -> np.ndarray:
    """The study's public codebook: ``size`` scrambled Sobol points of the unit cube, snapped to
    the space, from a seed that is a function of the space alone. Never a sample of the feasible
    set: a site's own nonlinear constraints would then give it other points than the others'."""
    shared = space.shared()  # not a lab's stock: every lab names the same points
    seed = int_seed(int(shared.fingerprint()[:15], 16), 0, 0, "vote-codebook")
    m = int(np.ceil(np.log2(max(size, 2))))
    return shared.snap(qmc.Sobol(space.dim, scramble=True, seed=np.random.default_rng(seed)).random_base2(m)[:size])


def choice_set(space: SearchSpace, size: int | str, context: Any) -> tuple[np.ndarray | None, np.ndarray]:
    """The codebook's points and the indices of those the site of ``context`` may name: all ``size`` Sobol
    points; or with ``"design"`` the study's collaborative design (None when the site cannot
    know it) and the rows dealt to this site."""
    if size != "design":
        return codebook(space, int(size)), np.arange(int(size))
    design = context.study_design
    if design is None or design.shape[1] < 2:  # one dealt row is no choice: nothing to vote on
        return None, np.zeros(0, dtype=int)
    n_init = design.shape[1]
    if design.shape[0] * n_init > MAX_CODEBOOK:
        raise ConfigurationError(f"vote: the study's design has {design.shape[0] * n_init} rows, more than a "
                                 f"vote can name ({MAX_CODEBOOK}); use codebook=B (public Sobol points)")
    return design.reshape(-1, space.dim), context.site_index * n_init + np.arange(n_init)


VOTE_MECHANISM = ("randomized response over the public codebook (labfbo.privacy.randomized_response): "
                  "pure epsilon-DP per vote")


def vote_epsilon(dp: DP) -> float:
    """The per-vote epsilon of ``dp``: the inverse of its noise multiplier (``inf`` for 0)."""
    return math.inf if not dp.sigma else 1.0 / dp.sigma


class VoteSite(LocalGPSite):
    """Votes for a codebook point; proposes with the others' votes as a location prior."""

    uses_study_design = True  # the Optimizer computes the study's design into the context only for such logic

    def __init__(self, space, options, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(space, options, context)
        spec = context.outcomes
        if spec is not None and (spec.constraints or spec.multi):
            raise ConfigurationError("the vote protocol weighs one objective's acquisition by the others' votes; "
                                     "it does not support outcome constraints or several objectives yet")
        self.points, self.mine = choice_set(space, options.codebook, context)
        if self.points is None and context.n_sites > 1:
            warnings.warn(f"vote: site {context.site!r} cannot know the study's collaborative design (it needs the "
                          "coordinator's design: n_init >= 2 and a coordinator that states its seed), so it will not "
                          "vote; give n_init, or codebook=B on every site for a public Sobol codebook", stacklevel=2)
        self._vote_prior: CellPrior | None = None
        self._voted: int | None = None  # the round of this process's last vote
        # sealed: the last vote that left and its round, to seal again for newcomers, and the keys it was sealed for
        self._last_vote: tuple[OptimumVote, int] | None = None
        self._sealed_for: dict[str, str] = {}
        self._pending: tuple[tuple[OptimumVote, int], dict[str, str]] | None = None  # answered, until it leaves
        self._cohort: dict[str, str] = {}  # the keys of the last vote request: whom a sealed vote may come from
        self._roster: list[str] = []  # the study's sites in roster order (sealed votes): whose rows a vote may name

    @property
    def buckets(self) -> int:
        """k of the randomized response: how many codepoints this site chooses among (>= 2 whenever it
        can vote; 2 for the plan of a site that cannot, which never releases)."""
        return max(len(self.mine), 2)

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if isinstance(request, KeyRequest):
            return PublicKeyShare(public_key=secagg.public_key(self.context.key_seed))
        if not isinstance(request, VoteRequest):
            return super().answer(request, data, round)
        o, k = self.options, self.schedule(self.context.horizon)
        if self.points is None:
            return Abstain(reason="codebook='design' needs the study's collaborative design: join the coordinator "
                                  "and start from the design it deals")
        if o.sealed and (refusal := self._check_cohort(request.cohort)):
            return refusal
        self._cohort = dict(request.cohort or {})
        self._roster = list(request.roster or [])
        if not self.release_round(round, k):
            if o.sealed and (again := self._reseal(request, round)) is not None:
                return again
            return Abstain(reason=f"not a release round (release_every={k})")
        if data.n < 2:
            return Abstain(reason="fewer than two observations")
        self._voted = round
        mean, _ = predict(self.local_model(data), self.points[self.mine])
        choice = int(np.argmax(mean))
        dp: DP | None = o.privacy
        if dp is not None and dp.sigma:  # the site-private stream, keyed by the data it protects
            choice = respond(choice, self.buckets, vote_epsilon(dp),
                             self.noise_rng(round, "dp-vote", data.digest()))
        vote = self._vote(int(self.mine[choice]))
        if not o.sealed:
            return vote
        return self._seal((vote, round), request.study, round)

    def _vote(self, index: int) -> OptimumVote:
        """The vote for codepoint ``index``, stating its DP settings and schedule."""
        dp, k = self.options.privacy, self.schedule(self.context.horizon)
        noised = dp is not None and bool(dp.sigma)
        return OptimumVote(index=index, codebook=len(self.points),
                           dp_noise_multiplier=dp.sigma if noised else None,  # type: ignore[union-attr]
                           choices=self.buckets if noised else None, release_every=None if k == 1 else k)

    def resume(self, releases: Sequence[Release]) -> None:
        """After a restart, the journal's last vote: not voted again before its schedule says
        (:meth:`release_round`), and sealed again for newcomers within its window from the index
        the site journaled (``Release.reported``), as the uninterrupted site would."""
        super().resume(releases)
        votes = [r for r in releases if r.message in ("optimum_vote", "sealed_vote")]
        if not votes:
            return
        last = votes[-1]
        self._voted = last.round
        if not self.options.sealed or self.points is None or last.reported is None:
            return
        vote = self._vote(int(last.reported)) if last.reported in self.mine else None
        now = None if vote is None else self.declare_release(last.message, last.round, None,
                                                             vote.dp_noise_multiplier is not None, None)
        same = now is not None and all(getattr(now, f) == getattr(last, f)
                                       for f in ("buckets", "pure_epsilon", "noise_multiplier"))
        if vote is None or not same:
            warnings.warn(f"vote: site {self.context.site!r} will not seal its round-{last.round} vote again for "
                          "newcomers: the journaled release is not one of its own rows under these privacy "
                          "options", stacklevel=2)
            return
        self._last_vote = (vote, last.round)

    def _reseal(self, request: VoteRequest, round: int) -> SealedVote | None:
        """The last vote that left, sealed again while it stands (``release_every``'s window) for a cohort
        with a member it was not sealed for, or with another key (a site that joined later or rekeyed):
        the same randomized response, already accounted, so no new release (:meth:`release`)."""
        if self._last_vote is None:
            return None
        voted, k = self._last_vote[1], self.schedule(self.context.horizon)
        if round >= voted + k or all(self._sealed_for.get(s) == key for s, key in self._cohort.items()
                                     if s != self.context.site):
            return None
        return self._seal(self._last_vote, request.study, round).model_copy(update={"resealed_from": voted})

    def _seal(self, vote: tuple[OptimumVote, int], study: str, round: int) -> SealedVote:
        """``vote`` (and the round it was made) sealed for this round's cohort; pending until it leaves."""
        self._pending = (vote, dict(self._cohort))
        return seal_vote(vote[0].model_dump(), self.context.site_index, self.context.site, self.context.key_seed,
                         self._cohort, study, round)

    def sent(self, message: Message) -> None:
        """A sealed vote that left is the one to seal again for newcomers; one the operator declined or
        the budget withheld (an abstention went instead) is forgotten."""
        if isinstance(message, SealedVote) and self._pending is not None:
            self._last_vote, self._sealed_for = self._pending
        self._pending = None

    def release(self, message: Message) -> Release | None:
        """A vote sealed again (``resealed_from``) repeats a randomized response that left and was
        accounted before (:meth:`sent`): post-processing, no new release. Everything else as declared."""
        if isinstance(message, SealedVote) and message.resealed_from is not None:
            return None
        out = super().release(message)
        vote = message if isinstance(message, OptimumVote) else None
        if isinstance(message, SealedVote) and self._pending is not None and self._pending[0][1] == message.round:
            vote = self._pending[0][0]  # what the tokens say
        return out if out is None or vote is None else out.model_copy(update={"reported": vote.index})

    def _check_cohort(self, cohort: Mapping[str, str] | None) -> Message | None:
        """Why this site cannot seal a vote for ``cohort`` (the answer to send instead), or None."""
        me, mine = self.context.site, secagg.public_key(self.context.key_seed)
        if cohort is None:
            return Abstain(reason="sealed votes need the cohort's public keys (a coordinator with sealed=False?)")
        if cohort.get(me) != mine:  # the coordinator holds no key of ours, or an old one
            return PublicKeyShare(public_key=mine)
        if len(cohort) < 2:
            return Abstain(reason="no other site to seal a vote for")
        return None

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        """A vote under DP is one randomized response over ``codebook`` options at ``1 / sigma``.

        The same under ``DP(unit="experiment")``: one experiment (a new best result) can flip the
        site's argmax, so experiment level is site level for a vote — the same response, the same
        epsilon, stated by the release (:meth:`Release.randomized_response`)."""
        dp = self.options.privacy
        if kind == "secagg_public_key":  # key material: nothing computed from the data
            return None
        if kind not in ("optimum_vote", "sealed_vote") or not noised or dp is None:
            return super().declare_release(kind, round, step, noised, sensitivity)
        return Release.randomized_response(kind, round, dp, VOTE_MECHANISM, buckets=self.buckets,
                                           epsilon=vote_epsilon(dp), step=step)

    def schedule(self, horizon: int | None) -> int:
        """``k``: ``release_every``, or by default every round (1) — under a campaign budget one vote
        a campaign (``k = horizon``), in the first round the site can (:meth:`release_round`): early,
        where the others' votes help most, and as truthful as the budget can buy."""
        o = self.options
        if o.release_every is not None:
            return int(o.release_every)
        budgeted = o.privacy is not None and o.privacy.epsilon is not None
        return max(int(horizon), 1) if budgeted and horizon else 1

    def release_round(self, round: int, k: int) -> bool:
        """Whether to vote in ``round``: ``round % k == 0`` with ``release_every=k``; by default under
        a budget, the first round this site can (a late joiner, or one without two observations in
        round 0, votes when it can), and again ``k`` rounds after its last vote."""
        if self.options.release_every is not None or k == 1:
            return round % k == 0
        return self._voted is None or round >= self._voted + k

    def planned_releases(self, horizon: int) -> dict[str, int]:
        """One vote in each round ``t < horizon`` with ``t % k == 0`` (:meth:`schedule`): ``ceil(horizon / k)``."""
        kind = "sealed_vote" if self.options.sealed else "optimum_vote"
        return {kind: -(-horizon // self.schedule(horizon))}

    def prior(self, tally: VoteTally) -> CellPrior | None:
        r"""The others' votes as a prior over the named codebook cells (None without votes or for
        another codebook). Randomized votes count by their truth weight q and leave the rest of
        their mass uniform: :math:`N` votes of evidence :math:`E = \sum q` give the cells
        weight :math:`E/N` and the uniform floor :math:`1 - (1 - \epsilon) E / N`."""
        counts = tally.counts.numpy().astype(float)
        if self.points is None or len(counts) != len(self.points) or counts.sum() <= 0:
            return None
        weights = counts if tally.evidence is None else tally.evidence.numpy().astype(float)
        if not weights.sum() > 0:
            return None
        floor = 1.0 - (1.0 - self.options.prior_floor) * min(weights.sum() / counts.sum(), 1.0)
        return CellPrior(self.space, self.points, weights, floor=floor)

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        if isinstance(guidance, SealedTally):
            guidance = self.open(guidance)
        self._vote_prior = self.prior(guidance) if isinstance(guidance, VoteTally) else None
        return self.propose_local(data, n, round)

    def open(self, tally: SealedTally) -> VoteTally | None:
        """The sealed votes this site can open and use, counted (None without any): a vote over
        another codebook, or naming a design row not dealt to its voter, is left out with a warning."""
        if self.points is None:
            return None
        n_init = len(self.mine) if self.options.codebook == "design" else None
        kept, stray = {}, []
        forged = [e.sender for e in tally.votes if self._cohort and self._cohort.get(e.sender) != e.public_key]
        if forged:  # a voter's key must be the one the coordinator stated in this site's own request
            warnings.warn(f"vote: ignoring the sealed votes of {sorted(forged)} (a key other than the cohort's)",
                          stacklevel=2)
            tally = tally.model_copy(update={"votes": [e for e in tally.votes if e.sender not in forged]})
        for sender, (fields, voter) in open_votes(tally, self.context.site, self.context.key_seed).items():
            try:
                vote = OptimumVote(**fields)
            except ValueError:
                stray.append(sender)
                continue
            own_index = self._roster.index(sender) if sender in self._roster else voter
            if (vote.codebook != len(self.points) or voter != own_index
                    or (n_init is not None and vote.index // n_init != voter)):
                stray.append(sender)  # (a vote sealed by one site for another site's rows, too)
            else:
                kept[sender] = vote
        if stray:
            warnings.warn(f"vote: ignoring the sealed votes of {sorted(stray)} (not over this site's codebook of "
                          f"{len(self.points)} points, or not a row dealt to the site that sealed it)", stacklevel=2)
        return count_votes(kept.values(), len(self.points)) if kept else None

    def prior_weight(self, data: SiteData, round: int) -> tuple[Any, float] | None:
        prior = self._vote_prior
        if prior is None:
            return None
        gamma = prior_exponent(self.options, prior, round, data.X, data.y)  # type: ignore[arg-type]
        if gamma and self.options.trust == "agreement":
            density = prior.log_density(torch.as_tensor(data.X, dtype=torch.float64))
            gamma *= guidance_agreement(self.local_model(data), density)
        return prior, gamma


def count_votes(votes: Iterable[OptimumVote], size: int, randomized: bool | None = None) -> VoteTally:
    """The votes counted per codebook point, with their evidence when some were randomized
    (``randomized``: decided over a larger set of votes, so that every site's tally has the same form)."""
    votes = list(votes)
    randomized = any(v.dp_noise_multiplier is not None for v in votes) if randomized is None else randomized
    counts, evidence = np.zeros(size, dtype=np.int64), np.zeros(size)
    for v in votes:
        counts[v.index] += 1
        evidence[v.index] += v.truth_weight
    return VoteTally(counts=Array.of(counts, "int64"),
                     evidence=Array.of(np.minimum(evidence, counts)) if randomized else None)


def tallies(votes: Mapping[str, OptimumVote], sites: list[str], size: int) -> dict[str, VoteTally]:
    """Each site's tally of the *other* sites' votes."""
    randomized = any(v.dp_noise_multiplier is not None for v in votes.values())
    return {s: count_votes((v for o, v in votes.items() if o != s), size, randomized) for s in sites}


class VoteAggregator(ReusesReleases, Aggregator):
    """Counts the votes; reuses a vote sent with ``release_every = k > 1`` for the next ``k - 1`` rounds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kind = SealedVote if self.options.sealed else OptimumVote
        self.reuse: HeldReleases[Any] = HeldReleases(self.sites, kind, "vote")
        self.sealed = SealedRelay(self.sites, self.reuse,
                                  lambda cohort: VoteRequest(cohort=cohort, roster=list(self.sites))) \
            if self.options.sealed else None

    def admit(self, site: str, message: Message) -> Message:
        """A clear vote over the study's public codebook of ``codebook`` points (with ``"design"`` the
        size follows the sites' ``n_init``: checked per round). A vote weighs one count, whatever it says."""
        size = self.options.codebook
        if isinstance(message, OptimumVote) and size != "design" and message.codebook != int(size):
            raise Inadmissible(f"a vote over a codebook of {message.codebook} points; the study's has {size}")
        return message

    def open_round(self, t: int) -> Step:
        if self.sealed is not None:
            return self.sealed.open_round()
        return Exchange({s: VoteRequest() for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        if self.sealed is not None:
            return self.sealed.on_responses(t, responses)
        fresh = {s: m for s, m in responses.items() if isinstance(m, OptimumVote)}
        votes = self.reuse.merge(t, fresh)
        size = self.options.codebook
        if size == "design":  # the design's size follows the sites' n_init: the majority's is the study's
            votes = self._own_rows(votes, fresh)
            sizes = sorted(m.codebook for m in votes.values())
            size = max(sizes, key=sizes.count) if sizes else 2
        wrong = sorted(s for s, m in votes.items() if m.codebook != size)
        if wrong:
            if set(wrong) & set(fresh):
                warnings.warn(f"vote: ignoring the votes of {sorted(set(wrong) & set(fresh))} (not over this "
                              f"study's codebook of {size} points)", stacklevel=2)
            votes = {s: m for s, m in votes.items() if s not in wrong}
        return Finish(tallies(votes, self.sites, size) if votes else {})

    def state(self) -> dict[str, Any]:
        return {**self.reuse.state(), **(self.sealed.state() if self.sealed is not None else {})}

    def restore(self, state: dict[str, Any]) -> None:
        self.reuse.restore(state)
        if self.sealed is not None:
            self.sealed.restore(state)

    def _own_rows(self, votes: dict[str, OptimumVote], fresh: Mapping[str, Message]) -> dict[str, OptimumVote]:
        """The design votes that name one of the rows dealt to their voter (site ``i`` of ``n`` holds
        rows ``i*m .. (i+1)*m - 1`` of a design of ``n*m``); the others are left out, with a warning."""
        n = len(self.sites)
        own = {s: m for s, m in votes.items()
               if m.codebook % n == 0 and m.index // (m.codebook // n) == self.sites.index(s)}
        stray = sorted(set(fresh) & (set(votes) - set(own)))
        if stray:
            warnings.warn(f"vote: ignoring the votes of {stray} (not one of the design rows dealt to the voter)",
                          stacklevel=3)
        return own


class Vote(Protocol):
    """One vote per site on the public codebook's candidates (randomized response under a small budget)."""

    name = "vote"
    federated = True
    Options = VoteOptions
    site_logic = VoteSite
    aggregator = VoteAggregator
    shared_options = ("codebook", "sealed")
