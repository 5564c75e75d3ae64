r"""Distributed DP noise under secure aggregation: each cohort member adds a share of the noise.

With secure aggregation the coordinator sees only the cohort's sum
:math:`\sum_{i=1}^{n} (\mathrm{clip}_C(A_i) + Z_i)`. If every member added the full noise
:math:`Z_i \sim \mathcal{N}(0, (\sigma\,2C)^2 I)` (*local* noise, :func:`~labfbo.privacy.dp.privatize`),
the sum would carry :math:`n` times the variance one site's guarantee needs. In *distributed*
mode each member adds only its share

.. math:: Z_i \sim \mathcal{N}\Big(0, \frac{(\sigma\,2C)^2}{h}\, I\Big), \qquad h = \max(n - t, 1),

where :math:`t` (``dp_colluders``) bounds how many of the *other* members may collude with the
coordinator (pool their data and noise with it, so they can subtract their own terms). The
:math:`h` honest members' shares then sum to exactly :math:`\mathcal{N}(0, (\sigma\,2C)^2 I)`:
what the coordinator and its colluders see of site :math:`i` is the same Gaussian mechanism as
in local mode (sensitivity :math:`2C\sqrt{K}` of one step's :math:`K` rows, effective multiplier
:math:`\sigma/\sqrt{K}`), so the declared release and the accounting are unchanged, while each
site adds :math:`\sqrt{h}` times less noise and the aggregate carries variance
:math:`(n/h)(\sigma\,2C)^2` per coordinate instead of :math:`n(\sigma\,2C)^2`.

``h = 1`` (a cohort of at most :math:`t + 1` members, e.g. after dropouts) means the site adds
the full noise itself: its guarantee is local mode's, nothing is saved and nothing is lost,
so such a cohort is not refused.

Trust assumption (stated in every release's mechanism): the coordinator is honest but
curious (it follows the protocol, in particular it tells every member the same cohort); at
most :math:`t` of the other members collude with it; the others add their shares honestly,
with the same ``dp_noise``/``dp_colluders`` (shared options, checked at join) *and* the same
noise std :math:`\sigma\,2C` (same ``clip`` and noise multiplier: the same ``DP(...)`` and
horizon). A member with a smaller :math:`\sigma\,2C` weakens the others' guarantee; this is
not verified. A single member's upload is hidden only by the masks, not by enough noise.

Site level only (``DP(unit="site")``): the shares are of :func:`~labfbo.privacy.dp.privatize`'s
noise, which refuses ``unit="experiment"`` (a score is no sum over experiments).
"""

from __future__ import annotations

import math

import numpy as np

from labfbo.core.exceptions import ValidationError
from labfbo.privacy.dp import DP, privatize


def honest_members(cohort: int, colluders: int) -> int:
    """``h = max(n - t, 1)``: the members of a cohort of ``n`` that surely add their share honestly."""
    if cohort < 1 or colluders < 0:
        raise ValidationError(f"a cohort needs >= 1 member and colluders >= 0, got n={cohort}, t={colluders}")
    return max(int(cohort) - int(colluders), 1)


def share_std(dp: DP, cohort: int, colluders: int) -> float:
    r"""Std of one member's noise share per coordinate, :math:`\sigma\,2C / \sqrt{\max(n - t, 1)}`."""
    return dp.noise_std / math.sqrt(honest_members(cohort, colluders))


def share_purpose(purpose: str, cohort: int, colluders: int) -> str:
    """The site-private noise stream of a share: keyed by ``h`` as well, so a step redone with a
    cohort of another ``h`` draws independent noise (never the same draw at another scale, whose
    difference would reveal it), and one redone at the same ``h`` sends the same values again."""
    return f"{purpose}/share-of-{honest_members(cohort, colluders)}"


def privatize_share(grads: np.ndarray, dp: DP, rng: np.random.Generator, cohort: int, colluders: int) -> np.ndarray:
    """Eq. 12 clipping, then this member's share of Eq. 13's noise: ``N(0, share_std^2)`` per entry.

    ``cohort = colluders + 1`` (or fewer) gives :func:`~labfbo.privacy.dp.privatize`'s full noise;
    ``noise_multiplier == 0``: clipped only, ``rng`` not used.
    """
    if not isinstance(dp, DP):
        raise ValidationError(f"dp must be a labfbo DP, got {type(dp).__name__}")
    return privatize(grads, dp, rng, share_std(dp, cohort, colluders))


def mechanism(colluders: int) -> str:
    """The release's mechanism as the privacy report states it, with its trust assumption."""
    return ("distributed Gaussian on the secure sum of K per-particle scores, each clipped to l2 norm C "
            "(PACD-BO Eqs. 12-13): each of the cohort's n members adds N(0, (sigma 2C)^2 / max(n - t, 1)), "
            f"t = {colluders}, so the honest members' shares sum to the noise std sigma 2C stated here; trust: an "
            f"honest-but-curious coordinator, at most {colluders} other site(s) collude with it, the others add "
            "their shares honestly with the same clip and noise multiplier")
