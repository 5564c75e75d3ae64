"""``surface`` under ``DP(unit="experiment")`` over secure sums: ranked moment sums, feature sums and the tilted
design's Gram, noise shares."""

from __future__ import annotations

import numpy as np
import pytest
from test_dp_unit import MIXED, replacements
from test_surface_secagg import SITES, SPACE, _opened, _run

import labfbo
from labfbo.core.messages import Array
from labfbo.privacy import secagg
from labfbo.protocols.secure_sum import MaskedScores
from labfbo.protocols.surface.design_tilt import tilt_weights, tilted_gram
from labfbo.protocols.surface.model import (
    SurfaceFeatures,
    design_points,
    feature_sums,
    guarded_noisy_weights,
    noisy_ridge_weights,
    rank_scores,
    ranked_moments,
    ranked_sum_sensitivity,
)
from labfbo.protocols.surface.secure import HeldSum


@pytest.mark.parametrize("space", [MIXED, SPACE], ids=["mixed", "categorical"])
@pytest.mark.parametrize("outcomes", [1, 2])
def test_replacing_one_experiment_never_moves_the_release_beyond_the_stated_sensitivity(space, outcomes) -> None:
    """Random datasets (ties, results far out), one experiment's setting and results replaced: the moment
    sums and C times the feature sums move by at most 2 C sqrt((P - 1)(4 m + 1)), whatever the count — and
    by a good part of it; the moments' constant entry is always 0."""
    feats = SurfaceFeatures(space, fourier=8)
    worst = 0.0
    for trial, (n, clip, X, y, X2, y2) in enumerate(replacements(space, outcomes, seed=2)):
        Phi, Phi2 = feats.of_unit(X), feats.of_unit(X2)
        a, b = ranked_moments(Phi, y, clip), ranked_moments(Phi2, y2, clip)
        assert np.allclose(np.atleast_2d(a)[:, 0], 0.0, atol=1e-9)
        bound = ranked_sum_sensitivity(feats.norm_bound, clip, outcomes)
        moved = np.concatenate([(a - b).ravel(), clip * (feature_sums(Phi) - feature_sums(Phi2))])
        change = float(np.linalg.norm(moved))
        assert change <= bound * (1 + 1e-12), (trial, n, change, bound)
        worst = max(worst, change / bound)
    assert worst > 0.25


def test_ranked_moments_are_the_features_times_the_centred_ranks() -> None:
    gen = np.random.default_rng(0)
    Phi, y = gen.random((7, 4)), gen.random(7)
    assert np.allclose(ranked_moments(Phi, y, 2.0), Phi.T @ rank_scores(y, 2.0))
    Y = gen.random((7, 2))
    assert np.allclose(ranked_moments(Phi, Y, 1.0), np.stack([Phi.T @ rank_scores(Y[:, j], 1.0) for j in range(2)]))


def _independent_gram(counts: list[np.ndarray], n: float) -> np.ndarray:
    """The Gram of ``n`` experiments whose reagents are drawn independently with these counts per block."""
    probs = np.concatenate([[1.0], *[c / n for c in counts]])
    G = np.outer(probs, probs)
    start = 1
    for c in counts:
        block = slice(start, start + len(c))
        G[block, block] = np.diag(c / n)
        start += len(c)
    return n * G


def test_the_tilted_design_matches_the_counts_and_is_the_uniform_design_without_a_signal() -> None:
    """On a categorical space: at the uniform design's own sums the Gram is the uniform design's (1/k on a block's
    diagonal, 1/(k k') across blocks); at any counts, each choice's count exactly and each pair's the product of
    its choices' counts over N (reagents drawn independently); the same matrix at every site."""
    feats = SurfaceFeatures(SPACE)
    U = design_points(feats)
    assert np.array_equal(U, SurfaceFeatures(SPACE).design)
    uniform = [np.full(k, 40 / k) for k in (3, 4, 5)]
    assert np.allclose(tilted_gram(U, 40, np.concatenate(uniform)), _independent_gram(uniform, 40), atol=0.1)
    counts = [np.array([30.0, 8.0, 2.0]), np.array([10.0, 10.0, 0.0, 20.0]), np.array([1.0, 2.0, 3.0, 4.0, 30.0])]
    G = tilted_gram(U, 40, np.concatenate(counts))
    assert np.allclose(G, _independent_gram(counts, 40), atol=0.1)   # a Sobol design of 4,096 points
    assert np.allclose(G, G.T) and np.linalg.eigvalsh(G).min() > -1e-9
    assert tilted_gram(U, 0, np.zeros(feats.p - 1)).sum() == 0.0


