"""A Flower deployment for a test module: a real SuperLink and three SuperNodes on 127.0.0.1,
with TLS (certificates made by ``cryptography``) and SuperNode authentication on."""

from __future__ import annotations

from typing import Iterator

import pytest

from labfbo.transport.flower_deploy import LocalFlowerDeployment


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFlowerDeployment]:
    with LocalFlowerDeployment(3, tmp_path_factory.mktemp("flower"), tls=True, auth=True) as fl:
        yield fl


def logs(fl: LocalFlowerDeployment, name: str) -> str:
    """The text of one of the deployment's log files (``superlink.log``, ``supernode-<site>.log``)."""
    return (fl.workdir / name).read_text(errors="replace")
