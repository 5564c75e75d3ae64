"""Protocols as configured objects: the same campaign as the name-plus-keywords shorthand."""

from __future__ import annotations

import pytest

import labfbo
from campaign import run_campaign
from labfbo.protocols import Distribution, Gradient, Independent, Surface

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
