"""Task-level differential privacy of a site's SVGD gradients (paper Section VI, Eqs. 12-13).

Mechanism. Before a site's per-particle score gradients ``A_k`` (rows of a ``(K, P)``
array, one row per hyper-posterior particle) leave the site, :func:`privatize` clips each
row to l2 norm ``C`` (Eq. 12) and adds independent ``N(0, sigma^2 (2C)^2 I)`` noise to each
clipped row (Eq. 13). The coordinator's aggregation and SVGD update only see the noised
rows, so they are post-processing and leak nothing further.

Accounting model (what a site's privacy report and ``Optimizer.epsilon()`` compute from the
releases its protocol declares, :mod:`labfbo.core.release`; :class:`PrivacyLedger` is the
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
  :func:`labfbo.protocols.surface.model.private_statistics`); a vote or a belief, which one experiment
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
from pydantic import BaseModel, ConfigDict, Field

from labfbo.core.dp import DP, LEDGER_VERSION, PLD_DISCRETIZATION, PLD_MIN_SIGMA, Unit  # noqa: F401 - re-exported
from labfbo.core.exceptions import ConfigurationError, ValidationError
from labfbo.privacy.noise import gaussian

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
    return gaussian(clipped, dp.noise_std if noise_std is None else noise_std, rng)


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
    event (:attr:`labfbo.core.release.Release.event`) to how many releases had it.

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
    from dp_accounting import (
        ComposedDpEvent,
        GaussianDpEvent,
        NeighboringRelation,
        RandomizedResponseDpEvent,
        SelfComposedDpEvent,
    )
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
