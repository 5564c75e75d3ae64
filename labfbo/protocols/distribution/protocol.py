r"""Protocol ``distribution``: GUIDE-FBO — sites exchange beliefs over where optima lie.

One exchange per BO round :math:`t` (rounds count from 1 in the formulas; labfbo's
round index is :math:`t - 1`):

**Site → coordinator** (:class:`OptimumBelief`, :math:`2d + 2` scalars). From its local GP
the site draws :math:`M` posterior sample paths, takes each path's argmax over a shared
candidate set, fits a diagonal DPGMM to the :math:`M` optimum samples
(:mod:`labfbo.models.optimum_belief`) and uploads its top-weight component
:math:`(\pi, \mu, \operatorname{diag}\Sigma)` with the standardized value score

.. math:: v = \frac{\mu_{\mathcal D}(\mu) - \kappa\,\sigma_{\mathcal D}(\mu) - \bar y}{\hat\sigma_y}

(an LCB of the maximization-oriented objective, so for ``objective="minimize"`` it is the
standardized :math:`-\mathrm{UCB}`; larger is always better).

**Coordinator** (:func:`merge_components`, :func:`reweight`, :func:`draw_packets`).
Complete-linkage clustering of the centres with :math:`d_{\mathrm{RMS}}(a, b) = \lVert a -
b\rVert_2/\sqrt d` and threshold :math:`\delta_{\mathrm{merge}}` (scipy); each cluster is
moment-matched, keeping the diagonal:
:math:`\pi' = \sum\pi_n`, :math:`\mu' = \sum\pi_n\mu_n/\pi'`,
:math:`\sigma'^2 = \sum\pi_n(\sigma_n^2 + (\mu_n - \mu')^2)/\pi'`, and its value score is
the mass-weighted mean :math:`v' = \sum\pi_n v_n/\pi'`. Value-aware weights

.. math:: \omega_\ell = \operatorname{softmax}_\ell\big(\log\pi'_\ell + v'_\ell/\tau_t\big),
          \qquad \tau_t = \max(c\,\Delta v_t,\ \tau_{\min}),\quad \Delta v_t = \max_\ell v'_\ell - \min_\ell v'_\ell,

with :math:`c = 0.1`, :math:`\tau_{\min} = 0.01` (the authors' code; the paper leaves
:math:`\tau_t` adaptive to :math:`\Delta v_t`), computed with log-sum-exp. Each site then
gets an independent draw of :math:`\min(P, L_t)` components without replacement by
:math:`\omega` (keeping the global weights): :class:`GuidancePacket`, at most
:math:`P(2d + 1)` scalars.

**Site proposal.** The FI-GP (:mod:`labfbo.models.figp`) with
:math:`\lambda_t = \lambda_{\max}/\sqrt t` and the configured acquisition (UCB, EI, NEI
or TS; ``ask(n > 1)`` uses the q-acquisitions). Ablations of GUIDE's Table 3:
``belief="single_gaussian"``, ``value_reweighting=False``, ``merging=False``,
``agent_specific=False`` (one packet for all sites), ``spatial=False`` (uniform scaling
by the domain average of :math:`G`).

**Fewer releases** (``release_every=k``). A site uploads its belief only in rounds
:math:`t \equiv 0 \pmod k` (so :math:`\lceil T/k\rceil` releases over rounds
:math:`0..T-1`; a site without two observations in a release round waits for the next
one) and otherwise answers ``Abstain("not a release round (release_every=k)")``. The
belief states its ``k``; the coordinator reuses a site's last belief from round :math:`r`
in the rounds :math:`r < t < r + k` it did not send one (post-processing of a release: no
new privacy cost), so guidance goes on every round and is at most :math:`k - 1` rounds
stale. Under ``DP(epsilon=...)`` fewer releases compose to the budget with less noise each.

**A centre-only belief** (``dp_belief="centre"``, with ``privacy``): only :math:`\mu` (and
the choice probabilities) are noised and released, sensitivity :math:`\sqrt{d_o + 2d_c}`
instead of :math:`\sqrt{2d + 2}` (:mod:`labfbo.privacy.belief_dp`); weight 1, standard
deviation 0.1 and value 0 travel as public constants, so the coordinator's merged, reweighted
mixture is the unweighted mixture of the sites' centres (:math:`\omega \propto` sites per
cluster, as every :math:`v' = 0`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np
import torch
from pydantic import Field, model_validator
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist
from scipy.special import logsumexp

from labfbo.core.exceptions import Inadmissible
from labfbo.core.messages import Abstain, Array, Message
from labfbo.core.release import Release
from labfbo.core.seeding import rng
from labfbo.models.figp import FIGP, GuidanceField, guidance_strength
from labfbo.models.gp import predict
from labfbo.models.optimum_belief import Belief, candidate_set, choice_layout, fit_belief, optimum_samples
from labfbo.models.transfer import guidance_agreement
from labfbo.privacy import DP
from labfbo.privacy.belief_dp import (
    CENTRE_SD,
    CENTRE_VALUE,
    CENTRE_WEIGHT,
    centre_sensitivity,
    privatize_belief,
    privatize_centre,
    sensitivity as belief_sensitivity,
)
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.distribution.messages import BeliefRequest, GuidancePacket, OptimumBelief
from labfbo.protocols.held import HeldReleases, ReusesReleases
from labfbo.protocols.independent import LocalGPSite, ModelOptions


# -- options ------------------------------------------------------------------------------
class DistributionOptions(ModelOptions):
    """GUIDE-FBO options; defaults from the paper's Table 7."""

    M: int = Field(500, ge=2, description="posterior-optimum samples per site and round")
    candidates: int = Field(1024, ge=16, description="Sobol points of the shared candidate set")
    max_components: int = Field(10, ge=1, description="DPGMM truncation level")
    kappa: float = Field(1.0, ge=0.0, description="LCB coefficient of the value score")
    P: int = Field(5, ge=1, description="components per downlink packet")
    merge_threshold: float = Field(0.05, ge=0.0, description="RMS distance below which centres merge")
    lambda_max: float = Field(1.0, ge=0.0, description="maximum guidance strength")
    temperature_scale: float = Field(0.1, gt=0.0, description="tau_t = max(scale * range(v), floor)")
    min_temperature: float = Field(0.01, gt=0.0)
    belief: Literal["dpgmm", "single_gaussian"] = "dpgmm"
    value_reweighting: bool = True
    merging: bool = True
    agent_specific: bool = True
    spatial: bool = True
    privacy: DP | None = Field(None, description="Gaussian mechanism on the uplink (labfbo.privacy.belief_dp)")
    release_every: int = Field(1, ge=1, description="k: upload the belief only in rounds t with t % k == 0 "
                               "(ceil(T/k) releases; the coordinator reuses it in between)")
    trust: Literal["agreement", "off"] = Field("off", description="agreement: the guidance strength times the "
                                              "probability that the lab's results are better where the guidance field "
                                              "is higher (labfbo.models.transfer.guidance_agreement), so a lab unlike "
                                              "its partners falls back to its local GP; off: the paper's strength")
    dp_belief: Literal["full", "centre"] = Field("full", description="with privacy: release the whole belief "
                                                 "(sensitivity sqrt(2d+2)) or only its centre (sqrt(d_o + 2 d_c)), "
                                                 "weight, sd and value then being public constants")

    @model_validator(mode="after")
    def _centre_needs_dp(self) -> "DistributionOptions":
        if self.dp_belief == "centre" and self.privacy is None:
            raise ValueError(
                "dp_belief='centre' lowers the sensitivity of a DP release: it needs privacy=labfbo.DP(...)"
            )
        return self


