r"""Protocol ``surface``: the consortium learns a shared response surface; each lab's GP starts from it.

Not from one of the seed papers: with a handful of labs and twenty experiments each, the
papers' mechanisms capture little of what pooling the data would (``docs/benchmarks.md``
§13). This one shares what a process chemist's design-of-experiments model would: main
effects of every choice and a quadratic in the ordered parameters
(:mod:`labfbo.models.surface`).

One exchange per BO round :math:`t`:

**Site → coordinator** (:class:`SurfaceStats`): its ridge sufficient statistics on its
standardized values, :math:`\bar G_i = \Phi_i^\top\Phi_i/n_i` (upper triangle,
:math:`p(p+1)/2` scalars), :math:`\bar h_i = \Phi_i^\top z_i/n_i` (:math:`p`) and
:math:`n_i`. With ``privacy`` the values are clipped to :math:`[-C, C]` and both averages
get the Gaussian mechanism (:func:`~labfbo.models.surface.privatize`, task level).

**Coordinator** (:func:`leave_one_out`): each site gets the other contributors' sums
:math:`\sum_{j\ne i} n_j\bar G_j` and :math:`\sum_{j\ne i} n_j\bar h_j`
(:class:`SurfaceTotals`) — never its own data back, so its own observations are not
counted twice.

**Site proposal.** :math:`w = (\sum_{j\ne i} n_j\bar G_j + \lambda I)^{-1}\sum_{j\ne i} n_j\bar h_j`;
the site's GP (the engine's kernel, :mod:`labfbo.models.gp`) gets the prior mean
:math:`a + c\,\phi(x)^\top w` with :math:`c \sim \mathcal N(1, 0.3^2)` fitted with the
kernel, and the configured acquisition (qLogNEI by default) is maximized. Without totals
(the first round, a missed round, no other contributor) the site proposes from its own GP.

**Fewer releases** (``release_every=k``). A site uploads its statistics only in rounds
:math:`t \equiv 0 \pmod k` — :math:`\lceil T/k\rceil` releases over rounds :math:`0..T-1`
(a site without two observations in a release round waits for the next one) — and
otherwise answers ``Abstain("not a release round (release_every=k)")``. The statistics
state their ``k``; the coordinator reuses a site's last statistics from round :math:`r` in
the rounds :math:`r < t < r + k` it sent none (post-processing: no new privacy cost), so the
totals keep coming every round, at most :math:`k - 1` rounds stale. Under
``DP(epsilon=...)`` fewer releases compose to the budget with less noise each.

**Several objectives** (``multi_objective="hypervolume"``, the default): one moment
:math:`\bar h_{i,k}` per objective :math:`k` beside the one :math:`\bar G_i`, one surface
:math:`w_k` per objective, each objective's GP on its own surface, and the site maximizes
qLogNEHVI over them (outcome constraints on their plain local GPs). ``"parego"``: the round's
shared Chebyshev scalarization, as the other federated protocols.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Literal, Mapping

import numpy as np
from botorch.models.model import Model
from pydantic import Field, model_serializer, model_validator

from labfbo.messages import Abstain, Array, Message, register
from labfbo.models.gp import fit_local_gp, predict
from labfbo.models.surface import (SurfaceFeatures, SurfaceMean, dp_sensitivity, packed_size, privatize,
                                   ridge_weights, site_statistics, symmetric)
from labfbo.privacy import DP
from labfbo.privacy.release import Release
from labfbo.protocols.held import HeldReleases, ReusesReleases
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.independent import LocalGPSite, ModelOptions
from labfbo.space import SearchSpace


# -- messages ----------------------------------------------------------------------------
@register
class SurfaceRequest(Message):
    """Coordinator -> site: upload your response-surface statistics for this round."""

    kind: Literal["surface_request"] = "surface_request"


def _finite(*arrays: Array) -> None:
    for a in arrays:
        if not np.all(np.isfinite(a.numpy())):
            raise ValueError("statistics must be finite")


MAX_OBJECTIVES = 16  # moments per message: one per objective (several objectives, multi_objective="hypervolume")


def _check_shapes(gram: Array, moment: Array, bound: float) -> None:
    shape = moment.shape
    if not (len(shape) == 1 or (len(shape) == 2 and 2 <= shape[0] <= MAX_OBJECTIVES)) \
            or gram.shape != (packed_size(shape[-1]),):
        raise ValueError(f"moment must be a (p,) vector (or (m, p), one per objective, 2 <= m <= {MAX_OBJECTIVES}) "
                         f"and gram its (p(p+1)/2,) upper triangle, got {shape} and {gram.shape}")
    _finite(gram, moment)
    if max(float(np.abs(gram.numpy()).max(initial=0.0)), float(np.abs(moment.numpy()).max(initial=0.0))) > bound:
        raise ValueError(f"statistics must be at most {bound:g} in absolute value")


MAX_COUNT = 10**7  # observations per site
MAX_AVERAGE = 1e9  # |entry| of an average: <= 1 without DP, DP noise far below this



@register
class SurfaceStats(Message):
    r"""Site -> coordinator: :math:`\bar G` (upper triangle), :math:`\bar h` and :math:`n`
    (``p(p+1)/2 + p + 1`` scalars); with several objectives one :math:`\bar h_j` per objective
    (``moment`` of shape ``(m, p)``)."""

    kind: Literal["surface_stats"] = "surface_stats"
    count: int = Field(ge=2, le=MAX_COUNT)
    gram: Array
    moment: Array
    dp_clip: float | None = None  # under DP: the bound of |z|, the noise multiplier and the l2 sensitivity
    dp_noise_multiplier: float | None = None
    dp_sensitivity: float | None = None
    release_every: int | None = Field(None, ge=1, description="the site's schedule: the coordinator may reuse these "
                                      "statistics for the next k - 1 rounds (None: 1; left off the wire)")

    @model_serializer(mode="wrap")
    def _no_default_schedule(self, handler: Any) -> Any:
        out = handler(self)
        if self.release_every is None and isinstance(out, dict):
            out.pop("release_every", None)  # the messages of release_every=1 are byte for byte as before
        return out

    @model_validator(mode="after")
    def _shapes(self) -> "SurfaceStats":
        _check_shapes(self.gram, self.moment, MAX_AVERAGE)
        return self

    @property
    def p(self) -> int:
        return int(self.moment.shape[-1])


@register
class SurfaceTotals(Message):
    """Coordinator -> site: the other contributors' count-weighted statistics, summed."""

    kind: Literal["surface_totals"] = "surface_totals"
    sites: int = Field(ge=0)
    count: int = Field(ge=0)
    gram: Array
    moment: Array
    noise_sd: float | None = Field(None, ge=0, allow_inf_nan=False, description="the DP noise std per entry of the "
                                   "sums, from what the contributors stated: sqrt(sum_j (n_j sigma_j Delta_j)^2)")

    @model_serializer(mode="wrap")
    def _no_unset_noise(self, handler: Any) -> Any:
        out = handler(self)
        if self.noise_sd is None and isinstance(out, dict):
            out.pop("noise_sd", None)  # totals without DP noise are byte for byte as before
        return out

    @model_validator(mode="after")
    def _shapes(self) -> "SurfaceTotals":
        _check_shapes(self.gram, self.moment, MAX_AVERAGE * MAX_COUNT * 10**4)
        return self


