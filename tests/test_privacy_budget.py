"""``DP(epsilon=...)``: a campaign budget, calibrated from the planned releases and never exceeded."""

from __future__ import annotations

import math
import warnings
from collections import Counter

import numpy as np
import pytest
from campaign import run_campaign
from hypothesis import given, settings, strategies as st

import labfbo
from labfbo.core.release import Release
from labfbo.privacy.budget import Budget, calibrate, planned_epsilon
from labfbo.privacy.dp import composed_epsilon

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
SITES = ["s0", "s1", "s2"]
FAST = {"num_restarts": 2, "raw_samples": 32}
PROTOCOLS = {"distribution": {"M": 64, "candidates": 128},
             "surface": {"fourier_features": 8},
             "gradient": {"n_particles": 3, "hidden": (8, 8), "warmup_steps": 4, "svgd_steps": 2},
             "gradient-sa": {"n_particles": 3, "hidden": (8, 8), "warmup_steps": 4, "svgd_steps": 2,
                             "secure_aggregation": True}}


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.1 * i) ** 2 + (p["y"] + 0.2) ** 2


def _sites(protocol: str, dp: labfbo.DP, horizon: int, tmp_path=None, coord=None, **extra):
    name = protocol.removesuffix("-sa")
    opts = {**FAST, **PROTOCOLS[protocol], "privacy": dp, **extra}
    coord = coord or labfbo.Coordinator(name, sites=SITES, seed=0, horizon=horizon, **opts)
    return coord, [labfbo.Optimizer(SPACE, protocol=name, coordinator=coord, site=s, seed=0, n_init=3, secret=11 + i,
                                    storage=None if tmp_path is None else str(tmp_path / s), **opts)
                   for i, s in enumerate(SITES)]


# -- the budget's arithmetic ----------------------------------------------------------------
def test_the_budget_form_leaves_sigma_to_calibration() -> None:
    assert labfbo.DP().noise_multiplier == 1.0 and labfbo.DP().epsilon is None  # the old default stands
    dp = labfbo.DP(epsilon=2.0)
    assert dp.noise_multiplier is None and not dp.calibrated
    with pytest.raises(labfbo.ConfigurationError, match="no noise multiplier until the site plans"):
        _ = dp.sigma
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="epsilon"):
            labfbo.DP(epsilon=bad)


@settings(max_examples=12, deadline=None)
@given(epsilon=st.floats(0.1, 20.0), delta=st.sampled_from([1e-6, 1e-5, 1e-3]),
       counts=st.lists(st.integers(1, 1200), min_size=1, max_size=2),
       factors=st.lists(st.floats(0.05, 3.0), min_size=2, max_size=2))
def test_calibration_is_within_the_budget_and_tight(epsilon, delta, counts, factors) -> None:
    kinds = {f"k{i}": f for i, f in enumerate(factors[:len(counts)])}
    plan = {k: n for k, n in zip(kinds, counts)}
    sigma = calibrate(kinds, plan, epsilon, delta)
    assert planned_epsilon(kinds, plan, sigma, delta) <= epsilon
    assert planned_epsilon(kinds, plan, sigma * 0.98, delta) > epsilon  # no noise wasted beyond 2 %


def test_calibration_across_the_reports_rdp_threshold() -> None:
    """A plan whose exact multiplier lies below the report's PLD range (accounted by RDP there):
    calibrated on the report's own accountant, within the budget and tight (hypothesis found it)."""
    kinds, plan = {"k0": 0.05}, {"k0": 1}
    sigma = calibrate(kinds, plan, 8.0, 1e-3)
    assert planned_epsilon(kinds, plan, sigma, 1e-3) <= 8.0 < planned_epsilon(kinds, plan, 0.98 * sigma, 1e-3)


def _release(m: float, private: bool = True) -> Release:
    if not private:
        return Release.unprotected("x", 0)
    return Release(round=0, message="x", sensitivity=1.0, noise_std=m, effective_noise_multiplier=m, delta=1e-5)


@settings(max_examples=12, deadline=None)
@given(epsilon=st.floats(0.3, 10.0), planned=st.lists(st.integers(1, 60), min_size=1, max_size=2),
       extra=st.integers(0, 8), order=st.randoms(use_true_random=False), expert=st.booleans())
