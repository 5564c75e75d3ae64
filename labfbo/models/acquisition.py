r"""Building and optimizing acquisition functions (BoTorch), shared by every protocol.

All acquisitions *maximize* a model of the objective in the maximization orientation.

* ``nei`` (the default of every protocol): ``qLogNoisyExpectedImprovement`` with the
  observed points as baseline; chosen on ``labfbo bench engine`` (``docs/benchmarks/engine.md``). The papers'
  acquisitions stay available by name.
* ``ucb``: :math:`\mu(x) + \sqrt{\beta}\,\sigma(x)` (analytic for one point without
  pending trials, ``qUpperConfidenceBound`` otherwise), :math:`\beta = 4`
  (:math:`\kappa = 2`) unless set: PACD-BO's, PMCBO's and GUIDE-FBO's setting.
* ``ei``: ``LogExpectedImprovement`` / ``qLogExpectedImprovement`` with
  :math:`f^* = \max_j \mu(x_j)` over observed points (the noise-robust incumbent).
* ``ts``: Thompson sampling — joint posterior draws on a scrambled Sobol candidate set
  (``MaxPosteriorSampling``); a batch uses one draw per point.

**Escaping a stalled basin** (``stall_rounds``, off by default; on for the meta-learned
protocols, :mod:`labfbo.protocols.gradient.protocol`): from model-based round ``stall_rounds`` on,
once the last ``stall_rounds`` observations have not raised the best value (by more than
0.1 % of the observed range), every other round's proposal maximizes the acquisition with
the incumbent's basin penalized (:class:`ExcludeIncumbent`). A site whose prior or early
data locked it onto a local optimum then samples the best alternative its model sees; the
rounds in between keep refining the incumbent. Thompson sampling is left as it is.

Pending trials enter as ``X_pending`` (the q-acquisitions integrate over them), so a
batch never re-proposes a point that is in flight. Optimization uses ``optimize_acqf``
(continuous spaces), scores every unseen combination of a small fully discrete space
(``optimize_acqf_discrete``), enumerates the discrete part of a mixed space with at most
10 combinations (``optimize_acqf_mixed``) and otherwise alternates
(``optimize_acqf_mixed_alternating``); 10 restarts and 512 raw samples by default, seeded.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Protocol

import numpy as np
import torch
from botorch.acquisition import (
    AcquisitionFunction,
    LogExpectedImprovement,
    UpperConfidenceBound,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.exceptions.warnings import OptimizationWarning
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models.model import Model
from botorch.optim import optimize_acqf, optimize_acqf_discrete, optimize_acqf_mixed
from botorch.optim.initializers import initialize_q_batch
from botorch.optim.optimize_mixed import optimize_acqf_mixed_alternating
from botorch.sampling import SobolQMCNormalSampler
from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import qmc

from labfbo.core.exceptions import SearchSpaceError
from labfbo.models.gp import DTYPE, as_tensor, seeded_torch
from labfbo.space.search import SearchSpace

if TYPE_CHECKING:
    from labfbo.models.priors import LocationPrior

AcquisitionName = Literal["ucb", "ei", "nei", "ts"]
STALL_TOL = 1e-3  # an improvement below this fraction of y's range does not end a stall
LOG_PENALTY = 30.0  # the incumbent's penalty on a log-acquisition, in nats
MAX_ENUMERATE = 4096  # a fully discrete space up to this size is scored exhaustively
MAX_FIXED_COMBOS = 10  # a mixed space with up to this many discrete combinations enumerates them (BoTorch's rule)
POLYTOPE_BURNIN = 200  # hit-and-run burn-in of the raw samples of a linearly constrained space (BoTorch: 10,000)
POLYTOPE_THINNING = 4  # ... and its thinning (BoTorch: 32)


class AcquisitionOptions(BaseModel):
    """Options every model-based protocol understands."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    acquisition: AcquisitionName = Field("ei", description="ei (LogEI, the default, chosen on labfbo bench "
                                         "engine), nei (noisy LogEI), ucb (the papers' setting) or ts")
    beta: float = Field(4.0, gt=0, description="UCB exploration weight (kappa^2)")
    num_restarts: int = Field(10, ge=1)
    raw_samples: int = Field(512, ge=1)
    sample_around_best: bool = Field(False, description="add perturbations of the best observed points to "
                                     "the raw samples that choose the restarts (BoTorch's sample_around_best)")
    mc_samples: int = Field(256, ge=16, description="QMC samples of q-acquisitions")
    ts_candidates: int = Field(2048, ge=16, description="Sobol candidates for Thompson sampling")
    stall_rounds: int | None = Field(None, ge=1, description="once this many observations brought no "
                                     "improvement, every other round's proposal searches outside the "
                                     "incumbent's basin, from round stall_rounds on (None: never)")
    stall_radius: float = Field(0.15, gt=0, description="the excluded basin's length scale per sqrt(dim), "
                                "unit cube")


