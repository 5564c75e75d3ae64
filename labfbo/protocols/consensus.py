r"""Protocol ``consensus``: PMCBO / CBOC — sites average their proposals through W.

Round :math:`t`: every site :math:`l` proposes :math:`x_l^t` by maximizing its local
(optionally prior-weighted) acquisition; the coordinator returns each site its
consensus point (PMCBO Eq. 9)

.. math:: x_l^{t,\mathrm{cons}} = [(W^t \otimes I_d) X^t]_l = \sum_m W^t_{lm} x_m^t,

which the site evaluates. Consensus matrices (:func:`uniform_schedule`,
:func:`leader_matrix`):

* ``matrix="uniform"`` (CBOC-U / PMCBO Eq. 10): :math:`W^t = W^0 + \min(t, T)\,\Delta`,
  :math:`W^0 = \tfrac1L 11^\top`, :math:`\Delta = \tfrac{1}{TL}(L I - 11^\top)`; it is
  the identity at :math:`t = T` (the horizon).
* ``matrix="leader"`` (CBOC-L / PMCBO §4.3): the leader :math:`l^*` is the site with the
  largest *standardized improvement* :math:`(y_{\mathrm{last}} - \max y_{\mathrm{prev}}) /
  \mathrm{sd}(y)` (a deviation: the paper compares raw :math:`y`, which would leave the
  site). :math:`W_2 = W_1^t` plus :math:`\tfrac{L-1}{TL}` on the leader's off-diagonal row
  and column, :math:`-\tfrac{1}{TL}` on the other off-leader block, and
  :math:`-\tfrac{(L-1)^2}{TL}` on the leader's diagonal. As written that diagonal is
  negative whenever :math:`T < (L-1)^2`; we clamp negative entries to 0 and restore
  double stochasticity by Sinkhorn scaling (the matrix stays symmetric).

Sites that do not answer in a round are left out: W is restricted to the contributors
and re-normalized. Integer, discrete and stepped columns are averaged and snapped to their
grid. Categorical parameters are refused (:meth:`Consensus.check_space`): a vote
over choices made labs run their partners' reagents, which on real reaction data with
dissimilar partners ended far worse than optimizing alone. Consensus points stay in the
box (a convex combination of box points; clipped for round-off).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal, Mapping

import numpy as np
from pydantic import Field

from labfbo.core.exceptions import ConfigurationError, Inadmissible, ProtocolError
from labfbo.core.messages import Abstain, Array, Message, register
from labfbo.models.acquisition import tried_points
from labfbo.protocols.base import Aggregator, Exchange, Finish, Protocol, SiteData, Step
from labfbo.protocols.independent import LocalGPSite, ModelOptions
from labfbo.space.search import SearchSpace


@register
class ConsensusRequest(Message):
    """Coordinator -> site: propose your next point(s)."""

    kind: Literal["consensus_request"] = "consensus_request"


@register
class ConsensusProposal(Message):
    """Site -> coordinator: proposed unit-cube points and (leader rule) a standardized improvement."""

    kind: Literal["consensus_proposal"] = "consensus_proposal"
    points: Array
    improvement: float | None = None


@register
class ConsensusReply(Message):
    """Coordinator -> site: its consensus points and its row of W."""

    kind: Literal["consensus_reply"] = "consensus_reply"
    points: Array
    weights: list[float]


class ConsensusOptions(ModelOptions):
    # qLogNEI, not the engine's LogEI: with the consensus points as a prior, LogEI ended Wing Weight at
    # 4.2e-3 against 1.8e-7 (5 sites, T = 30, 3 seeds; docs/protocols/consensus.md)
    acquisition: Literal["nei", "ucb", "ei"] = "nei"  # type: ignore[assignment]
    matrix: Literal["uniform", "leader"] = "uniform"
    sinkhorn_iters: int = Field(200, ge=1)


# -- consensus matrices ----------------------------------------------------------------
def uniform_schedule(L: int, T: int, t: int) -> np.ndarray:
    """:math:`W^t = W^0 + \\min(t, T)\\Delta`: uniform at 0, identity at ``T``."""
    if L < 1 or T < 1:
        raise ConfigurationError("the consensus schedule needs L >= 1 sites and a horizon T >= 1")
    s = min(max(t, 0), T) / T
    return (1.0 - s) * np.full((L, L), 1.0 / L) + s * np.eye(L)


def sinkhorn(W: np.ndarray, iters: int = 200, tol: float = 1e-12) -> np.ndarray:
    """Scale a non-negative matrix to doubly stochastic (symmetric input stays symmetric)."""
    W = np.clip(W, 0.0, None)
    W = W + np.eye(len(W)) * (W.sum(1) == 0)[:, None]  # an all-zero row keeps its own point
    for _ in range(iters):
        W = W / W.sum(1, keepdims=True)
        W = W / W.sum(0, keepdims=True)
        if np.abs(W.sum(1) - 1).max() < tol:
            break
    return 0.5 * (W + W.T) if np.allclose(W, W.T, atol=1e-9) else W


def leader_matrix(L: int, T: int, t: int, leader: int, iters: int = 200) -> np.ndarray:
    """The leader-driven matrix of round ``t`` (clamped and Sinkhorn-renormalized)."""
    W = uniform_schedule(L, T, t)
    if L == 1 or t >= T:
        return W
    a, b = (L - 1) / (T * L), 1.0 / (T * L)
    others = [m for m in range(L) if m != leader]
    W2 = W.copy()
    W2[others, leader] += a
    W2[leader, others] += a
    W2[np.ix_(others, others)] -= b
    W2[leader, leader] -= (L - 1) ** 2 / (T * L)
    return sinkhorn(W2, iters)


def combine(space: SearchSpace | None, W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Consensus points ``W @ X`` for ``X (L, d)``, snapped to the space's grids."""
    out = np.clip(W @ X, 0.0, 1.0)
    return space.snap(out) if space is not None else out


