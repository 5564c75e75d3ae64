"""surface's opt-in trust="top" and trust="agreement": the prior mean of the agreement scale from
where the partners' surface ranks the lab's best result, or from the probability that the lab agrees
with it; and weigh_upload="agreement" (labfbo.models.transfer)."""

from __future__ import annotations

import numpy as np
import pytest

from labfbo.core.records import TransferEstimate
from labfbo.models.transfer import agreement_probability, top_rank, top_trust
from labfbo.protocols.surface.protocol import SurfaceOptions


def test_the_rank_of_the_labs_best_result_under_its_partners_surface() -> None:
    y = np.array([0.1, 0.4, 0.2, 0.9])
    assert top_rank(np.array([0.0, 1.0, 2.0, 3.0]), y) == 1.0 and top_trust(np.array([0.0, 1.0, 2.0, 3.0]), y) == 1.0
    assert top_rank(np.array([3.0, 2.0, 1.0, 0.0]), y) == 0.0 and top_trust(np.array([3.0, 2.0, 1.0, 0.0]), y) == 0.0
    assert top_rank(np.array([0.0, 2.0, 1.0, 1.0]), y) == pytest.approx(0.5)  # one below, one above, one tie
    assert top_trust(np.array([0.0, 2.0, 1.0, 1.0]), y) == 1.0  # the upper half keeps full trust
    assert top_trust(np.array([1.0, 2.0, 3.0, 1.5]), y) == pytest.approx(2 * 1 / 3)
    assert top_rank(np.array([0.0, 1.0]), np.array([1.0, 0.0])) is None and top_trust(np.zeros(2), np.ones(2)) == 1.0


def _estimate(agreement: float | None, se: float | None) -> TransferEstimate:
    return TransferEstimate(n=8, alone=1.0, shared=1.0, gain=0.0, agreement=agreement, agreement_se=se)


def test_the_upload_weight_is_the_probability_that_the_lab_agrees() -> None:
    assert agreement_probability(None) == 1.0 and agreement_probability(_estimate(None, None)) == 1.0
    assert agreement_probability(_estimate(0.0, 0.5)) == pytest.approx(0.5)
    assert agreement_probability(_estimate(1.0, 0.5)) == pytest.approx(0.97725, abs=1e-5)  # Phi(2)
    assert agreement_probability(_estimate(-1.0, 0.5)) == pytest.approx(0.02275, abs=1e-5)
    assert agreement_probability(_estimate(0.3, 0.0)) == 1.0  # no standard error: not estimated


def test_trust_and_the_upload_weight_follow_the_labs_agreement_by_default() -> None:
    assert SurfaceOptions().trust == "agreement" and SurfaceOptions(trust="top").trust == "top"
    assert SurfaceOptions().weigh_upload == "agreement" and SurfaceOptions(trust="prior").trust == "prior"
    with pytest.raises(ValueError):
        SurfaceOptions(trust="always")


@pytest.mark.integration  # a four-lab campaign
def test_a_lab_whose_best_result_its_partners_rank_last_trusts_their_surface_less() -> None:
    opts = _opposite_lab_campaign({"num_restarts": 2, "raw_samples": 32, "trust": "top", "weigh_upload": "off"})
    prior = []
    for o in opts:
        logic = o.agent.logic
        model = logic.surface_model(o.site_data(), logic._weights)
        prior.append(float(model.mean_module.scale_prior.loc))
    assert prior[:3] == [1.0, 1.0, 1.0] and prior[3] < 0.5, prior


