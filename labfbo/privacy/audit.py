r"""The gradient-leakage audit: the coordinator's reconstruction attack on ``gradient`` (PACD-BO §V-A).

An honest-but-curious coordinator holds, for every BO round of a target site, the particles
it broadcast and the site's answers :math:`A_{k}^{(s)} = \nabla_{\phi_k^{(s)}} \ln Z(S, P_\phi)`
for each exchange step :math:`s` (:class:`Intercept`). :func:`reconstruct` recovers dummy data
:math:`(\hat X, \hat y)` by gradient matching (Eq. 11),

.. math::
    \min_{\hat X \in [0,1]^{n \times d},\ \hat y} \sum_{s,k}
    \lVert \mathrm{clip}_C\, \tilde g_k^{(s)}(\hat X, \hat y) - A_k^{(s)} \rVert^2
    \,/\, \sum_{s,k} \lVert A_k^{(s)} \rVert^2,

with scipy's L-BFGS-B (box bounds), ``restarts`` starts and the best by matching loss; each
start first fits :math:`\hat y` with :math:`\hat X` held, then both. ``n`` is
sent in the clear (the meta-weight needs it); ``C`` is in the message when DP is on, so the
attacker clips its dummy gradients too.

**Our stronger first start (not in the paper).** Random starts of Eq. 11 alone recover no
more of the queries than chance on our model (measured: ``docs/privacy.md``). The first start is instead
found by a convex-ish stage: the mean-MLP block of every answer is *linear* in the site's
:math:`\alpha_k = K_y^{-1}(y - m_k)`, :math:`A_k[\mathrm{mean}] = \sum_j \alpha_{kj}
\partial m_{\phi_k}(x_j)/\partial\phi_k` (:func:`~labfbo.models.pacoh.mean_jacobian`), so the
queries are the support of a sparse signed measure seen through known features. Simultaneous
orthogonal matching pursuit over candidate points (a grid in 2-D, a Sobol set otherwise, ``n``
atoms shared by all steps and particles) finds a support; L-BFGS-B then moves the atoms
continuously with the :math:`\alpha` solved by least squares at every evaluation (variable
projection); :math:`\hat y = m_k(\hat X) + K_y \hat\alpha_k` (averaged over particles, then
standardized) starts Eq. 11. The site's ``y`` is standardized by its own mean and std, so
:math:`\hat y` is recovered up to that affine map. The refinement ends on the *coupled*
residual (:func:`_y_residual`): :math:`\alpha_k = K_{y,k}^{-1}(\tilde y - m_k)` for one
:math:`\tilde y` shared by every step and particle, far fewer unknowns than a free
:math:`\alpha` per step and particle, which many wrong ``X`` fit.

**The attacker remembers (not in the paper).** :func:`reconstruct_sequence` is the
coordinator that keeps what it learned: ``n`` tells it how many queries each round added,
so it searches only those, with the earlier ones held (:func:`audit`'s default).

:func:`leakage_metrics` scores a reconstruction: dispersion (mean pairwise distance, Fig. 4)
beside that of as many uniform points in the same box, the Hungarian-matched distance to the
true queries, and the fraction of true queries recovered within ``tol``; all in unit-cube
coordinates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment, minimize
from scipy.spatial.distance import cdist, pdist
from scipy.stats import qmc
from torch import Tensor

from labfbo.core.exceptions import ConfigurationError
from labfbo.models.gp import DTYPE
from labfbo.models.pacoh import (
    PacohConfig,
    _standardize as _site_standardize,  # the site's own rule for y
    mean_block_index,
    mean_block_names,
    mean_jacobian,
    prior_mean_cov,
    site_score,
)

CHANCE_DRAWS = 64
REPAIR_RESIDUAL = 1e-8      # relative coupled residual above which a sequential round repairs

__all__ = ["Intercept", "Reconstruction", "intercepts", "reconstruct", "reconstruct_sequence", "leakage_metrics",
           "uniform_dispersion", "audit"]


@dataclass(frozen=True)
class Intercept:
    """What the coordinator holds on one site for one BO round: per exchange step, the
    broadcast particles ``(K, P)`` and the site's answer ``(K, P)``; the site's data count;
    the DP clip ``C`` if the answers were privatized."""

    round: int
    particles: tuple[Tensor, ...]
    scores: tuple[Tensor, ...]
    n_obs: int
    clip: float | None


@dataclass(frozen=True)
class Reconstruction:
    """The attack's best restart: unit-cube inputs ``X (n, d)``, standardized ``y (n,)``, its
    relative matching loss, which start won (0 = the sparse start), and every start's loss."""

    X: np.ndarray
    y: np.ndarray
    loss: float
    start: int
    losses: tuple[float, ...]


