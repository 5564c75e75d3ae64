"""A Flower deployment for a test module: a real SuperLink and three SuperNodes on 127.0.0.1,
with TLS (certificates made by ``cryptography``) and SuperNode authentication on."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import labfbo
from labfbo.transport.flower_deploy import LocalFlowerDeployment

FAST = {"num_restarts": 2, "raw_samples": 32}
EXTRA = {
    "distribution": {"M": 64, "candidates": 128},
    "gradient": {"n_particles": 4, "hidden": [8, 8], "warmup_steps": 2, "svgd_steps": 2},
    "consensus": {},
    "vote": {"privacy": labfbo.DP(epsilon=2.0)},
}  # vote: sealed, a randomized response


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFlowerDeployment]:
    with LocalFlowerDeployment(3, tmp_path_factory.mktemp("flower"), tls=True, auth=True) as fl:
        yield fl


def logs(fl: LocalFlowerDeployment, name: str) -> str:
    """The text of one of the deployment's log files (``superlink.log``, ``supernode-<site>.log``)."""
    return (fl.workdir / name).read_text(errors="replace")


def check_same_proposals(fl: LocalFlowerDeployment, protocol: str) -> None:
    """A small ``protocol`` campaign over Flower proposes and sends exactly what it does in-process,
    with TLS and SuperNode authentication on."""
    kw = dict(problem="branin", protocol=protocol, n_sites=3, n_init=3, budget=2, seed=4, **FAST, **EXTRA[protocol])
    flower = labfbo.simulate(transport="flower", flower_deployment=fl, **kw)
    local = labfbo.simulate(**kw)
    np.testing.assert_array_equal(flower.proposals, local.proposals)
    np.testing.assert_array_equal(flower.bytes_up, local.bytes_up)
    link = logs(fl, "superlink.log")
    assert "HTTPS" in link or "insecure" not in link.lower()  # TLS on
    assert "authentication is disabled" not in link  # SuperNode authentication on
    for site in fl.sites:
        assert "Starting Flower SuperNode" in logs(fl, f"supernode-{site.name}.log")