def test_noisy_feature_sums_move_the_design_by_their_evidence() -> None:
    """The weights stay a distribution; sums far off in the noise leave the design near uniform, the same sums
    without noise are matched."""
    feats = SurfaceFeatures(SPACE)
    U = design_points(feats)
    skewed = np.concatenate([[36.0, 2.0, 2.0], np.full(4, 10.0), np.full(5, 8.0)])
    for sd in (0.0, 3.0, 1e3):
        w = tilt_weights(U[:, 1:], skewed / 40, sd / 40)
        assert w.min() >= 0 and w.sum() == pytest.approx(1.0)
    exact, noisy = (tilted_gram(U, 40, skewed, sd)[1, 1] for sd in (0.0, 1e3))
    assert exact == pytest.approx(36.0, abs=0.05) and noisy == pytest.approx(40 / 3, abs=0.5)
    assert 40 / 3 < tilted_gram(U, 40, skewed, 6.0)[1, 1] < 36.0


def test_uploads_are_the_counts_the_feature_sums_and_noised_ranked_sums_with_a_third_of_the_noise_each() -> None:
    dp = labfbo.DP(clip=2.0, noise_multiplier=1.5, unit="experiment")
    _, sites, _ = _run(rounds=2, privacy=dp)
    logic, data = sites[0].agent.logic, sites[0].site_data()
    delta = ranked_sum_sensitivity(logic.features.norm_bound, 2.0)
    for o in sites:
        rel = o.releases()
        assert rel and all(r.message == "masked_score" and r.secure_aggregation and r.unit == "experiment"
                           for r in rel)
        assert all("centred ranks" in r.mechanism and r.sensitivity == pytest.approx(delta)
                   and r.effective_noise_multiplier == pytest.approx(1.5) for r in rel)
        ups = [m for m in o.sent_messages() if isinstance(m, MaskedScores)]
        assert ups and all(m.dp_unit == "experiment" and m.dp_sensitivity == pytest.approx(delta) for m in ups)
    p = logic.features.p
    P = p * (p + 1) // 2
    Phi = logic.features.of_unit(data.X)
    clean, sums = ranked_moments(Phi, data.y, 2.0), feature_sums(Phi)
    moment_noise, sum_noise = [], []
    for r in range(100, 160):  # each round's share is a fresh draw of the site's private stream
        vector, fields = logic.contribution(data, r, 3)
        assert vector[0] == data.n and not vector[p:P].any()   # of the Gram, only the constant row
        assert vector[-2:].tolist() == [data.n, 1.0] and fields["dp_unit"] == "experiment"
        moment_noise.append(vector[P:-2] - clean)
        sum_noise.append(vector[1:p] - sums)
    assert np.array_equal(logic.contribution(data, 100, 3)[0], logic.contribution(data, 100, 3)[0])
    share = 1.5 * delta / np.sqrt(3)
    assert 0.9 < np.std(moment_noise) / share < 1.1
    assert 0.9 < np.std(sum_noise) / (share / 2.0) < 1.1   # C s carries the share: s carries it over C


def test_the_sums_open_ranked_and_the_surface_is_used_until_the_noise_swamps_it(monkeypatch) -> None:
    """Little noise (a large budget): each site opens a ranked sum, subtracts its own upload and learns the
    others' surface by the noise-aware ridge at the noise it states; much noise: the guard leaves every
    site on its own GP, as alone."""
    import labfbo.protocols.surface.protocol as surface

    calls: list[float] = []

    def spy(G, h, ridge, noise_sd, value_var, shares, count, guard):  # type: ignore[no-untyped-def]
        calls.append(noise_sd)
        assert value_var == pytest.approx(1 / 3) and guard == 0.25
        return guarded_noisy_weights(G, h, ridge, noise_sd, value_var, shares, count, guard)

    monkeypatch.setattr(surface, "guarded_noisy_weights", spy)
    quiet = labfbo.DP(clip=1.0, noise_multiplier=0.01, unit="experiment")
    _, sites, props = _run(rounds=3, privacy=quiet)
    delta = ranked_sum_sensitivity(sites[0].agent.logic.features.norm_bound, 1.0)
    assert calls and all(c == pytest.approx(0.01 * delta * np.sqrt(2 / 3)) for c in calls)  # 2 others' shares of 3
    totals = _opened(sites[0])
    assert totals and all(t.ranked and not t.averages for t in totals)
    p = sites[0].agent.logic.features.p
    for t in totals:
        gram = t.gram.numpy()
        assert gram[0] == t.count and not gram[p:].any() and abs(gram[1:p]).max() > 1
    assert any(o.agent.logic._weights is not None for o in sites)
    loud = labfbo.DP(clip=1.0, noise_multiplier=50.0, unit="experiment")
    _, alone_sites, alone = _run(rounds=3, privacy=loud)
    assert all(o.agent.logic._weights is None for o in alone_sites)
    assert props != alone