def intercepts(sent: Sequence[Any], received: Sequence[Any]) -> dict[int, Intercept]:
    """The coordinator's view of one site, by round, from the site's sent and received messages
    (``Optimizer.sent_messages()`` / ``received_messages()``, or what a coordinator logged).

    Raises:
        ConfigurationError: no per-site gradient answers (another protocol, or secure
            aggregation, where the coordinator holds only masked vectors: nothing to invert).
    """
    answers = {(m.round, m.step): m for m in sent if getattr(m, "kind", None) == "score"}
    if not answers:
        masked = any(getattr(m, "kind", None) == "masked_score" for m in sent)
        raise ConfigurationError("no per-site gradient answers to attack: " + (
            "they were secure-aggregated (the coordinator holds only masked vectors)" if masked else
            "the audit needs a site of the `gradient` protocol that has answered a round"))
    requests = {(m.round, m.step): m for m in received if getattr(m, "kind", None) == "particles_request"}
    out: dict[int, Intercept] = {}
    for rnd in sorted({r for r, _ in answers}):
        steps = sorted(s for r, s in answers if r == rnd and (r, s) in requests)
        first = answers[(rnd, steps[0])] if steps else None
        if first is None or first.n_obs < 1:
            continue
        out[rnd] = Intercept(rnd, tuple(torch.as_tensor(requests[(rnd, s)].particles.numpy(), dtype=DTYPE)
                                        for s in steps),
                             tuple(torch.as_tensor(answers[(rnd, s)].scores.numpy(), dtype=DTYPE) for s in steps),
                             int(first.n_obs), first.dp_clip)
    return out


# ----------------------------------------------------------------------------- stage 1: sparse start
def _candidates(d: int, size: int, seed: int) -> Tensor:
    """Candidate atoms: a regular grid in 1-D/2-D, a scrambled Sobol set otherwise."""
    if d <= 2:
        side = max(2, round(size ** (1.0 / d)))
        g = (np.arange(side) + 0.5) / side
        pts = np.stack(np.meshgrid(*([g] * d), indexing="ij"), -1).reshape(-1, d)
    else:
        pts = qmc.Sobol(d, scramble=True, seed=seed).random(size)
    return torch.as_tensor(pts, dtype=DTYPE)


def _near(X: np.ndarray, radius: float = 0.015) -> Tensor:
    """Candidates a step of ``radius`` from each point of ``X`` along every axis, in the box."""
    d = X.shape[1]
    steps = np.concatenate([np.eye(d), -np.eye(d)]) * radius
    return torch.as_tensor(np.clip((X[:, None, :] + steps[None]).reshape(-1, d), 0.0, 1.0), dtype=DTYPE)


def _jacobians(particles: Sequence[Tensor], X: Tensor, cfg: PacohConfig) -> Tensor:
    """``(S*K, n, P_mean)``: the mean Jacobians at ``X`` of every step's particles, stacked."""
    return torch.cat([mean_jacobian(P, X, cfg) for P in particles], 0)


