"""Protocols as configured objects (an instance of the protocol class): the same campaign as the
name-plus-keywords shorthand; what the core asks of a protocol, declared on it."""

from __future__ import annotations

import pytest
from campaign import run_campaign

import labfbo
from labfbo.protocols import (
    Centralized,
    Distribution,
    Gradient,
    Independent,
    Surface,
    Vote,
    configure,
    get_protocol,
    resolve,
)

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])
FAST = {"num_restarts": 2, "raw_samples": 32}


def _f(i: int, p: dict) -> float:
    return (p["x"] - 0.3 - 0.1 * i) ** 2 + (p["y"] - 0.6) ** 2


def _run(protocol, **kw) -> list:
    name = protocol if isinstance(protocol, str) else protocol.name
    coord = labfbo.Coordinator(protocol, sites=["a", "b"], seed=3, horizon=2, **kw)
    sites = [labfbo.Optimizer(SPACE, protocol=protocol, coordinator=coord, site=s, seed=3, n_init=3, **kw)
             for s in ("a", "b")]
    assert all(s.protocol == name for s in sites) and coord.protocol == name
    return run_campaign(sites, _f, 3, 2)


def test_a_configured_protocol_is_the_shorthand() -> None:
    opts = {**FAST, "M": 64, "candidates": 128}
    assert _run(Distribution(**opts)) == _run("distribution", **opts)


def test_options_live_on_the_object() -> None:
    g = Gradient(n_particles=4, hidden=(8, 8), privacy=labfbo.DP(noise_multiplier=2.0))
    assert g.options.n_particles == 4 and g.options.pacoh().hidden == (8, 8) and g.options.privacy.noise_multiplier == 2
    assert repr(g).startswith("Gradient(n_particles=4") and g == Gradient(n_particles=4, hidden=(8, 8),
                                                                           privacy=labfbo.DP(noise_multiplier=2.0))
    assert Independent() != Surface()
    opt = labfbo.Optimizer(SPACE, protocol=Independent(acquisition="ucb", **FAST))
    assert opt.options.acquisition == "ucb" and opt.protocol == "independent"


def test_options_are_given_once_and_checked_when_the_object_is_made() -> None:
    with pytest.raises(labfbo.ConfigurationError, match="set on the object"):
        labfbo.Optimizer(SPACE, protocol=Independent(**FAST), acquisition="ei")
    with pytest.raises(labfbo.ConfigurationError, match="invalid options for protocol 'gradient'.*n_particles"):
        Gradient(n_particles=0)
    with pytest.raises(labfbo.ConfigurationError, match="a name or a configured protocol"):
        labfbo.Optimizer(SPACE, protocol=Gradient)  # the class, not an object


def test_simulate_takes_a_configured_protocol() -> None:
    kw = dict(problem="branin", n_sites=2, n_init=3, budget=1, seed=1)
    a = labfbo.simulate(protocol=Surface(**FAST), **kw)
    b = labfbo.simulate(protocol="surface", **FAST, **kw)
    assert (a.proposals == b.proposals).all()
    with pytest.raises(labfbo.ConfigurationError, match="set on the object"):
        labfbo.simulate(protocol=Surface(), acquisition="ei", **kw)


def test_the_configured_object_is_an_instance_of_its_protocol_class() -> None:
    v = Vote(privacy=labfbo.DP(epsilon=1.0))
    assert isinstance(v, get_protocol("vote")) and v.name == "vote" and v.federated and v.aggregator is not None
    assert configure("vote", {"privacy": labfbo.DP(epsilon=1.0)}) == v and configure(v) is v
    assert resolve(v, {}) == resolve("vote", {"privacy": labfbo.DP(epsilon=1.0)}) == ("vote", v.options)
    assert repr(Vote(sealed=False)) == "Vote(sealed=False)" and len({Vote(), Vote(), Vote(sealed=False)}) == 2
    with pytest.raises(labfbo.ConfigurationError, match="set on the object"):
        configure(v, {"sealed": False})
    with pytest.raises(labfbo.ConfigurationError, match=r"call it: labfbo.protocols.Vote\(...\)"):
        configure(Vote, {})
    with pytest.raises(labfbo.ConfigurationError, match="unknown option 'seald'; did you mean 'sealed'"):
        Vote(seald=False)


def test_what_the_core_asks_of_a_protocol_is_declared_on_it() -> None:
    dp = labfbo.DP(noise_multiplier=1.0)
    g = Gradient(secure_aggregation=True, dp_noise="distributed", dp_colluders=1, privacy=dp)
    assert g.privacy == dp and g.dp_colluders == 1 and g.distributed_noise and g.acquisition == "ei"
    s = Surface(fourier_features=8)
    assert s.privacy is None and s.dp_colluders == 0 and not s.distributed_noise
    assert s.shared == {"fourier_features": 8, "fourier_lengthscale": 0.2}  # multi_objective: left out at its default
    assert Independent(acquisition="ucb").acquisition == "ucb" and not Independent.supports_privacy()
    assert Surface.supports_privacy() and Vote.takes_acquisition()
    assert not Centralized.supports_privacy() and Centralized().privacy is None  # raw data: DP does not apply
    assert Vote.site_logic.uses_study_design and not Surface.site_logic.uses_study_design
    assert Centralized.shares_raw_data and not Centralized.demo and Surface.demo and not Independent.federated


def test_a_privacy_floor_needs_a_protocol_with_a_dp_mechanism() -> None:
    floor = labfbo.PrivacyFloor(epsilon=4.0)
    for protocol in ("independent", "centralized", "pooled"):
        with pytest.raises(labfbo.ConfigurationError, match="no differential privacy mechanism"):
            labfbo.Coordinator(protocol, sites=2, privacy_floor=floor)
    assert labfbo.Coordinator(Surface(), sites=2, privacy_floor=floor).configured == Surface()
