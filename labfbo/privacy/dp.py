"""Task-level differential privacy of a site's SVGD gradients (paper Section VI, Eqs. 12-13).

Mechanism. Before a site's per-particle score gradients ``A_k`` (rows of a ``(K, P)``
array, one row per hyper-posterior particle) leave the site, :func:`privatize` clips each
row to l2 norm ``C`` (Eq. 12) and adds independent ``N(0, sigma^2 (2C)^2 I)`` noise to each
clipped row (Eq. 13). The coordinator's aggregation and SVGD update only see the noised
rows, so they are post-processing and leak nothing further.

Accounting model (what a site's privacy report and ``Optimizer.epsilon()`` compute from the
releases its protocol declares, :mod:`labfbo.privacy.release`; :class:`PrivacyLedger` is the
same model for a fixed K, kept for code that accounts steps directly).

* The guarantee is *task-level*: neighbouring inputs differ in one site's *whole* dataset.
  Such a change may alter every per-particle gradient arbitrarily, but both versions are
  clipped to norm ``<= C``, so each row has l2 sensitivity ``Delta = 2C``.
* The K rows released in one SVGD step may all change at once, so together they are ONE
  Gaussian mechanism on the stacked ``K*P`` vector with l2 sensitivity ``2C*sqrt(K)`` and
  noise std ``sigma*2C`` per coordinate: an effective noise multiplier ``sigma/sqrt(K)``.
* These steps compose (adaptively: later gradients depend on earlier releases) over every
  SVGD step of every BO round. ``T`` compositions of a Gaussian with multiplier ``m`` are
  exactly one Gaussian with multiplier ``m/sqrt(T)``; dp-accounting's PLD accountant uses
  this and converts to a tight ``epsilon`` at ``delta`` (pessimistic discretization, so the
  reported value is an upper bound to within the discretization, see below).
* We describe it with dp-accounting's ``DpEvent`` API as
  ``SelfComposedDpEvent(GaussianDpEvent(sigma/sqrt(K)), T)`` under the library's default
  neighbouring relation, which treats ``GaussianDpEvent(m)`` as a unit-sensitivity
  Gaussian with noise std ``m`` -- exactly our mechanism after dividing by ``2C*sqrt(K)``.
* Each site accounts its own releases; sites' datasets are disjoint, so a site's guarantee
  is its own ``epsilon``. No subsampling amplification is claimed. Anything a site
  sends besides privatized gradients (e.g. counts, an initial design) is *not* covered.
  numpy's floating-point Gaussian sampler is not hardened against precision attacks.
* ``noise_multiplier = 0`` is allowed (clipping only) but gives **no** privacy: ``epsilon``
  is ``math.inf`` as soon as one step is recorded. Nothing recorded: ``epsilon = 0``.

The unit (``DP(unit=...)``). What neighbouring inputs differ in — what the guarantee hides:

* ``"site"`` (the default, everything above): one site's *whole* dataset. It hides the whole
  campaign: any result, any pattern over many experiments, even whether the data came from
  this lab. It needs noise of the order of the statistic's full range.
* ``"experiment"``: one experiment of the site — its setting and its result — replaced by
  another (the count ``n`` stays the same and is public: it is sent in the clear). The usual
  example-level guarantee of federated learning. An average over ``n`` experiments moves by
  O(1/n) when one of them changes, so the same epsilon needs about ``n`` times less noise. It
  does not hide that the lab took part, how many experiments it ran, nor a pattern repeated over
  many experiments (or the settings the lab chose next because of a result).
  Only a protocol whose release is such an average lowers its sensitivity (`surface`,
  :func:`labfbo.models.surface.private_statistics`); a vote or a belief, which one experiment
  can change entirely, keeps the site's noise (a site-level guarantee is an experiment-level one);
  `gradient` refuses the unit (its score is no sum over experiments). This module's gradient
  mechanism (:func:`privatize`) is site level only.

Discretization. :data:`PLD_DISCRETIZATION` = 1e-2 (dp-accounting's default is 1e-4).
Against 1e-4 it changes the regression values by < 1e-4 (sigma=1,T=1: 4.37723 vs 4.37718),
while 2,000 compositions take ~0.02-0.1 s for multipliers 8 and 2.83 (1e-3: ~0.2-0.9 s;
1e-4: 1.6-9 s). Cost grows with ``sqrt(T)/m``: m=1, T=2000 (epsilon ~1190) takes ~0.4 s.
Results are cached per ``(multiplier, T, delta, accountant)``.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Literal, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer
from pydantic import ValidationError as PydanticValidationError

from labfbo.exceptions import ConfigurationError, ValidationError

PLD_DISCRETIZATION = 1e-2
#: below this noise multiplier the PLD accountant's memory grows as 1/sigma^2 (1 GB at 0.05, 4.7 GB at
#: 0.02): such Gaussians are accounted by RDP instead, a valid and looser upper bound (one release at
#: sigma = 0.5 already has epsilon ~ 10 at delta 1e-5, so nothing a budget would allow is affected)
PLD_MIN_SIGMA = 0.5
"""``value_discretization_interval`` of the PLD accountant (see the module docstring)."""

LEDGER_VERSION = 1

Unit = Literal["site", "experiment"]
"""What a guarantee protects: a site's whole dataset, or one of its experiments (module docstring)."""