def _project(J: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Least-squares ``alpha`` of ``target (S*K, P_mean) ~ sum_j alpha_j J_j`` (normal equations
    with a 1e-10 relative ridge: fast to differentiate) and the residual."""
    gram = J @ J.transpose(-1, -2)
    ridge = 1e-10 * gram.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-300)
    gram = gram + ridge[:, None, None] * torch.eye(J.shape[-2], dtype=J.dtype)
    alpha = torch.linalg.solve(gram, (J @ target.unsqueeze(-1)))[..., 0]
    return alpha, target - (J.transpose(-1, -2) @ alpha.unsqueeze(-1))[..., 0]


def _mean_target(ic: Intercept, cfg: PacohConfig, d: int) -> Tensor:
    """The mean-MLP blocks of every step's answers, stacked ``(S*K, P_mean)``."""
    idx = mean_block_index(cfg, d)
    return torch.cat([A[:, idx] for A in ic.scores], 0)


def _scores(target: Tensor, Jc: Tensor, J_held: Tensor, orthogonal: bool = False) -> Tensor:
    r"""Matching-pursuit score of every candidate atom (columns of ``Jc``) against the residual
    ``r`` of the held atoms: :math:`\sum_{s,k} \langle r, J_c\rangle^2 / \lVert J_c\rVert^2`, or
    (``orthogonal``, optimized OMP) the drop of the squared residual if the atom joined,
    :math:`\sum_{s,k} \langle r, J_c\rangle^2 / \lVert J_c^\perp\rVert^2` with :math:`J_c^\perp`
    its part orthogonal to the held atoms (sharper for one missing atom, unstable for many)."""
    sq = (Jc ** 2).sum(-1)
    residual = _project(J_held, target)[1] if J_held.shape[1] else target
    if orthogonal and J_held.shape[1]:
        B = Jc @ J_held.transpose(-1, -2)
        gram = J_held @ J_held.transpose(-1, -2)
        ridge = 1e-10 * gram.diagonal(dim1=-2, dim2=-1).mean(-1)
        gram = gram + ridge[:, None, None] * torch.eye(gram.shape[-1], dtype=gram.dtype)
        sq = sq - (B * torch.linalg.solve(gram, B.transpose(-1, -2)).transpose(-1, -2)).sum(-1)
    return (((Jc @ residual.unsqueeze(-1))[..., 0]) ** 2 / sq.clamp_min(1e-12 * sq.max())).sum(0)


def _y_residual(ic: Intercept, cfg: PacohConfig, X: Tensor, target: Tensor, with_y: bool = False,
                ridge: float = 1e-10) -> Any:
    r"""Squared mean-block residual at ``X`` with the site's standardized :math:`\tilde y` solved
    by least squares: :math:`A_k[\mathrm{mean}] = J_k^\top K_{y,k}^{-1}(\tilde y - m_k)` is linear
    in one :math:`\tilde y` shared by every step and particle (differentiable in ``X``)."""
    rows, offsets = [], []
    for P in ic.particles:
        m, Ky = prior_mean_cov(P, X, cfg)
        M = torch.cholesky_solve(mean_jacobian(P, X, cfg), torch.linalg.cholesky(Ky)).transpose(-1, -2)
        rows.append(M.reshape(-1, X.shape[0]))
        offsets.append((M @ m.unsqueeze(-1)).reshape(-1))
    M, rhs = torch.cat(rows, 0), target.reshape(-1) + torch.cat(offsets, 0)
    gram = M.T @ M
    gram = gram + ridge * gram.diagonal().mean().clamp_min(1e-300) * torch.eye(gram.shape[0], dtype=DTYPE)
    y = torch.linalg.solve(gram, M.T @ rhs)
    value = ((rhs - M @ y) ** 2).sum()
    return (value, y) if with_y else value


def _vp_refine(ic: Intercept, cfg: PacohConfig, target: Tensor, X_held: np.ndarray, X_free: np.ndarray,
               maxiter: int, coupled: bool = False) -> tuple[np.ndarray, float]:
    """Move the free atoms (L-BFGS-B in the box), the held ones fixed, to minimize the relative
    mean-block residual, solving at every evaluation (variable projection) for a free
    :math:`\alpha` per step and particle, or (``coupled``) for the one :math:`\tilde y` they share
    (:func:`_y_residual`: fewer unknowns, so fewer wrong ``X`` fit). Returns the free atoms and
    the residual."""
    m, d = X_free.shape
    scale = max(float((target ** 2).sum()), 1e-300)
    held = torch.as_tensor(X_held, dtype=DTYPE).reshape(-1, d)
    J_held = None if coupled else _jacobians(ic.particles, held, cfg)

    def loss(z: np.ndarray) -> tuple[float, np.ndarray]:
        X = torch.as_tensor(z, dtype=DTYPE).reshape(m, d).requires_grad_(True)
        if coupled:
            value = _y_residual(ic, cfg, torch.cat([held, X], 0), target) / scale
        else:
            J = torch.cat([J_held, _jacobians(ic.particles, X, cfg)], 1)
            value = (_project(J, target)[1] ** 2).sum() / scale
        value.backward()
        return float(value.detach()), X.grad.numpy().ravel()

    out = minimize(loss, X_free.ravel(), jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * (m * d),
                   options={"maxiter": maxiter})
    return out.x.reshape(m, d), float(out.fun)


def _sparse_start(ic: Intercept, cfg: PacohConfig, d: int, n_candidates: int, maxiter: int,
                  seed: int, X_known: np.ndarray | None = None, tries: int = 2,
                  repair_above: float = REPAIR_RESIDUAL) -> tuple[np.ndarray, float]:
    """Greedy sparse recovery on the mean blocks, then continuous refinement.

    The points not in ``X_known`` (a previous round's reconstruction, or none) are chosen among
    the candidates one at a time by OMP score, then refined with the known atoms held; a single
    new point (a round of a sequential attack) is refined from each of the ``tries`` best
    candidates by optimized-OMP score (and next to the last query and the incumbent), and the
    lowest residual wins. Candidates are a grid plus points next to
    each known atom: a converging site's new query is often close to an earlier one. Then all
    atoms move together: briefly when they were known, for longer when the new point leaves
    the answers unexplained (relative residual above ``repair_above``: an earlier point is off).
    Returns the points and their relative coupled residual.
    """
    target = _mean_target(ic, cfg, d)
    known = np.zeros((0, d)) if X_known is None else np.asarray(X_known, float)[: ic.n_obs]
    n_new = ic.n_obs - len(known)
    if n_new <= 0 and len(known):       # nothing new this round (a failed trial): just refine
        return _vp_refine(ic, cfg, target, known[:0], known, max(maxiter // 10, 1), coupled=True)
    cand = torch.cat([_candidates(d, n_candidates, seed), _near(known)], 0)
    Jc = _jacobians(ic.particles, cand, cfg)
    J_known = _jacobians(ic.particles, torch.as_tensor(known, dtype=DTYPE), cfg)
    if n_new == 1:
        order = torch.argsort(_scores(target, Jc, J_known, orthogonal=True), descending=True)[:tries].tolist()
        starts = [cand[i: i + 1].numpy() for i in order]
        # a re-query of a known point has no score of its own (its atom is already held): try
        # next to the last query and the incumbent, where a converging site asks again
        prev = known[-1:].copy(), known[_closed_form_y(ic, cfg, known).argmax()][None].copy()
        starts += [np.clip(p + 1e-3, 0.0, 1.0) for p in prev]
    else:
        chosen: list[int] = []
        for _ in range(n_new):
            score = _scores(target, Jc, torch.cat([J_known, Jc[:, chosen, :]], 1))
            score[chosen] = -1.0      # a repeated query becomes its own atom in the refinement
            chosen.append(int(score.argmax()))
        starts = [cand[chosen].numpy()]

    if len(known):      # alpha-free fits cannot tell a new point apart; the coupled fit can
        new, residual = min((_vp_refine(ic, cfg, target, known, X0, max(maxiter // 5, 1), coupled=True)
                             for X0 in starts), key=lambda r: r[1])
        polish = maxiter if residual > repair_above else max(maxiter // 10, 1)
        return _vp_refine(ic, cfg, target, known[:0], np.concatenate([known, new]), polish, coupled=True)
    X = _vp_refine(ic, cfg, target, known, starts[0], maxiter)[0]
    return _vp_refine(ic, cfg, target, known, X, maxiter, coupled=True)


def _closed_form_y(ic: Intercept, cfg: PacohConfig, X: np.ndarray) -> np.ndarray:
    r""":math:`\hat y = m_k(X) + K_{y,k}\hat\alpha_k`, averaged over steps and particles, standardized."""
    Xt = torch.as_tensor(X, dtype=DTYPE)
    idx = mean_block_index(cfg, X.shape[1])
    ys = []
    for P, A in zip(ic.particles, ic.scores):
        alpha = _project(mean_jacobian(P, Xt, cfg), A[:, idx])[0]
        m, Ky = prior_mean_cov(P, Xt, cfg)
        ys.append(m + (Ky @ alpha.unsqueeze(-1))[..., 0])
    return _standardized(torch.cat(ys, 0).mean(0))


def _standardized(y: Any) -> np.ndarray:
    """``y`` as the site standardizes its own (:func:`labfbo.models.pacoh._standardize`)."""
    return _site_standardize(torch.as_tensor(y, dtype=DTYPE).detach())[0].numpy()


# ----------------------------------------------------------------------------- stage 2: Eq. 11
def _matching_loss(ic: Intercept, cfg: PacohConfig, d: int):
    scale = max(sum(float((A ** 2).sum()) for A in ic.scores), 1e-300)
    n = ic.n_obs

    def loss(z: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.as_tensor(z, dtype=DTYPE).requires_grad_(True)
        X, v = t[: n * d].reshape(n, d), t[n * d:]
        # standardize here, differentiably (the site's own standardization is constant to autograd)
        y = (v - v.mean()) / v.std().clamp_min(1e-12) if n > 1 else v
        total = torch.zeros((), dtype=DTYPE)
        for P, A in zip(ic.particles, ic.scores):
            G = site_score(P, X, y, cfg)
            if ic.clip is not None:
                G = G * torch.clamp(ic.clip / torch.linalg.norm(G, dim=1, keepdim=True).clamp_min(1e-300), max=1.0)
            total = total + ((G - A) ** 2).sum()
        value = total / scale
        value.backward()
        return float(value.detach()), t.grad.numpy()

    return loss


def reconstruct(ic: Intercept, cfg: PacohConfig, d: int, *, restarts: int = 5, steps: int = 5,
                candidates: int = 1024, maxiter: int = 100, seed: int = 0,
                sparse_start: bool = True, X_known: np.ndarray | None = None) -> Reconstruction:
    """Invert one round's intercepted answers (Eq. 11 with ``restarts`` starts; start 0 is the
    sparse start when the mean is an MLP, the others uniform ``X`` and standard normal ``y``).

    Args:
        ic: the round's intercept; its first ``steps`` exchanges are used.
        cfg: the protocol's PACOH settings (public: the coordinator runs SVGD with them).
        d: input dimension.
        restarts: number of starts (>= 1); the best by matching loss wins.
        candidates: candidate atoms of the sparse start.
        maxiter: L-BFGS-B iterations per start (and of the sparse refinement).
        seed: the random starts' generator.
        sparse_start: False: the paper's attack, random starts only.
        X_known: the attacker's reconstruction of an earlier round of the same site (rows =
            its first queries): the sparse start then searches only the new points.
    """
    if restarts < 1 or steps < 1:
        raise ConfigurationError(f"restarts and steps must be >= 1, got {restarts} and {steps}")
    ic = Intercept(ic.round, ic.particles[:steps], ic.scores[:steps], ic.n_obs, ic.clip)
    n, rng = ic.n_obs, np.random.default_rng(seed)
    loss = _matching_loss(ic, cfg, d)
    starts: list[np.ndarray] = []
    if sparse_start and mean_block_names(cfg, d):
        X0 = _sparse_start(ic, cfg, d, candidates, maxiter, seed, X_known)[0]
        starts.append(np.concatenate([X0.ravel(), _closed_form_y(ic, cfg, X0)]))
    while len(starts) < restarts:
        starts.append(np.concatenate([rng.random(n * d), rng.standard_normal(n)]))
    best, losses = None, []
    for z0 in starts:
        # y alone first (X held): a y far off makes the joint problem badly scaled
        X0 = z0[: n * d]
        y_only = minimize(lambda v: (lambda r: (r[0], r[1][n * d:]))(loss(np.concatenate([X0, v]))), z0[n * d:],  # noqa: B023 - called within this iteration
                          jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
        out = minimize(loss, np.concatenate([X0, y_only.x]), jac=True, method="L-BFGS-B",
                       bounds=[(0.0, 1.0)] * (n * d) + [(None, None)] * n, options={"maxiter": maxiter})
        losses.append(float(out.fun))
        if best is None or out.fun < best[1].fun:
            best = (len(losses) - 1, out)
    start, out = best
    return Reconstruction(out.x[: n * d].reshape(n, d), _standardized(out.x[n * d:]), float(out.fun), start,
                          tuple(losses))


def reconstruct_sequence(ics: Sequence[Intercept], cfg: PacohConfig, d: int, wanted: Sequence[int], *,
                         steps: int = 5, candidates: int = 1024, maxiter: int = 100, seed: int = 0,
                         track_steps: int = 2, **attack: Any) -> dict[int, Reconstruction]:
    """The stateful coordinator's attack: it has seen every round, so it carries its
    reconstruction forward and searches only each round's new queries (``n`` is sent in clear).

    Every round of ``ics`` (in order) adds its new points to the running reconstruction by
    OMP and refines them with the coupled residual; at the rounds in ``wanted`` all ``steps``
    exchanges are used, and the reconstruction is reported with the ``y`` solved with it (the
    coupled least squares, standardized) and its Eq. 11 loss. It is not polished by Eq. 11: trading ``X`` against ``y``
    there moved correct
    points away (measured), and the attacker's own criterion, the coupled residual, is
    already near zero when the points are right. ``attack`` (other :func:`reconstruct`
    options such as ``restarts``) is accepted and unused. A round with fewer points than the
    last starts over. Between audited rounds only the first ``track_steps`` exchanges are
    matched when the round adds at most one point (enough to place it, and 2.5x cheaper
    than 5); the initial design, or a batch, gets all ``steps``. Returns
    ``{round: Reconstruction}``.
    """
    if steps < 1 or track_steps < 1:
        raise ConfigurationError(f"steps and track_steps must be >= 1, got {steps} and {track_steps}")
    wanted, out = set(int(r) for r in wanted), {}
    X: np.ndarray | None = None
    last = 0.0                  # the previous round's residual: under DP it never gets small
    for ic in sorted(ics, key=lambda i: i.round):
        ic = Intercept(ic.round, ic.particles[:steps], ic.scores[:steps], ic.n_obs, ic.clip)
        known = X if X is not None and len(X) <= ic.n_obs else None
        if ic.round in wanted or known is None or len(known) < ic.n_obs:
            one_new = known is not None and ic.n_obs - len(known) <= 1
            used = ic if ic.round in wanted or not one_new else \
                Intercept(ic.round, ic.particles[:track_steps], ic.scores[:track_steps], ic.n_obs, ic.clip)
            X, last = _sparse_start(used, cfg, d, candidates, maxiter, seed, known,
                                    repair_above=max(REPAIR_RESIDUAL, 100.0 * last))
        if ic.round in wanted:     # the site's standardized y, solved jointly (see _y_residual)
            # a small ridge: 1e-4 biased y at the true X (measured: max error 0.56 standardized, 0.0 at 1e-8)
            y = _standardized(_y_residual(ic, cfg, torch.as_tensor(X, dtype=DTYPE), _mean_target(ic, cfg, d),
                                          True, 1e-8)[1])
            loss = float(_matching_loss(ic, cfg, d)(np.concatenate([X.ravel(), y]))[0])
            out[ic.round] = Reconstruction(X, y, loss, 0, (loss,))
        if len(out) == len(wanted):
            break
    return out


# ----------------------------------------------------------------------------- metrics
def uniform_dispersion(n: int, d: int, draws: int = 64, seed: int = 0) -> float:
    """Mean pairwise distance of ``n`` uniform points in the unit cube (mean over ``draws``)."""
    if n < 2:
        return math.nan
    rng = np.random.default_rng(seed)
    return float(np.mean([pdist(rng.random((n, d))).mean() for _ in range(draws)]))


def _matched_distances(X_hat: np.ndarray, X_true: np.ndarray) -> np.ndarray:
    """Distances of the Hungarian (minimum total distance) matching of the two point sets."""
    D = cdist(X_hat, X_true)
    return D[linear_sum_assignment(D)]


def leakage_metrics(X_hat: np.ndarray, X_true: np.ndarray, tol: float = 0.05, y_hat: np.ndarray | None = None,
                    y_true: np.ndarray | None = None, optimum: np.ndarray | None = None) -> dict[str, float]:
    """Dispersion of the reconstruction, of the true queries and of uniform points; the
    Hungarian-matched mean distance; the fraction of true queries recovered within ``tol``, and
    what ``n`` uniform random points recover (``recovered_chance``, mean of 8 draws).

    With ``y_hat`` and ``y_true`` (maximization orientation) also the exploitation metrics: the
    distance from the site's best query to the nearest recovered point (``incumbent_nearest``)
    and to the attacker's guess of it, the recovered point with the best ``y_hat``
    (``incumbent_guess``), and a uniform random guess's mean distance to it (``incumbent_guess_chance``).
    With ``optimum`` too (the site's optimized setting, e.g. its final best query): the distance
    from the attacker's guess to it (``optimum_guess``) and a random guess's (``optimum_guess_chance``).
    """
    X_hat, X_true = np.asarray(X_hat, float), np.asarray(X_true, float)
    matched = _matched_distances(X_hat, X_true)
    n, d = X_true.shape
    out = {"n": float(n),
           "dispersion": float(pdist(X_hat).mean()) if len(X_hat) > 1 else math.nan,
           "dispersion_true": float(pdist(X_true).mean()) if n > 1 else math.nan,
           "dispersion_uniform": uniform_dispersion(n, d),
           "matched_distance": float(matched.mean()),
           "recovered": float((matched <= tol).mean())}
    chance = np.random.default_rng(0).random((CHANCE_DRAWS, n, d))
    out["recovered_chance"] = float(np.mean([(_matched_distances(u, X_true) <= tol).mean() for u in chance[:8]]))
    if y_hat is not None and y_true is not None:
        best = X_true[int(np.argmax(y_true))]
        out["incumbent_nearest"] = float(np.linalg.norm(X_hat - best, axis=1).min())
        out["incumbent_guess"] = float(np.linalg.norm(X_hat[int(np.argmax(y_hat))] - best))
        out["incumbent_guess_chance"] = float(np.linalg.norm(chance.reshape(-1, d) - best, axis=1).mean())
        if optimum is not None:
            target = np.asarray(optimum, float)
            out["optimum_guess"] = float(np.linalg.norm(X_hat[int(np.argmax(y_hat))] - target))
            out["optimum_guess_chance"] = float(np.linalg.norm(chance.reshape(-1, d) - target, axis=1).mean())
    return out


def audit(opt: Any, iterations: Sequence[int] | None = None, *, tol: float = 0.05, sequential: bool = True,
          **attack: Any) -> list[dict[str, Any]]:
    """Run the coordinator's attack on what ``opt`` (a ``gradient`` site) has sent, and score it
    against the site's own data: one row per audited BO iteration (1-based; default: all).

    ``sequential``: the stateful attack (:func:`reconstruct_sequence`) over every round up to
    the last audited one; otherwise each audited round is attacked alone. ``attack`` goes to
    :func:`reconstruct`. Rows hold the iteration, round, the :func:`leakage_metrics` (the
    site's final best query is its optimum), the matching loss and the reconstruction.
    """
    if opt.protocol not in ("gradient", "centralized"):  # the sites that send SVGD score gradients
        raise ConfigurationError("the gradient-leakage audit needs a site of the `gradient` protocol")
    ics = intercepts(opt.sent_messages(), opt.received_messages())
    rounds = sorted(ics)
    wanted = range(1, len(rounds) + 1) if iterations is None else iterations
    bad = [t for t in wanted if not 1 <= int(t) <= len(rounds)]
    if bad:
        raise ConfigurationError(f"iterations {bad} out of range: this site answered {len(rounds)} rounds "
                                 f"(iterations are 1-based)")
    from labfbo.models.encoding import FeatureMap

    # the particles read the feature map's inputs (one-hot or descriptor columns for categorical
    # parameters): that is what the coordinator can reconstruct, and what it is scored against
    X_all = FeatureMap(opt.space, one_hot=True).numpy(opt.space.encode([ob.params for ob in opt.observations]))
    sign = -1.0 if opt.objective == "minimize" else 1.0        # the model's maximization orientation
    y_all = sign * np.asarray([ob.value for ob in opt.observations], float)
    cfg, d = opt.options.pacoh(), X_all.shape[1]
    optimum = X_all[int(np.argmax(y_all))]
    targets = [rounds[int(t) - 1] for t in wanted]
    if sequential:
        recs = reconstruct_sequence([ics[r] for r in rounds if r <= max(targets)], cfg, d, targets, **attack)
    else:
        recs = {r: reconstruct(ics[r], cfg, d, **attack) for r in targets}
    rows = []
    for t, r in zip(wanted, targets):
        rec, n = recs[r], ics[r].n_obs
        X_true, y_true = X_all[:n], y_all[:n]
        rows.append({"iteration": int(t), "round": r,
                     **leakage_metrics(rec.X, X_true, tol, rec.y, y_true, optimum=optimum),
                     "loss": rec.loss, "start": rec.start, "X_hat": rec.X.tolist(), "X_true": X_true.tolist(),
                     "y_true": y_true.tolist(), "y_hat": rec.y.tolist(), "dp": ics[r].clip is not None})
    return rows