def test_no_sequence_of_releases_goes_beyond_the_budget(epsilon, planned, extra, order, expert) -> None:
    """Whatever the campaign does — the plan, more releases than planned, another mix, a resume
    (the check reads only the releases made so far) — what is let out stays within the budget."""
    factors = {f"k{i}": 1.0 / (1 + i) for i in range(len(planned))}
    counts = dict(zip(factors, planned))
    sigma = 3.0 if expert else calibrate(factors, counts, epsilon, 1e-5)
    dp = labfbo.DP(noise_multiplier=sigma, epsilon=epsilon)
    plan = Counter({sigma * factors[k]: n for k, n in counts.items()})
    budget = Budget(dp, None if expert and composed_epsilon(plan, 1e-5) > epsilon else plan)
    wanted = [sigma * factors[k] for k, n in counts.items() for _ in range(n)]
    order.shuffle(wanted)  # the plan in any order, then more than planned
    wanted += [sigma * factors[order.choice(list(factors))] for _ in range(extra)]
    made: list[Release] = []
    for m in wanted:
        rel = _release(m)
        if budget.allows(made, rel):
            made.append(rel)
    assert budget.spent(made) <= epsilon
    if not expert:
        assert len(made) >= sum(planned)  # every planned release fits
    assert not budget.allows(made, _release(1.0, private=False))  # an unprotected release never fits


# -- campaigns --------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_campaign_longer_than_planned_stops_releasing_within_the_budget(protocol) -> None:
    _, sites = _sites(protocol, labfbo.DP(epsilon=1.0), horizon=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_campaign(sites, _f, 3, rounds=4)
    said = [str(w.message) for w in caught if "privacy budget spent" in str(w.message)]
    assert len(said) == len(SITES)  # once per site
    for o in sites:
        b = o.privacy_budget()
        assert o.epsilon() <= 1.0 and b["spent"] == o.epsilon() and b["epsilon"] == 1.0
        assert b["exhausted"] and b["withheld"] >= 1 and b["exhausted_at_round"] is not None
        assert b["releases"] == b["planned_releases"]  # the whole plan, nothing beyond it
        assert o.epsilon() > 0.999  # the calibration spends the budget, no more
        assert [r for r in o.state.withheld if r.budget != 1.0] == []
        assert len(o.ask(n=1)) == 1  # the site goes on, on its own model


@pytest.mark.integration
def test_a_resumed_site_keeps_to_the_budget_it_had_spent(tmp_path) -> None:
    coord, sites = _sites("surface", labfbo.DP(epsilon=0.5), horizon=3, tmp_path=tmp_path)
    run_campaign(sites, _f, 3, rounds=2)
    sigma = sites[0].privacy_budget()["noise_multiplier"]
    for o in sites:
        o.close()
    _, sites = _sites("surface", labfbo.DP(epsilon=0.5), horizon=3, tmp_path=tmp_path, coord=coord)
    assert sites[0].privacy_budget()["noise_multiplier"] == sigma  # the same plan, the same noise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            trials = [o.ask() for o in sites]
            for i, (o, t) in enumerate(zip(sites, trials)):
                o.tell(t, _f(i, t.params))
    for o in sites:
        assert o.epsilon() <= 0.5 and o.privacy_budget()["exhausted"]
        assert o.privacy_report()[-1]["epsilon"] <= 0.5
    first = sites[0].privacy_budget()["exhausted_at_round"]
    for o in sites:
        o.close()
    from labfbo.report import write_report  # the lab's report says it, from the journal alone

    html = write_report(tmp_path / "s0", tmp_path / "s0.html").html.read_text()
    assert "Privacy budget of the campaign: <b>ε ≤ 0.5</b> (the noise was calibrated to it)" in html
    assert f"The budget was spent</b>: from round {first} on" in html


@pytest.mark.integration
def test_a_fixed_noise_with_a_budget_is_capped_and_said_at_the_start() -> None:
    with pytest.warns(UserWarning, match="planned releases would spend"):
        _, sites = _sites("distribution", labfbo.DP(noise_multiplier=2.0, epsilon=3.0), horizon=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_campaign(sites, _f, 3, rounds=6)
    for o in sites:
        assert 0 < o.epsilon() <= 3.0 and o.privacy_budget()["exhausted"]


def test_a_budget_needs_a_horizon_to_plan_and_is_refused_before_it_joins_without_one() -> None:
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, privacy=labfbo.DP(epsilon=1.0))
    with pytest.raises(labfbo.FederationError, match=r"DP\(epsilon=1\), and no horizon .* the study sets none"):
        labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", privacy=labfbo.DP(epsilon=1.0))
    assert coord.members == {} and coord.privacy == {} and coord.space is None  # nothing half-joined
    # the site's own horizon plans its budget (it declares it when it joins)
    own = labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", horizon=3,
                           privacy=labfbo.DP(epsilon=1.0))
    assert coord.members == {"s0": 0} and coord.privacy["s0"].horizon == 3
    assert own.privacy_budget()["planned_releases"] > 0
    # the study's horizon does too; a noise multiplier alone needs none
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, horizon=3, privacy=labfbo.DP(epsilon=1.0))
    labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", privacy=labfbo.DP(epsilon=1.0))
    assert coord.privacy["s0"].horizon is None
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, privacy=labfbo.DP(noise_multiplier=2.0))
    labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", privacy=labfbo.DP(noise_multiplier=2.0))
    assert list(coord.members) == ["s0"]


