"""The non-private `pooled` reference: a multi-task GP on every site's raw data."""

from __future__ import annotations

import numpy as np
import pytest
from campaign import run_campaign

import labfbo
from labfbo.models.gp import fit_local_gp, predict
from labfbo.protocols.pooled import PooledData, fit_multitask, rescaled

SPACE = labfbo.SearchSpace([labfbo.Real("x", -2.0, 2.0), labfbo.Integer("k", 1, 4)])
SITES = ["lab-a", "lab-b", "lab-c"]
FAST = {"num_restarts": 2, "raw_samples": 32}


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.2 * i) ** 2 + 0.3 * p["k"]


@pytest.mark.integration  # a multi-site campaign
def test_a_campaign_shares_raw_data_and_each_site_gets_only_the_others() -> None:
    coord = labfbo.Coordinator("pooled", sites=SITES, seed=1, horizon=1, **FAST)
    sites = [labfbo.Optimizer(SPACE, protocol="pooled", coordinator=coord, site=s, seed=1, n_init=3, **FAST)
             for s in SITES]
    props = run_campaign(sites, _f, 3, 1)
    assert all(-2.0 <= p["x"] <= 2.0 and p["k"] in (1, 2, 3, 4) for rnd in props for p in rnd)
    sent = [m.kind for m in sites[0].sent_messages()]
    assert "raw_data" in sent and set(sent) == {"join", "raw_data"}
    got = [m for m in sites[0].received_messages() if isinstance(m, PooledData)]
    assert got and all(len(m.X) == 2 for m in got)                      # the two other sites, not its own
    own = {tuple(np.round(x, 12)) for x in sites[0].sent_messages()[-1].X.numpy()}
    assert not any(tuple(np.round(x, 12)) in own for m in got for X in m.X for x in X.numpy())


def test_it_refuses_categorical_spaces_and_expert_priors() -> None:
    cat = labfbo.SearchSpace([labfbo.Real("x", 0, 1), labfbo.Categorical("c", ["a", "b"])])
    with pytest.raises(labfbo.ProtocolError, match="categorical"):
        labfbo.Optimizer(cat, protocol="pooled", site="a", coordinator=labfbo.Coordinator("pooled", sites=["a"]))
    with pytest.raises(labfbo.ConfigurationError, match="prior"):
        labfbo.Coordinator("pooled", sites=["a"], prior={"x": 0.5})
    with pytest.raises(labfbo.ConfigurationError, match="kernel, input_warping"):
        labfbo.Coordinator("pooled", sites=["a"], kernel="matern52", input_warping=True)
    with pytest.raises(ValueError, match="inputs"):
        PooledData(X=[labfbo.core.messages.Array.of(np.zeros((3, 2)))], y=[labfbo.core.messages.Array.of(np.zeros(2))])


def test_the_multitask_gp_transfers_from_a_related_site_and_rescales_its_values() -> None:
    rng = np.random.default_rng(0)
    f = lambda X: np.sin(6 * X[:, 0]) + X[:, 1]  # noqa: E731
    X_own = rng.uniform(size=(5, 2))
    X_other = rng.uniform(size=(30, 2))
    other = 100.0 + 10.0 * f(X_other)                # the same shape at another level and scale
    test = rng.uniform(size=(200, 2))
    pooled, _ = predict(fit_multitask(X_own, f(X_own), [(X_other, other)], seed=0), test)
    alone, _ = predict(fit_local_gp(X_own, f(X_own), seed=0), test)
    truth = f(test)
    assert np.corrcoef(pooled, truth)[0, 1] > 0.9 > np.corrcoef(alone, truth)[0, 1]
    r = rescaled(other, f(X_own))
    assert np.isclose(r.mean(), f(X_own).mean()) and np.isclose(r.std(), f(X_own).std())


def test_the_same_seed_gives_the_same_model() -> None:
    rng = np.random.default_rng(1)
    X, Xo = rng.uniform(size=(4, 2)), rng.uniform(size=(6, 2))
    test = rng.uniform(size=(20, 2))
    a = predict(fit_multitask(X, X.sum(1), [(Xo, Xo.sum(1))], seed=3), test)[0]
    b = predict(fit_multitask(X, X.sum(1), [(Xo, Xo.sum(1))], seed=3), test)[0]
    assert np.array_equal(a, b)                    # the index kernel's random start is seeded too
