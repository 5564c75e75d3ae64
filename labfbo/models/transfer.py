r"""What a lab's shared information is worth to it: held-out predictive error with and without.

A GP whose prior mean carries what the partners shared (``surface``'s
:math:`m(x) = a + c\,\phi(x)^\top w`) is compared with the same GP on a constant mean, both at
the lab's fitted kernel and noise, by leave-one-out prediction of the lab's own results
(closed form, Rasmussen & Williams §5.4.2): with :math:`K` the training covariance plus
noise, :math:`r = y - m(X)` and :math:`\alpha = K^{-1} r`, the prediction of :math:`y_i` from
the other results misses by :math:`\alpha_i / [K^{-1}]_{ii}`. "Alone" uses the best constant
mean, :math:`a_0 = 1^\top K^{-1} y / 1^\top K^{-1} 1`.

The estimate is **gain** :math:`= 1 - \text{RMSE}_\text{shared} / \text{RMSE}_\text{alone}`:
the share of the lab's held-out prediction error the partners' information removes (negative:
it adds error — a partner unlike this lab). Both errors are in the model's standardized
units. With the partners' prediction :math:`s(X)` at the lab's inputs, **agreement** is the
generalized-least-squares coefficient of the lab's results on it under the same covariance,
:math:`\hat c` of :math:`y = a + c\,s(X) + \varepsilon`, :math:`\varepsilon \sim N(0, K)`:
how strongly the partners' surface explains this lab's results, with no prior on it (1: as the
partners see it, 0: not at all, negative: the opposite way). Computed from the lab's data
alone and kept in its journal (the campaign report); sent only if the lab opts in.

The same probability of agreement on any shared signal (:func:`guidance_agreement`) scales how
strongly ``vote`` (its prior's exponent) and, opt-in, ``distribution`` (its guidance strength)
weigh what the partners sent.

**Top rank** (:func:`top_rank`, ``surface``'s opt-in ``trust="top"``, :func:`top_trust`): where the
partners' prediction puts the lab's best result among the lab's own results — what matters to
an optimizer is whether they point to what does best *here*, not how well they fit the rest.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from botorch.models.model import Model

from labfbo.core.records import TransferEstimate

MIN_POINTS = 3  # fewer results predict nothing held out


def held_out_gain(model: Model, scale: float | None = None,
                  shared: torch.Tensor | None = None) -> TransferEstimate | None:
    """The transfer estimate of a fitted single-output exact GP whose mean module carries the
    shared information, ``shared`` the partners' prediction at its training inputs (for the
    agreement; None: not estimated) — None: too few results, or not such a model."""
    fitted = _inverse_covariance(model)
    if fitted is None:
        return None
    X, y, Kinv = fitted
    with torch.no_grad():
        d = Kinv.diagonal()
        ones = torch.ones_like(y)
        a0 = (ones @ Kinv @ y) / (ones @ Kinv @ ones)
        with_it = _loo_rmse(Kinv, d, y - model.mean_module(X).reshape(-1))
        alone = _loo_rmse(Kinv, d, y - a0)
        fit = None if shared is None else _gls_slope(Kinv, y, shared.reshape(-1).to(y))
    if not (alone > 0):
        return None
    return TransferEstimate(n=len(y), alone=alone, shared=with_it, gain=1.0 - with_it / alone,
                            scale=None if scale is None else float(scale), agreement=None if fit is None else fit[0],
                            agreement_se=None if fit is None else fit[1])


def guidance_agreement(model: Model, shared: torch.Tensor) -> float:
    r""":math:`P = \Phi(\hat c / \mathrm{se}(\hat c))` of a lab's results on any shared signal at its
    training inputs (``shared``: e.g. ``distribution``'s guidance field, where the partners believe
    optima lie), under its GP's covariance: about 1 when the lab does better where the partners
    point, about 0 when it does worse, 1/2 while it cannot tell; 1 with too few results or a
    signal constant over them (nothing to judge yet)."""
    fitted = _inverse_covariance(model)
    if fitted is None:
        return 1.0
    _, y, Kinv = fitted
    with torch.no_grad():
        fit = _gls_slope(Kinv, y, shared.reshape(-1).to(y))
    return 1.0 if fit is None or not fit[1] else _probability(*fit)


def _inverse_covariance(model: Model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A fitted single-output exact GP's training inputs, targets and inverse training covariance
    (kernel plus noise); None with fewer than :data:`MIN_POINTS` results or not such a model."""
    X = model.train_inputs[0] if getattr(model, "train_inputs", None) else None
    y = getattr(model, "train_targets", None)
    if X is None or y is None or y.dim() != 1 or len(y) < MIN_POINTS:
        return None
    with torch.no_grad():
        noise = torch.broadcast_to(model.likelihood.noise.reshape(-1), (len(y),))
        K = model.covar_module(X).to_dense() + torch.diag(noise)
        L, info = torch.linalg.cholesky_ex(K)
        if int(info) != 0:
            return None
        return X, y, torch.cholesky_inverse(L)


