"""Protocol `gradient` (PACD-BO): distributed == centralized, DP on the uplink, batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from campaign import run_campaign

import labfbo
from labfbo.privacy import gaussian_epsilon
from labfbo.protocols.gradient.protocol import ScoreResponse

FAST = {"num_restarts": 2, "raw_samples": 32, "n_particles": 4, "hidden": (8, 8), "warmup_steps": 5}
SPACE = labfbo.SearchSpace([labfbo.Real("x", -2.0, 2.0), labfbo.Real("y", 0.0, 1.0)])
SITES = ["lab-a", "lab-b", "lab-c"]


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.3 * i) ** 2 + np.sin(3 * p["y"] + i)


def _federation(protocol: str, **opts: object) -> tuple[labfbo.Coordinator, list[labfbo.Optimizer]]:
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=3, horizon=5, **{**FAST, **opts})
    sites = [labfbo.Optimizer(SPACE, protocol=protocol, coordinator=coord, site=s, seed=3, n_init=4,
                              **{**FAST, **opts}) for s in SITES]
    return coord, sites


def _run(protocol: str, rounds: int, **opts: object) -> tuple[labfbo.Coordinator, list[labfbo.Optimizer], list]:
    coord, sites = _federation(protocol, **opts)
    return coord, sites, run_campaign(sites, _f, 4, rounds)


@pytest.mark.integration  # a multi-site campaign
def test_distributed_meta_learning_equals_centralized() -> None:
    cd, _, prop_d = _run("gradient", 3, svgd_steps=6)
    cc, _, prop_c = _run("centralized", 3, svgd_steps=6)
    pd, pc = cd.aggregator().particles, cc.aggregator().particles
    assert pd.dtype == torch.float64
    c0, _, _ = _run("gradient", 1, svgd_steps=0)
    assert torch.max(torch.abs(pd - c0.aggregator().particles)).item() > 1e-3  # meta-learning moved them
    assert torch.max(torch.abs(pd - pc)).item() <= 1e-10
    for rd, rc in zip(prop_d, prop_c):
        for a, b in zip(rd, rc):
            assert a == pytest.approx(b, abs=1e-10)


def test_the_meta_optimizers_moments_survive_a_coordinator_restart() -> None:
    """Adam's moments are the coordinator's carried state: a restored aggregator continues
    exactly where the original would (the server stores this state with every round)."""
    import json

    from labfbo.protocols.gradient.protocol import meta_step

    coord, _, _ = _run("gradient", 2, svgd_steps=3)
    agg = coord.aggregator()
    assert agg.adam is not None and int(agg.adam["step"]) == FAST["warmup_steps"] + 3
    fresh, _ = _federation("gradient", svgd_steps=3)
    fresh.aggregator().restore(json.loads(json.dumps(agg.state())))
    scores = [torch.ones_like(agg.particles)] * 2
    a = meta_step(agg.particles, scores, [5, 6], agg.cfg, agg.adam)
    b = meta_step(fresh.aggregator().particles, scores, [5, 6], agg.cfg, fresh.aggregator().adam)
    assert torch.equal(a[0], b[0]) and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_meta_learning_moves_the_particles_and_sites_send_only_scores() -> None:
    coord, sites, _ = _run("gradient", 1, svgd_steps=3, warmup_steps=3)
    sent = sites[0].sent_messages()
    assert [m.kind for m in sent] == ["join"] + ["score"] * 3
    score = sent[1]
    assert isinstance(score, ScoreResponse)
    K, P = score.scores.shape
    assert K == FAST["n_particles"] and P == coord.aggregator().particles.shape[1]
    assert set(score.model_dump()) == {"kind", "version", "round", "study", "step", "scores", "n_obs",
                                       "dp_clip", "dp_noise_multiplier"}
    up, down = sites[0].ledger.round_bytes(0)
    assert up > 3 * K * P * 8 and down > up  # three K x P float64 uploads; particles come back


def test_dp_clips_and_noises_every_uplink_and_accounts_for_it(tmp_path) -> None:
    dp = labfbo.DP(clip=0.5, noise_multiplier=0.0)
    _, sites, _ = _run("gradient", 1, svgd_steps=2, privacy=dp)
    for m in sites[1].sent_messages()[1:]:
        norms = np.linalg.norm(m.scores.numpy(), axis=1)
        assert (norms <= 0.5 + 1e-12).all() and m.dp_clip == 0.5

    dp = labfbo.DP(clip=0.5, noise_multiplier=2.0, delta=1e-5)
    _, plain, _ = _run("gradient", 1, svgd_steps=2)
    _, noisy, _ = _run("gradient", 1, svgd_steps=2, privacy=dp)
    a = plain[0].sent_messages()[1].scores.numpy()
    b = noisy[0].sent_messages()[1].scores.numpy()
    assert np.abs(b).max() > 0.5  # noise of std 2 * 2C = 2 on top of clipped rows
    assert not np.allclose(a, b)
    steps = FAST["warmup_steps"]  # round 0 is the warm-up
    expected = gaussian_epsilon(2.0 / np.sqrt(FAST["n_particles"]), steps, 1e-5)
    assert noisy[0].epsilon() == pytest.approx(expected, rel=1e-9)
    report = noisy[0].privacy_report()
    assert report[-1]["epsilon"] == pytest.approx(expected, rel=1e-9)


def test_dp_ledger_survives_a_restart(tmp_path) -> None:
    dp = labfbo.DP(clip=1.0, noise_multiplier=4.0)
    coord = labfbo.Coordinator("gradient", sites=["a", "b"], seed=0, **FAST, svgd_steps=2, privacy=dp)
    path = tmp_path / "a.journal"
    a = labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site="a", storage=str(path), n_init=3,
                         **FAST, svgd_steps=2, privacy=dp)
    b = labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site="b", n_init=3, **FAST,
                         svgd_steps=2, privacy=dp)
    for i, o in enumerate((a, b)):
        for t in o.ask(n=3):
            o.tell(t, _f(i, t.params))
    a.tell(a.ask(), 1.0)
    eps = a.epsilon()
    assert eps > 0
    a.close()
    again = labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site="a", storage=str(path), n_init=3,
                             **FAST, svgd_steps=2, privacy=dp)
    assert again.epsilon() == pytest.approx(eps)


def test_batches_under_gradient_are_pending_aware() -> None:
    _, sites, _ = _run("gradient", 1, svgd_steps=2)
    batch = sites[0].ask(n=3)
    xs = np.array([[t.params["x"], t.params["y"]] for t in batch])
    assert len(batch) == 3
    assert np.min(np.linalg.norm(xs[:, None] - xs[None], axis=-1)[~np.eye(3, dtype=bool)]) > 1e-6
    mean, std = sites[0].predict([t.params for t in batch])
    assert mean.shape == (3,) and (std > 0).all()


CAT_SPACE = labfbo.SearchSpace([labfbo.Real("x", -2.0, 2.0), labfbo.Categorical("c", ["a", "b", "c"]),
                                 labfbo.Categorical("s", ["w", "e"], descriptors={"w": [80.1], "e": [24.5]})])


def _f_cat(i: int, p: dict) -> float:
    return (p["x"] - 0.3 * i) ** 2 + {"a": 0.0, "b": 1.0, "c": 0.5}[p["c"]] + (0.3 if p["s"] == "w" else 0.0)


@pytest.mark.integration  # a multi-site campaign
@pytest.mark.parametrize("protocol", ["gradient", "centralized"])
def test_meta_learning_reads_categoricals_one_hot_and_descriptors(protocol: str) -> None:
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=3, horizon=5, **FAST)
    sites = [labfbo.Optimizer(CAT_SPACE, protocol=protocol, coordinator=coord, site=s, seed=3, n_init=4, **FAST)
             for s in SITES]
    props = run_campaign(sites, _f_cat, 4, 2)
    # the feature map reads x, a one-hot of c (3) and the scaled descriptor of s (1): 5 inputs
    assert coord.aggregator().features.n_out == 5
    assert all(p["c"] in ("a", "b", "c") and p["s"] in ("w", "e") for rnd in props for p in rnd)
    mean, std = sites[0].predict([{"x": 0.0, "c": c, "s": "w"} for c in ("a", "b", "c")])
    assert mean.shape == (3,) and np.isfinite(mean).all() and (std > 0).all()


@pytest.mark.integration  # a multi-site campaign
def test_distributed_equals_centralized_on_a_categorical_space() -> None:
    runs = {}
    for protocol in ("gradient", "centralized"):
        coord = labfbo.Coordinator(protocol, sites=SITES, seed=3, horizon=5, **{**FAST, "svgd_steps": 4})
        sites = [labfbo.Optimizer(CAT_SPACE, protocol=protocol, coordinator=coord, site=s, seed=3, n_init=4,
                                  **{**FAST, "svgd_steps": 4}) for s in SITES]
        runs[protocol] = (coord, run_campaign(sites, _f_cat, 4, 3))
    pd, pc = runs["gradient"][0].aggregator().particles, runs["centralized"][0].aggregator().particles
    assert torch.max(torch.abs(pd - pc)).item() <= 1e-10
    for rd, rc in zip(runs["gradient"][1], runs["centralized"][1]):
        for a, b in zip(rd, rc):
            assert (a["c"], a["s"]) == (b["c"], b["s"]) and a["x"] == pytest.approx(b["x"], abs=1e-10)


def test_centralized_refuses_dp() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="raw data"):
        labfbo.Coordinator("centralized", sites=["a"], privacy=labfbo.DP())


def test_simulate_reports_epsilon_per_site() -> None:
    res = labfbo.simulate("branin", protocol="gradient", n_sites=2, n_init=3, budget=1, seed=0, svgd_steps=2,
                          privacy=labfbo.DP(clip=1.0, noise_multiplier=8.0), **FAST)
    assert len(res.epsilon) == 2 and all(e > 0 for e in res.epsilon)
    plain = labfbo.simulate("branin", protocol="gradient", n_sites=2, n_init=3, budget=1, seed=0, svgd_steps=2,
                            **FAST)
    assert plain.epsilon == []


def test_dp_noise_is_keyed_by_a_site_secret_not_the_study_seed(tmp_path) -> None:
    dp = labfbo.DP(clip=1.0, noise_multiplier=1.0)

    def first_upload(secret: int | None, storage: str | None = None) -> np.ndarray:
        coord = labfbo.Coordinator("gradient", sites=["a"], seed=0, **FAST, svgd_steps=1, privacy=dp)
        o = labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site="a", seed=0, n_init=3,
                             secret=secret, storage=storage, **FAST, svgd_steps=1, privacy=dp)
        for t in o.ask(n=3):
            o.tell(t, _f(0, t.params))
        o.ask()
        o.close()
        return [m for m in o.sent_messages() if isinstance(m, ScoreResponse)][0].scores.numpy()

    same = first_upload(7), first_upload(7)
    np.testing.assert_array_equal(*same)                    # reproducible given the secret
    assert not np.allclose(first_upload(8), same[0])        # same study seed, other secret
    assert not np.allclose(first_upload(None), first_upload(None))  # default: drawn from the OS
    path = str(tmp_path / "a.journal")
    first_upload(None, path)
    with pytest.raises(labfbo.JournalError, match="secret"):
        labfbo.Optimizer(SPACE, protocol="gradient", coordinator=labfbo.Coordinator(
            "gradient", sites=["a"], **FAST, privacy=dp), site="a", seed=0, n_init=3, storage=path,
            secret=123, **FAST, privacy=dp)


def test_resume_with_other_dp_settings_is_refused(tmp_path) -> None:
    path = str(tmp_path / "a.journal")
    coord = labfbo.Coordinator("gradient", sites=["a"], **FAST, privacy=labfbo.DP(noise_multiplier=8.0))
    labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site="a", storage=path, **FAST,
                     privacy=labfbo.DP(noise_multiplier=8.0)).close()
    coord2 = labfbo.Coordinator("gradient", sites=["a"], **FAST, privacy=labfbo.DP(noise_multiplier=100.0))
    with pytest.raises(labfbo.JournalError, match="privacy"):
        labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord2, site="a", storage=path, **FAST,
                         privacy=labfbo.DP(noise_multiplier=100.0))