@dataclass(frozen=True)
class AcquisitionData:
    """What an acquisition needs from the site: observed inputs and pending points."""

    X: np.ndarray        # (n, d) observed, unit cube
    y: np.ndarray        # (n,) maximization orientation
    pending: np.ndarray  # (p, d) in flight
    failed: np.ndarray | None = None  # (f, d) failed trials: a discrete space does not propose them again


def build_acquisition(model: Model, data: AcquisitionData, opts: AcquisitionOptions,
                      q: int, seed: int) -> AcquisitionFunction:
    """The acquisition function named by ``opts.acquisition`` on ``model``."""
    pending = as_tensor(data.pending) if len(data.pending) else None
    analytic = q == 1 and pending is None
    sampler = SobolQMCNormalSampler(torch.Size([opts.mc_samples]), seed=seed % (2**31))
    name = opts.acquisition
    if name == "ucb":
        if analytic:
            return UpperConfidenceBound(model, beta=opts.beta)
        return qUpperConfidenceBound(model, beta=opts.beta, sampler=sampler, X_pending=pending)
    if name == "ei":
        with torch.no_grad():
            best_f = model.posterior(as_tensor(data.X)).mean.max()
        if analytic:
            return LogExpectedImprovement(model, best_f=best_f)
        return qLogExpectedImprovement(model, best_f=best_f, sampler=sampler, X_pending=pending)
    if name == "nei":
        return qLogNoisyExpectedImprovement(model, X_baseline=as_tensor(data.X), sampler=sampler,
                                            X_pending=pending, prune_baseline=True)
    raise ValueError(f"acquisition {name!r} is not optimized by gradient (use thompson_sample)")


def _initial_conditions(acqf: AcquisitionFunction, space: SearchSpace, q: int, seed: int,
                        opts: AcquisitionOptions, extra_raw: np.ndarray) -> torch.Tensor:
    """Restart points chosen (Boltzmann, as BoTorch does) among Sobol q-batches plus
    q-batches of ``extra_raw`` points (e.g. prior samples, which a narrow prior needs)."""
    gen = np.random.default_rng(seed)
    sobol = sobol_candidates(space, opts.raw_samples * q, seed).reshape(opts.raw_samples, q, space.dim)
    extra = extra_raw[gen.integers(0, len(extra_raw), size=(len(extra_raw), q))]
    X = as_tensor(np.concatenate([sobol, extra]))
    with torch.no_grad():
        vals = torch.cat([acqf(chunk) for chunk in X.split(256)])
    ic, _ = initialize_q_batch(X, vals, n=opts.num_restarts)
    return ic


