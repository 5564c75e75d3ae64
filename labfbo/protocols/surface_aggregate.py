r"""The ``surface`` coordinator's side: what it admits (statistics a site's data can produce,
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
:func:`~labfbo.protocols.surface_secure.open_totals`). That is the cost of secure aggregation; each honest site
still bounds its own statistics (its features and standardized values), and a lab's own GP fits
the agreement scale :math:`c` of the surface it receives, so a surface its data contradict weighs
less in its model.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from labfbo.exceptions import Inadmissible
from labfbo.messages import Array
from labfbo.models.surface import packed_size
from labfbo.protocols.surface_messages import SurfaceStats, SurfaceTotals

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