# -- coordinator-side math ------------------------------------------------------------------
VALUE_BOUND = 3.0
"""The largest value score the coordinator takes from a belief (a standardized improvement: the
site's best predicted value less kappa sd, in standard deviations of its own results); beyond it a
score is clipped (under DP, to the clip C when larger), so one site cannot claim an unbounded
advantage in the value-aware reweighting."""

@dataclass(frozen=True)
class Components:
    """A pool of components (diagonal Gaussians on the ordered columns, choice probabilities
    on the categorical ones) with mixture masses and value scores."""

    weights: np.ndarray    # (L,)
    means: np.ndarray      # (L, d_o)
    variances: np.ndarray  # (L, d_o)
    values: np.ndarray     # (L,)
    probs: np.ndarray | None = None  # (L, sum of choice counts)
    cats: tuple[tuple[int, int, int], ...] = ()
    noise_sd: np.ndarray | None = None  # (L,): DP noise std per coordinate of the centre (None: no DP anywhere)

    def __len__(self) -> int:
        return int(len(self.weights))


def component_distances(c: Components) -> np.ndarray:
    r"""Condensed pairwise distances :math:`\sqrt{(\lVert\Delta\mu\rVert^2 + \sum_j
    \mathrm{TV}_j^2)/d}`: RMS over the columns, a categorical column contributing the total
    variation between the two choice distributions (1 for disjoint certain choices, as a
    unit-cube coordinate at most contributes 1)."""
    sq = pdist(c.means, "sqeuclidean") if c.means.shape[1] else np.zeros(len(c) * (len(c) - 1) // 2)
    for _, k, off in c.cats:
        sq = sq + (0.5 * pdist(c.probs[:, off:off + k], "cityblock")) ** 2  # type: ignore[index]
    return np.sqrt(sq / (c.means.shape[1] + len(c.cats)))


def merge_components(c: Components, threshold: float) -> Components:
    r"""Complete-linkage clusters (distance <= threshold), moment-matched per cluster (choice
    probabilities: the mass-weighted mean; the DP noise of the mass-weighted centre,
    :math:`\sqrt{\sum_i w_i^2 s_i^2} / W`)."""
    if len(c) < 2:
        return c
    Z = linkage(component_distances(c), method="complete")
    labels = fcluster(Z, t=threshold, criterion="distance")
    out: list[tuple[float, np.ndarray, np.ndarray, float, np.ndarray | None, float]] = []
    for lab in sorted(set(labels), key=lambda lb: int(np.argmax(labels == lb))):  # first-member order
        idx = np.nonzero(labels == lab)[0]
        w = c.weights[idx]
        W = float(w.sum())
        mu = (w[:, None] * c.means[idx]).sum(0) / W
        var = (w[:, None] * (c.variances[idx] + (c.means[idx] - mu) ** 2)).sum(0) / W
        probs = None if c.probs is None else (w[:, None] * c.probs[idx]).sum(0) / W
        noise = 0.0 if c.noise_sd is None else float(np.sqrt(np.sum((w * c.noise_sd[idx]) ** 2)) / W)
        out.append((W, mu, var, float(w @ c.values[idx] / W), probs, noise))
    return Components(np.array([o[0] for o in out]), np.stack([o[1] for o in out]),
                      np.stack([o[2] for o in out]), np.array([o[3] for o in out]),
                      None if c.probs is None else np.stack([o[4] for o in out]), c.cats,
                      None if c.noise_sd is None else np.array([o[5] for o in out]))


def temperature(values: np.ndarray, scale: float = 0.1, floor: float = 0.01) -> float:
    r""":math:`\tau_t = \max(c\,(\max v - \min v), \tau_{\min})`."""
    spread = float(values.max() - values.min()) if len(values) else 0.0
    return max(scale * spread, floor)


def reweight(c: Components, value_aware: bool = True, scale: float = 0.1, floor: float = 0.01) -> np.ndarray:
    r"""Global weights :math:`\omega \propto \pi' e^{v'/\tau_t}` (or :math:`\propto \pi'`), stable softmax."""
    logits = np.log(np.maximum(c.weights, 1e-300))
    if value_aware:
        logits = logits + c.values / temperature(c.values, scale, floor)
    return np.exp(logits - logsumexp(logits))


def draw_packet(omega: np.ndarray, P: int, gen: np.random.Generator) -> np.ndarray:
    """Indices of ``min(P, L)`` components drawn without replacement with probabilities ``omega``."""
    k = min(P, int(np.count_nonzero(omega > 0)))
    return gen.choice(len(omega), size=k, replace=False, p=omega / omega.sum())


# -- the two sides ---------------------------------------------------------------------------
BELIEF_MECHANISM = "Gaussian on the belief (pi, mu, sd, v) normalized to the unit cube (labfbo.privacy.belief_dp)"
CENTRE_MECHANISM = ("Gaussian on the belief's centre mu in the unit cube and its choice probabilities; weight, sd "
                    "and value are public constants (labfbo.privacy.belief_dp)")


class DistributionSite(LocalGPSite):
    """Uploads its optimum-location component; proposes with the FI-GP."""

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if not isinstance(request, BeliefRequest):
            return super().answer(request, data, round)
        o = self.options
        if round % o.release_every:
            return Abstain(reason=f"not a release round (release_every={o.release_every})")
        if data.n < 2:
            return Abstain(reason="fewer than two observations")
        model = self.local_model(data)
        cands = candidate_set(
            self.space, data.X, data.y, o.candidates, self.context.seed_for(round, "guide-candidates")
        )
        samples = optimum_samples(model, cands, o.M, self.context.seed_for(round, "guide-paths"))
        belief = fit_belief(samples, self.context.seed_for(round, "guide-dpgmm"), o.max_components, o.belief,
                            space=self.space)
        k = belief.top()
        centre, probs = belief.means[k], None if belief.probs is None else belief.probs[k]
        dp: DP | None = o.privacy
        schedule = None if o.release_every == 1 else o.release_every
        if dp is not None and o.dp_belief == "centre":  # the centre alone; the rest public constants
            gen = self.noise_rng(round, "dp-belief", data.digest())
            cats = choice_layout(self.space)[1]
            centre, probs = privatize_centre(centre, dp, gen, probs, cats)
            return OptimumBelief(weight=CENTRE_WEIGHT, mean=Array.of(centre),
                                 variance=Array.of(np.full(len(centre), CENTRE_SD ** 2)), value=CENTRE_VALUE,
                                 probs=None if probs is None else Array.of(probs), dp_clip=dp.clip,
                                 dp_noise_multiplier=dp.sigma, release_every=schedule,
                                 dp_noise_sd=dp.sigma * centre_sensitivity(len(centre), cats))
        mean, sd = predict(model, self.centre(belief, k)[None])
        y_sd = float(np.std(data.y)) or 1.0
        value = float((mean[0] - o.kappa * sd[0] - np.mean(data.y)) / y_sd)
        weight, variance = float(belief.weights[k]), belief.variances[k]
        if dp is not None:  # the site-private stream, never the study seed
            gen = self.noise_rng(round, "dp-belief", data.digest())
            weight, centre, variance, value, probs = privatize_belief(weight, centre, variance, value, dp, gen,
                                                                      probs, choice_layout(self.space)[1])
        return OptimumBelief(weight=weight, mean=Array.of(centre), variance=Array.of(variance), value=value,
                             probs=None if probs is None else Array.of(probs),
                             dp_clip=None if dp is None else dp.clip,
                             dp_noise_multiplier=None if dp is None else dp.sigma, release_every=schedule,
                             dp_noise_sd=None if dp is None else dp.sigma * belief_sensitivity(self.space.dim))

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        """The belief, normalized to the unit cube, is one Gaussian mechanism of sensitivity
        ``sqrt(2d + 2)``; with ``dp_belief="centre"`` ``sqrt(d_o + 2 d_c)`` (:mod:`labfbo.privacy.belief_dp`).

        The same under ``DP(unit="experiment")``: the belief is where the site's GP puts its optimum,
        and one experiment (a new best result) can move it anywhere in the cube, so the sensitivity to
        one experiment is the whole dataset's and the noise stays; the release states it."""
        dp = self.options.privacy
        if kind != "optimum_belief" or not noised or dp is None:
            return super().declare_release(kind, round, step, noised, sensitivity)
        if self.options.dp_belief == "centre":
            ordered, cats = choice_layout(self.space)
            delta_l2, mechanism = centre_sensitivity(len(ordered), cats), CENTRE_MECHANISM
        else:
            delta_l2, mechanism = belief_sensitivity(self.space.dim), BELIEF_MECHANISM
        delta_l2 = delta_l2 if sensitivity is None else sensitivity
        return Release.gaussian(kind, round, dp, mechanism, sensitivity=delta_l2, noise_std=dp.sigma * delta_l2,
                                step=step, whole=True)  # one experiment may move the belief anywhere

    def planned_releases(self, horizon: int) -> dict[str, int]:
        """One belief in each round ``t < horizon`` with ``t % release_every == 0``: ``ceil(horizon / k)``."""
        return {"optimum_belief": -(-horizon // self.options.release_every)}

    def centre(self, belief: Belief, k: int) -> np.ndarray:
        """Component ``k``'s centre as a unit-cube point (its most likely choice per categorical)."""
        ordered, cats = choice_layout(self.space)
        x = np.zeros(self.space.dim)
        x[ordered] = belief.means[k]
        for j, m, off in cats:
            x[j] = int(np.argmax(belief.probs[k, off:off + m])) / (m - 1)  # type: ignore[index]
        return x

    def figp(self, data: SiteData, guidance: Message | None, round: int) -> FIGP:
        """The FI-GP of this round (an empty field, i.e. the local GP, without guidance)."""
        field = (guidance.field(self.space) if isinstance(guidance, GuidancePacket)
                 else GuidanceField.empty(self.space.dim))
        strength = guidance_strength(self.options.lambda_max, round + 1)
        local = self.local_model(data)
        if len(field) and self.options.trust == "agreement":
            strength *= guidance_agreement(local, field(torch.as_tensor(data.X, dtype=torch.float64)))
        return FIGP(local, field, strength, uniform=not self.options.spatial)

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        return self.propose_with(self.figp(data, guidance, round), data, n, round)


class DistributionAggregator(ReusesReleases, Aggregator):
    """Also keeps each site's last belief sent with ``release_every = k > 1`` (:attr:`held`: site ->
    (round, belief)) and reuses it in the rounds :math:`r < t < r + k` the site sends none."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reuse: HeldReleases[OptimumBelief] = HeldReleases(self.sites, OptimumBelief, "belief")

    def open_round(self, t: int) -> Step:
        return Exchange({s: BeliefRequest() for s in self.sites})

    def admit(self, site: str, message: Message) -> Message:
        """A belief of this space's shape with its centre in the unit cube and variances at most 1
        (the cube's); its value score clipped to :data:`VALUE_BOUND` (the DP clip when larger)."""
        if not isinstance(message, OptimumBelief):
            return message
        ordered, cats = choice_layout(self.space) if self.space is not None else (None, [])
        n_probs = sum(k for _, k, _ in cats)
        p_shape = None if message.probs is None else message.probs.shape
        if ordered is not None and (message.mean.shape != (len(ordered),)
                                    or p_shape != ((n_probs,) if cats else None)):
            raise Inadmissible(f"a {message.mean.shape}/{p_shape} belief for a space with {len(ordered)} ordered "
                               f"and {len(cats)} categorical columns")
        mean, var = message.mean.numpy(), message.variance.numpy()
        if np.any(mean < -1e-9) or np.any(mean > 1 + 1e-9):
            raise Inadmissible("a belief centre outside the unit cube")
        if np.any(var > 1.0):
            raise Inadmissible("a belief variance above 1 (wider than the unit cube)")
        bound = max(VALUE_BOUND, message.dp_clip or 0.0)
        if abs(message.value) > bound:
            return message.model_copy(update={"value": float(np.clip(message.value, -bound, bound))})
        return message

    def valid(self, responses: Mapping[str, Message]) -> dict[str, OptimumBelief]:
        """The valid uploads, in site order (a wrong shape is left out with a warning)."""
        ordered, cats = choice_layout(self.space) if self.space is not None else (None, [])
        d = None if ordered is None else len(ordered)
        n_probs = sum(k for _, k, _ in cats)
        got = {}
        for s in self.sites:
            m = responses.get(s)
            if not isinstance(m, OptimumBelief):
                continue
            p_shape = None if m.probs is None else m.probs.shape
            if d is not None and (m.mean.shape != (d,) or p_shape != ((n_probs,) if cats else None)):
                warnings.warn(f"site {s!r} sent a {m.mean.shape}/{p_shape} belief for a space with {d} ordered "
                              f"and {len(cats)} categorical columns; left out", stacklevel=2)
                continue
            got[s] = m
        return got


    def pool(self, responses: Mapping[str, Message]) -> Components:
        """The valid uploads as a pool of components, in site order."""
        ordered, cats = choice_layout(self.space) if self.space is not None else (None, [])
        d = None if ordered is None else len(ordered)
        got = list(self.valid(responses).values())
        if not got:
            return Components(np.zeros(0), np.zeros((0, d or 0)), np.zeros((0, d or 0)), np.zeros(0))
        noise = np.array([m.dp_noise_sd or 0.0 for m in got])
        return Components(np.array([m.weight for m in got]), np.stack([m.mean.numpy() for m in got]),
                          np.stack([m.variance.numpy() for m in got]), np.array([m.value for m in got]),
                          np.stack([m.probs.numpy() for m in got]) if cats else None, tuple(cats),
                          noise if noise.any() else None)

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        o = self.options
        comps = self.pool(self.reuse.merge(t, self.valid(responses)))
        if not len(comps):
            return Finish({})
        if o.merging:
            comps = merge_components(comps, o.merge_threshold)
        omega = reweight(comps, o.value_reweighting, o.temperature_scale, o.min_temperature)
        shared = None if o.agent_specific else draw_packet(omega, o.P, rng(self.seed, 0, t, "guide-shared-packet"))
        replies: dict[str, Message] = {}
        for i, s in enumerate(self.sites):
            idx = shared if shared is not None else draw_packet(omega, o.P, rng(self.seed, i, t, "guide-packet"))
            replies[s] = GuidancePacket(weights=Array.of(omega[idx]), means=Array.of(comps.means[idx]),
                                        variances=Array.of(comps.variances[idx]),
                                        probs=None if comps.probs is None else Array.of(comps.probs[idx]),
                                        noise_sd=None if comps.noise_sd is None else Array.of(comps.noise_sd[idx]))
        return Finish(replies)


class Distribution(Protocol):
    """GUIDE-FBO: the sites' beliefs about the optimum's location guide each local GP."""

    name = "distribution"
    quick_options = {"M": 64, "candidates": 128}
    federated = True
    shared_options = ("P", "merge_threshold", "temperature_scale", "min_temperature",
                      "value_reweighting", "merging", "agent_specific")
    Options = DistributionOptions
    site_logic = DistributionSite
    aggregator = DistributionAggregator