def optimize_acquisition(acqf: AcquisitionFunction, space: SearchSpace, q: int, seed: int,
                         opts: AcquisitionOptions, extra_raw: np.ndarray | None = None,
                         observed: np.ndarray | None = None) -> np.ndarray:
    """Maximize ``acqf`` over the feasible points of ``space``; returns ``(q, d)`` points.

    * continuous: ``optimize_acqf`` (``extra_raw``, ``(m, d)`` unit-cube points such as
      prior samples, join the raw samples that choose the restarts);
    * no continuous column and at most :data:`MAX_ENUMERATE` feasible combinations (the
      allowed ones, if the space restricts them): every combination not in ``observed``
      (observed, pending and failed points) is scored (``optimize_acqf_discrete``);
    * mixed with at most :data:`MAX_FIXED_COMBOS` discrete combinations: one continuous
      optimization per combination (``optimize_acqf_mixed``), the restarts and raw samples
      shared out over them (at least 2 and 64 each); with allowed combinations,
      the :data:`MAX_FIXED_COMBOS` that score best at a Sobol continuous point each;
    * otherwise ``optimize_acqf_mixed_alternating`` (unrestricted spaces only).
    """
    d = space.dim
    bounds = torch.stack([torch.zeros(d, dtype=DTYPE), torch.ones(d, dtype=DTYPE)])
    discrete = {**space.discrete_dims(), **space.cat_dims()}
    ineq, eq = space.linear.botorch() if space.linear is not None else (None, None)
    linear = {"inequality_constraints": ineq, "equality_constraints": eq} if space.linear is not None else {}
    # BoTorch draws the raw samples of a constrained space by hit-and-run, a Python loop of 10,000
    # burn-in steps by default (~1 s a call, once per discrete combination); a shorter chain is
    # plenty for starting points that the optimizer then moves
    chain = {"n_burnin": POLYTOPE_BURNIN, "n_thinning": POLYTOPE_THINNING} if space.linear is not None else {}
    with seeded_torch(seed), warnings.catch_warnings():
        # L-BFGS-B line-search failures on some restarts: BoTorch retries and keeps the best
        warnings.filterwarnings("ignore", category=OptimizationWarning)
        warnings.filterwarnings("ignore", message="Optimization failed", category=RuntimeWarning)
        if space.is_continuous and extra_raw is not None and len(extra_raw):
            ic = _initial_conditions(acqf, space, q, seed, opts, extra_raw)
            X, _ = optimize_acqf(acqf, bounds=bounds, q=q, num_restarts=opts.num_restarts,
                                 batch_initial_conditions=ic, **linear)
        elif space.is_continuous:
            X, _ = optimize_acqf(acqf, bounds=bounds, q=q, num_restarts=opts.num_restarts,
                                 raw_samples=opts.raw_samples, **linear,
                                 options={"seed": seed % (2**31), **chain,
                                          "sample_around_best": opts.sample_around_best and eq is None})
        elif len(discrete) == d and (grid := space.feasible_grid(MAX_ENUMERATE, seed)) is not None:
            grid = grid[space.local_ok(grid)] if space.local_constraints else grid
            choices = _unseen(space, grid, observed)
            if len(choices) < q:  # everything was tried: re-score the whole grid
                choices = grid
            if len(choices) < q:
                raise SearchSpaceError(f"asked for {q} points at once, but the space has only {len(choices)} "
                                       "feasible combinations")
            X, _ = optimize_acqf_discrete(acqf, q=q, choices=as_tensor(choices), unique=True)
        elif (fixed := _fixed_combos(acqf, space, seed)) is not None:
            # the restarts and raw samples are shared out over the combinations (at least 2 and 64
            # each): a categorical costs about what a continuous column does, not k times more
            X, _ = optimize_acqf_mixed(acqf, bounds=bounds, q=q, fixed_features_list=fixed,
                                       num_restarts=max(2, math.ceil(opts.num_restarts / len(fixed))),
                                       raw_samples=max(64, opts.raw_samples // len(fixed)), **linear,
                                       options=dict(chain))
        else:
            X, _ = optimize_acqf_mixed_alternating(
                acqf, bounds=bounds, discrete_dims=space.discrete_dims() or None,
                cat_dims=space.cat_dims() or None, q=q, num_restarts=opts.num_restarts,
                raw_samples=opts.raw_samples, **linear)
    X = space.snap(X.detach().numpy().reshape(q, d))
    return _meet_local(acqf, space, X, seed, opts) if space.local_constraints else X


def _meet_local(acqf: AcquisitionFunction, space: SearchSpace, X: np.ndarray, seed: int,
                opts: AcquisitionOptions) -> np.ndarray:
    """Replace the points that break a site-local nonlinear constraint by the best-scoring
    (one at a time) of ``raw_samples`` feasible candidates: the constraint is a black box,
    so it is enforced by selection, not by the gradient optimizer."""
    bad = np.flatnonzero(~space.local_ok(X))
    if not len(bad):
        return X
    cands = space.sample(max(opts.raw_samples, 4 * len(X)), seed)
    order = torch.argsort(_score_points(acqf, cands), descending=True).numpy()
    X[bad] = cands[order[: len(bad)]]
    return X


def _fixed_combos(acqf: AcquisitionFunction, space: SearchSpace, seed: int) -> list[dict[int, float]] | None:
    """The discrete combinations ``optimize_acqf_mixed`` enumerates, or None (too many, no table)."""
    cols = sorted({**space.discrete_dims(), **space.cat_dims()})
    grid = space.feasible_grid(MAX_ENUMERATE, seed)
    if grid is None or (len(grid) > MAX_FIXED_COMBOS and not space.restricted):
        return None
    if len(grid) > MAX_FIXED_COMBOS:  # pre-select by the acquisition at one Sobol continuous point each
        pts = sobol_candidates(space, len(grid), seed)[: len(grid)]
        pts[:, cols] = grid
        grid = grid[torch.topk(_score_points(acqf, pts), MAX_FIXED_COMBOS).indices.numpy()]
    return [dict(zip(cols, row.tolist())) for row in grid]


def _score_points(acqf: AcquisitionFunction, points: np.ndarray) -> torch.Tensor:
    """The acquisition of each of ``points (m, d)`` on its own (q = 1), in chunks of about 256."""
    with torch.no_grad():
        return torch.cat([acqf(as_tensor(c).unsqueeze(1)) for c in np.array_split(points, max(1, len(points) // 256))])


def _unseen(space: SearchSpace, grid: np.ndarray, observed: np.ndarray | None) -> np.ndarray:
    """The rows of a fully discrete space's ``grid`` not in ``observed``."""
    if observed is None or not len(observed):
        return grid
    seen = np.abs(grid[:, None, :] - space.snap(observed, restrict=False)[None]).max(-1).min(1) < 1e-9
    return grid[~seen]


def sobol_candidates(space: SearchSpace, n: int, seed: int) -> np.ndarray:
    """``n`` scrambled Sobol points in the unit cube, snapped to feasible values (with linear or
    nonlinear constraints: :meth:`SearchSpace.sample`, spread over the feasible set)."""
    if space.linear is not None or space.local_constraints:
        X = space.sample(n, seed)
        return X if len(X) == n else X[np.arange(n) % len(X)]
    m = int(np.ceil(np.log2(max(n, 2))))
    pts = qmc.Sobol(space.dim, scramble=True, seed=np.random.default_rng(seed)).random_base2(m)[:n]
    return space.snap(pts)


def thompson_sample(model: Model, space: SearchSpace, q: int, seed: int,
                    opts: AcquisitionOptions, exclude: np.ndarray | None = None) -> np.ndarray:
    """``q`` Thompson draws: argmax of posterior sample paths on a Sobol candidate set."""
    cands = sobol_candidates(space, opts.ts_candidates, seed)
    if exclude is not None and len(exclude):
        far = np.min(np.abs(cands[:, None, :] - exclude[None]).max(-1), axis=1) > 1e-9
        cands = cands[far] if far.any() else cands
    with seeded_torch(seed), torch.no_grad():
        mps = MaxPosteriorSampling(model=model, replacement=False)
        X = mps(as_tensor(cands), num_samples=q)
    return space.snap(X.numpy().reshape(q, space.dim))


class WrappedAcquisition(AcquisitionFunction):
    """An acquisition that transforms ``base``; pending points are the base's."""

    def __init__(self, base: AcquisitionFunction) -> None:
        super().__init__(model=base.model)
        self.base = base

    @property
    def X_pending(self) -> torch.Tensor | None:  # type: ignore[override]
        return getattr(self.base, "X_pending", None)

    @X_pending.setter
    def X_pending(self, value: torch.Tensor | None) -> None:
        if "base" in self._modules:
            self.base.set_X_pending(value)

    def set_X_pending(self, X_pending: torch.Tensor | None = None) -> None:
        self.base.set_X_pending(X_pending)


class PriorWeighted(WrappedAcquisition):
    r"""``log alpha+(X) + gamma * sum_q log pi(x_q)``: an acquisition times a prior power.

    ``log_base``: the base acquisition is already a log-acquisition (LogEI family);
    otherwise (UCB) it is made positive as ``softplus((alpha - ref) / scale)`` first
    (see :mod:`labfbo.models.priors`).

    Not BoTorch's ``PriorGuidedAcquisitionFunction``: it multiplies the raw acquisition by
    the prior, which for a UCB that is negative somewhere inverts the prior's preference
    there; the soft-plus above is what πBO's UCB needs.
    """

    def __init__(self, base: AcquisitionFunction, prior: "LocationPrior", gamma: float,
                 log_base: bool, ref: float = 0.0, scale: float = 1.0) -> None:
        super().__init__(base)
        self.prior, self.gamma = prior, gamma
        self.log_base, self.ref, self.scale = log_base, ref, scale

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        a = self.base(X)
        if not self.log_base:
            z = (a - self.ref) / self.scale
            a = torch.where(z < -30.0, z, torch.log(torch.nn.functional.softplus(z.clamp_min(-30.0))))
        return a + self.gamma * self.prior.log_density(X).sum(-1)


def propose_with_model(model: Model, space: SearchSpace, data: AcquisitionData, q: int,
                       seed: int, opts: AcquisitionOptions,
                       prior: "tuple[LocationPrior, float] | None" = None,
                       round: int | None = None,
                       weigh: "Callable[[AcquisitionFunction], AcquisitionFunction] | None" = None) -> np.ndarray:
    """Propose ``q`` points from ``model`` with the configured acquisition.

    ``prior=(location_prior, gamma)`` multiplies the acquisition by the prior to the
    power ``gamma`` (skipped when ``gamma == 0``). ``round``: the site's model-based round,
    for ``stall_rounds`` (None: never escape). ``weigh``: wraps the acquisition (e.g. in the
    site's probability of meeting its outcome constraints).
    """
    if opts.acquisition == "ts":
        return thompson_sample(model, space, q, seed, opts, exclude=data.pending)
    with seeded_torch(seed):  # qLogNEI prunes its baseline with posterior draws from torch's RNG
        acqf = build_acquisition(model, data, opts, q, seed)
    if weigh is not None:
        acqf = weigh(acqf)
    if escaping(data.y, round, opts):
        acqf = ExcludeIncumbent.around_best(acqf, data, space.dim, opts)
    if prior is not None and prior[1] > 0:
        with torch.no_grad():
            ref = float(model.posterior(as_tensor(data.X)).mean.max())
        scale = float(np.std(data.y)) if len(data.y) > 1 and np.std(data.y) > 0 else 1.0
        acqf = PriorWeighted(acqf, prior[0], prior[1], log_base=opts.acquisition != "ucb",
                             ref=ref, scale=scale)
        extra = prior[0].sample(max(opts.raw_samples // 2, opts.num_restarts), seed)
        return optimize_acquisition(acqf, space, q, seed, opts, extra_raw=extra, observed=tried_points(data))
    return optimize_acquisition(acqf, space, q, seed, opts, observed=tried_points(data))


class Tried(Protocol):
    """What :func:`tried_points` reads: an :class:`AcquisitionData`, or a site's data."""

    X: np.ndarray
    pending: np.ndarray
    failed: np.ndarray | None


def tried_points(data: Tried) -> np.ndarray:
    """Observed, pending and failed points: a fully discrete space does not propose them again."""
    d = data.X.shape[1]
    failed = np.zeros((0, d)) if data.failed is None else data.failed.reshape(-1, d)
    return np.concatenate([data.X, data.pending.reshape(-1, d), failed])


def stalled(y: np.ndarray, rounds: int, tol: float = STALL_TOL) -> bool:
    """The last ``rounds`` observations raised the best ``y`` by at most ``tol`` times ``y``'s range."""
    if len(y) <= rounds:
        return False
    return float(np.max(y[-rounds:])) <= float(np.max(y[:-rounds])) + tol * float(np.ptp(y))


def escaping(y: np.ndarray, round: int | None, opts: AcquisitionOptions) -> bool:
    """Whether the proposal of model-based round ``round`` (0, 1, ...) searches outside the
    incumbent's basin: at least ``stall_rounds`` rounds have passed, the site has stalled
    (:func:`stalled`), and it is every other round (the incumbent is refined in between)."""
    m = opts.stall_rounds
    return m is not None and round is not None and round >= m and (round - m) % 2 == 0 and stalled(y, m)


class ExcludeIncumbent(WrappedAcquisition):
    r"""The acquisition with the incumbent's basin penalized:
    :math:`\alpha(X) - w \sum_q \exp(-\|x_q - x^+\|^2 / 2r^2)`.

    :math:`x^+` is the best observed point and :math:`r` = ``stall_radius`` :math:`\sqrt{d}`
    (unit cube). :math:`w` is three times the observed range of ``y`` for UCB (in the units
    of :math:`\mu + \kappa\sigma`), and :data:`LOG_PENALTY` nats for the log-acquisitions
    (``ei``, ``nei``: EI divided by :math:`e^{30}` at :math:`x^+`). Beyond :math:`3r` the
    penalty is below 1.2 % of :math:`w`. Smooth, so the gradient optimizer works as before.

    Not BoTorch's ``PenalizedAcquisitionFunction`` with a ``GaussianPenalty``: that takes the
    maximum of the penalty over the q points of a batch, where this sums it, so that every
    point of a batch is kept out of the incumbent's basin.
    """

    def __init__(self, base: AcquisitionFunction, center: torch.Tensor, radius: float, weight: float) -> None:
        super().__init__(base)
        self.center, self.radius, self.weight = center, radius, weight

    @classmethod
    def around_best(cls, base: AcquisitionFunction, data: AcquisitionData, dim: int,
                    opts: AcquisitionOptions) -> "ExcludeIncumbent":
        best = as_tensor(data.X[int(np.argmax(data.y))])
        weight = 3.0 * float(np.ptp(data.y)) + 1e-12 if opts.acquisition == "ucb" else LOG_PENALTY
        return cls(base, best, opts.stall_radius * math.sqrt(dim), weight)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        d2 = ((X - self.center) ** 2).sum(-1)
        return self.base(X) - self.weight * torch.exp(-0.5 * d2 / self.radius ** 2).sum(-1)
