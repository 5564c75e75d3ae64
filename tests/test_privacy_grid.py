"""`labfbo bench privacy-utility` over campaign budgets: its jobs, its arithmetic, its table and plot."""

from __future__ import annotations

from pathlib import Path

import labfbo
from labfbo_bench import privacy_grid as pg


def test_the_grid_runs_every_variant_at_every_budget_beside_its_plain_rows(tmp_path: Path) -> None:
    jobs = pg.pacd_jobs(str(tmp_path), ["gradient", "surface-every5"], [0.5, 2.0], [0, 1], functions=("branin",))
    labels = sorted({j.label for j in jobs})
    assert labels == sorted(["Independent (labfbo defaults)", "PACD-BO (labfbo defaults)", "Surface (labfbo defaults)",
                             "gradient ε=0.5", "gradient ε=2", "surface-every5 ε=0.5", "surface-every5 ε=2"])
    assert len(jobs) == len(labels) * 2 and len({j.path for j in jobs}) == len(jobs)
    every5 = next(j for j in jobs if j.label == "surface-every5 ε=2")
    assert every5.protocol == "surface" and every5.options["release_every"] == 5
    assert every5.options["privacy"] == labfbo.DP(epsilon=2.0, clip=2.0) and every5.budget == 30


def test_gain_kept_is_only_reported_for_a_gain_beyond_the_spread() -> None:
    assert pg._kept([1.0, 1.2, 0.8], [0.5, 0.6, 0.4], [0.75, 0.8, 0.7]) == "50 %"
    assert pg._kept([1.0, 1.2, 0.8], [0.5, 0.6, 0.4], [1.0, 1.1, 0.9]) == "0 %"
    assert pg._kept([1.0, 2.0, 0.1], [0.9, 1.9, 0.2], [0.5, 0.5, 0.5]).startswith("— (no gain")


def test_reaction_methods_name_a_variant_and_a_budget() -> None:
    assert pg.reaction_variant(pg.reaction_method("surface", 2.0)) == ("surface", {"privacy": labfbo.DP(epsilon=2.0,
                                                                                                     clip=2.0)})
    assert pg.reaction_variant("surface") is None and pg.reaction_variant("nope@eps=2") is None


def test_the_table_and_plot_show_every_row(tmp_path: Path) -> None:
    summary = {("branin", pg.NON_PRIVATE["independent"]): {"final": [1e-4, 2e-4], "auc": [0.02, 0.03], "eps": []},
               ("branin", pg.NON_PRIVATE["surface"]): {"final": [1e-5, 2e-5], "auc": [0.01, 0.012], "eps": []},
               ("branin", "surface ε=2"): {"final": [9e-5, 1e-4], "auc": [0.02, 0.025], "eps": [1.99, 2.0]}}
    table = pg.pacd_table(summary, ["surface"], [2.0, 8.0])
    assert "| branin | surface ε=2 | 2 | 9.5e-05 ± 5e-06 |" in table and "| 2 |" in table
    assert "surface ε=8" not in table  # not run: no row
    png = pg.plot({"branin": {"ylabel": "regret", "independent": 1.5e-4, "log": True,
                              "rows": {"surface": ([2.0], [9.5e-5])}, "plain": {"surface": 1.5e-5}}},
                  tmp_path / "pu.png")
    assert png.stat().st_size > 5000
