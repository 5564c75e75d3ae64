r"""Protocol ``gradient``: PACD-BO — distributed PACOH meta-learning of a GP prior.

One BO round :math:`t` is ``svgd_steps`` exchanges (``warmup_steps`` in the first round
that has data, when the particles are still the hyper-prior's draws). In each, the coordinator broadcasts
the :math:`K` particles :math:`\{\phi_k\}`; every site answers with its per-particle
scores :math:`A_{ik} = \nabla_{\phi_k} \ln Z_\beta(S_i, P_{\phi_k})` computed on its own
data (Eq. 6; :func:`labfbo.models.pacoh.site_score`) and its number of observations
:math:`n_i` (the meta-weight needs it); the coordinator sums them,
:math:`G_k = \sum_i A_{ik}` over the sites that contributed, adds the hyper-prior score
(Eq. 7) and makes an SVGD step (:func:`meta_step`). The final particles are the round's
guidance: each site forms the particle-mixture predictive (Eqs. 8–9,
:class:`~labfbo.models.particle_mixture.ParticleMixtureGP`) on its own data and maximizes its
acquisition (qLogNEI by default, the engine's; the paper's UCB with ``acquisition="ucb"``,
:math:`\beta = 4`, i.e. :math:`\kappa = 2`), pending-aware,
escaping a stalled basin every other round from round ``stall_rounds = 10``
(:mod:`labfbo.models.acquisition`; the paper has no escape: ``stall_rounds=None``).

Particles persist across rounds (warm start). With ``privacy=labfbo.DP(...)`` each site
clips every per-particle score to norm :math:`C` and adds :math:`\mathcal{N}(0,
\sigma^2(2C)^2 I)` before it leaves (Eqs. 12–13); its privacy ledger (journaled by the
Optimizer) accounts every release. With ``secure_aggregation=True`` and
``dp_noise="distributed"`` each member of a cohort of :math:`n` adds only its share,
:math:`\mathcal{N}(0, \sigma^2(2C)^2 / \max(n - t, 1))` with :math:`t` = ``dp_colluders``, so the
honest members' shares sum to the same noise and every release is declared and accounted as in
local mode (:mod:`labfbo.privacy.distributed`, which states the trust assumption).
The guarantee is site level only: ``DP(unit="experiment")`` is refused, since a site's score
(the gradient of its GP marginal likelihood) is no sum over experiments — one experiment may
change it as much as the whole dataset (:data:`labfbo.privacy.dp.GRADIENT_UNIT_REFUSAL`).

With ``wire="compact"`` the scores travel as stochastically rounded 8-bit codes and the
particles as quantized changes on a reconstruction both ends share, about an eighth of the
bytes (:mod:`labfbo.protocols.gradient.wire`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator

from labfbo.core.exceptions import ConfigurationError, Inadmissible
from labfbo.core.messages import Abstain, Array, Message
from labfbo.core.release import Release
from labfbo.core.seeding import rng
from labfbo.models.encoding import FeatureMap
from labfbo.models.gp import loo_log_density, predict
from labfbo.models.pacoh import AdamState, PacohConfig, init_particles, meta_score, site_score, svgd_step
from labfbo.models.particle_mixture import ParticleMixtureGP
from labfbo.privacy import DP, distributed, privatize, secagg
from labfbo.privacy.dp import GRADIENT_UNIT_REFUSAL
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.gradient.messages import ParticlesReply, ParticlesRequest, ScoreResponse, dp_purpose, dp_query
from labfbo.protocols.gradient.wire import MISSED, CoordinatorWire, ParticlesDelta, SiteWire, quantize
from labfbo.protocols.independent import LocalGPSite, ModelOptions
from labfbo.protocols.secure_sum import (
    MIN_COHORT,
    KeyRequest,
    MaskedScores,
    PublicKeyShare,
    SecureSum,
    UnmaskRequest,
    check_cohort,
    digest,
    reveal,
    upload,
)


class GradientOptions(ModelOptions, PacohConfig):
    """The local GP's and acquisition's options (:class:`ModelOptions`), PACOH's
    (:class:`~labfbo.models.pacoh.PacohConfig`), and the protocol's own: warm-up, stall
    escape, harm guard, DP, secure aggregation and where the DP noise is added."""

    warmup_steps: int = Field(500, ge=0, description="SVGD steps of the first round (fresh particles)")
    stall_rounds: int | None = Field(10, ge=1, description="escape a stalled basin (labfbo.models.acquisition): the "
                                     "meta-learned prior herds every site to the family's usual optimum")
    harm_guard: bool = Field(True, description="a site proposes from its local GP whenever that predicts its own "
                             "data (leave-one-out) better than the meta-learned mixture; False: the paper")
    privacy: DP | None = None
    secure_aggregation: bool = Field(False, description="pairwise-masked sums: the coordinator sees only sum_i A_i")
    dp_noise: Literal["local", "distributed"] = Field(
        "local", description="local: each site adds the full DP noise; distributed (needs secure_aggregation and "
        "privacy): each member of a cohort of n adds 1/max(n - dp_colluders, 1) of its variance "
        "(labfbo.privacy.distributed)")
    dp_colluders: int = Field(0, ge=0, description="distributed DP: how many other sites may collude with the "
                              "coordinator (subtract their own noise); each site's share grows with it")
    score_clip: float | None = Field(None, gt=1, description="coordinator, clear scores of 3 sites or more: cap each "
                                     "site's score matrix at this many times the step's median norm, so one member "
                                     "cannot own the step (None: off, the default: honest sites reach 40x the median "
                                     "in early steps; under secure sums the norms are not seen)")
    wire: Literal["lossless", "compact"] = Field(
        "lossless", description="compact: 8-bit stochastically rounded scores up and particle changes down, about "
        "an eighth of the bytes (labfbo.protocols.gradient.wire); lossless: float64")

    @model_validator(mode="after")
    def _distributed_dp(self) -> "GradientOptions":
        if self.privacy is not None and self.privacy.unit != "site":
            raise ValueError(GRADIENT_UNIT_REFUSAL)
        if self.dp_noise == "distributed":
            if not self.secure_aggregation:
                raise ValueError("dp_noise='distributed' needs secure_aggregation=True: each site adds only a share "
                                 "of the DP noise, so the coordinator must see nothing but the cohort's sum")
            if self.privacy is None:
                raise ValueError("dp_noise='distributed' needs privacy=labfbo.DP(...): it splits that DP noise "
                                 "among the cohort")
        elif self.dp_colluders:
            raise ValueError("dp_colluders applies to dp_noise='distributed' only")
        if self.wire == "compact" and self.secure_aggregation:
            raise ValueError("wire='compact' does not combine with secure_aggregation: the masked sums need the "
                             "exact scores")
        return self

    def pacoh(self) -> PacohConfig:
        """The PACOH settings alone."""
        return PacohConfig.model_validate(self.model_dump(include=set(PacohConfig.model_fields)))


def meta_step(particles: torch.Tensor, scores: Sequence[torch.Tensor], n_obs: Sequence[int],
              cfg: PacohConfig, state: AdamState | None = None) -> tuple[torch.Tensor, AdamState | None]:
    """One SVGD step from the per-site scores, summed in the given (site) order (Eq. 7);
    returns the particles and the meta-optimizer's state (:func:`~labfbo.models.pacoh.svgd_step`)."""
    G = torch.zeros_like(particles)
    for A in scores:
        G = G + A
    return svgd_step(particles, meta_score(particles, G, len(scores), cfg, n_points=list(n_obs)), cfg, state)


