r"""Protocol ``ensemble``: each site weighs the other sites' models by how well they rank its own data.

Built for the everyday lab consortium — a handful of labs, a few dozen experiments each,
reagents chosen from lists — where the seed papers' mechanisms (built for continuous
functions and many rounds) transfer little. One exchange per BO round:

**Site → coordinator** (:class:`ModelSamples`). The site fits its local GP and shares
:math:`S` draws of its posterior as random-Fourier-feature weight vectors
:math:`w_s \in \mathbb R^M` on a basis the coordinator's seed fixes for the round, with
its kernel's scales (:mod:`labfbo.models.rff`): :math:`f_s(x) = c + \phi(x)^\top w_s` on
the site's standardized scale (Dai, Low & Jaillet 2020 share one such draw; we share
:math:`S` so a peer can weigh and average them). Never an observation, an input, nor the
site's yield level or spread.

**Coordinator** (:class:`EnsembleAggregator`): forwards to each site the other sites'
samples (:class:`PeerModels`). Nothing is merged: the weighting needs the site's own data.

**Site proposal**: the RGPE posterior (:mod:`labfbo.models.rgpe`) of the site's own GP and
its peers' sample functions, weighted by the probability of ranking the site's own
observations best (its own model judged leave-one-out), peers that rank them worse than
its own model with 95 % confidence dropped; then the configured acquisition (qLogNEI by
default) on it. Before any peer's samples arrive the site runs plain local BO.

With ``privacy=labfbo.DP(clip, noise_multiplier)`` each of the :math:`S` weight vectors
is clipped to :math:`\lVert w_s\rVert \le C` and :math:`\mathcal N(0, (2\sigma C)^2 I)`
noise is added before it leaves (a task-level Gaussian mechanism on the :math:`S \times M`
block, effective multiplier :math:`\sigma/\sqrt S`, as for ``gradient``'s scores). The
kernel scales and the constant :math:`c` travel unnoised. A prior draw has
:math:`\lVert w\rVert \approx \sqrt M`: set :math:`C` accordingly.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Literal, Mapping

import numpy as np
import torch
from pydantic import Field, model_validator

from labfbo.messages import Abstain, Array, Message, register
from labfbo.models.rff import Basis, features, shared_encoding, site_sample_weights
from labfbo.models.rgpe import EnsembleModel, SampledModel, loo_losses, ranking_losses, relatedness, rgpe_weights
from labfbo.privacy import DP, privatize
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.independent import LocalGPSite, ModelOptions
from labfbo.seeding import int_seed
from labfbo.space import SearchSpace


# -- messages ----------------------------------------------------------------------------
@register
class SamplesRequest(Message):
    """Coordinator -> site: share posterior samples on this round's random-feature basis."""

    kind: Literal["samples_request"] = "samples_request"
    basis_seed: int = Field(ge=0)


@register
class ModelSamples(Message):
    """Site -> coordinator: ``S`` posterior weight draws ``(S, M)``, the kernel's scales on the
    shared encoding ``(D,)`` (Matérn-5/2 columns flagged) and the constant mean ``c``."""

    kind: Literal["model_samples"] = "model_samples"
    kernel: Literal["rbf", "matern52"]
    scales: Array
    matern: Array
    offset: float
    weights: Array
    dp_clip: float | None = None
    dp_noise_multiplier: float | None = None

    @model_validator(mode="after")
    def _shapes(self) -> "ModelSamples":
        s, m, w = self.scales.numpy(), self.matern.numpy(), self.weights.numpy()
        if s.ndim != 1 or m.shape != s.shape or w.ndim != 2 or w.shape[0] < 2:
            raise ValueError(f"scales (D,), matern (D,) and weights (S >= 2, M) expected, got "
                             f"{s.shape}, {m.shape}, {w.shape}")
        if self.matern.dtype != "bool":
            raise ValueError("matern must be a boolean array")
        if not (np.all(np.isfinite(s)) and np.all(s > 0) and np.all(np.isfinite(w)) and np.isfinite(self.offset)):
            raise ValueError("scales must be finite and > 0, weights and offset finite")
        return self

    @property
    def n_scalars(self) -> int:
        return 1 + self.scales.n_scalars + self.matern.n_scalars + self.weights.n_scalars


@register
class PeerModels(Message):
    """Coordinator -> site: the other sites' samples of this round (in study order, unnamed)."""

    kind: Literal["peer_models"] = "peer_models"
    basis_seed: int = Field(ge=0)
    models: list[ModelSamples]


# -- options ------------------------------------------------------------------------------
class EnsembleOptions(ModelOptions):
    """``ensemble``: the shared acquisition and surrogate options, and what is shared."""

    n_features: int = Field(512, ge=16, le=8192, description="random Fourier features M (shared by the study)")
    n_samples: int = Field(32, ge=2, le=1024, description="posterior draws S a site shares per round")
    dilution: bool = Field(True, description="drop peers that rank the site's data worse than its own model")
    combine: Literal["bcm", "rgpe"] = Field(
        "bcm", description="bcm: a committee of the own GP and the peers, each peer's evidence scaled by its "
        "relatedness; rgpe: RGPE's ranking-weighted mean of the models")
    privacy: DP | None = Field(None, description="Gaussian mechanism on the shared weight draws")

    @model_validator(mode="after")
    def _no_warping(self) -> "EnsembleOptions":
        if self.input_warping:
            raise ValueError("input_warping is not available with protocol 'ensemble': a site's warping has no "
                             "random-feature form its peers could evaluate")
        return self

    @property
    def dp_rows(self) -> int:
        """Rows one release carries (the privacy accountant's K)."""
        return self.n_samples


