r"""Protocol ``surface``: the consortium learns a shared response surface; each lab's GP starts from it.

Not from one of the seed papers, whose mechanisms capture little of what pooling would with a handful of labs
(``docs/benchmarks/reactions.md``). It shares what a process chemist's design-of-experiments model would: main
effects of every choice and a quadratic in the ordered parameters (:mod:`labfbo.protocols.surface.model`).

One exchange per BO round :math:`t`:

**Site → coordinator** (:class:`SurfaceStats`): its ridge statistics on its standardized values,
:math:`\bar G_i = \Phi_i^\top\Phi_i/n_i` (upper triangle), :math:`\bar h_i = \Phi_i^\top z_i/n_i` and :math:`n_i`;
with ``privacy`` values clipped to :math:`[-C, C]` and the Gaussian mechanism in the unit of ``DP(unit=...)``
(:func:`~labfbo.protocols.surface.model.private_statistics`; over secure sums :mod:`~labfbo.protocols.surface.secure`).

**Coordinator** (:func:`leave_one_out`): each site gets the other contributors' sums
:math:`\sum_{j\ne i} n_j\bar G_j` and :math:`\sum_{j\ne i} n_j\bar h_j`
(:class:`SurfaceTotals`) — never its own data back, so its own observations are not
counted twice.

**Secure aggregation** (``secure_aggregation="auto"``, the default: on from 3 sites). The
statistics leave a site only masked (``MaskedScores``) and the sites alone open the cohort's sum
:math:`\sum_i [n_i\bar G_i, n_i\bar h_i, n_i, 1]` (``sum_seen_by="members"``: the coordinator holds
it still masked; ``"coordinator"``: it unmasks it); each site subtracts its own upload itself
(:mod:`labfbo.protocols.surface.secure`, which states the dropout rule, the reuse of a sum under ``release_every`` and
the distributed DP noise). A study of two sites
runs in the clear with a warning (a sum minus one's own would be the other's statistics); ``"on"``
refuses it; ``"off"``: the statistics in the clear, as above.

**Site proposal.** :math:`w = (\sum_{j\ne i} n_j\bar G_j + \lambda I)^{-1}\sum_{j\ne i} n_j\bar h_j`;
the site's GP (the engine's kernel, :mod:`labfbo.models.gp`) gets the prior mean
:math:`a + c\,\phi(x)^\top w` with :math:`c \sim \mathcal N(P, 0.3^2)` fitted with the
kernel — :math:`P = \Phi(\hat c/\mathrm{se}(\hat c))` the probability that the site's results go
the same way as the surface (``trust="agreement"``, :func:`~labfbo.models.transfer.agreement_probability`;
1 with ``trust="prior"``) — and the configured acquisition is maximized. Without totals
(the first round, a missed round, no other contributor) the site proposes from its own GP.
With ``weigh_upload="agreement"`` (no DP) a site multiplies its statistics by the :math:`P` of its
last proposal, so a site unlike the others pulls their surface less.

**Fewer releases** (``release_every=k``). A site uploads only in rounds :math:`t \equiv 0 \pmod k`
(:math:`\lceil T/k\rceil` releases over rounds :math:`0..T-1`; without two observations it waits for the
next) and otherwise abstains; the coordinator reuses its statistics of round :math:`r` in rounds
:math:`r < t < r + k` (post-processing: no new privacy cost). Under ``DP(epsilon=...)`` fewer releases
compose to the budget with less noise each.

**Several objectives** (``multi_objective="hypervolume"``, the default): one moment
:math:`\bar h_{i,k}` per objective :math:`k` beside the one :math:`\bar G_i`, one surface
:math:`w_k` per objective, each objective's GP on its own surface with its own trust (its :math:`P` on
the site's values of that objective), and the site maximizes qLogNEHVI over them (outcome constraints
on their plain local GPs). ``"parego"``: the round's shared Chebyshev scalarization, as the other
federated protocols.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from botorch.models.model import Model
from pydantic import BaseModel

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.messages import Abstain, Array, Message
from labfbo.core.records import TransferEstimate
from labfbo.core.release import Release
from labfbo.models.gp import fit_local_gp, predict
from labfbo.models.transfer import agreement_probability, top_trust
from labfbo.privacy import DP, secagg
from labfbo.privacy.distributed import honest_members, share_purpose
from labfbo.privacy.noise import gaussian
from labfbo.protocols.base import Protocol, SiteData
from labfbo.protocols.independent import LocalGPSite
from labfbo.protocols.secure_sum import (
    MIN_COHORT,
    KeyRequest,
    MaskedScores,
    PublicKeyShare,
    UnmaskRequest,
    check_cohort,
    reveal,
)
from labfbo.protocols.surface.aggregate import SurfaceAggregator, features
from labfbo.protocols.surface.design_tilt import LastTilt
from labfbo.protocols.surface.messages import SealedTotals, SurfaceRequest, SurfaceStats, SurfaceTotals, why_no_surface
from labfbo.protocols.surface.model import (
    SurfaceMean,
    dp_sensitivity,
    feature_sums,
    guarded_noisy_weights,
    packed_size,
    private_statistics,
    ranked_moments,
    ranked_sum_sensitivity,
    ridge_weights,
    site_statistics,
    surface_transfer,
    symmetric,
)
from labfbo.protocols.surface.options import AGREEMENT_REFIT, NOISE_GUARD, SurfaceOptions  # noqa: F401 (re-exported)
from labfbo.protocols.surface.secure import (
    MECHANISM,
    RANKED_MECHANISM,
    UNMASKED_2_SITES,
    as_summed,
    contribution,
    leave_out,
    masked_study,
    masked_upload,
    opened,
)

# -- the two sides ---------------------------------------------------------------------------
STATS_MECHANISM = ("Gaussian on the averaged ridge statistics (G/n, h/n), values clipped to [-C, C] "
                   "(labfbo.protocols.surface.model); the count n is released exactly")
STATS_MECHANISM_RANKS = ("Gaussian on the averaged ridge statistics (G/n, h/n) of the values' centred ranks in "
                         "[-C, C] (labfbo.protocols.surface.model.private_statistics); the count n is released exactly")


class SurfaceSite(LocalGPSite):
    """Uploads its statistics; proposes with its GP on the others' surface as prior mean."""

    _surface_key: bytes | None = None
    _surface_model: Model | None = None
    _weights: np.ndarray | None = None  # the surface of the last proposal (predictions use the same model)
    _transfer: TransferEstimate | None = None  # what that surface was worth to the lab's held-out predictions
    _surface_estimate: TransferEstimate | None = None  # ... for the cached surface model
    _alone: str | None = None  # why the last proposal took nothing from the partners (None: it took their surface)

    def __init__(self, space, options, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(space, options, context)
        self.features = features(space, options)
        # objective -> (data + surface key, its GP, what its surface is worth to the lab)
        self._objective_models: dict[int, tuple[bytes, Model, TransferEstimate | None]] = {}
        self._mine: dict[int, tuple[tuple[str, ...], np.ndarray]] = {}  # round -> (cohort, this site's upload)
        self._warned = self._warned_restart = False
        self._tilted = LastTilt()  # the others' tilted Gram, kept while a sum is reused (release_every)

    def objectives(self, data: SiteData) -> int:
        """How many surfaces the site shares: one per objective under several objectives with
        ``multi_objective="hypervolume"``, else 1 (the objective, or the round's ParEGO target)."""
        spec = self.context.outcomes
        if spec is None or not spec.multi or data.Y is None or self.options.multi_objective != "hypervolume":
            return 1
        return len(spec.objectives)

    @property
    def masked(self) -> bool:
        """Its statistics leave only masked into a cohort's sum (``secure_aggregation`` and the study's size)."""
        return masked_study(self.options.secure_aggregation, self.context.n_sites)

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        ctx = self.context
        if isinstance(request, KeyRequest):
            return PublicKeyShare(public_key=secagg.public_key(ctx.key_seed))
        if isinstance(request, UnmaskRequest):
            return reveal(request, ctx.site, ctx.key_seed, request.study, round, self.options.sum_seen_by == "members")
        if not isinstance(request, SurfaceRequest):
            return super().answer(request, data, round)
        k = self.options.release_every
        if round % k:
            return Abstain(reason=f"not a release round (release_every={k})")
        if data.n < 2:
            return Abstain(reason="fewer than two observations")
        if request.cohort is None:
            if self.masked:  # never in the clear in a study that runs secure sums
                return Abstain(reason="secure aggregation is on in this study: the statistics leave only masked")
            self._warn_unmasked()
            return self.statistics(data, round)
        if refusal := check_cohort(request.cohort, ctx.site, ctx.key_seed):
            return refusal
        vector, dp = self.contribution(data, round, len(request.cohort))
        self._mine = {r: v for r, v in self._mine.items() if r > round - 2 * k} | {
            round: (tuple(sorted(request.cohort)), vector)
        }
        masked, sealed = masked_upload(vector, ctx.site, ctx.key_seed, request, round, self.options.sum_seen_by)
        return MaskedScores(step=0, masked=masked, **dp, release_every=None if k == 1 else k, sealed=sealed,
                            agreement=self._shared_agreement())

    def _shared_agreement(self) -> float | None:
        """The last proposal's agreement, if the lab opted in (``share_agreement``) and runs no DP."""
        t = self._transfer
        return t.agreement if self.options.share_agreement and self.options.privacy is None and t else None

    def _warn_unmasked(self) -> None:
        n = self.context.n_sites
        if self.options.secure_aggregation == "auto" and 1 < n < MIN_COHORT and not self._warned:
            self._warned = True
            warnings.warn(UNMASKED_2_SITES.format(n=n), stacklevel=4)

    def _statistics(self, data: SiteData, round: int, cohort: int | None
                    ) -> tuple[np.ndarray, np.ndarray, int, float | None]:
        """``(upper(G/n), h/n, m, Delta)``, with the DP noise of l2 sensitivity ``Delta`` in the unit of
        ``DP(unit=...)`` (None without DP): the full noise, or this member's share of it
        (``cohort``: a secure sum's size, under DP with ``unit="site"``). The site-private stream, never
        the study seed, keyed by every value it protects (and a share by ``h``, so a cohort of another
        size draws independent noise): recomputing a round's answer repeats its bytes."""
        dp: DP | None = self.options.privacy
        m = self.objectives(data)
        values = data.y if m == 1 else data.Y[:, :m]  # type: ignore[index]
        Phi = self.features.of_unit(data.X)
        if dp is None:
            w = agreement_probability(self._transfer) if self.options.weigh_upload == "agreement" and m == 1 else 1.0
            gram, moment = site_statistics(Phi, values)
            return w * gram, w * moment, m, None
        query = data.digest(None if m == 1 else values)
        if cohort is None or dp.unit != "site":  # the full noise, in the unit's sensitivity
            gram, moment, delta = private_statistics(Phi, values, dp, self.features.norm_bound,
                                                     self.noise_rng(round, "dp-surface", query))
            return gram, moment, m, delta
        gram, moment = site_statistics(Phi, values, dp.clip)  # distributed, unit "site" (experiment: ranked sums)
        delta = dp_sensitivity(self.features.norm_bound, dp.clip, m)
        t = self.options.dp_colluders
        scale = dp.sigma * delta / math.sqrt(honest_members(cohort, t))
        if scale > 0:  # the full noise's draws (gram, then moment) at the share's std
            gen = self.noise_rng(round, share_purpose("dp-surface", cohort, t), query)
            gram, moment = gaussian(gram, scale, gen), gaussian(moment, scale, gen)
        return gram, moment, m, delta

    def statistics(self, data: SiteData, round: int) -> SurfaceStats:
        """The statistics in the clear (``secure_aggregation="off"``, or a study of two sites)."""
        dp: DP | None = self.options.privacy
        k = self.options.release_every
        gram, moment, _, delta = self._statistics(data, round, None)
        return SurfaceStats(count=data.n, gram=Array.of(gram), moment=Array.of(moment),
                            dp_clip=None if dp is None else dp.clip,
                            dp_noise_multiplier=None if dp is None else dp.sigma,
                            dp_sensitivity=delta,
                            release_every=None if k == 1 else k, agreement=self._shared_agreement())

    def contribution(self, data: SiteData, round: int, cohort: int) -> tuple[np.ndarray, dict[str, Any]]:
        """This member's vector for a secure sum of ``cohort`` members
        (:func:`~labfbo.protocols.surface.secure.contribution`)
        and the DP fields its upload states in the clear."""
        dp: DP | None = self.options.privacy
        if dp is not None and dp.unit == "experiment":
            return self._ranked_contribution(data, round, cohort, dp)
        gram, moment, _, delta = self._statistics(data, round, cohort)
        fields = {} if dp is None else {"dp_clip": dp.clip, "dp_noise_multiplier": dp.sigma, "dp_sensitivity": delta}
        return contribution(gram, moment, data.n, averaged=dp is not None), fields

    def _ranked_contribution(
        self, data: SiteData, round: int, cohort: int, dp: DP
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Under ``DP(unit="experiment")``: ``[upper(G), h + share, n, 1]``, ``G`` only the constant row: the count and
        the
        features' sums (:func:`~labfbo.protocols.surface.model.feature_sums`); shares of the noise on ``(h, C s)`` from
        the
        site-private stream keyed by the data (:mod:`~labfbo.protocols.surface.secure`)."""
        m = self.objectives(data)
        values = data.y if m == 1 else data.Y[:, :m]  # type: ignore[index]
        Phi = self.features.of_unit(data.X)
        moment, sums = ranked_moments(Phi, values, dp.clip), feature_sums(Phi)
        delta = ranked_sum_sensitivity(self.features.norm_bound, dp.clip, m)
        t = self.options.dp_colluders
        scale = dp.sigma * delta / math.sqrt(honest_members(cohort, t))
        if scale > 0:
            gen = self.noise_rng(
                round, share_purpose("dp-surface-ranks", cohort, t), data.digest(None if m == 1 else values)
            )
            moment = gaussian(moment, scale, gen)
            sums = gaussian(sums, scale / dp.clip, gen)
        gram = np.zeros(packed_size(self.features.p))
        gram[0], gram[1:self.features.p] = data.n, sums  # upper() is row by row: the constant row first
        vector = np.concatenate([gram, moment.ravel(), [float(data.n), 1.0]])
        return vector, {"dp_clip": dp.clip, "dp_noise_multiplier": dp.sigma, "dp_sensitivity": delta,
                        "dp_unit": "experiment"}

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        """The statistics are one Gaussian mechanism of the sensitivity the message states; the count travels
        exactly. Masked into a secure sum (``masked_score``) the same, declared as secure-aggregated: the honest
        members' shares of the noise total ``sigma Delta`` whatever the cohort's size, so the declaration (and
        the accounting) is local mode's. Keys and self-mask seeds carry nothing of the data."""
        if kind in ("secagg_public_key", "secagg_self_mask"):
            return None
        dp, masked = self.options.privacy, kind == "masked_score"
        if kind not in ("surface_stats", "masked_score") or not noised or dp is None:
            if masked:
                return Release.unprotected(kind, round, step, secure_aggregation=True)
            return super().declare_release(kind, round, step, noised, sensitivity)
        delta_l2 = dp_sensitivity(self.features.norm_bound, dp.clip) if sensitivity is None else sensitivity
        t = self.options.dp_colluders
        how = (RANKED_MECHANISM if dp.unit == "experiment" else MECHANISM).format(t=t) if masked else \
            STATS_MECHANISM if dp.unit == "site" else STATS_MECHANISM_RANKS
        return Release.gaussian(kind, round, dp, how, sensitivity=delta_l2, noise_std=dp.sigma * delta_l2, step=step,
                                secure_aggregation=masked)

    def planned_releases(self, horizon: int) -> dict[str, int]:
        """One upload in each round ``t < horizon`` with ``t % release_every == 0``: ``ceil(horizon / k)``."""
        return {"masked_score" if self.masked else "surface_stats": -(-horizon // self.options.release_every)}

    def others(self, total: SurfaceTotals, data: SiteData, round: int) -> SurfaceTotals | None:
        """The others' totals from a secure sum: the sum less this site's own upload (kept from its answer, or
        recomputed from the round's data after a restart); None when it cannot be had."""
        members, r, me = total.members or [], total.summed_round, self.context.site
        gram, moment, count, sites = total.gram.numpy(), total.moment.numpy(), total.count, total.sites
        if me in members:
            held = self._mine.get(r)  # type: ignore[arg-type]
            if held is not None and held[0] == tuple(sorted(members)):
                mine = held[1]
            elif r == round:  # restarted: the data of this round is the data it answered from
                mine = self.contribution(data, round, len(members))[0]
            else:
                if not self._warned_restart:
                    self._warned_restart = True
                    warnings.warn(f"surface: site {me!r} holds no record of its upload to round {r}'s sum (restarted "
                                  "since?): proposing from its own GP until the next release round", stacklevel=4)
                return None
            others = leave_out(total, as_summed(mine, len(members)))
            if others is None:
                return None
            gram, moment, count, sites = others
        if sites < 1:
            return None
        noise = None
        dp = self.options.privacy
        if total.ranked and dp is not None:  # the others' shares of the noise on their moment sums
            outs = 1 if moment.ndim == 1 else len(moment)
            shares = honest_members(len(members), self.options.dp_colluders)
            noise = float(dp.sigma * ranked_sum_sensitivity(self.features.norm_bound, dp.clip, outs)
                          * math.sqrt(max(sites, 1) / shares))
        elif total.averages:  # the others' summed averages, scaled by their mean count
            scale = count / sites
            gram, moment = scale * gram, scale * moment
            if dp is not None:
                outs = 1 if moment.ndim == 1 else len(moment)  # per experiment: at the others' mean count
                per = dp.sigma * dp_sensitivity(self.features.norm_bound, dp.clip, outs, dp.unit,
                                                max(int(scale + 0.5), 2))
                shares = honest_members(len(members), self.options.dp_colluders) if self.options.distributed() else 1
                noise = float(scale * per * math.sqrt(sites / shares))
        return SurfaceTotals(sites=sites, count=max(count, 0), gram=Array.of(gram), moment=Array.of(moment),
                             noise_sd=noise, ranked=total.ranked)

    def weights(self, totals: SurfaceTotals, objectives: int = 1) -> np.ndarray | None:
        """The surface's coefficients from the others' totals, ``(p,)`` (or ``(m, p)``, one surface per objective);
        None if there are none, they do not fit (another shape than ``objectives`` asks for), or their DP noise
        swamps them: a noise std per entry above ``noise_guard`` times the others' count (a trusted noise surface
        misleads; the site proposes from its own GP). Ranked sums (``unit="experiment"``): the Gram of the design
        matching the others' feature sums (:func:`~labfbo.protocols.surface.design_tilt.tilted_gram`), the guard per
        feature
        (:func:`~labfbo.protocols.surface.model.guarded_noisy_weights`)."""
        expected = (self.features.p,) if objectives == 1 else (objectives, self.features.p)
        if totals.sites == 0 or tuple(totals.moment.shape) != expected:
            return None
        G = symmetric(totals.gram.numpy(), self.features.p)
        dp, guard = self.options.privacy, self.options.noise_guard
        if totals.ranked and dp is not None:  # the Gram of the design that matches the others' feature sums
            G = self._tilted(self.features.design, totals.count, G[0, 1:], (totals.noise_sd or 0.0) / dp.clip)
            if totals.noise_sd:  # centred ranks in [-C, C]: variance C^2 / 3
                return guarded_noisy_weights(G, totals.moment.numpy(), self.options.ridge, totals.noise_sd,
                                             dp.clip ** 2 / 3, self.features.shares, totals.count, guard)
        if totals.noise_sd is not None and totals.noise_sd > guard * max(totals.count, 1):
            return None
        return ridge_weights(G, totals.moment.numpy(), self.options.ridge)

    def surface_model(self, data: SiteData, w: np.ndarray) -> Model:
        key = data.key() + w.tobytes()
        if key != self._surface_key or self._surface_model is None:
            model, estimate = self._trusted_fit(data, w, data.y, data.yvar, "gp-fit")
            self._surface_model, self._surface_estimate, self._surface_key = model, estimate, key
        return self._surface_model

    def _trusted_fit(self, data: SiteData, w: np.ndarray, y: np.ndarray, yvar: np.ndarray | None, stream: str,
                     objective: bool = True) -> tuple[Model, TransferEstimate | None]:
        """The GP of the values ``y`` at the site's inputs with the surface ``w`` as prior mean, the agreement
        scale's prior mean ``scale_mean`` times the lab's trust in ``w`` on ``y`` (``trust="top"``), or refitted at
        P(the lab agrees with it) (``"agreement"``); ``stream``: the fit's seed stream."""
        o = self.options

        def fit(scale_mean: float) -> Model:
            return fit_local_gp(data.X, y, yvar, space=self.space, options=o, objective=objective,
                                seed=self.context.seed_for(data.n, stream),
                                mean_module=SurfaceMean(self.features, w, scale_mean, o.scale_sd))

        model = fit(o.scale_mean * (top_trust(self.features.of_unit(data.X) @ w, y) if o.trust == "top" else 1.0))
        estimate = surface_transfer(model)
        if o.trust == "agreement" and (trust := agreement_probability(estimate)) < AGREEMENT_REFIT:
            model = fit(o.scale_mean * trust)
            estimate = surface_transfer(model)
        return model, estimate

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        m = self.objectives(data)
        received = guidance
        if isinstance(guidance, SealedTotals):
            guidance = opened(guidance, self.context.site, self.context.key_seed, self.features.p)
        if isinstance(guidance, SurfaceTotals) and guidance.members is not None:
            guidance = self.others(guidance, data, round)
        w = self._weights = self.weights(guidance, m) if isinstance(guidance, SurfaceTotals) else None
        self._transfer = None
        self._alone = None if w is not None or data.n < 2 else why_no_surface(received, guidance)
        if w is None or data.n < 2:
            self._weights = None
            return self.propose_local(data, n, round)
        if m > 1:  # qLogNEHVI over the objectives' GPs on their surfaces (outcome_model); the least trusted is recorded
            X = self.propose_local(data, n, round)
            estimates = [self._objective_models[j][2] for j in range(m) if j in self._objective_models]
            self._transfer = min(estimates, key=agreement_probability, default=None)
            return X
        model = self.surface_model(data, w)
        self._transfer = self._surface_estimate
        return self.propose_with(model, data, n, round)

    def alone(self) -> str | None:
        return self._alone

    def transfer(self) -> TransferEstimate | None:
        """The last proposal's surface against none: the lab's held-out error with and without
        it, and its agreement scale (:mod:`labfbo.models.transfer`); None when it proposed alone."""
        return self._transfer

    def resume_transfer(self, estimate: TransferEstimate | None) -> None:
        """After a restart: the last proposal's estimate, whose agreement weighs this lab's uploads."""
        self._transfer = estimate

    def outcome_model(self, data: SiteData, j: int) -> Model:
        """With one surface per objective: objective ``j``'s GP with its surface as prior mean, trusted as
        far as the site's own values of that objective agree with it (``trust``); else the local GP."""
        w = self._weights
        if w is None or w.ndim != 2 or j >= w.shape[0] or data.Y is None or data.n < 2:
            return super().outcome_model(data, j)
        key = data.X.tobytes() + data.Y[:, j].tobytes() + w[j].tobytes()
        models = self._objective_models
        if j not in models or models[j][0] != key:
            var = None if data.Yvar is None or np.isnan(data.Yvar[:, j]).any() else data.Yvar[:, j]
            models[j] = (key, *self._trusted_fit(data, w[j], data.Y[:, j], var, f"gp-fit/{j}", objective=False))
        return models[j][1]

    def predict(self, data: SiteData, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model of the last proposal: with the last surface received, or the plain GP."""
        if self._weights is None or self._weights.ndim != 1 or data.n < 2:
            return super().predict(data, X)
        return predict(self.surface_model(data, self._weights), X)


class Surface(Protocol):
    """A shared response surface from the sites' ridge statistics as each local GP's prior mean."""

    name = "surface"
    federated = True
    Options = SurfaceOptions
    site_logic = SurfaceSite
    aggregator = SurfaceAggregator
    shared_options = ("fourier_features", "fourier_lengthscale", "multi_objective", "secure_aggregation",
                      "dp_colluders", "sum_seen_by")
    later_shared_options = ("multi_objective", "secure_aggregation", "dp_colluders", "sum_seen_by")

    @property
    def dp_colluders(self) -> int:
        """``dp_colluders``: the sites whose distributed noise shares may be missing from a sum."""
        return int(self.options.dp_colluders)  # type: ignore[attr-defined]

    @property
    def distributed_noise(self) -> bool:
        """Under secure sums with ``DP(unit="site")`` each site adds a share of the sum's noise (a study
        of two sites under ``"auto"`` runs in the clear with local noise: not known here)."""
        o = self.options
        return o.secure_aggregation != "off" and o.distributed()  # type: ignore[attr-defined]

    @classmethod
    def check_study(cls, options: BaseModel, n_sites: int) -> None:
        assert isinstance(options, SurfaceOptions)
        if options.secure_aggregation == "on" and n_sites < MIN_COHORT:
            raise ConfigurationError(f"secure_aggregation='on' needs at least {MIN_COHORT} sites (got {n_sites}): with "
                                     "two, each site could recover the other's statistics from the sum; use 'auto' "
                                     "(the clear protocol, with a warning) or 'off'")
