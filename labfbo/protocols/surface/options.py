"""``surface``'s options: the shared model options plus the surface's own (:mod:`labfbo.protocols.surface.protocol`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from labfbo.privacy import DP
from labfbo.protocols.independent import ModelOptions
from labfbo.protocols.surface.secure import Mode, Reader

__all__ = ["AGREEMENT_REFIT", "NOISE_GUARD", "SurfaceOptions"]


# -- options -------------------------------------------------------------------------------
AGREEMENT_REFIT = 0.9
"""``trust="agreement"``: the GP is refitted with a scaled prior mean only below this probability."""
NOISE_GUARD = 0.25
"""The largest DP noise std per entry of the others' sums, relative to their count, at which a
site still uses their surface (the averaged statistics are of order 1, so the sums of order the count)."""


class SurfaceOptions(ModelOptions):
    """``surface``: the shared acquisition, surrogate and prior options, plus the surface's own."""

    lengthscale_prior: Literal["optuna", "capped", "dim_scaled"] = Field(
        "dim_scaled", description="the lab's GP lengthscale prior: 'dim_scaled' (surface's default: its trust "
        "and guidance defaults were chosen with it; the single-site engine's default 'optuna' is measured "
        "alone, not yet federated), 'optuna' or 'capped' (independent's options)")
    ridge: float = Field(1.0, gt=0, description="lambda: ridge penalty of the shared surface's coefficients")
    scale_mean: float = Field(1.0, description="c0: prior mean of the agreement scale c (1: trust the surface)")
    scale_sd: float = Field(0.3, gt=0, description="s_c: prior standard deviation of c")
    trust: Literal["agreement", "prior", "top"] = Field(
        "agreement", description="the agreement scale's prior mean: scale_mean times the probability that the "
        "lab's results go the same way as the partners' surface ('agreement', labfbo.models.transfer); scale_mean "
        "('prior'); or less while the surface ranks the lab's best result in the lower half of its results ('top')")
    weigh_upload: Literal["agreement", "off"] = Field(
        "agreement",
        description="agreement: a lab weighs its own statistics by the probability that its results go "
        "the same way as its partners' surface (labfbo.models.transfer.agreement_probability), "
        "so a lab unlike the others "
        "does not pull their surface its way; off: every lab's statistics at full weight (always so under DP)",
    )
    noise_guard: float = Field(NOISE_GUARD, gt=0, description="under DP: the largest noise std per entry of "
                               "the others' sums, relative to their count, at which a site still uses their surface")
    privacy: DP | None = Field(None, description="Gaussian mechanism on the uplink (labfbo.protocols.surface.model)")
    fourier_features: int = Field(100, ge=0, le=2000, description="random Fourier features of the ordered "
                                  "columns added to the quadratic (a kernel ridge surface; the basis is a function "
                                  "of the space)")
    fourier_lengthscale: float = Field(0.2, gt=0, description="their RBF lengthscale in unit-cube units")
    release_every: int = Field(1, ge=1, description="k: upload the statistics only in rounds t with t % k == 0 "
                               "(ceil(T/k) releases; the coordinator reuses them in between)")
    secure_aggregation: Mode = Field(
        "auto", description="auto: the statistics leave a site only masked into the cohort's sum in a study of "
        ">= 3 sites, in the clear (with a warning) in one of 2; on: always masked (a study of fewer than 3 is "
        "refused); off: in the clear (labfbo.protocols.surface.secure)")
    sum_seen_by: Reader = Field("members", description="secure aggregation: who learns the cohort's sum. members: "
                                "the self-mask seeds are sealed for the other members, the coordinator holds only "
                                "the masked sum; coordinator: it unmasks the sum (labfbo.protocols.surface.secure)")
    share_agreement: bool = Field(False, description="send the coordinator this lab's agreement with its "
                                  "partners' surface with each upload, in the clear, for the operator's dashboard "
                                  "(never under DP)")
    count_cap: Literal["median", "off"] = Field(
        "median", description="clear statistics: cap each member's count at the round's median count, so no member "
        "can own the surface by stating a huge count (labfbo.protocols.surface.aggregate)")
    dp_colluders: int = Field(0, ge=0, description="secure aggregation under DP: how many other sites may collude "
                              "with the coordinator; each member adds 1/max(n - dp_colluders, 1) of the noise variance")
    multi_objective: Literal["hypervolume", "parego"] = Field(
        "hypervolume", description="several objectives: 'hypervolume' shares one surface per objective and each "
        "site maximizes qLogNEHVI over its GPs on them; 'parego' shares the surface of the round's random "
        "Chebyshev scalarization (as gradient, distribution and consensus do)")

    @model_validator(mode="after")
    def _no_warping(self) -> "SurfaceOptions":
        if self.input_warping:
            raise ValueError("the surface protocol's prior mean is a function of the unwarped inputs; "
                             "input_warping cannot be set")
        if self.dp_colluders and (self.privacy is None or self.secure_aggregation == "off"):
            raise ValueError("dp_colluders applies to DP noise shared over secure sums: it needs privacy=DP(...) "
                             "and secure_aggregation 'auto' or 'on'")
        return self

    def distributed(self) -> bool:
        """Under secure sums each member adds a share of the DP noise: of the averages' under ``unit="site"``,
        of the ranked moment sums' under ``unit="experiment"`` (:mod:`labfbo.protocols.surface.secure`)."""
        return self.privacy is not None