def capped_norms(scores: list[torch.Tensor], factor: float | None) -> list[torch.Tensor]:
    """Each site's scores scaled down to at most ``factor`` times the median Frobenius norm of the
    step's (3 sites or more; ``None``: as sent): a member sending huge scores weighs as one at the cap."""
    if factor is None or len(scores) < 3:
        return scores
    norms = torch.stack([torch.linalg.norm(A) for A in scores])
    cap = factor * float(norms.median())
    return [A * (cap / float(n)) if float(n) > cap > 0 else A for A, n in zip(scores, norms)]


def secure_meta_step(particles: torch.Tensor, total: np.ndarray, cfg: PacohConfig,
                     state: AdamState | None = None) -> tuple[torch.Tensor, AdamState | None] | None:
    r"""One SVGD step from a secure-aggregated sum ``[sum_i A_i, sum_i 1/n_i, #sites with data]``.

    The meta-weight's :math:`\beta` (the harmonic mean of the :math:`n_i`) needs only the
    two sums, so the coordinator never sees a single site's count. None: no site had data.
    """
    count = int(round(total[-1]))
    if count < 1:
        return None
    G = torch.as_tensor(total[:-2].reshape(particles.shape))
    harmonic = count / total[-2]
    return svgd_step(particles, meta_score(particles, G, count, cfg, n_points=[harmonic] * count), cfg, state)


