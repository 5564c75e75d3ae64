r"""Protocol ``centralized``: PACOH-BO with every site's data in one place (a baseline).

The paper's "ideal" reference. **Not private**: each round every site sends its raw
observations (unit-cube inputs and values) to the coordinator, which then runs exactly
the meta-learning of :mod:`labfbo.protocols.gradient.protocol` itself — the score still summed
task by task (each site's data one task), in the same site order and with the same
:func:`~labfbo.protocols.gradient.protocol.meta_step` — so ``centralized`` and ``gradient`` produce
the same particles up to floating-point round-off. Sites propose exactly as under
``gradient``. Use it to measure what federation costs, never with real partners.
"""

from __future__ import annotations

from typing import Literal, Mapping

from pydantic import model_validator

from labfbo.core.messages import Abstain, Array, Message, register
from labfbo.models.pacoh import site_score
from labfbo.protocols.base import Exchange, Protocol, SiteData, Step
from labfbo.protocols.gradient.protocol import Gradient, GradientAggregator, GradientOptions, GradientSite, meta_step


@register
class DataRequest(Message):
    """Coordinator -> site: send your observations (centralized baseline only)."""

    kind: Literal["data_request"] = "data_request"


@register
class RawData(Message):
    """Site -> coordinator: the site's raw observations (unit cube; maximization orientation)."""

    kind: Literal["raw_data"] = "raw_data"
    X: Array
    y: Array


class CentralizedOptions(GradientOptions):
    @model_validator(mode="after")
    def _no_dp(self) -> "CentralizedOptions":
        if self.privacy is not None:
            raise ValueError("the centralized baseline shares raw data; differential privacy does not apply")
        return self


class CentralizedSite(GradientSite):
    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if not isinstance(request, DataRequest):
            return super().answer(request, data, round)
        if data.n == 0:
            return Abstain(reason="no observations yet")
        return RawData(X=Array.of(data.X), y=Array.of(data.y))


class CentralizedAggregator(GradientAggregator):
    def open_round(self, t: int) -> Step:
        return Exchange({s: DataRequest() for s in self.sites})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        tasks = [(self.features.numpy(responses[s].X.numpy()), responses[s].y.numpy())  # type: ignore[attr-defined]
                 for s in self.sites if isinstance(responses.get(s), RawData)]
        if tasks:
            for _ in range(self.steps_in_round()):
                scores = [site_score(self.particles, X, y, self.cfg) for X, y in tasks]
                self.particles, self.adam = meta_step(self.particles, scores, [len(y) for _, y in tasks], self.cfg,
                                                      self.adam)
            self.trained = True
        return self._finish()


class Centralized(Protocol):
    """Reference, not private: PACOH meta-learning on every site's raw data."""

    name = "centralized"
    quick_options = {"n_particles": 4, "hidden": [8, 8], "warmup_steps": 3, "svgd_steps": 2}
    federated = True
    demo = False  # not a privacy-preserving protocol: not in `labfbo bench demo-suite`
    shares_raw_data = True
    shared_options = Gradient.shared_options
    dp_colluders = Gradient.dp_colluders  # its options are gradient's
    distributed_noise = Gradient.distributed_noise
    Options = CentralizedOptions
    site_logic = CentralizedSite
    aggregator = CentralizedAggregator

    @classmethod
    def supports_privacy(cls) -> bool:
        """No: it shares raw data (its options refuse ``privacy``, a field it has from gradient's)."""
        return False