def test_the_consortium_floor_refuses_weaker_joins() -> None:
    floor = labfbo.PrivacyFloor(epsilon=2.0)
    for dp, why in [(None, "without differential privacy"), (labfbo.DP(noise_multiplier=4.0), "no privacy budget"),
                    (labfbo.DP(epsilon=4.0), "weaker than the study's floor"),
                    (labfbo.DP(epsilon=1.0, delta=1e-3), "weaker than the study's floor")]:
        extra = {} if dp is None else {"privacy": dp}
        coord = labfbo.Coordinator("surface", sites=SITES, seed=0, horizon=3, privacy_floor=floor)
        with pytest.raises(labfbo.FederationError, match=why):
            labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", **extra)
    coord = labfbo.Coordinator("surface", sites=SITES, seed=0, horizon=3, privacy_floor={"epsilon": 2.0})
    ok = labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", privacy=labfbo.DP(epsilon=2.0))
    assert ok.privacy_budget()["epsilon"] == 2.0
    with pytest.raises(labfbo.ConfigurationError, match="no differential privacy mechanism"):
        labfbo.Coordinator("consensus", sites=SITES, horizon=3, privacy_floor=floor)


@pytest.mark.integration
def test_the_budget_holds_over_http_with_the_same_proposals_as_local() -> None:
    kw = dict(problem="branin", protocol="distribution", n_sites=3, n_init=3, budget=3, seed=2,
              privacy=labfbo.DP(epsilon=1.5), **FAST, **PROTOCOLS["distribution"])
    local, http = labfbo.simulate(**kw), labfbo.simulate(transport="http", **kw)
    np.testing.assert_array_equal(http.proposals, local.proposals)
    assert max(http.epsilon) <= 1.5 and http.epsilon == local.epsilon


def test_a_servers_config_sets_the_floor() -> None:
    from labfbo.server.config import ServerConfig

    cfg = ServerConfig(protocol="surface", horizon=3, sites=SITES, privacy_floor={"epsilon": 2.0, "delta": 1e-6})
    coord = cfg.coordinator()
    assert coord.privacy_floor == labfbo.PrivacyFloor(epsilon=2.0, delta=1e-6)
    with pytest.raises(labfbo.FederationError, match="weaker than the study's floor"):
        labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site="s0", privacy=labfbo.DP(epsilon=2.0))