# -- options -------------------------------------------------------------------------------
class SurfaceOptions(ModelOptions):
    """``surface``: the shared acquisition, surrogate and prior options, plus the surface's own."""

    ridge: float = Field(1.0, gt=0, description="lambda: ridge penalty of the shared surface's coefficients")
    scale_mean: float = Field(1.0, description="c0: prior mean of the agreement scale c (1: trust the surface)")
    scale_sd: float = Field(0.3, gt=0, description="s_c: prior standard deviation of c")
    privacy: DP | None = Field(None, description="Gaussian mechanism on the uplink (labfbo.models.surface)")
    fourier_features: int = Field(100, ge=0, le=2000, description="random Fourier features of the ordered "
                                  "columns added to the quadratic (a kernel ridge surface; the basis is a function "
                                  "of the space)")
    fourier_lengthscale: float = Field(0.2, gt=0, description="their RBF lengthscale in unit-cube units")
    release_every: int = Field(1, ge=1, description="k: upload the statistics only in rounds t with t % k == 0 "
                               "(ceil(T/k) releases; the coordinator reuses them in between)")
    multi_objective: Literal["hypervolume", "parego"] = Field(
        "hypervolume", description="several objectives: 'hypervolume' shares one surface per objective and each "
        "site maximizes qLogNEHVI over its GPs on them; 'parego' shares the surface of the round's random "
        "Chebyshev scalarization (as gradient, distribution and consensus do)")

    @model_validator(mode="after")
    def _no_warping(self) -> "SurfaceOptions":
        if self.input_warping:
            raise ValueError("the surface protocol's prior mean is a function of the unwarped inputs; "
                             "input_warping cannot be set")
        return self


# -- the two sides ---------------------------------------------------------------------------
STATS_MECHANISM = ("Gaussian on the averaged ridge statistics (G/n, h/n), values clipped to [-C, C] "
                   "(labfbo.models.surface); the count n is released exactly")


NOISE_GUARD = 0.25
"""The largest DP noise std per entry of the others' sums, relative to their count, at which a
site still uses their surface (the averaged statistics are of order 1, so the sums of order the count)."""


