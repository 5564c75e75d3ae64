"""The one place labfbo draws the Gaussian noise of a DP release.

Every mechanism (:func:`labfbo.privacy.dp.privatize`, :mod:`labfbo.privacy.distributed`,
:mod:`labfbo.privacy.belief_dp`, ``surface``'s statistics) adds its noise through
:func:`gaussian`, from a site-private generator chosen by :mod:`labfbo.privacy.streams`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def gaussian(x: Any, std: float, rng: np.random.Generator) -> np.ndarray:
    """``x`` plus independent :math:`\\mathcal N(0, \\mathrm{std}^2)` noise in every entry (one draw per
    entry, in C order, from ``rng``)."""
    return x + rng.normal(0.0, std, np.shape(x))