# -- the two sides ---------------------------------------------------------------------------
class EnsembleSite(LocalGPSite):
    """Shares posterior samples; proposes with the ranking-weighted ensemble."""

    last_weights: np.ndarray | None = None  # peers' then its own, from the last proposal

    def basis(self, seed: int) -> Basis:
        return Basis.draw(shared_encoding(self.space).n_out, self.options.n_features, seed)

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if not isinstance(request, SamplesRequest):
            return super().answer(request, data, round)
        if data.n < 2:
            return Abstain(reason="fewer than two observations")
        o, ctx = self.options, self.context
        W, scales, matern, kernel, offset = site_sample_weights(
            self.local_model(data), self.space, data.X, self.basis(request.basis_seed), o.n_samples,
            ctx.private_rng(round, "ensemble-samples"))
        dp: DP | None = o.privacy
        if dp is not None:  # the site-private stream, never the study seed
            W = privatize(W, dp, ctx.private_rng(round, "dp-ensemble"))
        return ModelSamples(kernel=kernel, scales=Array.of(scales), matern=Array.of(matern, "bool"), offset=offset,
                            weights=Array.of(W), dp_clip=None if dp is None else dp.clip,
                            dp_noise_multiplier=None if dp is None else dp.noise_multiplier)

    def peers(self, guidance: PeerModels) -> list[SampledModel]:
        """The peers' sample functions (a sample of the wrong shape for this space is left out)."""
        basis, shared = self.basis(guidance.basis_seed), shared_encoding(self.space)
        out = []
        for m in guidance.models:
            if m.scales.shape != (shared.n_out,) or m.weights.shape[1] != basis.n_features:
                warnings.warn(f"a peer's samples of shape {m.weights.shape}/{m.scales.shape} do not fit this space "
                              f"and {basis.n_features} features; left out", stacklevel=2)
                continue
            fn = partial(features, basis, shared, scales=m.scales.numpy(), kernel=m.kernel,
                         matern_cols=m.matern.numpy())
            out.append(SampledModel(fn, m.weights.numpy(), m.offset))
        return out

    def ensemble(self, data: SiteData, guidance: PeerModels, round: int) -> EnsembleModel | None:
        """The RGPE model of this round, or None when no peer's samples are usable."""
        peers = self.peers(guidance)
        if not peers:
            return None
        own = self.local_model(data)
        o = self.options
        gen = np.random.default_rng(self.context.seed_for(round, "ensemble-weights"))
        y = own.train_targets.detach().numpy()
        X = torch.as_tensor(data.X, dtype=torch.float64)
        with torch.no_grad():
            peer_losses = [ranking_losses(p.draws(X).numpy(), y) for p in peers]
        own_losses = loo_losses(own, o.n_samples, gen)
        if o.combine == "rgpe":
            weights = rgpe_weights(peer_losses, own_losses, gen, o.dilution)
        else:
            weights = np.append(relatedness(peer_losses, own_losses, o.dilution), 1.0)
        self.last_weights = weights
        tf = own.outcome_transform
        y_mean, y_std = float(tf.means.reshape(-1)[0]), float(tf.stdvs.reshape(-1)[0])
        prior_mean = y_mean + y_std * float(own.mean_module.constant.detach())
        return EnsembleModel(own, weights[-1], peers, list(weights[:-1]), y_mean, y_std, o.combine, prior_mean)

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        model = self.ensemble(data, guidance, round) if isinstance(guidance, PeerModels) and data.n >= 2 else None
        if model is None:
            return self.propose_local(data, n, round)
        return self.propose_with(model, data, n, round)


class EnsembleAggregator(Aggregator):
    """Draws the round's basis seed; forwards each site the other sites' samples."""

    def basis_seed(self, t: int) -> int:
        return int_seed(self.seed, 0, t, "ensemble-basis")

    def open_round(self, t: int) -> Step:
        return Exchange({s: SamplesRequest(basis_seed=self.basis_seed(t)) for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        d = shared_encoding(self.space).n_out if self.space is not None else None
        got: dict[str, ModelSamples] = {}
        for s in self.sites:
            m = responses.get(s)
            if not isinstance(m, ModelSamples):
                continue
            if (d is not None and m.scales.shape != (d,)) or m.weights.shape[1] != self.options.n_features:
                warnings.warn(f"site {s!r} sent samples of shape {m.weights.shape}/{m.scales.shape} for "
                              f"{self.options.n_features} features and {d} encoded columns; left out", stacklevel=2)
                continue
            got[s] = m
        return Finish({s: PeerModels(basis_seed=self.basis_seed(t), models=[got[o] for o in self.sites
                                                                          if o != s and o in got])
                       for s in self.sites})


class EnsembleProtocol(Protocol):
    name = "ensemble"
    federated = True
    shared_options = ("n_features",)
    Options = EnsembleOptions
    site_logic = EnsembleSite
    aggregator = EnsembleAggregator


def space_message_size(space: SearchSpace, options: EnsembleOptions) -> int:
    """Scalars one site sends per round on ``space``: ``S * M + 2 D + 1``."""
    return options.n_samples * options.n_features + 2 * shared_encoding(space).n_out + 1