class SurfaceSite(LocalGPSite):
    """Uploads its statistics; proposes with its GP on the others' surface as prior mean."""

    _surface_key: bytes | None = None
    _surface_model: Model | None = None
    _weights: np.ndarray | None = None  # the surface of the last proposal (predictions use the same model)

    def __init__(self, space, options, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(space, options, context)
        self.features = features(space, options)
        self._objective_models: dict[int, tuple[bytes, Model]] = {}  # objective -> (data + surface key, its GP)

    def objectives(self, data: SiteData) -> int:
        """How many surfaces the site shares: one per objective under several objectives with
        ``multi_objective="hypervolume"``, else 1 (the objective, or the round's ParEGO target)."""
        spec = self.context.outcomes
        if spec is None or not spec.multi or data.Y is None or self.options.multi_objective != "hypervolume":
            return 1
        return len(spec.objectives)

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if not isinstance(request, SurfaceRequest):
            return super().answer(request, data, round)
        k = self.options.release_every
        if round % k:
            return Abstain(reason=f"not a release round (release_every={k})")
        if data.n < 2:
            return Abstain(reason="fewer than two observations")
        dp: DP | None = self.options.privacy
        m = self.objectives(data)
        values = data.y if m == 1 else data.Y[:, :m]  # type: ignore[index]
        gram, moment = site_statistics(self.features.of_unit(data.X), values, None if dp is None else dp.clip)
        if dp is not None:  # the site-private stream, never the study seed; keyed by every value it protects
            digest = data.digest() if m == 1 else hashlib.sha256(data.key() + values.tobytes()).hexdigest()[:16]
            gram, moment = privatize(gram, moment, dp, self.features.norm_bound,
                                     self.context.private_rng(round, f"dp-surface/{digest}"))
        return SurfaceStats(count=data.n, gram=Array.of(gram), moment=Array.of(moment),
                            dp_clip=None if dp is None else dp.clip,
                            dp_noise_multiplier=None if dp is None else dp.sigma,
                            dp_sensitivity=None if dp is None else dp_sensitivity(self.features.norm_bound, dp.clip, m),
                            release_every=None if k == 1 else k)

    def declare_release(self, kind: str, round: int, step: int | None, noised: bool,
                        sensitivity: float | None) -> Release | None:
        """The averaged statistics are one Gaussian mechanism of the sensitivity the message states
        (:func:`labfbo.models.surface.dp_sensitivity`); the count travels exactly."""
        dp = self.options.privacy
        if kind != "surface_stats" or not noised or dp is None:
            return super().declare_release(kind, round, step, noised, sensitivity)
        delta_l2 = dp_sensitivity(self.features.norm_bound, dp.clip) if sensitivity is None else sensitivity
        return Release.gaussian(kind, round, dp, STATS_MECHANISM, sensitivity=delta_l2,
                                noise_std=dp.sigma * delta_l2, step=step)

    def planned_releases(self, horizon: int) -> dict[str, int]:
        """One upload in each round ``t < horizon`` with ``t % release_every == 0``: ``ceil(horizon / k)``."""
        return {"surface_stats": -(-horizon // self.options.release_every)}

    def weights(self, totals: SurfaceTotals, objectives: int = 1) -> np.ndarray | None:
        """The surface's coefficients from the others' totals, ``(p,)`` (or ``(m, p)``, one surface per
        objective); None if there are none, they do not fit (another shape than ``objectives``
        asks for), or their DP noise swamps them: a noise std per entry above :data:`NOISE_GUARD`
        times the others' count, the scale of the sums — a trusted noise surface misleads, so the
        site then proposes from its own GP."""
        expected = (self.features.p,) if objectives == 1 else (objectives, self.features.p)
        if totals.sites == 0 or tuple(totals.moment.shape) != expected:
            return None
        if totals.noise_sd is not None and totals.noise_sd > NOISE_GUARD * max(totals.count, 1):
            return None
        G = symmetric(totals.gram.numpy(), self.features.p)
        return ridge_weights(G, totals.moment.numpy(), self.options.ridge)

    def surface_model(self, data: SiteData, w: np.ndarray) -> Model:
        key = data.key() + w.tobytes()
        if key != self._surface_key or self._surface_model is None:
            o = self.options
            mean = SurfaceMean(self.features, w, o.scale_mean, o.scale_sd)
            self._surface_model = fit_local_gp(data.X, data.y, data.yvar, space=self.space,
                                               seed=self.context.seed_for(data.n, "gp-fit"),
                                               options=o, mean_module=mean)
            self._surface_key = key
        return self._surface_model

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        m = self.objectives(data)
        w = self._weights = self.weights(guidance, m) if isinstance(guidance, SurfaceTotals) else None
        if w is None or data.n < 2:
            self._weights = None
            return self.propose_local(data, n, round)
        if m > 1:  # qLogNEHVI over the objectives' GPs on their surfaces (outcome_model)
            return self.propose_local(data, n, round)
        return self.propose_with(self.surface_model(data, w), data, n, round)

    def outcome_model(self, data: SiteData, j: int) -> Model:
        """With one surface per objective: objective ``j``'s GP with its surface as prior mean
        (its agreement scale fitted on the site's own values of that objective); else the local GP."""
        w = self._weights
        if w is None or w.ndim != 2 or j >= w.shape[0] or data.Y is None or data.n < 2:
            return super().outcome_model(data, j)
        key = data.X.tobytes() + data.Y[:, j].tobytes() + w[j].tobytes()
        models = self._objective_models
        if j not in models or models[j][0] != key:
            o = self.options
            var = None if data.Yvar is None or np.isnan(data.Yvar[:, j]).any() else data.Yvar[:, j]
            models[j] = (key, fit_local_gp(data.X, data.Y[:, j], var, space=self.space, options=o,
                                           seed=self.context.seed_for(data.n, f"gp-fit/{j}"), objective=False,
                                           mean_module=SurfaceMean(self.features, w[j], o.scale_mean, o.scale_sd)))
        return models[j][1]

    def predict(self, data: SiteData, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model of the last proposal: with the last surface received, or the plain GP."""
        if self._weights is None or self._weights.ndim != 1 or data.n < 2:
            return super().predict(data, X)
        return predict(self.surface_model(data, self._weights), X)


def features(space: SearchSpace, options: SurfaceOptions) -> SurfaceFeatures:
    """The study's features (the Fourier basis is a function of the space, which every party shares)."""
    return SurfaceFeatures(space, options.fourier_features, options.fourier_lengthscale)


def leave_one_out(stats: Mapping[str, SurfaceStats], sites: list[str]) -> dict[str, SurfaceTotals]:
    """Each site's totals over the *other* contributors (count-weighted sums of their averages),
    summed in roster order whatever order the answers arrived in (the same bits on every transport)."""
    shape = tuple(next(iter(stats.values())).moment.shape) if stats else (0,)
    p = shape[-1]
    G = {s: stats[s].count * stats[s].gram.numpy() for s in sites if s in stats}
    h = {s: stats[s].count * stats[s].moment.numpy() for s in sites if s in stats}
    out = {}
    for s in sites:
        others = [o for o in G if o != s]
        gram, moment = np.zeros(packed_size(p)), np.zeros(shape)
        for o in others:
            gram, moment = gram + G[o], moment + h[o]
        noised = [(stats[o].count * stats[o].dp_noise_multiplier * stats[o].dp_sensitivity) ** 2 for o in others
                  if stats[o].dp_noise_multiplier is not None and stats[o].dp_sensitivity is not None]
        out[s] = SurfaceTotals(sites=len(others), count=sum(stats[o].count for o in others),
                               gram=Array.of(gram), moment=Array.of(moment),
                               noise_sd=float(np.sqrt(sum(noised))) if noised else None)
    return out


class SurfaceAggregator(ReusesReleases, Aggregator):
    """Also keeps each site's last statistics sent with ``release_every = k > 1`` (:attr:`held`:
    site -> (round, statistics)) and reuses them in the rounds :math:`r < t < r + k` the site sends none."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reuse: HeldReleases[SurfaceStats] = HeldReleases(self.sites, SurfaceStats, "stats")

    def open_round(self, t: int) -> Step:
        return Exchange({s: SurfaceRequest() for s in self.sites})


    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        stats = {s: m for s, m in responses.items() if isinstance(m, SurfaceStats)}
        if self.space is not None and not hasattr(self, "_p"):
            self._p = features(self.space, self.options).p  # the basis is drawn once, not every round
        p = getattr(self, "_p", None)
        shapes = [tuple(stats[s].moment.shape) for s in self.sites if s in stats]
        common = max(shapes, key=shapes.count) if shapes else None  # the most frequent (first in roster order)
        wrong = sorted(s for s, m in stats.items() if (p is not None and m.p != p) or tuple(m.moment.shape) != common)
        if wrong:
            warnings.warn(f"surface: ignoring statistics of {wrong} (expected {p} features and moments of shape "
                          f"{common}: one per objective)", stacklevel=2)
            stats = {s: m for s, m in stats.items() if s not in wrong}
        stats = self.reuse.merge(t, stats)
        return Finish(leave_one_out(stats, self.sites) if stats else {})


class Surface(Protocol):
    """A shared response surface from the sites' ridge statistics as each local GP's prior mean."""

    name = "surface"
    federated = True
    Options = SurfaceOptions
    site_logic = SurfaceSite
    aggregator = SurfaceAggregator
    shared_options = ("fourier_features", "fourier_lengthscale", "multi_objective")
    later_shared_options = ("multi_objective",)
