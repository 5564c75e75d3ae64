r"""The ``surface`` coordinator's side (:class:`SurfaceAggregator`): what it admits (statistics a site's data can
produce,
counts no member can inflate) and each site's totals over the others (:func:`leave_one_out`).

**Range** (:func:`admit_stats`, per message, clear statistics). A site's features lie in
:math:`[-1, 1]` and its standardized values have :math:`\overline{z^2} = (n - 1)/n < 1`, so every
entry of :math:`\bar G = G/n` is in :math:`[-1, 1]` and every entry of :math:`\bar h = h/n` in
:math:`[-1, 1]` (with values clipped to :math:`[-C, C]`: :math:`[-C, C]`). Under DP each entry
carries Gaussian noise of the stated std :math:`\sigma\Delta`: the bound widens by
:data:`NOISE_SLACK` of them. Statistics of another feature count or shape, or outside the
bound, are left out of the round (the member is named); the others get the round they would
have had without it.

**Weight** (:func:`capped_counts`, per round). The others' totals weigh each member's averages by
its count; a member stating a huge count would own the surface. With ``count_cap="median"``
(the default) each count is capped at the median of the round's counts, so one member weighs at
most what a typical one does (:math:`1/n` when the others are alike). Labs with unequal data
then weigh alike above the median; ``count_cap="off"`` keeps the counts as sent.

**Under secure aggregation** (the default from 3 sites) the coordinator sees no member's
statistics (by default not even their sum, which only the sites open): neither a member's range
nor its count can be checked, and one member can spoil the sum for the whole cohort (no one can
be named; each site refuses a sum outside what the cohort's count allows,
:func:`~labfbo.protocols.surface.secure.open_totals`). That is the cost of secure aggregation; each honest site
still bounds its own statistics (its features and standardized values), and a lab's own GP fits
the agreement scale :math:`c` of the surface it receives, so a surface its data contradict weighs
less in its model.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np

from labfbo.core.exceptions import Inadmissible
from labfbo.core.messages import Array, Message
from labfbo.protocols.base import Aggregator, Exchange, Finish, Step
from labfbo.protocols.held import HeldReleases, ReusesReleases
from labfbo.protocols.secure_sum import MaskedScores
from labfbo.protocols.surface.messages import SurfaceRequest, SurfaceStats, SurfaceTotals
from labfbo.protocols.surface.model import SurfaceFeatures, packed_size
from labfbo.protocols.surface.options import SurfaceOptions
from labfbo.protocols.surface.secure import SecureRounds
from labfbo.space.search import SearchSpace

NOISE_SLACK = 10.0  # noise stds of slack under DP: a false rejection has probability < 1e-22 per entry
TOLERANCE = 1e-9


def admit_stats(msg: SurfaceStats, p: int | None) -> SurfaceStats:
    """``msg`` if a site's data can produce it for ``p`` features (else :class:`Inadmissible`)."""
    if p is not None and (msg.p != p or msg.gram.shape != (packed_size(p),) or len(msg.moment.shape) > 2):
        raise Inadmissible(f"surface statistics of {msg.p} features (gram {msg.gram.shape}, moment "
                           f"{msg.moment.shape}); the study's surface has {p}")
    noise = NOISE_SLACK * (msg.dp_noise_multiplier or 0.0) * (msg.dp_sensitivity or 0.0)
    moment_bound = max(1.0, msg.dp_clip or 0.0) + noise + TOLERANCE
    if np.abs(msg.gram.numpy()).max(initial=0.0) > 1.0 + noise + TOLERANCE:
        raise Inadmissible("surface statistics with a Gram entry outside [-1, 1] (features are in [-1, 1])")
    if np.abs(msg.moment.numpy()).max(initial=0.0) > moment_bound:
        raise Inadmissible(f"surface statistics with a moment entry outside [-{moment_bound:.3g}, {moment_bound:.3g}] "
                           "(standardized values times features in [-1, 1])")
    return msg


def capped_counts(stats: Mapping[str, SurfaceStats]) -> dict[str, SurfaceStats]:
    """Each member's count capped at the median of the round's counts (the others unchanged)."""
    if len(stats) < 3:
        return dict(stats)
    cap = int(np.median([m.count for m in stats.values()]))
    return {s: m if m.count <= cap else m.model_copy(update={"count": cap}) for s, m in stats.items()}


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


def features(space: SearchSpace, options: SurfaceOptions) -> SurfaceFeatures:
    """The study's features (the Fourier basis is a function of the space, which every party shares)."""
    return SurfaceFeatures(space, options.fourier_features, options.fourier_lengthscale)


class SurfaceAggregator(SecureRounds, ReusesReleases, Aggregator):
    """Also keeps each site's last statistics sent with ``release_every = k > 1`` (:attr:`held`:
    site -> (round, statistics)) and reuses them in the rounds :math:`r < t < r + k` the site sends none.

    In a study that runs secure sums (:attr:`masked`) a round is a
    :class:`~labfbo.protocols.secure_sum.SecureSum` over the cohort: the masked uploads, then the
    self-mask seeds; every site gets the cohort's sum and its members (:attr:`held_sum`, reused
    under ``release_every``). A dropout redoes the exchange with the others; fewer than 3 left:
    no new sum this round."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reuse: HeldReleases[SurfaceStats] = HeldReleases(self.sites, SurfaceStats, "stats")
        self.shared_agreement: dict[str, float] = {}  # site -> the agreement it last chose to share
        self._p: int | None = None  # the study's feature count, once its space is known
        self.start_secure(self.options.secure_aggregation, self.options.sum_seen_by)

    def state(self) -> dict[str, Any]:
        return {**self.reuse.state(), **self.secure_state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.reuse.restore(state)
        self.secure_restore(state)

    def admit(self, site: str, message: Message) -> Message:
        """Clear statistics in the range a site's data allow (:mod:`~labfbo.protocols.surface.aggregate`);
        an agreement a lab chose to share is kept for the operator (:meth:`site_reports`)."""
        if isinstance(message, SurfaceStats):
            message = admit_stats(message, self._features())
        if isinstance(message, (SurfaceStats, MaskedScores)) and message.agreement is not None:
            self.shared_agreement[site] = float(message.agreement)
        return message

    def site_reports(self) -> dict[str, str]:
        return {s: f"agreement {a:.2f}" for s, a in self.shared_agreement.items()}

    def open_round(self, t: int) -> Step:
        if not self.masked:
            return Exchange({s: SurfaceRequest() for s in self.sites})
        self.secure.reset()
        return self._ask(t)

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        if self.masked:
            return self._on_secure(t, responses)
        stats = {s: m for s, m in responses.items() if isinstance(m, SurfaceStats)}
        p = self._features()
        shapes = [tuple(stats[s].moment.shape) for s in self.sites if s in stats]
        common = max(shapes, key=shapes.count) if shapes else None  # the most frequent (first in roster order)
        wrong = sorted(s for s, m in stats.items() if (p is not None and m.p != p) or tuple(m.moment.shape) != common)
        if wrong:
            warnings.warn(f"surface: ignoring statistics of {wrong} (expected {p} features and moments of shape "
                          f"{common}: one per objective)", stacklevel=2)
            stats = {s: m for s, m in stats.items() if s not in wrong}
        stats = self.reuse.merge(t, stats)
        stats = capped_counts(stats) if self.options.count_cap == "median" else stats
        return Finish(leave_one_out(stats, self.sites) if stats else {})

    def _features(self) -> int | None:
        if self.space is not None and self._p is None:
            self._p = features(self.space, self.options).p  # the basis is drawn once, not every round
        return self._p
