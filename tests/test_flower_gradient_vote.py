"""The Flower transport gives the same proposals as in-process for `gradient` (many exchanges a
round) and `vote` (sealed votes): a deployment of its own, beside test_flower.py's."""

from __future__ import annotations

import pytest

flwr = pytest.importorskip("flwr")

from flower_fixtures import check_same_proposals, deployment  # noqa: E402,F401 - the module's deployment fixture

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("protocol", ["gradient", "vote"])
def test_flower_gives_the_same_proposals_as_local(deployment, protocol: str) -> None:  # noqa: F811 - the fixture
    check_same_proposals(deployment, protocol)
