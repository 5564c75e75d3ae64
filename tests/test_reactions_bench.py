"""`labfbo bench reactions`: data, scenarios, exact random search, failures, the report."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from labfbo.cli import main
from labfbo.core.exceptions import ConfigurationError
from labfbo.datasets import load_reactions, scenarios, spearman_matrix
from labfbo_bench import reactions as rx

pytestmark = pytest.mark.integration  # the reaction benchmark campaigns


def _csv(tmp_path, missing=(("L1", "b1", "g0", "x1"),)) -> str:
    rows = ["lab,base,ligand,additive,yield"]
    gen = np.random.default_rng(0)
    for lab, shift in (("L0", 0.0), ("L1", 5.0), ("L2-chloro", 40.0)):
        for b, g, a in itertools.product(("b0", "b1"), ("g0", "g1"), ("x0", "x1", "x2")):
            if (lab, b, g, a) in missing:
                continue
            base = 10 * int(b[1]) + 20 * int(g[1]) + 5 * int(a[1])
            y = (80 - base if lab == "L2-chloro" else base + shift) + gen.normal(0, 1)
            rows.append(f"{lab},{b},{g},{a},{max(y, 0):.3f}")
    path = tmp_path / "rx.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_shipped_data_and_its_scenarios() -> None:
    data = load_reactions()
    assert len(data.labs) == 15 and len(data.combos()) == 3 * 4 * 23
    sc = scenarios(data)
    C = spearman_matrix(data)
    idx = [data.labs.index(n) for n in sc["a"]]
    assert len(sc["a"]) == 5 and min(C[i, j] for i, j in itertools.combinations(idx, 2)) == pytest.approx(
        0.80, abs=0.02
    )
    assert len(sc["b"]) == 5 and sum("chloro" in n for n in sc["b"][3:]) == 2 and len(sc["c"]) == 15


def test_a_file_with_missing_columns_is_refused(tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("lab,base,yield\nA,b,1\n")
    with pytest.raises(ConfigurationError, match="missing column"):
        load_reactions(bad)


def test_random_search_regret_is_the_exact_expectation(tmp_path) -> None:
    data = load_reactions(_csv(tmp_path))
    exact = rx.random_regret(data, n_init=1, budget=3)
    for lab in range(len(data.labs)):  # brute force: every subset of n of the 12 combinations is equally likely
        v = np.nan_to_num(data.yields(lab), nan=0.0)
        best = [np.mean([v[list(s)].max() for s in itertools.combinations(range(len(v)), n)]) for n in range(1, 5)]
        np.testing.assert_allclose(exact[lab], data.best(lab) - np.array(best), atol=1e-9)
    assert (np.diff(exact, axis=1) <= 1e-12).all()


def test_a_missing_combination_is_a_failed_experiment_that_uses_budget(tmp_path) -> None:
    path = _csv(tmp_path, missing=tuple(("L1", b, g, a) for b, g, a in itertools.product(("b0", "b1"), ("g0", "g1"),
                                                                                          ("x0", "x1")))),
    data = load_reactions(path[0])
    job = rx.ReactionJob(path=str(tmp_path / "j.json"), scenario="x", labs=data.labs, method="independent", seed=0,
                         n_init=3, budget=4, data=path[0])
    out = rx.run_protocol(job, data)
    assert out["failed"][0] == 0 and out["failed"][1] > 0  # L1 ran only the x2 column of its table
    regret = np.array(out["regret"])
    assert regret.shape == (3, 5) and (regret >= 0).all() and (np.diff(regret, axis=1) <= 1e-12).all()


@pytest.mark.parametrize("method", ["gradient", "pooled"])
def test_federated_and_pooled_campaigns_run_and_report(tmp_path, method, capsys) -> None:
    path = _csv(tmp_path)
    out = tmp_path / "out"
    fast = ["--budget", "2", "--seeds", "1", "--workers", "1", "--scenarios", "a", "--out", str(out)]
    assert main(["bench", "reactions", "--data", path, "--methods", "random", "independent", method, *fast]) == 0
    text = capsys.readouterr().out
    assert "| independent | 1 |" in text and f"| {method} | 1 |" in text and "| random | exact |" in text
    assert (out / "reactions.png").stat().st_size > 1000 and "regret @" in (out / "summary.md").read_text()
    rec = json.loads(next((out / "rx").rglob(f"{method}/seed0.json")).read_text())
    assert np.array(rec["regret"]).shape == (3, 3)
    assert not math.isnan(rec["ask_seconds"])


def test_a_reversed_lab_has_real_yields_and_opposite_preferences() -> None:
    from labfbo.datasets.reactions import REVERSED

    data = load_reactions()
    d = scenarios(data)["d"]
    assert len(d) == 5 and d[4].endswith(REVERSED) and all(n in data.labs for n in d[:4])
    sub = data.subset(d)
    C = spearman_matrix(sub)
    assert (C[4, :4] < -0.4).all() and (C[:4, :4] > 0.7).all()  # opposite to each of the four, which are alike
    base = data.tables[data.labs.index(d[4].removesuffix(REVERSED))]
    assert sorted(sub.tables[4].values()) == sorted(base.values())  # the same yields, at swapped reagents
    with pytest.raises(ConfigurationError, match="no lab"):
        data.subset(["no such lab"])