def test_a_cohort_mixing_units_is_not_unmasked() -> None:
    from labfbo.protocols.surface.protocol import SurfaceAggregator, SurfaceOptions

    agg = SurfaceAggregator(SurfaceOptions(), SITES, 0, None, SPACE)
    agg.secure.keys = {s: secagg.public_key(bytes([i + 1]) * 32) for i, s in enumerate(SITES)}
    agg.open_round(0)
    ups = {s: MaskedScores(step=0, masked=Array.of(np.zeros(4), dtype="uint64"), dp_clip=1.0, dp_noise_multiplier=1.0,
                           dp_unit="experiment" if s == "lab-c" else None) for s in SITES}
    with pytest.warns(UserWarning, match="different DP noise or units"):
        done = agg.on_responses(0, ups)
    assert done.replies == {} and agg.held_sum is None


def test_a_held_ranked_sum_survives_a_coordinator_restart_and_old_states_read_as_before() -> None:
    held = HeldSum(round=2, total=np.arange(5.0), members=("a", "b", "c"), every=3, averaged=False, ranked=True)
    again = HeldSum.restore(held.state())
    assert again.ranked and not again.averaged and np.array_equal(again.total, held.total)
    old = HeldSum(round=2, total=np.arange(5.0), members=("a", "b", "c"), every=3, averaged=True).state()
    assert "ranked" not in old and not HeldSum.restore(old).ranked


def test_a_masked_upload_without_the_unit_serializes_as_before() -> None:
    m = MaskedScores(step=0, masked=Array.of(np.zeros(2), dtype="uint64"), dp_clip=1.0, dp_noise_multiplier=1.0)
    assert "dp_unit" not in m.model_dump(mode="json")
    ranked = m.model_copy(update={"dp_unit": "experiment"})
    assert MaskedScores.model_validate(ranked.model_dump(mode="json")).dp_unit == "experiment"


def test_the_noise_aware_ridge_is_the_ridge_without_noise_and_shrinks_what_the_noise_swamps() -> None:
    from labfbo.protocols.surface.model import ridge_weights

    feats = SurfaceFeatures(SPACE)
    G = 40 * feats.design.T @ feats.design / len(feats.design)   # the uniform design's Gram
    gen = np.random.default_rng(4)
    truth = np.concatenate([[0.0], gen.normal(0.0, 0.5, feats.p - 1)])
    h = G @ truth
    assert np.allclose(noisy_ridge_weights(G, h, 1.0, 0.0, 1 / 3), ridge_weights(G, h, 1.0))
    assert np.allclose(noisy_ridge_weights(G, h, 1.0, 1e-6, 1 / 3), ridge_weights(G, h, 1.0), atol=1e-6)
    assert np.abs(noisy_ridge_weights(G, h + gen.normal(0, 1e6, h.shape), 1.0, 1e6, 1 / 3)).max() < 1e-3
    H = np.stack([h, -h])   # one surface per outcome
    assert np.allclose(noisy_ridge_weights(G, H, 1.0, 3.0, 1 / 3)[1], -noisy_ridge_weights(G, h, 1.0, 3.0, 1 / 3))
    # at a noise that swamps the rare choices, it errs less than the plain ridge that trusts the noise
    errs = {"plain": [], "aware": []}
    for _ in range(200):
        noisy = h + gen.normal(0.0, 10.0, h.shape)
        errs["plain"].append(np.linalg.norm(ridge_weights(G, noisy, 1.0) - truth))
        errs["aware"].append(np.linalg.norm(noisy_ridge_weights(G, noisy, 1.0, 10.0, 1 / 3) - truth))
    assert np.mean(errs["aware"]) < 0.8 * np.mean(errs["plain"])


def test_the_guard_per_feature_reads_a_reagent_of_few_choices_before_one_of_many() -> None:
    """Each feature is kept while the noise is at most the guard times the experiments its moment sums
    (a choice among k: the count over k); the others' coefficients are 0; nothing kept: None."""
    feats = SurfaceFeatures(SPACE)
    assert feats.shares.tolist() == [1.0] + [1 / 3] * 3 + [1 / 4] * 4 + [1 / 5] * 5
    N = 60
    G = N * feats.design.T @ feats.design / len(feats.design)
    h = np.random.default_rng(5).normal(0.0, 5.0, feats.p)
    # noise 4.5: 0.25 * 60 / 3 = 5 keeps the bases; 0.25 * 60 / 4 = 3.75 drops ligands and additives
    w = guarded_noisy_weights(G, h, 1.0, 4.5, 1 / 3, feats.shares, N, 0.25)
    assert w is not None and np.all(w[1:4] != 0) and np.all(w[4:] == 0)
    sub = noisy_ridge_weights(G[:4, :4], h[:4], 1.0, 4.5, 1 / 3)
    assert np.allclose(w[:4], sub)
    assert np.count_nonzero(guarded_noisy_weights(G, h, 1.0, 2.0, 1 / 3, feats.shares, N, 0.25)) == feats.p
    assert guarded_noisy_weights(G, h, 1.0, 6.0, 1 / 3, feats.shares, N, 0.25) is None
    two = guarded_noisy_weights(G, np.stack([h, 2 * h]), 1.0, 4.5, 1 / 3, feats.shares, N, 0.25)
    assert two.shape == (2, feats.p) and np.allclose(two[1], 2 * w)
