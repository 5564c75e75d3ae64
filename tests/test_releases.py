"""Releases are declared by the protocol that makes them; the report and the accountant fold over them."""

from __future__ import annotations

import math

import pytest
from campaign import run_campaign
from toy_protocol import MECHANISM

import labfbo
from labfbo.core.release import Release
from labfbo.privacy import gaussian_epsilon
from labfbo.privacy.dp import composed_epsilon
from labfbo.privacy.report import cumulative_epsilon, report

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])
SITES = ["a", "b"]




def _campaign(dp: labfbo.DP | None, rounds: int = 3) -> list[labfbo.Optimizer]:
    kw = {} if dp is None else {"privacy": dp}
    coord = labfbo.Coordinator("toy-noised-mean", sites=SITES, seed=0, horizon=rounds, **kw)
    sites = [labfbo.Optimizer(SPACE, protocol="toy-noised-mean", coordinator=coord, site=s, seed=0, n_init=2, **kw)
             for s in SITES]
    run_campaign(sites, lambda i, p: p["x"] + i, 2, rounds)
    return sites


def test_a_new_protocols_noised_release_reaches_the_privacy_report(toy) -> None:
    dp = labfbo.DP(clip=0.5, noise_multiplier=2.0, delta=1e-6)
    site = _campaign(dp)[0]
    rows = site.privacy_report()
    assert [r["message"] for r in rows] == ["toy_noised_mean"] * 3 and [r["round"] for r in rows] == [0, 1, 2]
    assert all(r["mechanism"] == MECHANISM and r["sensitivity"] == 1.0 and r["noise_std"] == 2.0 for r in rows)
    assert all(r["effective_noise_multiplier"] == 2.0 and r["delta"] == 1e-6 for r in rows)
    assert [r["epsilon"] for r in rows] == pytest.approx([gaussian_epsilon(2.0, t, 1e-6) for t in (1, 2, 3)])
    assert site.epsilon() == pytest.approx(gaussian_epsilon(2.0, 3, 1e-6))
    assert all(isinstance(r, Release) and r.private for r in site.releases())


def test_without_dp_the_same_protocol_releases_with_no_finite_guarantee(toy) -> None:
    site = _campaign(None, rounds=2)[0]
    rows = site.privacy_report()
    assert len(rows) == 2 and all(r["epsilon"] == math.inf and r["mechanism"].startswith("none") for r in rows)
    assert site.epsilon() is None  # no DP configured


def test_a_protocol_that_declares_nothing_is_reported_as_unprotected() -> None:
    """The default declaration is conservative: released as it is."""
    from toy_protocol import NoisedMean, ToyOptions, ToySite

    from labfbo.protocols import SiteContext

    logic = ToySite(SPACE, ToyOptions(), SiteContext(site="a"))
    rel = logic.release(NoisedMean(mean=1.0, round=4))
    assert rel is not None and not rel.private and rel.round == 4
    assert logic.release(labfbo.core.messages.Abstain(reason="x")) is None


def test_releases_with_different_multipliers_compose() -> None:
    dp1, dp2 = labfbo.DP(noise_multiplier=2.0), labfbo.DP(noise_multiplier=4.0)
    rels = [Release.gaussian("m", 0, dp1, "g", sensitivity=1.0, noise_std=2.0),
            Release.gaussian("m", 1, dp2, "g", sensitivity=1.0, noise_std=4.0)]
    # two Gaussians of multipliers 2 and 4 compose to one of multiplier (1/4 + 1/16)^-1/2
    assert cumulative_epsilon(rels) == pytest.approx(gaussian_epsilon((1 / 4 + 1 / 16) ** -0.5, 1, 1e-5), rel=1e-3)
    assert composed_epsilon({2.0: 3}, 1e-5) == gaussian_epsilon(2.0, 3, 1e-5)
    assert cumulative_epsilon(rels + [Release.unprotected("m", 2)]) == math.inf
    assert report(rels)[0]["epsilon"] < report(rels)[1]["epsilon"]
    with pytest.raises(ValueError, match="together"):
        Release(round=0, message="m", sensitivity=1.0)


def test_a_gaussian_release_needs_a_positive_sensitivity() -> None:
    with pytest.raises(ValueError, match="positive l2 sensitivity"):
        Release.gaussian("m", 0, labfbo.DP(), "g", sensitivity=0.0, noise_std=1.0)