# -- the two sides -----------------------------------------------------------------------
class ConsensusSite(LocalGPSite):
    """Answers with its local proposal; evaluates the consensus point it gets back."""

    _n = 1

    def expect(self, n: int) -> None:
        self._n = n

    def answer(self, request: Message, data: SiteData, round: int) -> Message:
        if not isinstance(request, ConsensusRequest):
            return super().answer(request, data, round)
        if data.n == 0:
            return Abstain(reason="no observations yet")
        X = self.propose_local(data, self._n, round)
        improvement = None
        if self.options.matrix == "leader" and data.n >= 2:
            sd = float(np.std(data.y)) or 1.0
            improvement = float((data.y[-1] - data.y[:-1].max()) / sd)
        return ConsensusProposal(points=Array.of(X), improvement=improvement)

    def propose(self, data: SiteData, guidance: Message | None, n: int, round: int) -> np.ndarray:
        self._n = 1
        got = guidance.points.numpy()[:n] if isinstance(guidance, ConsensusReply) else np.zeros((0, self.space.dim))
        if len(got) and not self.space.is_continuous:  # a vote for a combination this site has run: its own pick
            tried = tried_points(data)
            if len(tried):
                got = got[np.abs(got[:, None, :] - tried[None]).max(-1).min(1) > 1e-9]
        if len(got) == n:
            return got
        extra = replace(data, pending=np.vstack([data.pending, got]) if len(got) else data.pending)
        return np.vstack([got, self.propose_local(extra, n - len(got), round)]) if len(got) else \
            self.propose_local(extra, n, round)


MAX_POINTS = 64  #: proposals per site and round (``ask(n)``'s limit)
IMPROVEMENT_BOUND = 3.0
"""The largest standardized improvement a site may state for the leader rule (clipped beyond)."""


