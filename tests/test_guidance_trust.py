"""`distribution` and `vote` trust what they receive by the lab's agreement with it: the guidance's
strength (the votes' prior exponent) times the probability that the lab's results are better where
the partners point (labfbo.models.transfer.guidance_agreement)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import labfbo
from labfbo.core.messages import Array
from labfbo.models.figp import guidance_strength
from labfbo.models.gp import fit_local_gp
from labfbo.models.priors import CellPrior
from labfbo.models.transfer import guidance_agreement
from labfbo.protocols.base import SiteContext, SiteData
from labfbo.protocols.distribution.protocol import DistributionOptions, DistributionSite, GuidancePacket
from labfbo.protocols.vote.protocol import VoteOptions, VoteSite

SPACE = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
X = np.random.default_rng(3).random((10, 2))
Y = -((X - 0.3) ** 2).sum(1)  # best near (0.3, 0.3)
DATA = SiteData(SPACE, X, Y, None, np.zeros((0, 2)))


def _shared(centre) -> torch.Tensor:
    return torch.as_tensor(np.exp(-((X - np.asarray(centre)) ** 2).sum(1) / 0.1))


def test_the_agreement_with_a_shared_signal_is_the_probability_that_the_lab_does_better_where_it_is_high() -> None:
    model = fit_local_gp(X, Y, None, space=SPACE, seed=0)
    assert guidance_agreement(model, _shared([0.3, 0.3])) > 0.75 # the partners point where the lab does well
    assert guidance_agreement(model, _shared([0.9, 0.9])) < 0.1  # ... where it does worst
    assert guidance_agreement(model, torch.ones(len(Y))) == 1.0  # a constant signal: nothing to judge
    few = fit_local_gp(X[:2], Y[:2], None, space=SPACE, seed=0)
    assert guidance_agreement(few, _shared([0.9, 0.9])[:2]) == 1.0  # too few results


def _packet(centre) -> GuidancePacket:
    return GuidancePacket(weights=Array.of([1.0]), means=Array.of([centre]), variances=Array.of([[0.05, 0.05]]))


def test_distribution_scales_the_guidance_strength_by_the_labs_agreement() -> None:
    fast = {"M": 32, "candidates": 64}
    site = DistributionSite(SPACE, DistributionOptions(trust="agreement", **fast), SiteContext(site="s0", seed=0))
    full = guidance_strength(1.0, 4)
    assert DistributionOptions().trust == "off" and VoteOptions().trust == "agreement"
    assert site.figp(DATA, _packet([0.3, 0.3]), 3).strength > 0.75 * full
    assert site.figp(DATA, _packet([0.9, 0.9]), 3).strength < 0.1 * full
    off = DistributionSite(SPACE, DistributionOptions(**fast), SiteContext(site="s0", seed=0))
    assert off.figp(DATA, _packet([0.9, 0.9]), 3).strength == pytest.approx(full)  # the paper's strength


def test_vote_scales_the_votes_prior_exponent_by_the_labs_agreement() -> None:
    codebook = np.array([[0.3, 0.3], [0.9, 0.9], [0.1, 0.9], [0.9, 0.1]])
    exponents = {}
    for trust in ("agreement", "off"):
        site = VoteSite(SPACE, VoteOptions(codebook=4, trust=trust), SiteContext(site="s0", seed=0))
        for named in (0, 1):
            site._vote_prior = CellPrior(SPACE, codebook, np.eye(4)[named])
            exponents[trust, named] = site.prior_weight(DATA, 3)[1]
    assert exponents["off", 0] == exponents["off", 1] > 0
    assert exponents["agreement", 0] > 0.75 * exponents["off", 0]  # the votes name the lab's good region
    assert exponents["agreement", 1] < 0.1 * exponents["off", 1]  # ... its worst
