"""The reconstruction attack on ``surface``'s messages: coordinator, peer, secure sum;
``labfbo privacy audit --protocol surface``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import binom

import labfbo
from labfbo.apps.attacks.surface import Snapshot, attack, candidates, coordinator_view, score
from labfbo.cli import main
from labfbo.core.exceptions import ConfigurationError
from labfbo.protocols.surface.model import (
    SurfaceFeatures,
    dp_sensitivity,
    privatize_statistics,
    site_statistics,
    standardized,
)

SPACE = labfbo.SearchSpace([labfbo.Categorical("base", list("abcd")), labfbo.Categorical("ligand", list("vwxyz")),
                            labfbo.Categorical("additive", list("pqr"))])  # 60 combinations, p = 13
CAND = candidates(SPACE)


def _lab(seed: int, n0: int = 3, n: int = 10, dp: labfbo.DP | None = None) -> tuple[list[int], np.ndarray, list]:
    """A lab's distinct combinations, its last standardized results, and its statistics after
    ``n0``, ``n0 + 1``, ..., ``n`` experiments (as :class:`SurfaceSite` computes them)."""
    gen = np.random.default_rng(seed)
    rows = gen.choice(len(CAND.X), n, replace=False).tolist()
    y = gen.normal(size=n)
    bound = SurfaceFeatures(SPACE).norm_bound
    snaps = []
    for t, k in enumerate(range(n0, n + 1)):
        G, h = site_statistics(CAND.Phi[rows[:k]], y[:k], None if dp is None else dp.clip)
        sd = 0.0
        if dp is not None:
            G, h = privatize_statistics(G, h, dp, bound, np.random.default_rng([seed, t]))
            sd = k * dp.sigma * dp_sensitivity(bound, dp.clip)
        snaps.append(Snapshot(t, k, k * G, k * h, sd))
    return rows, standardized(y), snaps


def test_the_coordinator_recovers_a_labs_combinations_and_results_exactly_without_dp():
    for seed in range(3):
        rows, z, snaps = _lab(seed)
        guess, values = attack(snaps, CAND)
        s = score(guess, values, rows, z, len(CAND.X))
        assert sorted(guess) == sorted(rows) and guess[3:] == rows[3:]  # one new row per round: in order
        assert s["recall"] == s["precision"] == 1.0 and s["recall_chance"] < 0.25
        assert s["rmse"] < 1e-8 and s["spearman"] == pytest.approx(1.0) and abs(s["spearman_chance"]) < 0.2


def test_every_round_pins_results_the_last_round_alone_does_not():
    """p = 13 features of rank 9 and 12 rows: the last round's statistics have a null space; the rounds do not."""
    rows, z, snaps = _lab(7, n=12)
    assert np.linalg.matrix_rank(CAND.Phi[rows]) < len(rows)
    guess, values = attack(snaps, CAND)
    assert score(guess, values, rows, z, len(CAND.X))["rmse"] < 1e-8
    _, last_only = attack(snaps[-1:], CAND)  # the first release alone: the integer program on all 12 rows
    assert score(guess, last_only, rows, z, len(CAND.X))["rmse"] > 0.1


def test_strong_dp_takes_the_attack_to_chance_and_weak_dp_does_not():
    def recall(dp):
        out = [score(*attack(lab[2], CAND), lab[0], lab[1], len(CAND.X)) for lab in (_lab(s, dp=dp) for s in range(4))]
        return np.mean([o["recall"] for o in out]), np.mean([o["recall_chance"] for o in out])

    weak, chance = recall(labfbo.DP(noise_multiplier=0.01))
    strong, _ = recall(labfbo.DP(noise_multiplier=1.0))
    assert weak > 0.8 and chance < 0.2
    assert strong < chance + 0.15


def test_the_sum_of_three_labs_hides_attribution_and_results_not_the_set_of_experiments():
    single, summed = [], []
    for seed in range(3):
        labs = [_lab(10 * seed + k) for k in range(3)]
        rows, z, snaps = labs[0]
        single.append(score(*attack(snaps, CAND), rows, z, len(CAND.X)))
        total = [Snapshot(t, sum(lab[2][t].count for lab in labs), sum(lab[2][t].gram for lab in labs),
                          sum(lab[2][t].moment for lab in labs), 0.0, 3) for t in range(len(snaps))]
        summed.append(score(*attack(total, CAND, single=False), rows, z, len(CAND.X)))
    # the rounds' differences still give the cohort's combinations away, but not whose they are ...
    assert all(s["recall"] == 1.0 for s in summed) and all(s["precision"] == pytest.approx(1 / 3) for s in summed)
    # ... and 30 rows under 13 features leave the results far less determined than one lab's 10
    assert np.mean([s["spearman"] for s in summed]) < np.mean([s["spearman"] for s in single]) - 0.4
    assert np.mean([s["rmse"] for s in summed]) > 0.5 > np.mean([s["rmse"] for s in single])