class ConsensusAggregator(Aggregator):
    def __init__(self, options, sites, seed, horizon, space) -> None:  # type: ignore[no-untyped-def]
        super().__init__(options, sites, seed, horizon, space)
        if not horizon or horizon < 1:
            raise ConfigurationError("protocol 'consensus' needs the planned number of rounds: "
                                     "Coordinator(..., horizon=T) (simulate sets it to budget)")

    def matrix(self, t: int, improvements: Mapping[str, float | None]) -> np.ndarray:
        """W^t over all sites (before restriction to the contributors)."""
        L, T = len(self.sites), int(self.horizon or 1)
        if self.options.matrix == "leader":
            scored = {s: v for s, v in improvements.items() if v is not None}
            if scored:
                leader = self.sites.index(max(sorted(scored), key=lambda s: scored[s]))
                return leader_matrix(L, T, t, leader, self.options.sinkhorn_iters)
        return uniform_schedule(L, T, t)

    def open_round(self, t: int) -> Step:
        return Exchange({s: ConsensusRequest() for s in self.sites})

    def admit(self, site: str, message: Message) -> Message:
        """Proposals of this space's dimension (1 to :data:`MAX_POINTS` of them) in the unit cube; a
        stated improvement clipped to :data:`IMPROVEMENT_BOUND` standard deviations."""
        if not isinstance(message, ConsensusProposal):
            return message
        P = message.points.numpy()
        d = None if self.space is None else self.space.dim
        if P.ndim != 2 or not 1 <= len(P) <= MAX_POINTS or (d is not None and P.shape[1] != d):
            raise Inadmissible(f"{P.shape} proposed points for a {d}-dimensional space")
        if not np.all(np.isfinite(P)) or np.any(P < -1e-9) or np.any(P > 1 + 1e-9):
            raise Inadmissible("proposed points outside the unit cube")
        v = message.improvement
        if v is not None and not math.isfinite(v):
            raise Inadmissible("an improvement that is not a finite number")
        if v is not None and abs(v) > IMPROVEMENT_BOUND:
            return message.model_copy(update={"improvement": math.copysign(IMPROVEMENT_BOUND, v)})
        return message

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        props = {s: m for s, m in responses.items() if isinstance(m, ConsensusProposal)}
        if not props:
            return Finish({})
        W = self.matrix(t, {s: m.improvement for s, m in props.items()})
        idx = [self.sites.index(s) for s in self.sites if s in props]
        names = [s for s in self.sites if s in props]
        Wc = sinkhorn(W[np.ix_(idx, idx)], self.options.sinkhorn_iters) if len(idx) < len(self.sites) else W
        points = {s: props[s].points.numpy() for s in names}
        k_max = max(len(p) for p in points.values())
        out: dict[str, list[np.ndarray]] = {s: [] for s in names}
        used = {s: [0.0] * len(names) for s in names}
        for j in range(k_max):
            have = [i for i, s in enumerate(names) if len(points[s]) > j]
            Wj = Wc[np.ix_(have, have)].copy()
            empty = Wj.sum(1) <= 1e-15            # a clamped site alone in this slot keeps its point
            Wj[empty, :] = 0.0
            Wj[empty, np.nonzero(empty)[0]] = 1.0
            Wj = Wj / Wj.sum(1, keepdims=True)
            if j == 0:
                for r, i in enumerate(have):
                    for c, m in enumerate(have):
                        used[names[i]][m] = float(Wj[r, c])
            X = np.stack([points[names[i]][j] for i in have])
            cons = combine(self.space, Wj, X)
            for r, i in enumerate(have):
                out[names[i]].append(cons[r])
        return Finish({s: ConsensusReply(points=Array.of(np.stack(out[s])), weights=used[s]) for s in names})


class Consensus(Protocol):
    """PMCBO / CBOC: a consensus of proposed points as an expert prior (ordered spaces)."""

    name = "consensus"
    federated = True
    needs_horizon = True
    shared_options = ("matrix",)
    supported_types = frozenset({"real", "integer", "discrete"})
    Options = ConsensusOptions
    site_logic = ConsensusSite
    aggregator = ConsensusAggregator

    @classmethod
    def check_space(cls, space: SearchSpace) -> None:
        if "categorical" in space.kinds():
            names = [p.name for p in space.params if p.type == "categorical"]
            raise ProtocolError(
                f"protocol 'consensus' does not support categorical parameters ({', '.join(names)}): its vote "
                "makes a lab run its partners' choices, which on real reaction data with dissimilar partners "
                "ended far worse than optimizing alone (docs/protocols/consensus.md); use 'distribution' "
                "(recommended for categorical lab spaces) or 'gradient'")
        super().check_space(space)