@pytest.mark.integration  # a four-lab campaign
def test_a_lab_that_disagrees_with_its_partners_trusts_their_surface_less_and_weighs_its_upload_less() -> None:
    from labfbo.protocols.surface.model import site_statistics

    opts = _opposite_lab_campaign({"num_restarts": 2, "raw_samples": 32})  # the defaults
    prior, weight = [], []
    for o in opts:
        logic, data = o.agent.logic, o.site_data()
        model = logic.surface_model(data, logic._weights)
        prior.append(float(model.mean_module.scale_prior.loc))
        weight.append(agreement_probability(logic._transfer))
        gram, moment, _, _ = logic._statistics(data, 9, None)  # what it would send: its statistics, weighted
        g, h = site_statistics(logic.features.of_unit(data.X), data.y)
        np.testing.assert_allclose(gram, weight[-1] * g) and np.testing.assert_allclose(moment, weight[-1] * h)
    assert prior[3] < 0.5 < min(prior[:3]) and weight[3] < 0.5 < min(weight[:3]), (prior, weight)


def _opposite_lab_campaign(fast: dict) -> list:
    """Four labs on two categorical parameters, lab 3 the opposite of the others; 3 + 4 experiments."""
    import warnings

    from campaign import run_campaign

    import labfbo

    space = labfbo.SearchSpace([labfbo.Categorical("a", list("pqrs")), labfbo.Categorical("b", list("vwxyz"))])
    effect = {"p": 0.0, "q": 0.5, "r": 1.0, "s": 1.5, "v": 0.0, "w": 0.3, "x": 0.6, "y": 0.9, "z": 1.2}

    def f(i: int, params: dict) -> float:  # lab 3 is the opposite of the others
        value = sum(effect[v] for v in params.values())
        return -value if i == 3 else value

    coord = labfbo.Coordinator("surface", sites=["l0", "l1", "l2", "l3"], space=space, seed=3, horizon=6, **fast)
    opts = [labfbo.Optimizer(space, protocol="surface", coordinator=coord, site=f"l{i}", seed=3, n_init=3, **fast)
            for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_campaign(opts, f, 3, 4)
    return opts


@pytest.mark.integration  # a four-lab campaign with two objectives
def test_with_several_objectives_a_lab_trusts_each_objectives_surface_as_far_as_its_values_agree() -> None:
    """Lab 3's first objective goes the partners' way, its second the opposite way: it keeps the first
    surface at full trust and takes the second at its (low) probability of agreement. (The other labs'
    second surface holds lab 3's opposite statistics too, unweighted with several objectives: they
    trust it less than the first.)"""
    import warnings

    from campaign import run_campaign

    import labfbo

    space = labfbo.SearchSpace([labfbo.Categorical("a", list("pqrs")), labfbo.Categorical("b", list("vwxyz"))])
    effect = {"p": 0.0, "q": 0.5, "r": 1.0, "s": 1.5, "v": 0.0, "w": 0.3, "x": 0.6, "y": 0.9, "z": 1.2}
    fast = {"num_restarts": 2, "raw_samples": 32}

    def f(i: int, params: dict) -> dict:
        value = sum(effect[v] for v in params.values())
        return {"purity": value, "yield": -value if i == 3 else value}

    two = [labfbo.Objective("purity", "maximize"), labfbo.Objective("yield", "maximize")]
    coord = labfbo.Coordinator("surface", sites=["l0", "l1", "l2", "l3"], space=space, seed=3, horizon=6, **fast)
    opts = [labfbo.Optimizer(space, objective=two, protocol="surface", coordinator=coord, site=f"l{i}", seed=3,
                             n_init=3, **fast) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_campaign(opts, f, 3, 4)
    prior = []
    for o in opts:
        logic, data = o.agent.logic, o.site_data()
        assert logic._weights is not None and logic._weights.shape == (2, logic.features.p)
        prior.append([float(logic.outcome_model(data, j).mean_module.scale_prior.loc) for j in range(2)])
    assert min(p[0] for p in prior) >= 0.9, prior              # the first objective: every lab agrees
    assert prior[3][1] < 0.5 and prior[3][1] < min(p[1] for p in prior[:3]) / 4, prior
    # its asks record the least trusted objective's estimate (the report and dashboard show it)
    recorded = [agreement_probability(o.transfer_estimates()[-1][1]) for o in opts]
    assert recorded[3] < 0.5 and recorded[3] < min(recorded[:3]) / 4, recorded
