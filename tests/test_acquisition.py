"""Acquisition: escaping a stalled basin (``stall_rounds``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from botorch.acquisition import UpperConfidenceBound

import labfbo
from labfbo.core.exceptions import ConfigurationError
from labfbo.models.acquisition import (
    AcquisitionData,
    AcquisitionOptions,
    ExcludeIncumbent,
    escaping,
    propose_with_model,
    stalled,
)
from labfbo.models.gp import fit_local_gp
from labfbo.protocols import available_protocols, get_protocol
from labfbo.protocols.centralized import CentralizedOptions
from labfbo.protocols.gradient.protocol import GradientOptions
from labfbo.protocols.independent import IndependentOptions

SPACE = labfbo.SearchSpace([labfbo.Real("a", 0.0, 1.0), labfbo.Real("b", 0.0, 1.0)])


def test_stalled_counts_only_improvements_above_the_tolerance() -> None:
    y = np.array([0.0, 1.0, 0.5, 0.2, 0.9])
    assert stalled(y, 3)                 # best 1.0 came before the last three
    assert not stalled(y, 4)             # the last four include it
    assert not stalled(y[:3], 3)         # not enough observations to tell
    assert stalled(np.append(y, 1.0 + 1e-6), 2)        # a 1e-6 gain on a range of 1 is no progress
    assert not stalled(np.append(y, 1.01), 2)


def test_escaping_alternates_from_round_stall_rounds_and_needs_the_option() -> None:
    y = np.array([0.0, 1.0, 0.5, 0.2, 0.9, 0.3])   # stalled for the last 3 observations
    on = AcquisitionOptions(stall_rounds=3)
    assert [escaping(y, t, on) for t in range(8)] == [False, False, False, True, False, True, False, True]
    assert not escaping(y, None, on)                # no round given: never
    assert not escaping(y, 3, AcquisitionOptions())  # off by default
    assert not escaping(np.append(y, 2.0), 3, on)  # a new best ends the stall


def test_the_penalty_removes_the_incumbents_basin_only() -> None:
    X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = -((X - 0.3) ** 2).sum(-1, keepdim=True)
    gp = fit_local_gp(X.numpy(), y.squeeze(-1).numpy())
    base = UpperConfidenceBound(gp, beta=4.0)
    data = AcquisitionData(X=X.numpy(), y=y.squeeze(-1).numpy(), pending=np.zeros((0, 2)))
    acq = ExcludeIncumbent.around_best(base, data, 2, AcquisitionOptions(stall_rounds=1))
    best = torch.as_tensor(data.X[np.argmax(data.y)]).reshape(1, 1, 2)
    far = torch.tensor([[[1.0, 1.0]]], dtype=torch.float64)
    with torch.no_grad():
        assert float(base(best) - acq(best)) == pytest.approx(acq.weight)
        assert float(base(far) - acq(far)) < 1e-3 * acq.weight
        assert acq.weight > float(base(best) - base(far))   # the basin now scores below the far corner


@pytest.mark.parametrize("round", [6, 7])
def test_a_stalled_site_proposes_outside_its_basin_every_other_round(round: int) -> None:
    rng = np.random.default_rng(0)
    X = np.vstack([rng.random((8, 2)), [0.3, 0.3], 0.3 + 0.01 * rng.standard_normal((7, 2))])
    y = -((X - 0.3) ** 2).sum(-1)
    y[8] += 0.5   # the incumbent, then 7 observations that do not beat it
    opts = AcquisitionOptions(stall_rounds=5, num_restarts=4, raw_samples=128)
    assert escaping(y, round, opts) == (round == 7)   # rounds 5, 7, ... escape; 6 refines
    data = AcquisitionData(X=X, y=y, pending=np.zeros((0, 2)))
    gp = fit_local_gp(X, y)
    x = propose_with_model(gp, SPACE, data, 1, 0, opts, round=round)[0]
    plain = propose_with_model(gp, SPACE, data, 1, 0, opts.model_copy(update={"stall_rounds": None}))[0]
    if round == 7:
        assert np.linalg.norm(x - X[8]) > 2 * opts.stall_radius * np.sqrt(2)
        assert np.linalg.norm(plain - X[8]) < 2 * opts.stall_radius * np.sqrt(2)   # would have stayed
    else:
        np.testing.assert_array_equal(x, plain)   # in between, the plain acquisition refines


def test_defaults_and_validation() -> None:
    assert IndependentOptions().stall_rounds is None
    assert GradientOptions().stall_rounds == 10
    assert CentralizedOptions().stall_rounds == 10   # PACOH-BO gets the same as PACD-BO
    assert GradientOptions(stall_rounds=None).stall_rounds is None
    with pytest.raises(ConfigurationError, match="stall_rounds"):
        labfbo.Optimizer(SPACE, stall_rounds=0)
    with pytest.raises(ConfigurationError, match="stall_radius"):
        labfbo.Optimizer(SPACE, stall_radius=-1.0)


@pytest.mark.parametrize("protocol", [p for p in available_protocols() if get_protocol(p).takes_acquisition()])
def test_every_protocol_defaults_to_the_engines_acquisition_and_keeps_ucb_by_name(protocol: str) -> None:
    from labfbo.protocols import get_protocol, parse_options

    cls = get_protocol(protocol)
    # consensus keeps qLogNEI: LogEI with the consensus prior lost Wing Weight (docs/protocols/consensus.md)
    assert parse_options(cls, {}).acquisition == ("nei" if protocol == "consensus" else "ei")
    paper = parse_options(cls, {"acquisition": "ucb", "beta": 4.0})
    assert (paper.acquisition, paper.beta) == ("ucb", 4.0)


def test_consensus_refuses_thompson_sampling() -> None:
    from labfbo.protocols import get_protocol, parse_options

    with pytest.raises(ConfigurationError, match="acquisition"):
        parse_options(get_protocol("consensus"), {"acquisition": "ts"})


def test_paper_suites_ask_for_the_papers_ucb_by_name(tmp_path) -> None:
    from labfbo_bench import guide, pacd

    jobs = {j.label: j for j in pacd.jobs(str(tmp_path), ("branin",), [0], dp=True)}
    for label in ("Independent", "PACOH-BO", "PACD-BO", "CBOC-U", "CBOC-L", "DP-PACD-BO"):
        assert jobs[label].options["acquisition"] == "ucb" and jobs[label].options["beta"] == 4.0
    for label in ("Independent (labfbo defaults)", "PACD-BO (labfbo defaults)", "CBOC-U (labfbo defaults)"):
        assert "acquisition" not in jobs[label].options
    by_name = pacd.jobs(str(tmp_path), ("branin",), [0], methods=("PACOH-BO (labfbo defaults)",
                                                                   "Pooled MTGP (labfbo defaults)"))
    assert [(j.protocol, j.options) for j in by_name] == [("centralized", {}), ("pooled", {})]
    for label, (_, opts) in guide.METHODS.items():
        assert opts["acquisition"] == label.split("-")[-1].lower()
        # the paper's rows model the outputs as they are; labfbo's (NEI) rows take its defaults
        assert opts.get("output_transform") == (None if label.endswith("NEI") else "standardize")
    for label in ("Independent", "PACOH-BO", "PACD-BO", "CBOC-U", "CBOC-L"):
        assert jobs[label].options["output_transform"] == "standardize"
    assert all("output_transform" not in j.options for lbl, j in jobs.items() if "(labfbo defaults)" in lbl)


def test_the_guide_suites_nei_rows_take_each_protocols_default_and_winsorize_is_a_named_variant(tmp_path) -> None:
    from labfbo.apps.harness import options_fingerprint
    from labfbo_bench import guide

    jobs = {j.label: j for j in guide.jobs(str(tmp_path), ("ellipsoid",), (2,),
                                           ("NEI", "GUIDE-NEI", "GUIDE-NEI-winsorize"), [0])}
    assert jobs["NEI"].fingerprint() == options_fingerprint("independent", {"beta": 2.0, "acquisition": "nei",
                                                                            "output_transform": "standardize"})
    assert jobs["GUIDE-NEI"].fingerprint() == options_fingerprint(
        "distribution", {"beta": 2.0, "acquisition": "nei", "output_transform": "standardize"})
    assert jobs["GUIDE-NEI-winsorize"].options["output_transform"] == "winsorize"
    assert jobs["GUIDE-NEI-winsorize"].fingerprint() != jobs["GUIDE-NEI"].fingerprint()
    assert "GUIDE-NEI-winsorize" in jobs["GUIDE-NEI-winsorize"].path and "GUIDE-NEI-winsorize" not in guide.METHODS


def test_pmcbo_paper_rows_keep_the_papers_surrogate_and_nei_rows_take_labfbos(tmp_path) -> None:
    from labfbo_bench import pmcbo

    for job in pmcbo.jobs(str(tmp_path), ("branin",), ("ucb", "nei"), [0]):
        acq, label = job.label.split(":", 1)
        paper_row = acq == "ucb" and "(labfbo defaults)" not in label
        assert job.options.get("output_transform") == ("standardize" if paper_row else None), job.label


def test_a_cached_run_made_with_other_defaults_runs_again(tmp_path) -> None:
    """A cache keyed by the method's label must not hand an old default's run to a new table."""
    import json

    from labfbo.apps.harness import Job, cached_fingerprint, options_fingerprint, run_pending

    job = Job(path=str(tmp_path / "p" / "m" / "seed0.json"), label="m", problem="branin", problem_kwargs={},
              protocol="independent", seed=0, n_init=3, budget=1)
    assert job.fingerprint() == options_fingerprint("independent", {"output_transform": "standardize"})
    assert job.fingerprint() != options_fingerprint("independent", {"output_transform": "winsorize"})
    # simulate's own keywords: where it journals is not an option; the transport is
    assert options_fingerprint("independent", {"storage_dir": str(tmp_path)}) == job.fingerprint()
    assert options_fingerprint("independent", {"transport": "http"}) != job.fingerprint()
    ran: list[str] = []

    def run(j: Job) -> str:
        ran.append(j.path)
        Path(j.path).parent.mkdir(parents=True, exist_ok=True)
        Path(j.path).write_text(json.dumps({"options": {"fingerprint": j.fingerprint()}}))
        return j.path

    Path(job.path).parent.mkdir(parents=True)
    Path(job.path).write_text(json.dumps({"options": {"fingerprint": "made-with-old-defaults"}}))
    run_pending([job], run)
    assert ran == [job.path] and cached_fingerprint(job.path) == job.fingerprint()
    assert json.loads((tmp_path / "p" / "m" / "seed0.stale.json").read_text())["options"]["fingerprint"] == \
        "made-with-old-defaults"                                     # set aside, not deleted
    run_pending([job], run)                                          # up to date: not run again
    assert ran == [job.path]
    Path(job.path).write_text(json.dumps({"options": {}}))           # a run from before fingerprints
    run_pending([job], run)
    assert len(ran) == 2
    # a report that runs nothing leaves a stale run out all the same
    from labfbo.apps.harness import run_with_progress

    Path(job.path).write_text(json.dumps({"options": {"fingerprint": "other-options"}}))
    run_with_progress([job], run, 1, "test", report_only=True)
    assert len(ran) == 2 and not Path(job.path).exists()
    stale = json.loads((tmp_path / "p" / "m" / "seed0.stale.json").read_text())
    assert stale["options"]["fingerprint"] == "other-options"


def test_pacd_suite_runs_the_escape_ablations_only_by_name(tmp_path) -> None:
    from labfbo_bench import pacd

    default = {j.label: j for j in pacd.jobs(str(tmp_path), ("branin",), [0])}
    assert list(default) == list(pacd.DEFAULT_METHODS)
    chosen = {j.label: j for j in pacd.jobs(str(tmp_path), ("branin",), [0],
                                            methods=("Independent-escape", "PACD-BO-paper"))}
    assert chosen["Independent-escape"].protocol == "independent"
    assert chosen["Independent-escape"].options["stall_rounds"] == 10
    assert chosen["PACD-BO-paper"].protocol == "gradient" and chosen["PACD-BO-paper"].options["stall_rounds"] is None
    with pytest.raises(ConfigurationError, match="PACD"):
        pacd.jobs(str(tmp_path), ("branin",), [0], methods=("PACD",))
    small = pacd.jobs(str(tmp_path), ("hartmann3",), [0], n_sites=4, initial=4,
                      methods=("Pooled MTGP (labfbo defaults)",))
    assert small[0].protocol == "pooled" and small[0].n_init == 4 and small[0].problem_kwargs == {"n_sites": 4}
    assert "hartmann3-4sites-4init" in small[0].path          # not the paper setting's cache
    assert "/branin/" in default["PACD-BO"].path


def test_pacd_transfer_efficiency_is_the_share_of_the_pooled_gain_with_the_same_acquisition() -> None:
    from types import SimpleNamespace

    from labfbo_bench import pacd

    def runs(*finals: float) -> list:
        return [SimpleNamespace(final_regret=lambda v=v: np.array([v, v]), auc=np.array([2 * v])) for v in finals]

    by = {("branin", "Independent (labfbo defaults)"): runs(0.5, 0.7),        # alone 0.6
          ("branin", "PACOH-BO (labfbo defaults)"): runs(0.2),                 # pooled 0.2
          ("branin", "PACD-BO (labfbo defaults)"): runs(0.3),                  # (0.6 - 0.3) / 0.4
          ("branin", "Independent"): runs(0.4), ("branin", "PACOH-BO"): runs(0.4),
          ("branin", "PACD-BO"): runs(0.1)}                                    # the UCB rows: no pooled gain
    te = pacd.transfer_efficiency(by)
    assert te == {("branin", "PACD-BO (labfbo defaults)"): ("PACOH-BO (labfbo defaults)", "75%", "75%"),
                  ("branin", "PACD-BO"): ("PACOH-BO",) + ("n/a (pooling gains nothing)",) * 2}
    by[("branin", "Pooled MTGP (labfbo defaults)")] = runs(0.4)                # preferred when run: (0.6 - 0.3) / 0.2
    te = pacd.transfer_efficiency(by)
    assert te[("branin", "PACD-BO (labfbo defaults)")] == ("Pooled MTGP (labfbo defaults)", "150%", "150%")
    assert te[("branin", "PACOH-BO (labfbo defaults)")] == ("Pooled MTGP (labfbo defaults)", "200%", "200%")


def test_the_penalty_of_a_log_acquisition_is_in_nats() -> None:
    X = np.random.default_rng(1).random((12, 2))
    y = 1e4 * -((X - 0.3) ** 2).sum(-1)    # large units: a y-scaled penalty would swamp log EI everywhere
    data = AcquisitionData(X=X, y=y, pending=np.zeros((0, 2)))
    gp = fit_local_gp(X, y)
    for acquisition, weight in [("ei", 30.0), ("nei", 30.0), ("ucb", 3.0 * np.ptp(y))]:
        opts = AcquisitionOptions(acquisition=acquisition, stall_rounds=1)
        acq = ExcludeIncumbent.around_best(UpperConfidenceBound(gp, beta=4.0), data, 2, opts)
        assert acq.weight == pytest.approx(weight, rel=1e-9)


def test_an_escaping_batch_with_pending_points_leaves_the_basin() -> None:
    rng = np.random.default_rng(0)
    X = np.vstack([rng.random((8, 2)), [0.3, 0.3], 0.3 + 0.01 * rng.standard_normal((7, 2))])
    y = -((X - 0.3) ** 2).sum(-1)
    y[8] += 0.5
    pending = np.array([[0.9, 0.1]])
    data = AcquisitionData(X=X, y=y, pending=pending)
    opts = AcquisitionOptions(stall_rounds=5, num_restarts=4, raw_samples=128)
    batch = propose_with_model(fit_local_gp(X, y), SPACE, data, 2, 0, opts, round=7)
    assert batch.shape == (2, 2)
    assert np.all(np.linalg.norm(batch - X[8], axis=1) > 2 * opts.stall_radius * np.sqrt(2))
    assert np.all(np.abs(batch - pending).max(axis=1) > 1e-6)


def test_auto_noise_prior_interpolates_noiseless_data_and_keeps_noise_when_there_is_some() -> None:
    import numpy as np

    from labfbo.models.gp import SurrogateOptions, fit_local_gp

    rng = np.random.default_rng(0)
    X = rng.random((20, 2))
    y = np.sin(6 * X[:, 0]) + X[:, 1] ** 2
    auto = SurrogateOptions(noise_prior="auto", kernel="rbf")  # the smoother kernel: noise is told from signal
    assert float(fit_local_gp(X, y, options=auto).likelihood.noise) < 1e-5  # the interpolating fit
    noisy = y + 0.3 * rng.standard_normal(20)
    assert float(fit_local_gp(X, noisy, options=auto).likelihood.noise) > 1e-2  # BoTorch's prior kept


def test_winsorized_raises_only_the_bad_tail_to_tukeys_fence() -> None:
    from labfbo.models.gp import winsorized

    y = np.array([0.50, 0.55, 0.60, 0.62, 0.65, 0.70, -40.0])      # one failed run
    q1, q3 = np.quantile(y, [0.25, 0.75])
    w = winsorized(y)
    assert w[-1] == pytest.approx(q1 - 1.5 * (q3 - q1)) and w[-1] > -1.0
    np.testing.assert_array_equal(w[:-1], y[:-1])                   # the good values untouched
    good_outlier = np.array([0.50, 0.55, 0.60, 0.62, 0.65, 0.70, 40.0])
    np.testing.assert_array_equal(winsorized(good_outlier), good_outlier)  # a great result is never clipped
    np.testing.assert_array_equal(winsorized(y[:3]), y[:3])          # too few values to judge


def test_the_winsorized_gp_keeps_its_scale_near_the_optimum_and_constraints_are_never_clipped() -> None:
    from labfbo.models.gp import SurrogateOptions, fit_local_gp, predict

    rng = np.random.default_rng(1)
    X = rng.random((16, 2))
    y = -((X - 0.6) ** 2).sum(axis=1)
    y[:2] = -50.0                                                    # two failed runs
    robust = SurrogateOptions(output_transform="winsorize")
    plain_model = fit_local_gp(X, y, options=SurrogateOptions(output_transform="standardize"))
    robust_model = fit_local_gp(X, y, options=robust)
    good = X[2:]
    err_plain = np.abs(predict(plain_model, good)[0] - y[2:]).max()
    err_robust = np.abs(predict(robust_model, good)[0] - y[2:]).max()
    assert err_robust < err_plain
    # an outcome column (objective=False) keeps every value, whatever the option says
    as_constraint = fit_local_gp(X, y, options=robust, objective=False)
    assert float(as_constraint.train_targets.min()) == pytest.approx(float(plain_model.train_targets.min()))


def test_the_output_transform_is_validated_and_refused_where_it_does_not_apply() -> None:
    from labfbo.protocols.pooled import PooledOptions

    with pytest.raises(ValueError, match="output_transform"):
        IndependentOptions(output_transform="log")
    with pytest.raises(ValueError, match="output_transform"):
        PooledOptions(output_transform="winsorize")
    assert PooledOptions().output_transform == "standardize"         # the pooled reference keeps its own
    assert IndependentOptions().output_transform == "standardize"
    assert IndependentOptions(output_transform="winsorize").output_transform == "winsorize"


def test_distribution_keeps_standardize_as_its_own_default_and_its_sites_use_it() -> None:
    """GUIDE-NEI lost sites on Ellipsoid with winsorizing (docs/benchmarks/papers.md, the guide suite): ``distribution``
    standardizes unless asked; its sites' local GP then keeps a failed run's value."""
    from labfbo.protocols.base import SiteContext, SiteData
    from labfbo.protocols.distribution.protocol import DistributionOptions, DistributionSite

    assert DistributionOptions().output_transform == "standardize"
    assert DistributionOptions(output_transform="winsorize").output_transform == "winsorize"
    space = labfbo.SearchSpace([labfbo.Real("a", 0, 1), labfbo.Real("b", 0, 1)])
    rng = np.random.default_rng(2)
    X = rng.random((12, 2))
    y = -((X - 0.4) ** 2).sum(axis=1)
    y[0] = -40.0                                                     # one failed run
    data = SiteData(space=space, X=X, y=y, yvar=None, pending=np.zeros((0, 2)))
    lows = {}
    for transform in ("standardize", "winsorize"):
        site = DistributionSite(space, DistributionOptions(output_transform=transform), SiteContext("s0"))
        model = site.local_model(data)
        lows[transform] = float(model.outcome_transform.untransform(model.train_targets.unsqueeze(-1))[0].min())
    assert lows["standardize"] == pytest.approx(-40.0)
    assert lows["winsorize"] > -40.0 + 1.0
