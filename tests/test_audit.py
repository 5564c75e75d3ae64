"""The gradient-leakage audit: the coordinator's attack, its metrics, ``labfbo privacy audit``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import labfbo
from labfbo.apps.attacks.gradient import campaign
from labfbo.benchmarks import get_problem
from labfbo.cli import main
from labfbo.core.exceptions import ConfigurationError
from labfbo.models.pacoh import PacohConfig, _fit, init_particles, mean_block_index, mean_jacobian, site_score
from labfbo.privacy import secagg
from labfbo.privacy.audit import Intercept, audit, intercepts, leakage_metrics, reconstruct, uniform_dispersion

pytestmark = pytest.mark.integration  # the leakage audit: campaigns and attacks

SMALL = dict(n_particles=3, hidden=(8, 8), warmup_steps=20, svgd_steps=5)


def _campaign(n_sites: int, budget: int, **opts):
    return campaign("sphere", n_sites, 0, budget, **opts)


def test_mean_block_of_a_score_is_linear_in_alpha():
    """A_k[mean] = sum_j alpha_kj dm_k(x_j)/dphi_k: the identity the sparse start inverts."""
    cfg = PacohConfig(n_particles=3, hidden=(8, 8))
    P = init_particles(cfg, 2, 0)
    X = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    A = site_score(P, X, y, cfg)[:, mean_block_index(cfg, 2)]
    alpha = _fit(P, X, y, cfg)["alpha"]
    assert torch.allclose(A, (alpha.unsqueeze(-1) * mean_jacobian(P, X, cfg)).sum(1), rtol=0, atol=1e-10)


def test_plain_gradient_messages_give_the_initial_design_away_and_dp_scatters_it():
    plain = audit(_campaign(3, 1, **SMALL)[0], [1], restarts=2)[0]
    # every query of the initial design within 0.05 (the unit box's diagonal is 1.41); chance: rarely any
    assert plain["n"] == 5 and plain["recovered"] == 1.0 and plain["recovered_chance"] < 0.2
    assert plain["incumbent_guess"] < 0.05 < 0.2 < plain["incumbent_guess_chance"]
    noisy = audit(_campaign(3, 1, privacy=labfbo.DP(clip=1.0, noise_multiplier=8.0), **SMALL)[0], [1], restarts=2)[0]
    assert noisy["dp"] and noisy["recovered"] <= 0.2 and noisy["matched_distance"] > 0.1
    assert noisy["loss"] > 0.5          # the attacker cannot explain noise with data


def test_the_sequential_attack_follows_every_query_where_one_round_alone_cannot_tell():
    """The stateful coordinator searches each round's one new query with the earlier ones
    known; its guess of the site's best setting is the site's own (the paper's PACD-BO: the
    harm guard would change which queries the site makes, not what its messages reveal)."""
    site = _campaign(3, 12, harm_guard=False, **SMALL)[0]
    rows = audit(site, [1, 12], sequential=True, restarts=1)
    assert [r["recovered"] for r in rows] == [1.0, 1.0] and rows[1]["n"] == 16
    assert rows[1]["optimum_guess"] < 0.01 < 0.2 < rows[1]["optimum_guess_chance"]
    assert rows[1]["dispersion"] == pytest.approx(rows[1]["dispersion_true"], abs=0.01)   # uniform: 0.52


def test_secure_aggregation_leaves_nothing_per_site_to_invert():
    site = _campaign(3, 1, secure_aggregation=True, **SMALL)[0]
    with pytest.raises(ConfigurationError, match="secure-aggregated"):
        intercepts(site.sent_messages(), site.received_messages())
    # the attack run on what the coordinator holds (the masked vectors, decoded as if they were
    # scores) finds nothing, where the same campaign's plain messages gave the design away
    masked = {(m.round, m.step): m for m in site.sent_messages() if m.kind == "masked_score"}
    requests = {(m.round, m.step): m for m in site.received_messages() if m.kind == "particles_request"}
    keys = sorted(k for k in masked if k in requests)[:5]
    P = [torch.as_tensor(requests[k].particles.numpy()) for k in keys]
    A = [torch.as_tensor(secagg.decode(masked[k].masked.numpy())[:-2].reshape(p.shape)) for k, p in zip(keys, P)]
    ic = Intercept(keys[0][0], tuple(P), tuple(A), 5, None)
    rec = reconstruct(ic, site.options.pacoh(), 2, restarts=2)
    X_true = site.space.encode([ob.params for ob in site.observations])[:5]
    m = leakage_metrics(rec.X, X_true)
    assert m["recovered"] <= 0.2 and m["matched_distance"] > 0.1


def test_audit_refuses_other_protocols_and_bad_iterations():
    prob = get_problem("sphere", n_sites=1, seed=0, dim=2)
    opt = labfbo.Optimizer(prob.space, seed=0, n_init=2)
    for tr in opt.ask(n=2):
        opt.tell(tr, prob.evaluate(0, tr.params))
    with pytest.raises(ConfigurationError, match="gradient"):
        audit(opt)
    site = _campaign(3, 1, **SMALL)[0]
    with pytest.raises(ConfigurationError, match="out of range"):
        audit(site, [2])


def test_leakage_metrics():
    X = np.random.default_rng(0).random((40, 2))
    m = leakage_metrics(X[::-1], X)
    assert m["matched_distance"] == 0.0 and m["recovered"] == 1.0 and m["dispersion"] == m["dispersion_true"]
    assert 0.0 <= m["recovered_chance"] < 0.5           # random points seldom land within tol of a query
    y = np.arange(40.0)
    best = leakage_metrics(X, X, y_hat=y, y_true=y)
    assert best["incumbent_guess"] == 0.0 and 0.2 < best["incumbent_guess_chance"] < 0.8
    final = leakage_metrics(X, X, y_hat=y, y_true=y, optimum=X[0])
    assert final["optimum_guess"] == pytest.approx(np.linalg.norm(X[-1] - X[0]))
    far = leakage_metrics(np.clip(X + 0.2, 0, 1), X, tol=0.05)
    assert far["recovered"] < 0.2
    assert abs(uniform_dispersion(400, 2) - 0.5214) < 0.01        # mean distance in the unit square


def test_privacy_audit_cli_writes_report_and_plots_and_resumes(tmp_path, capsys):
    args = ["privacy", "audit", "--sigmas", "0", "--iterations", "1", "--seeds", "1", "--sites", "3",
            "--particles", "3", "--restarts", "1", "--workers", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    out = tmp_path / "sphere"
    assert (out / "leakage_queries.png").stat().st_size > 0 and (out / "leakage_dispersion.png").stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "| 0 | 1 | 5 |" in report and "labfbo privacy audit" in report
    capsys.readouterr()
    assert main(args) == 0
    assert "(0 to do)" in capsys.readouterr().out
    assert main([*args, "--paper-attack"]) == 2           # other settings, same cache: refused
    assert "cached with other settings" in capsys.readouterr().err


def test_the_sequential_attack_survives_a_round_without_a_new_query():
    """A failed trial adds no observation: the tracker refines what it has, it does not extend it."""
    from labfbo.privacy.audit import reconstruct_sequence

    site = _campaign(3, 3, **SMALL)[0]
    ics = intercepts(site.sent_messages(), site.received_messages())
    r = sorted(ics)
    again = Intercept(r[1] + 100, ics[r[1]].particles, ics[r[1]].scores, ics[r[1]].n_obs, None)
    out = reconstruct_sequence([ics[r[0]], ics[r[1]], again], site.options.pacoh(), 2, [again.round])
    X_true = site.space.encode([ob.params for ob in site.observations])[: again.n_obs]
    assert out[again.round].X.shape == (again.n_obs, 2)
    assert leakage_metrics(out[again.round].X, X_true)["recovered"] == 1.0
