"""surface's opt-in trust="top": the prior mean of the agreement scale from where the partners'
surface ranks the lab's best result (labfbo.models.transfer)."""

from __future__ import annotations

import numpy as np
import pytest

from labfbo.models.transfer import top_rank, top_trust
from labfbo.protocols.surface import SurfaceOptions


def test_the_rank_of_the_labs_best_result_under_its_partners_surface() -> None:
    y = np.array([0.1, 0.4, 0.2, 0.9])
    assert top_rank(np.array([0.0, 1.0, 2.0, 3.0]), y) == 1.0 and top_trust(np.array([0.0, 1.0, 2.0, 3.0]), y) == 1.0
    assert top_rank(np.array([3.0, 2.0, 1.0, 0.0]), y) == 0.0 and top_trust(np.array([3.0, 2.0, 1.0, 0.0]), y) == 0.0
    assert top_rank(np.array([0.0, 2.0, 1.0, 1.0]), y) == pytest.approx(0.5)  # one below, one above, one tie
    assert top_trust(np.array([0.0, 2.0, 1.0, 1.0]), y) == 1.0  # the upper half keeps full trust
    assert top_trust(np.array([1.0, 2.0, 3.0, 1.5]), y) == pytest.approx(2 * 1 / 3)
    assert top_rank(np.array([0.0, 1.0]), np.array([1.0, 0.0])) is None and top_trust(np.zeros(2), np.ones(2)) == 1.0


def test_trust_is_an_option_of_surface_and_off_by_default() -> None:
    assert SurfaceOptions().trust == "prior" and SurfaceOptions(trust="top").trust == "top"
    with pytest.raises(ValueError):
        SurfaceOptions(trust="always")


@pytest.mark.integration  # a three-lab campaign
def test_a_lab_whose_best_result_its_partners_rank_last_trusts_their_surface_less() -> None:
    import warnings

    import labfbo
    from campaign import run_campaign

    space = labfbo.SearchSpace([labfbo.Categorical("a", list("pqrs")), labfbo.Categorical("b", list("vwxyz"))])
    effect = {"p": 0.0, "q": 0.5, "r": 1.0, "s": 1.5, "v": 0.0, "w": 0.3, "x": 0.6, "y": 0.9, "z": 1.2}

    def f(i: int, params: dict) -> float:  # lab 3 is the opposite of the others
        value = sum(effect[v] for v in params.values())
        return -value if i == 3 else value

    fast = {"num_restarts": 2, "raw_samples": 32, "trust": "top"}
    coord = labfbo.Coordinator("surface", sites=["l0", "l1", "l2", "l3"], space=space, seed=3, horizon=6, **fast)
    opts = [labfbo.Optimizer(space, protocol="surface", coordinator=coord, site=f"l{i}", seed=3, n_init=3, **fast)
            for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_campaign(opts, f, 3, 4)
    prior = []
    for o in opts:
        logic = o.agent.logic
        model = logic.surface_model(o.site_data(), logic._weights)
        prior.append(float(model.mean_module.scale_prior.loc))
    assert prior[:3] == [1.0, 1.0, 1.0] and prior[3] < 0.5, prior
