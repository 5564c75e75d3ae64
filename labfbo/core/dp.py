"""The DP settings a study declares (:class:`DP`) and the accounting constants every layer reads.

The mechanisms that act on these settings (clipping, noise, accounting) are in
:mod:`labfbo.privacy`; the meaning of ``unit`` is in :mod:`labfbo.privacy.dp`'s docstring.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError as PydanticValidationError,
    field_validator,
    model_serializer,
)

from labfbo.core.exceptions import ConfigurationError

PLD_DISCRETIZATION = 1e-2
#: below this noise multiplier the PLD accountant's memory grows as 1/sigma^2 (1 GB at 0.05, 4.7 GB at
#: 0.02): such Gaussians are accounted by RDP instead, a valid and looser upper bound (one release at
#: sigma = 0.5 already has epsilon ~ 10 at delta 1e-5, so nothing a budget would allow is affected)
PLD_MIN_SIGMA = 0.5
"""``value_discretization_interval`` of the PLD accountant (see the module docstring)."""

LEDGER_VERSION = 1

Unit = Literal["site", "experiment"]
"""What a guarantee protects: a site's whole dataset, or one of its experiments (module docstring)."""


class DP(BaseModel):
    """Settings of a site's Gaussian mechanism: a campaign budget, or a noise multiplier.

    The budget form, ``DP(epsilon=2.0, delta=1e-5)``: the site plans its campaign's releases
    from the horizon and the protocol's settings and calibrates ``sigma`` so that all of them
    together stay within ``(epsilon, delta)`` (:mod:`labfbo.privacy.budget`); a release that
    would go beyond the budget is never sent. The expert form, ``DP(noise_multiplier=8)``, fixes
    ``sigma`` (and, with ``epsilon=`` as well, still never goes beyond that budget).

    ``clip`` is ``C``, the l2 bound of each clipped quantity (its meaning is the protocol's);
    ``noise_multiplier`` is ``sigma`` (noise std ``sigma`` times the release's sensitivity; 0
    means clipping only, i.e. ``epsilon = inf``); ``delta`` is the delta of the guarantee.
    Neither ``epsilon`` nor ``noise_multiplier`` given: ``sigma = 1`` and no budget.
    ``unit`` is what is protected: ``"site"`` (the default: the lab's whole dataset) or
    ``"experiment"`` (one experiment's setting and result; see the module docstring).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    clip: float = Field(1.0, description="C: l2 bound of each per-particle gradient")
    noise_multiplier: float | None = Field(None, description="sigma: noise std is sigma times the sensitivity "
                                           "(None with epsilon: calibrated to the budget)")
    delta: float = Field(1e-5, description="delta of the (epsilon, delta) guarantee")
    epsilon: float | None = Field(None, description="the campaign's budget: cumulative epsilon never exceeds it")
    unit: Unit = Field("site", description="what is protected: 'site' (the lab's whole dataset) or 'experiment' "
                       "(one experiment's setting and result)")

    def __init__(self, clip: float = 1.0, noise_multiplier: float | None = None, delta: float = 1e-5,
                 epsilon: float | None = None, unit: Unit = "site", **kw: Any) -> None:
        if noise_multiplier is None and epsilon is None:
            noise_multiplier = 1.0
        try:
            super().__init__(clip=clip, noise_multiplier=noise_multiplier, delta=delta, epsilon=epsilon, unit=unit,
                             **kw)
        except PydanticValidationError as exc:  # a labfbo error that names each wrong setting
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'DP'}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()
            )
            raise ConfigurationError(f"DP settings: {problems}") from None

    @model_serializer(mode="wrap")
    def _no_unset_budget(self, handler: Any) -> Any:
        out = handler(self)
        if self.epsilon is None and isinstance(out, dict):
            out.pop("epsilon", None)  # without a budget, the settings dump as before budgets existed (journals)
        if self.unit == "site" and isinstance(out, dict):
            out.pop("unit", None)  # the default unit dumps as before units existed (journals, goldens)
        return out

    @field_validator("clip")
    @classmethod
    def _clip(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"clip (C, the l2 bound of each per-particle gradient) must be a "
                             f"finite number > 0, got {v}")
        return v

    @field_validator("noise_multiplier")
    @classmethod
    def _sigma(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"noise_multiplier (sigma) must be a finite number >= 0 "
                             f"(0 = no noise, no privacy), got {v}")
        return v

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError(f"delta must satisfy 0 < delta < 1, got {v}")
        return v

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"epsilon (the campaign's privacy budget) must be a finite number > 0, got {v}")
        return v

    @property
    def calibrated(self) -> bool:
        """Whether ``sigma`` is known (given, or calibrated to the budget by the site)."""
        return self.noise_multiplier is not None

    @property
    def sigma(self) -> float:
        """``noise_multiplier``; a budget not yet calibrated (no site has planned it) is an error."""
        if self.noise_multiplier is None:
            raise ConfigurationError(f"DP(epsilon={self.epsilon:g}) has no noise multiplier until the site plans "
                                     "its campaign (labfbo.privacy.budget.calibrate)")
        return self.noise_multiplier

    @property
    def sensitivity(self) -> float:
        """``Delta = 2C``: l2 sensitivity of one clipped per-particle gradient."""
        return 2.0 * self.clip

    @property
    def noise_std(self) -> float:
        """``sigma * 2C``: std of the noise added to each coordinate."""
        return self.sigma * self.sensitivity