class DP(BaseModel):
    """Settings of a site's Gaussian mechanism: a campaign budget, or a noise multiplier.

    The budget form, ``DP(epsilon=2.0, delta=1e-5)``: the site plans its campaign's releases
    from the horizon and the protocol's settings and calibrates ``sigma`` so that all of them
    together stay within ``(epsilon, delta)`` (:mod:`labfbo.privacy.budget`); a release that
    would go beyond the budget is never sent. The expert form, ``DP(noise_multiplier=8)``, fixes
    ``sigma`` (and, with ``epsilon=`` as well, still never goes beyond that budget).

    ``clip`` is ``C``, the l2 bound of each clipped quantity (its meaning is the protocol's);
    ``noise_multiplier`` is ``sigma`` (noise std ``sigma`` times the release's sensitivity; 0
    means clipping only, i.e. ``epsilon = inf``); ``delta`` is the delta of the guarantee.
    Neither ``epsilon`` nor ``noise_multiplier`` given: ``sigma = 1`` and no budget.
    ``unit`` is what is protected: ``"site"`` (the default: the lab's whole dataset) or
    ``"experiment"`` (one experiment's setting and result; see the module docstring).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    clip: float = Field(1.0, description="C: l2 bound of each per-particle gradient")
    noise_multiplier: float | None = Field(None, description="sigma: noise std is sigma times the sensitivity "
                                           "(None with epsilon: calibrated to the budget)")
    delta: float = Field(1e-5, description="delta of the (epsilon, delta) guarantee")
    epsilon: float | None = Field(None, description="the campaign's budget: cumulative epsilon never exceeds it")
    unit: Unit = Field("site", description="what is protected: 'site' (the lab's whole dataset) or 'experiment' "
                       "(one experiment's setting and result)")

    def __init__(self, clip: float = 1.0, noise_multiplier: float | None = None, delta: float = 1e-5,
                 epsilon: float | None = None, unit: Unit = "site", **kw: Any) -> None:
        if noise_multiplier is None and epsilon is None:
            noise_multiplier = 1.0
        try:
            super().__init__(clip=clip, noise_multiplier=noise_multiplier, delta=delta, epsilon=epsilon, unit=unit,
                             **kw)
        except PydanticValidationError as exc:  # a labfbo error that names each wrong setting
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'DP'}: {e['msg'].removeprefix('Value error, ')}"
                                 for e in exc.errors())
            raise ConfigurationError(f"DP settings: {problems}") from None

    @model_serializer(mode="wrap")
    def _no_unset_budget(self, handler: Any) -> Any:
        out = handler(self)
        if self.epsilon is None and isinstance(out, dict):
            out.pop("epsilon", None)  # without a budget, the settings dump as before budgets existed (journals)
        if self.unit == "site" and isinstance(out, dict):
            out.pop("unit", None)  # the default unit dumps as before units existed (journals, goldens)
        return out

    @field_validator("clip")
    @classmethod
    def _clip(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"clip (C, the l2 bound of each per-particle gradient) must be a "
                             f"finite number > 0, got {v}")
        return v

    @field_validator("noise_multiplier")
    @classmethod
    def _sigma(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"noise_multiplier (sigma) must be a finite number >= 0 "
                             f"(0 = no noise, no privacy), got {v}")
        return v

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError(f"delta must satisfy 0 < delta < 1, got {v}")
        return v

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"epsilon (the campaign's privacy budget) must be a finite number > 0, got {v}")
        return v

    @property
    def calibrated(self) -> bool:
        """Whether ``sigma`` is known (given, or calibrated to the budget by the site)."""
        return self.noise_multiplier is not None

    @property
    def sigma(self) -> float:
        """``noise_multiplier``; a budget not yet calibrated (no site has planned it) is an error."""
        if self.noise_multiplier is None:
            raise ConfigurationError(f"DP(epsilon={self.epsilon:g}) has no noise multiplier until the site plans "
                                     "its campaign (labfbo.privacy.budget.calibrate)")
        return self.noise_multiplier

    @property
    def sensitivity(self) -> float:
        """``Delta = 2C``: l2 sensitivity of one clipped per-particle gradient."""
        return 2.0 * self.clip

    @property
    def noise_std(self) -> float:
        """``sigma * 2C``: std of the noise added to each coordinate."""
        return self.sigma * self.sensitivity


GRADIENT_UNIT_REFUSAL = (
    "DP(unit='experiment') cannot protect per-particle score gradients: a site's score is the gradient of its GP "
    "marginal likelihood log N(y | m, K + s^2 I) on values standardized by its own mean and std, which couples "
    "every experiment (no sum over experiments), so one experiment may change it as much as the whole dataset "
    "does and its experiment-level sensitivity is the site level's 2C: use DP(unit='site'), which gives the same "
    "noise and protects more")


def _as_matrix(grads: Any) -> np.ndarray:
    g = np.asarray(grads, dtype=float)
    if g.ndim != 2:
        raise ValidationError(f"grads must be a (K, P) array of per-particle gradients, "
                              f"got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValidationError("grads contain NaN or infinite values")
    return g


def clip_rows(grads: np.ndarray, clip: float) -> np.ndarray:
    """Eq. 12: each row scaled by ``min(1, C / ||row||)``; a new float array, input untouched."""
    g = _as_matrix(grads)
    c = float(clip)
    if not (math.isfinite(c) and c > 0):
        raise ValidationError(f"clip must be a finite number > 0, got {clip}")
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    scale = np.minimum(1.0, c / np.maximum(norms, np.finfo(float).tiny))
    return g * scale


def privatize(grads: np.ndarray, dp: DP, rng: np.random.Generator, noise_std: float | None = None) -> np.ndarray:
    """Eqs. 12-13: clip each row to ``dp.clip``, add ``N(0, (sigma * 2C)^2)`` to every entry
    (``noise_std``: another std, e.g. a member's share of distributed noise).

    With ``noise_multiplier == 0`` the result is exactly :func:`clip_rows` and ``rng`` is
    not used. Site level only: ``unit="experiment"`` raises a ConfigurationError
    (:data:`GRADIENT_UNIT_REFUSAL`).
    """
    if not isinstance(dp, DP):
        raise ValidationError(f"dp must be a labfbo DP, got {type(dp).__name__}")
    if dp.unit != "site":
        raise ConfigurationError(GRADIENT_UNIT_REFUSAL)
    if not isinstance(rng, np.random.Generator):
        raise ValidationError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    clipped = clip_rows(grads, dp.clip)
    if dp.sigma == 0:
        return clipped
    return clipped + rng.normal(0.0, dp.noise_std if noise_std is None else noise_std, size=clipped.shape)


def _accountant(accountant: str) -> Any:
    try:
        from dp_accounting.pld import PLDAccountant
        from dp_accounting.rdp import RdpAccountant
    except ImportError as e:  # optional dependency (extra "privacy")
        raise ConfigurationError("privacy accounting needs dp-accounting: "
                                 "pip install 'labfbo[privacy]'") from e
    if accountant == "pld":
        return PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    return RdpAccountant()


@functools.lru_cache(maxsize=4096)
def _epsilon(noise_multiplier: float, compositions: int, delta: float, accountant: str) -> float:
    from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
    acc = _accountant("rdp" if noise_multiplier < PLD_MIN_SIGMA else accountant)
    acc.compose(SelfComposedDpEvent(GaussianDpEvent(noise_multiplier), compositions))
    return float(acc.get_epsilon(delta))


def gaussian_epsilon(noise_multiplier: float, compositions: int, delta: float,
                     accountant: Literal["pld", "rdp"] = "pld") -> float:
    """Epsilon at ``delta`` of a unit-sensitivity Gaussian with this multiplier, composed
    ``compositions`` times. ``accountant``: ``"pld"`` (tight, default) or ``"rdp"`` (looser).

    ``compositions == 0`` gives 0; ``noise_multiplier == 0`` (and any composition) gives
    ``math.inf``: an un-noised release has no finite guarantee.
    """
    if accountant not in ("pld", "rdp"):
        raise ValidationError(f"accountant must be 'pld' or 'rdp', got {accountant!r}")
    m = float(noise_multiplier)
    if not (math.isfinite(m) and m >= 0):
        raise ValidationError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    if isinstance(compositions, bool) or int(compositions) != compositions or compositions < 0:
        raise ValidationError(f"compositions must be an integer >= 0, got {compositions}")
    if not 0 < float(delta) < 1:
        raise ValidationError(f"delta must satisfy 0 < delta < 1, got {delta}")
    if compositions == 0:
        return 0.0
    if m == 0:
        return math.inf
    return _epsilon(m, int(compositions), float(delta), accountant)


def composed_epsilon(multipliers: Mapping[Any, int], delta: float,
                     accountant: Literal["pld", "rdp"] = "pld") -> float:
    """Epsilon at ``delta`` of mechanisms composed: ``multipliers`` maps a release's accounting
    event (:attr:`labfbo.privacy.release.Release.event`) to how many releases had it.

    A float is a unit-sensitivity Gaussian's noise multiplier (an infinite one releases
    nothing; 0 gives ``math.inf``); one multiplier alone is :func:`gaussian_epsilon` exactly. A
    ``(buckets, epsilon)`` pair is a randomized response (:mod:`labfbo.privacy.randomized_response`),
    accounted under dp-accounting's replace-one relation (the PLD accountant's only one for it),
    where the Gaussians then enter with twice their multiplier — the same privacy loss, as our
    sensitivities are already the distance between two neighbouring releases.
    """
    rr = sorted((int(k[0]), float(k[1]), int(n)) for k, n in multipliers.items() if n and isinstance(k, tuple))
    items = sorted((float(m), int(n)) for m, n in multipliers.items()
                   if n and not isinstance(m, tuple) and not math.isinf(m))
    if rr and accountant != "pld":
        raise ValidationError("randomized-response releases are accounted by the PLD accountant only")
    if not rr and len(items) <= 1:
        return gaussian_epsilon(items[0][0], items[0][1], delta, accountant) if items else 0.0
    for m, n in items:
        gaussian_epsilon(m, n, delta, accountant)  # validates each group (and 0 -> inf below)
    if items and items[0][0] == 0:
        return math.inf
    if rr:
        return _composed_with_responses(tuple(items), tuple(rr), float(delta))
    return _composed_epsilon(tuple(items), float(delta), accountant)


@functools.lru_cache(maxsize=1024)
def _composed_epsilon(items: tuple[tuple[float, int], ...], delta: float, accountant: str) -> float:
    from dp_accounting import ComposedDpEvent, GaussianDpEvent, SelfComposedDpEvent
    acc = _accountant("rdp" if items and items[0][0] < PLD_MIN_SIGMA else accountant)  # items: smallest first
    acc.compose(ComposedDpEvent([SelfComposedDpEvent(GaussianDpEvent(m), n) for m, n in items]))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=1024)
def _composed_with_responses(gaussians: tuple[tuple[float, int], ...], responses: tuple[tuple[int, float, int], ...],
                             delta: float) -> float:
    """PLD (replace-one) over Gaussians and randomized responses. The responses are listed one by
    one: dp-accounting 0.6's PLD accountant composes ``SelfComposedDpEvent(RandomizedResponseDpEvent)``
    as a single response, whatever its count (tested). Never above basic composition's sum."""
    from dp_accounting import (ComposedDpEvent, GaussianDpEvent, NeighboringRelation, RandomizedResponseDpEvent,
                               SelfComposedDpEvent)
    from dp_accounting.pld import PLDAccountant

    from labfbo.privacy.randomized_response import noise_parameter

    tiny = tuple(g for g in gaussians if g[0] < PLD_MIN_SIGMA)
    if tiny:  # basic composition: RDP for the tiny Gaussians at delta / 2, PLD for the rest at delta / 2
        rest = tuple(g for g in gaussians if g[0] >= PLD_MIN_SIGMA)
        return _composed_epsilon(tiny, delta / 2, "rdp") + _composed_with_responses(rest, responses, delta / 2)
    events: list[Any] = [SelfComposedDpEvent(GaussianDpEvent(2 * m), n) for m, n in gaussians]
    for k, eps, n in responses:
        events.extend([RandomizedResponseDpEvent(noise_parameter(eps, k), k)] * n)
    acc = PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=PLD_DISCRETIZATION)
    acc.compose(ComposedDpEvent(events))
    pld = float(acc.get_epsilon(delta))
    if gaussians:
        return pld
    return min(pld, sum(eps * n for _, eps, n in responses))


