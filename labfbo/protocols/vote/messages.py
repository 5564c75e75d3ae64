"""The messages of protocol ``vote`` (:mod:`labfbo.protocols.vote.protocol`): the coordinator's request,
a site's vote (one codebook index; under DP a randomized response) and the tally a site
receives. Sealed votes travel in the messages of :mod:`labfbo.protocols.vote.sealed`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_serializer, model_validator

from labfbo.core.messages import Array, Message, omit_unset, register
from labfbo.privacy.randomized_response import noise_parameter

MAX_CODEBOOK = 4096


@register
class VoteRequest(Message):
    """Coordinator -> site: vote for the codebook point where you believe the optimum lies."""

    kind: Literal["vote_request"] = "vote_request"
    cohort: dict[str, str] | None = Field(None, description="sealed votes: every member's X25519 public key "
                                          "(base64), for sealing the vote to each other member")
    roster: list[Annotated[str, Field(max_length=200)]] | None = Field(
        None, max_length=4096, description="sealed votes: the study's sites in roster order, so a recipient "
        "checks that a vote names rows dealt to the site that sealed it (left off the wire when unset)")

    @model_serializer(mode="wrap")
    def _no_unset_roster(self, handler: Any) -> Any:
        return omit_unset(handler(self), self, "roster")


@register
class OptimumVote(Message):
    """Site -> coordinator: one codebook index (with DP: a randomized response)."""

    kind: Literal["optimum_vote"] = "optimum_vote"
    index: int = Field(ge=0, lt=MAX_CODEBOOK)
    codebook: int = Field(ge=2, le=MAX_CODEBOOK, description="B, the codebook's size the vote refers to")
    dp_noise_multiplier: float | None = Field(None, gt=0, description="under DP: sigma, the inverse of the vote's "
                                              "epsilon (randomized response)")
    release_every: int | None = Field(None, ge=1, description="the site's schedule: the coordinator may reuse this "
                                      "vote for the next k - 1 rounds (None: 1)")
    choices: int | None = Field(None, ge=2, le=MAX_CODEBOOK, description="under DP: k, how many points the "
                                "randomized response chose among (the site's dealt rows with the design)")

    @model_validator(mode="after")
    def _in_codebook(self) -> "OptimumVote":
        if self.index >= self.codebook:
            raise ValueError(f"index {self.index} is not in a codebook of {self.codebook} points")
        if self.choices is not None and self.choices > self.codebook:
            raise ValueError(f"a vote among {self.choices} points of a codebook of {self.codebook}")
        return self

    @property
    def truth_weight(self) -> float:
        r"""q: a randomized response is the truth with probability :math:`q = (e^\varepsilon - 1)/
        (e^\varepsilon + k - 1)` and otherwise a uniform draw of the k points (1 without DP)."""
        if self.dp_noise_multiplier is None:
            return 1.0
        return 1.0 - noise_parameter(1.0 / self.dp_noise_multiplier, self.choices or self.codebook)


@register
class VoteTally(Message):
    """Coordinator -> site: the other sites' votes, counted per codebook point."""

    kind: Literal["vote_tally"] = "vote_tally"
    counts: Array  # (B,) int64
    evidence: Array | None = Field(None, description="(B,) float64, when some votes were randomized: per point, "
                                   "the sum of its votes' truth weights q (a vote without DP weighs 1)")

    @model_validator(mode="after")
    def _counts(self) -> "VoteTally":
        if self.counts.dtype not in ("int64", "int32"):
            raise ValueError(f"counts must be integers, got {self.counts.dtype}")
        c = self.counts.numpy()
        if c.ndim != 1 or not 2 <= len(c) <= MAX_CODEBOOK or np.any(c < 0):
            raise ValueError(f"counts must be a (B,) vector of non-negative integers, 2 <= B <= {MAX_CODEBOOK}")
        if self.evidence is not None:
            e = self.evidence.numpy()
            if e.shape != c.shape or not np.all(np.isfinite(e)) or np.any(e < 0) or np.any(e > c + 1e-9):
                raise ValueError("evidence must be one weight in [0, count] per codebook point")
        return self