def test_a_round_answered_again_from_other_data_draws_fresh_noise() -> None:
    """The DP noise stream is keyed by the data it protects: the same data repeats its bytes (a
    resend reveals nothing), other data (a round re-answered after a restart) draws fresh noise."""
    from labfbo.protocols import SiteContext, SiteData, get_protocol, parse_options
    from labfbo.protocols.surface.protocol import SurfaceRequest

    proto = get_protocol("surface")
    logic = proto.site_logic(SPACE, parse_options(proto, {"privacy": labfbo.DP(noise_multiplier=1.0)}),
                             SiteContext(site="s0", secret=5))
    gen = np.random.default_rng(0)
    X, y = gen.random((6, 2)), gen.random(6)
    five, six = (SiteData(space=SPACE, X=X[:n], y=y[:n], yvar=None, pending=np.zeros((0, 2))) for n in (5, 6))
    a, b, c = (logic.answer(SurfaceRequest(), d, 0) for d in (five, five, six))
    assert a.moment.numpy().tolist() == b.moment.numpy().tolist()
    clean5, clean6 = (proto.site_logic(SPACE, parse_options(proto, {}), SiteContext(site="s0")).answer(
        SurfaceRequest(), d, 0).moment.numpy() for d in (five, six))
    noise5, noise6 = a.moment.numpy() - clean5, c.moment.numpy() - clean6
    assert not np.allclose(noise5, noise6)


@pytest.mark.integration
def test_a_spent_member_of_a_secure_sum_costs_the_others_nothing_after_it_retires() -> None:
    """Under secure aggregation a site that spent its budget abstains; the coordinator leaves it out
    of every later cohort, so the others' steps are not redone (and charged) round after round."""
    opts = {**FAST, **PROTOCOLS["gradient-sa"]}
    coord = labfbo.Coordinator("gradient", sites=SITES + ["s3"], seed=0, horizon=5, **opts)
    sites = [labfbo.Optimizer(SPACE, protocol="gradient", coordinator=coord, site=s, seed=0, n_init=3, secret=11 + i,
                              horizon=2 if i == 0 else 5, privacy=labfbo.DP(epsilon=1.0), **opts)
             for i, s in enumerate(SITES + ["s3"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_campaign(sites, lambda i, p: _f(i % 3, p), 3, rounds=5)
    assert sites[0].privacy_budget()["exhausted_at_round"] == 2 and "s0" in coord.aggregator().secure.retired
    for o in sites[1:]:  # warm-up 4 steps, then 2 a round: the round s0 ran out in was redone once, no other
        per_round = Counter(r.round for r in o.releases())
        assert [per_round[t] for t in range(4)] == [4, 2, 3, 2] and o.epsilon() <= 1.0


def test_a_surface_drowned_in_dp_noise_is_not_trusted() -> None:
    """The coordinator states the DP noise of the others' sums (from what each contributor declared);
    a site uses the surface only while that noise is small against the sums' scale."""
    from labfbo.core.messages import Array
    from labfbo.protocols import SiteContext, get_protocol, parse_options
    from labfbo.protocols.surface.aggregate import leave_one_out
    from labfbo.protocols.surface.protocol import NOISE_GUARD, SurfaceStats

    proto = get_protocol("surface")
    logic = proto.site_logic(SPACE, parse_options(proto, {"fourier_features": 4}), SiteContext(site="s0"))
    p = logic.features.p
    gram, moment = np.eye(p)[np.triu_indices(p)], np.full(p, 0.1)
    stats = {s: SurfaceStats(count=10, gram=Array.of(gram), moment=Array.of(moment), dp_clip=1.0,
                             dp_noise_multiplier=sigma, dp_sensitivity=2.0)
             for s, sigma in zip(SITES, (0.1, 0.1, 0.1))}
    totals = leave_one_out(stats, SITES)["s0"]
    assert totals.noise_sd == pytest.approx(np.sqrt(2) * 10 * 0.1 * 2.0) and totals.count == 20
    assert logic.weights(totals) is not None  # noise 2.8 against sums of 20: used
    loud = leave_one_out({s: m.model_copy(update={"dp_noise_multiplier": 5.0}) for s, m in stats.items()}, SITES)["s0"]
    assert loud.noise_sd > NOISE_GUARD * loud.count and logic.weights(loud) is None  # drowned: the site's own GP
    plain = leave_one_out({s: m.model_copy(update={"dp_noise_multiplier": None, "dp_sensitivity": None,
                                                   "dp_clip": None}) for s, m in stats.items()}, SITES)["s0"]
    assert plain.noise_sd is None and "noise_sd" not in plain.model_dump_json()