class LedgerEntry(BaseModel):
    """One BO round of one site: ``steps`` SVGD steps, each releasing K privatized rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    round: int = Field(ge=0)
    steps: int = Field(ge=0)


class PrivacyLedger:
    """Per-site record of every DP release; reports (epsilon, delta) with dp-accounting's PLD
    accountant under the task-level model of the module docstring.

    ``record(round, steps)`` once per BO round (rounds non-decreasing; recording the same
    round again adds its steps to that round's row). ``to_dict``/``to_json`` and
    ``from_json`` let a journal persist and restore it.
    """

    def __init__(self, dp: DP, n_particles: int) -> None:
        if not isinstance(dp, DP):
            raise ValidationError(f"dp must be a labfbo DP, got {type(dp).__name__}")
        if isinstance(n_particles, bool) or int(n_particles) != n_particles or n_particles < 1:
            raise ValidationError(f"n_particles (K) must be an integer >= 1, got {n_particles}")
        self.dp = dp
        self.n_particles = int(n_particles)
        self._entries: list[LedgerEntry] = []

    @property
    def effective_noise_multiplier(self) -> float:
        """``sigma / sqrt(K)``: multiplier of one SVGD step's K releases as one mechanism."""
        return self.dp.sigma / math.sqrt(self.n_particles)

    @property
    def total_steps(self) -> int:
        """Number of composed mechanisms (SVGD steps) recorded so far."""
        return sum(e.steps for e in self._entries)

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    def record(self, round: int, steps: int = 1) -> None:
        """Record ``steps`` SVGD steps of BO round ``round`` (K privatized rows per step).

        Releases compose in any order; consecutive records of one round are merged."""
        for name, v in (("round", round), ("steps", steps)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValidationError(f"{name} must be an integer >= 0, got {v!r}")
        last = self._entries[-1] if self._entries else None
        if last is not None and round == last.round:
            self._entries[-1] = LedgerEntry(round=int(round), steps=last.steps + int(steps))
        else:
            self._entries.append(LedgerEntry(round=int(round), steps=int(steps)))

    def _eps(self, steps: int) -> float:
        return gaussian_epsilon(self.effective_noise_multiplier, steps, self.dp.delta)

    def epsilon(self) -> float:
        """Cumulative epsilon at ``dp.delta`` (0 if nothing recorded, inf if sigma = 0)."""
        return self._eps(self.total_steps)

    def report(self) -> list[dict[str, Any]]:
        """One row per round: ``round``, ``steps``, cumulative ``releases`` (per-particle
        gradients sent so far = K * cumulative steps), cumulative ``steps_total``, and
        ``epsilon`` after that round (at ``delta``)."""
        rows, total = [], 0
        for e in self._entries:
            total += e.steps
            rows.append({"round": e.round, "steps": e.steps, "steps_total": total,
                         "releases": total * self.n_particles, "epsilon": self._eps(total),
                         "delta": self.dp.delta})
        return rows

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (no epsilons: they are recomputed, deterministically, on load)."""
        return {"v": LEDGER_VERSION, "dp": self.dp.model_dump(), "n_particles": self.n_particles,
                "entries": [e.model_dump() for e in self._entries]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, data: str | bytes | Mapping[str, Any]) -> "PrivacyLedger":
        """Inverse of :meth:`to_json` / :meth:`to_dict`."""
        try:
            d = json.loads(data) if isinstance(data, (str, bytes)) else dict(data)
            if d.get("v") != LEDGER_VERSION:
                raise ValidationError(f"privacy ledger version {d.get('v')!r} is not {LEDGER_VERSION}")
            ledger = cls(DP.model_validate(d["dp"]), d["n_particles"])
            for e in d["entries"]:
                entry = LedgerEntry.model_validate(e)
                ledger.record(entry.round, entry.steps)
        except ValidationError:
            raise
        except Exception as e:  # malformed JSON, missing keys, pydantic errors
            raise ValidationError(f"not a privacy ledger: {e}") from e
        return ledger

    def __repr__(self) -> str:
        return (f"PrivacyLedger(dp={self.dp!r}, n_particles={self.n_particles}, "
                f"rounds={len(self._entries)}, steps={self.total_steps})")