def _gls_slope(Kinv: torch.Tensor, y: torch.Tensor, s: torch.Tensor) -> tuple[float, float] | None:
    r""":math:`\hat c` of :math:`y = a + c s` by generalized least squares under :math:`K`, and its
    standard error (None: ``s`` constant)."""
    A = torch.stack([torch.ones_like(s), s], dim=1)
    M = A.T @ Kinv @ A
    if float(torch.linalg.det(M)) <= 1e-12 * float(M.diagonal().prod()):
        return None
    beta = torch.linalg.solve(M, A.T @ Kinv @ y)
    return float(beta[1]), float(torch.linalg.inv(M)[1, 1].clamp_min(0.0).sqrt())


def _loo_rmse(Kinv: torch.Tensor, d: torch.Tensor, r: torch.Tensor) -> float:
    return float(((Kinv @ r) / d).pow(2).mean().sqrt())


def top_rank(shared: np.ndarray, y: np.ndarray) -> float | None:
    """Where the partners' prediction ``shared`` puts the lab's best result among the lab's results
    ``y`` (maximization): the share of its other results it ranks below the best, ties counting
    half (1: the partners point to what did best here; 0: they rank it last). None with fewer
    than :data:`MIN_POINTS` results."""
    s, y = np.asarray(shared, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if len(y) < MIN_POINTS or len(s) != len(y):
        return None
    b = int(np.argmax(y))
    others = np.delete(s, b)
    return float((np.sum(others < s[b]) + 0.5 * np.sum(others == s[b])) / len(others))


def top_trust(shared: np.ndarray, y: np.ndarray) -> float:
    r"""``surface``'s ``trust="top"``: the share of the agreement scale's prior mean a lab keeps,
    :math:`\min(1, 2q)` with :math:`q` = :func:`top_rank` — full trust while its partners' surface
    ranks the lab's best result in the upper half of its results, falling to 0 as it ranks it
    last (1 with too few results)."""
    q = top_rank(shared, y)
    return 1.0 if q is None else min(1.0, 2.0 * q)


def agreement_probability(estimate: TransferEstimate | None) -> float:
    r""":math:`P = \Phi(\hat c / \mathrm{se}(\hat c))`, the probability that a lab's results go the
    same way as its partners' surface (its GLS agreement :math:`\hat c` under a flat prior): ``surface``'s
    trust (``trust="agreement"``: the agreement scale's prior mean times P) and the weight of its own
    upload (``weigh_upload="agreement"``) — about 1 for a lab like its partners, about 0 for one whose results go the
    opposite way, 1/2 while it cannot tell. 1 without an estimate (before its first surface)."""
    if estimate is None or estimate.agreement is None or not estimate.agreement_se:
        return 1.0
    return _probability(estimate.agreement, estimate.agreement_se)


def _probability(c: float, se: float) -> float:
    return float(0.5 * math.erfc(-c / (se * math.sqrt(2.0))))