def test_feature_sums_alone_give_the_choices_of_a_sum_not_how_they_were_combined():
    """The experiment-level secure sum holds only the Gram's constant row (each choice's count): from a sum of
    three labs the attack matches every released count, but pairs the choices into fewer of the cohort's
    combinations than from the full Gram; one new row at a time it still reads them."""
    from labfbo.apps.attacks.surface import Candidates
    from labfbo.protocols.surface.model import feature_sums

    row_only = Candidates(CAND.X, CAND.Phi, CAND.Phi)
    full, ranked = [], []
    for seed in range(4):
        labs = [_lab(10 * seed + k) for k in range(3)]
        rows, z, snaps = labs[0]
        cohort = [[r for lab in labs for r in lab[0][:k]] for k in range(3, 11)]
        total = [Snapshot(t, len(c), sum(lab[2][t].gram for lab in labs), sum(lab[2][t].moment for lab in labs), 0.0, 3)
                 for t, c in enumerate(cohort)]
        full.append(score(*attack(total, CAND, single=False), rows, z, len(CAND.X))["recall"])
        sums = [Snapshot(t, len(c), np.concatenate([[len(c)], feature_sums(CAND.Phi[c])]), total[t].moment, 0.0, 3)
                for t, c in enumerate(cohort)]
        guess, values = attack(sums, row_only, single=False)
        assert np.allclose(CAND.Phi[guess].sum(0), sums[-1].gram)
        ranked.append(score(guess, values, rows, z, len(CAND.X))["recall"])
    assert np.mean(full) == 1.0 and np.mean(ranked) < 0.9, ranked
    rows, z, snaps = _lab(3)
    one = [Snapshot(s.round, s.count, np.concatenate([[s.count], feature_sums(CAND.Phi[rows[:s.count]])]), s.moment)
           for s in snaps]
    assert attack(one, row_only)[0][3:] == rows[3:]


def test_the_views_refuse_what_they_cannot_read():
    with pytest.raises(ConfigurationError, match="surface"):
        coordinator_view([])
    with pytest.raises(ConfigurationError, match="categorical"):
        candidates(labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0)]))


@pytest.mark.integration
def test_privacy_audit_surface_cli_attacks_a_campaign_and_resumes(tmp_path, capsys):
    args = ["privacy", "audit", "--protocol", "surface", "--iterations", "2", "--seeds", "1", "--epsilons", "2",
            "--out", str(tmp_path)]
    assert main(args) == 0
    out = tmp_path / "surface"
    assert (out / "surface_leakage.png").stat().st_size > 0
    report = (out / "surface_report.md").read_text()
    assert "| no DP | coordinator | 1 |" in report and "| ε = 2 | sum | 3 |" in report
    data = json.loads((out / "surface_audit.json").read_text())
    plain = [r for r in data["results"] if r["job"]["epsilon"] is None][0]["results"]
    # a real campaign on Buchwald–Hartwig labs: the coordinator reads every lab's experiments and results
    assert [r["recall"] for r in plain["coordinator"]] == [1.0, 1.0, 1.0]
    assert all(r["rmse"] < 1e-6 for r in plain["coordinator"])
    # the sum a coordinator unmasks gives the cohort's experiments away; the sealed one it holds by default,
    # nothing beyond chance — and the campaign at the defaults proposed what the clear one did
    assert [r["recall"] for r in plain["sum"]] == [1.0, 1.0, 1.0] and "| no DP | sealed | 3 |" in report
    sealed = plain["sealed"]
    # at chance: the combinations it hits are no more than guessing would hit (a one-sided binomial test at
    # 1e-3; the masks come from the OS, so the hits are a fresh draw in every run — a bound on the mean
    # recall alone failed about one run in fifty)
    n = sum(r["n"] for r in sealed)
    hits, expected = sum(r["recall"] * r["n"] for r in sealed), sum(r["recall_chance"] * r["n"] for r in sealed)
    assert len(sealed) == 3 and binom.sf(round(hits) - 1, round(n), expected / n) > 1e-3, (hits, expected, n)
    assert all(r["same_proposals"] for r in data["results"])
    capsys.readouterr()
    assert main(args) == 0
    assert "(0 to do)" in capsys.readouterr().out
    assert main([*args[:-2], "--n-init", "4", "--out", str(tmp_path)]) == 2  # other settings, same cache: refused
    assert "cached with other settings" in capsys.readouterr().err


@pytest.mark.integration
def test_privacy_audit_surface_cli_audits_the_experiment_unit(tmp_path, capsys):
    """``--unit experiment``: the campaigns run DP(unit="experiment"); the secure sum attacked is the ranked
    release (feature and moment sums), the rows the table names with their unit."""
    args = ["privacy", "audit", "--protocol", "surface", "--iterations", "2", "--seeds", "1", "--epsilons", "8",
            "--unit", "experiment", "--out", str(tmp_path)]
    assert main(args) == 0
    report = (tmp_path / "surface" / "surface_report.md").read_text()
    assert "| ε = 8 per experiment | sum | 3 |" in report and "| ε = 8 per experiment | coordinator | 1 |" in report
    data = json.loads((tmp_path / "surface" / "surface_audit.json").read_text())
    private = [r for r in data["results"] if r["job"]["epsilon"] == 8][0]
    assert private["job"]["unit"] == "experiment"
    rows = private["results"]["sum"]
    assert len(rows) == 3 and all(0.0 <= r["recall"] <= 1.0 and r["noise_sd"] > 0 for r in rows)