# -- site side -------------------------------------------------------------------------------
MIN_GUARD_POINTS = 5  # fewer observations: a leave-one-out comparison says nothing yet
NOISE_GUARD = 1.0
"""The largest noise-to-signal ratio of the score sums (``ParticlesReply.dp_noise_ratio``) at which a
site still uses the meta-learned particles: beyond it the DP noise in each step outweighs everything
the sites' clipped scores can say."""
SCORE_MECHANISM = "Gaussian on K per-particle scores, each clipped to l2 norm C (PACD-BO Eqs. 12-13)"
_KEY_MATERIAL = frozenset({"secagg_public_key", "secagg_self_mask"})  # nothing computed from the data


class GradientSite(LocalGPSite):
    """Scores the coordinator's particles on local data; proposes from the particle mixture."""

    particles: torch.Tensor | None = None
    noise_ratio: float | None = None  # the last reply's dp_noise_ratio
    _mixture_key: tuple[bytes, bytes] | None = None
    _mixture: ParticleMixtureGP | None = None

    def __init__(self, space, options, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(space, options, context)
        self.features = FeatureMap(space, one_hot=True)  # what the meta-learned feature map reads
        self.wire = SiteWire()  # the compact wire's reference particles

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        ctx = self.context
        if isinstance(request, KeyRequest):
            return PublicKeyShare(public_key=secagg.public_key(ctx.key_seed))
        if isinstance(request, UnmaskRequest):
            return reveal(request, ctx.site, ctx.key_seed, request.study, round)
        if not isinstance(request, (ParticlesRequest, ParticlesDelta)):
            return super().answer(request, data, round)
        if isinstance(request, ParticlesDelta) or self.options.wire == "compact":  # tracked even without data
            held = self.wire.particles(request, round)
            if held is None:
                return Abstain(reason=MISSED)
            query = request.dp_query if isinstance(request, ParticlesRequest) else dp_query(Array.of(held))
        else:
            held, query = request.particles.numpy(), request.dp_query
        if data.n == 0:
            return Abstain(reason="no observations yet")
        if isinstance(request, ParticlesRequest) and self.options.secure_aggregation and (
                refusal := check_cohort(request.cohort, ctx.site, ctx.key_seed)):
            return refusal
        A = site_score(torch.as_tensor(held), self.features.numpy(data.X), data.y, self.options.pacoh()).numpy()
        dp: DP | None = self.options.privacy
        if dp is not None and self.options.dp_noise == "distributed":  # this member's share (secure sum only)
            n, t = len(request.cohort or {}), self.options.dp_colluders
            A = distributed.privatize_share(A, dp, self.noise_rng(round, distributed.share_purpose(
                dp_purpose(request.step), n, t), f"{query}/{data.digest()}"), n, t)
        elif dp is not None:
            # never from the study seed; the query is the particles and the data (labfbo.privacy.streams)
            A = privatize(A, dp, self.noise_rng(round, dp_purpose(request.step), f"{query}/{data.digest()}"))
        dp_fields = {"dp_clip": None if dp is None else dp.clip,
                     "dp_noise_multiplier": None if dp is None else dp.sigma}
        if self.options.wire == "compact":  # stochastic rounding: the same codes on every transport
            codes, scale = quantize(A, rng(ctx.seed, ctx.site_index, round, f"wire/{request.step}"))
            return ScoreResponse(step=request.step, scores=codes, scale=scale, n_obs=data.n, **dp_fields)
        if not self.options.secure_aggregation:
            return ScoreResponse(step=request.step, scores=Array.of(A), n_obs=data.n, **dp_fields)
        # the count travels inside the sum: the meta-weight needs only sum(1/n_i) and the number of sites
        masked = upload(np.concatenate([A.ravel(), [1.0 / data.n, 1.0]]), ctx.site, ctx.key_seed, request.cohort or {},
                        request.study, round, request.step, digest(request.particles))
        return MaskedScores(step=request.step, masked=masked, **dp_fields)

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        """One SVGD step's K score rows are one Gaussian mechanism: l2 sensitivity ``2C sqrt(K)``,
        noise std ``sigma 2C`` per coordinate (effective multiplier ``sigma / sqrt(K)``).

        With ``dp_noise="distributed"`` that is the mechanism on the secure sum as the coordinator
        (and up to ``dp_colluders`` sites) see it: the honest members' shares total ``sigma 2C``
        whatever the cohort's size, so the declaration does not depend on it."""
        if kind in _KEY_MATERIAL:
            return None
        masked, dp, k = kind == "masked_score", self.options.privacy, self.options.n_particles
        if kind in ("score", "masked_score") and noised and dp is not None:
            shared = masked and self.options.dp_noise == "distributed"
            how = distributed.mechanism(self.options.dp_colluders) if shared else SCORE_MECHANISM
            return Release.gaussian(kind, round, dp, how, sensitivity=dp.sensitivity * k ** 0.5,
                                    noise_std=dp.noise_std, step=step, rows=k, secure_aggregation=masked)
        return Release.unprotected(kind, round, step, secure_aggregation=masked,
                                   rows=k if kind in ("score", "masked_score") else 1)

    def planned_releases(self, horizon: int) -> dict[str, int]:
        """One release per SVGD step: ``warmup_steps`` in the first round, ``svgd_steps`` in each later one."""
        o = self.options
        kind = "masked_score" if o.secure_aggregation else "score"
        return {kind: o.warmup_steps + o.svgd_steps * max(horizon - 1, 0)}

    def mixture(self, data: SiteData) -> ParticleMixtureGP | None:
        """The particle-mixture model on local data (cached per particles and data)."""
        if self.particles is None:
            return None
        key = (self.particles.numpy().tobytes(), data.key())
        if key != self._mixture_key:
            self._mixture = ParticleMixtureGP(self.particles, data.X, data.y, self.options.pacoh(),
                                              features=None if self.features.identity else self.features)
            self._mixture_key = key
        return self._mixture

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        if isinstance(guidance, ParticlesReply):
            self.particles = torch.as_tensor(guidance.particles.numpy())
            self.noise_ratio = guidance.dp_noise_ratio
        model = self.mixture(data)
        if model is None or not self.trusts(model, data):  # no guidance yet, or it misleads here: local GP
            return self.propose_local(data, n, round)
        return self.propose_with(model, data, n, round)

    def trusts(self, mixture: ParticleMixtureGP, data: SiteData) -> bool:
        """Keep the federation's model unless it was trained mostly on DP noise (the coordinator's
        stated ``dp_noise_ratio`` above :data:`NOISE_GUARD`), and (``harm_guard``) only while it
        predicts this site's own data (leave-one-out log density) at least as well as its local GP."""
        if self.noise_ratio is not None and self.noise_ratio > NOISE_GUARD:
            return False  # trained on DP noise far above the scores' signal, whatever a few points say
        if not self.options.harm_guard or data.n < MIN_GUARD_POINTS:
            return True
        fed, own = mixture.loo_log_density(), loo_log_density(self.local_model(data))
        return not (np.isfinite(fed) and np.isfinite(own) and fed < own)

    def predict(self, data: SiteData, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model the site proposes from: the mixture, or its local GP when the guard says so."""
        model = self.mixture(data)
        if model is None or not self.trusts(model, data):
            return super().predict(data, X)
        return predict(model, X[:, None, :])  # marginals, not one joint posterior


# -- coordinator side --------------------------------------------------------------------------
class GradientAggregator(Aggregator):
    """Runs ``svgd_steps`` exchanges per round on warm-started particles.

    With ``secure_aggregation`` each step is a secure sum over the cohort
    (:class:`~labfbo.protocols.secure_sum.SecureSum`: masked uploads, then the self masks'
    seeds); a member that drops out makes the step run again with the others, and a round
    that cannot keep :data:`MIN_COHORT` members ends without further updates.
    """

    def __init__(self, options: GradientOptions, sites: Sequence[str], seed: int, horizon: int | None,
                 space: Any) -> None:
        super().__init__(options, sites, seed, horizon, space)
        Gradient.check_study(options, len(self.sites))
        self.cfg = options.pacoh()
        self.features = FeatureMap(space, one_hot=True)
        self.particles = init_particles(self.cfg, self.features.n_out,
                                        int(rng(seed, 0, 0, "pacoh-init").integers(2**31)))
        self.step = 0
        self.adam: AdamState | None = None  # the meta-optimizer's moments, carried across rounds
        self.trained = False
        self.updated = False  # some step of this round changed the particles
        self.secure = SecureSum(self.sites)
        self._sent: Array | None = None  # the particles of the exchange in progress, as sent
        self.wire = CoordinatorWire(seed) if options.wire == "compact" else None
        self.round = 0
        self.noise_ratio: float | None = None  # under DP: the largest noise-to-signal of the steps so far

    @property
    def redone(self) -> int:
        return self.secure.redone

    def _request(self) -> Step:
        if self.wire is not None:
            delta, full, behind = self.wire.request(self.particles.numpy(), self.step, self.round)
            whole = None if full is None else ParticlesRequest(step=self.step, particles=full)
            return Exchange({s: delta if delta is not None and s not in behind else whole for s in self.sites})
        particles = self._sent = Array.of(self.particles.numpy())  # encoded once; the secure sum hashes it
        if not self.options.secure_aggregation:
            msg = ParticlesRequest(step=self.step, particles=particles)
            return Exchange({s: msg for s in self.sites})
        exchange = self.secure.first(
            lambda cohort: ParticlesRequest(step=self.step, particles=particles, cohort=cohort)
        )
        return self._finish() if exchange is None else Exchange(exchange)

    def _finish(self) -> Finish:
        self.trained = self.trained or self.updated
        self.updated = False
        self.secure.reset()
        reply = ParticlesReply(particles=Array.of(self.particles.numpy()), dp_noise_ratio=self.noise_ratio)
        return Finish({s: reply for s in self.sites})

    def _noised(self, stated: Sequence[tuple[float | None, float | None]], members: int = 0) -> None:
        """Account one step's DP noise in :attr:`noise_ratio`: ``stated`` (noise multiplier, clip) per
        contribution (clear scores), or once for a secure sum of ``members`` (its noise: one full
        noise under distributed shares, each member's under local noise)."""
        noisy = [(s, c) for s, c in stated if s and c]
        if not noisy:
            return
        if members:  # a secure sum: the cohort stated one setting
            s, c = noisy[0]
            var, signal = (2 * c * s) ** 2 * (1 if self.options.dp_noise == "distributed" else members), members * c
        else:
            var, signal = sum((2 * c * s) ** 2 for s, c in noisy), sum(c for _, c in stated if c) or 1.0
        ratio = float(np.sqrt(var * self.particles.shape[1]) / signal)
        self.noise_ratio = max(self.noise_ratio or 0.0, ratio)  # noise once learned stays in the particles

    def admit(self, site: str, message: Message) -> Message:
        """Scores for this step's particles: one row per particle, finite, from a site with data."""
        if isinstance(message, ScoreResponse):
            if message.step != self.step:
                raise Inadmissible(f"scores for step {message.step}, not the step in progress ({self.step})")
            shape = tuple(message.scores.shape)  # the compact wire's codes have the scores' shape: no decoding here
            if shape != tuple(self.particles.shape):
                raise Inadmissible(f"scores of shape {shape} for particles of shape {tuple(self.particles.shape)}")
            finite = np.all(np.isfinite(message.scores.numpy() if message.scale is None else message.scale.numpy()))
            if not finite or message.n_obs < 1:
                raise Inadmissible("scores that are not finite, or no observations behind them")
        elif isinstance(message, MaskedScores) and message.step != self.step:
            raise Inadmissible(f"a masked upload for step {message.step}, not the step in progress ({self.step})")
        return message

    def retire(self, site: str) -> None:
        self.secure.retired.add(site)

    def abstained(self, site: str, reason: str) -> None:
        if self.wire is not None and reason == MISSED:
            self.wire.behind.add(site)  # its next request carries the particles in full

    def state(self) -> dict[str, Any]:
        adam = {k: Array.of(v.numpy()).model_dump(mode="json") for k, v in (self.adam or {}).items()}
        out = {"particles": Array.of(self.particles.numpy()).model_dump(mode="json"), "trained": self.trained,
               "keys": self.secure.keys, "adam": adam}
        if self.secure.retired:  # absent when none: a snapshot reads as before
            out["retired"] = sorted(self.secure.retired)
        if self.noise_ratio is not None:
            out["noise_ratio"] = self.noise_ratio
        return out

    def restore(self, state: dict[str, Any]) -> None:
        if state:
            self.particles = torch.as_tensor(Array.model_validate(state["particles"]).numpy())
            self.trained = bool(state["trained"])
            adam = state.get("adam") or {}
            self.adam = {k: torch.as_tensor(Array.model_validate(v).numpy()) for k, v in adam.items()} or None
            self.secure.keys = dict(state.get("keys", {}))
            self.secure.retired = set(state.get("retired", ()))
            self.noise_ratio = state.get("noise_ratio")

    def steps_in_round(self) -> int:
        """``warmup_steps`` until the particles have been trained once, then ``svgd_steps``."""
        return self.options.warmup_steps if not self.trained else self.cfg.svgd_steps

    def open_round(self, t: int) -> Step:
        self.step, self.updated, self.round = 0, False, t
        if self.wire is not None:
            self.wire.reset()
        self.secure.reset()
        return self._request() if self.steps_in_round() else self._finish()

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        if self.options.secure_aggregation:
            return self._on_secure(responses)
        answers = [responses[s] for s in self.sites if isinstance(responses.get(s), ScoreResponse)]
        if self.wire is not None and not answers and self.wire.behind:
            self.wire.reset()  # nobody could score, some for want of the base: this step again, in full
            return self._request()
        if answers:
            self._noised([(a.dp_noise_multiplier, a.dp_clip) for a in answers])
            scores = capped_norms([torch.as_tensor(a.values()) for a in answers], self.options.score_clip)
            self.particles, self.adam = meta_step(self.particles, scores, [a.n_obs for a in answers], self.cfg,
                                                  self.adam)
        return self._next(bool(answers))

    def _next(self, updated: bool) -> Step:
        self.updated = self.updated or updated
        self.step += 1
        if not updated or self.step >= self.steps_in_round():
            return self._finish()
        return self._request()

    def _on_secure(self, responses: Mapping[str, Message]) -> Step:
        if self.options.dp_noise == "distributed":  # a share relies on the others': never unmask unequal ones
            stated = {(m.dp_noise_multiplier, m.dp_clip) for m in responses.values() if isinstance(m, MaskedScores)}
            if len(stated) > 1:
                warnings.warn(f"gradient: the cohort of step {self.step} stated different DP noise {sorted(stated)}; "
                              "with distributed noise one member's smaller share weakens the others' guarantee, so "
                              "this round ends without unmasking the sum", stacklevel=2)
                return self._finish()
        out = self.secure.on_responses(self.step, digest(self._sent), self.particles.numel() + 2, responses)
        if isinstance(out, str):
            return self._request() if out == "redo" else self._finish()
        if isinstance(out, dict):
            return Exchange(out)
        new = secure_meta_step(self.particles, out, self.cfg, self.adam)
        if new is not None:
            masked = [m for m in responses.values() if isinstance(m, MaskedScores)]
            self._noised([(m.dp_noise_multiplier, m.dp_clip) for m in masked], members=max(len(masked), 1))
            self.particles, self.adam = new
        return self._next(new is not None)


class Gradient(Protocol):
    """PACD-BO: a meta-learned GP prior from the sites' SVGD score gradients (:class:`GradientOptions`)."""

    name = "gradient"
    quick_options = {"n_particles": 4, "hidden": [8, 8], "warmup_steps": 3, "svgd_steps": 2}
    federated = True
    shared_options = ("n_particles", "hidden", "feature_dim", "learn_mean", "prior_std", "beta_meta", "lam",
                      "secure_aggregation", "dp_noise", "dp_colluders", "wire")  # a noise share relies on the others'
    later_shared_options = ("dp_noise", "dp_colluders", "wire")
    Options = GradientOptions
    site_logic = GradientSite
    aggregator = GradientAggregator

    @property
    def dp_colluders(self) -> int:
        """``dp_colluders``: the sites whose distributed noise shares may be missing from a sum."""
        return int(self.options.dp_colluders)  # type: ignore[attr-defined]

    @property
    def distributed_noise(self) -> bool:
        """``dp_noise="distributed"``: each site adds a share of the sum's noise."""
        return self.options.dp_noise == "distributed"  # type: ignore[attr-defined]

    @classmethod
    def check_study(cls, options: BaseModel, n_sites: int) -> None:
        assert isinstance(options, GradientOptions)
        if options.secure_aggregation and n_sites < MIN_COHORT:
            raise ConfigurationError(f"secure aggregation needs at least {MIN_COHORT} sites (got {n_sites}): with "
                                     "two, each site could recover the other's exact scores from the particle update")
        t = options.dp_colluders
        if options.dp_noise == "distributed" and n_sites - t < 2:
            raise ConfigurationError(f"dp_colluders={t} with {n_sites} sites leaves at most one honest member in any "
                                     "cohort: every site would add the full noise; use dp_noise='local' or fewer "
                                     "colluders")
