r"""What a campaign measures: named objectives and outcome constraints.

* :class:`Objective` — a named outcome to maximize or minimize; ``threshold`` (several
  objectives) is the worst value still worth having: the hypervolume's reference point.
* :class:`Outcome` — an outcome constraint, e.g. ``Outcome("impurity", "<=", 0.5)``: an
  experiment is *feasible* when its measured mean meets every one.

With either, ``tell`` takes a dict with a value (a number or ``(mean, sem)``) for every
outcome's name. :class:`OutcomeSpec` is the site's whole declaration; it lives in the
site's journal header and never leaves the site (partners exchange only what their protocol
exchanges for the objective).

**Several objectives under a federated protocol** (ParEGO, Knowles 2006): in BO round
:math:`t` every site maximizes the same augmented Chebyshev scalarization
:math:`s_w(y) = \min_j w_j \hat y_j + 0.05 \sum_j w_j \hat y_j` of its objectives
(each normalized to [0, 1] over the site's own observations, maximization orientation;
BoTorch's ``get_chebyshev_scalarization``), its weights :math:`w \sim` uniform on the
simplex drawn from ``(study seed, t)``. All sites share the round's weights, so the
protocol keeps exchanging one model of one function per round, and over rounds the
sites sweep the Pareto front together. ``independent`` uses qLogNEHVI instead, and so does
``surface`` by default (one shared surface per objective, :mod:`labfbo.protocols.surface.protocol`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from labfbo.core.exceptions import ConfigurationError, ValidationError
from labfbo.core.trial import parse_value

#: the augmented Chebyshev scalarization's weighted-sum term (Knowles 2006; BoTorch's default)
CHEBYSHEV_ALPHA = 0.05


def _reason(exc: Exception) -> str:
    """A pydantic error's messages, without its boilerplate."""
    errors = getattr(exc, "errors", None)
    if errors is None:
        return str(exc)
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) + ': ' if e['loc'] else ''}{e['msg'].removeprefix('Value error, ')}"
        for e in errors()
    )


class Objective(BaseModel):
    """A named outcome to ``"maximize"`` or ``"minimize"``; ``threshold``: the worst value worth having
    (several objectives: the hypervolume's reference point; inferred from the data if None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    direction: Literal["maximize", "minimize"] = "maximize"
    threshold: float | None = None

    def __init__(self, name: str | None = None, direction: str = "maximize", threshold: float | None = None,
                 **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, direction=direction, threshold=threshold)
        try:
            super().__init__(**kw)
        except Exception as exc:  # pydantic's error, worded for a lab
            raise ConfigurationError(f"Objective {kw.get('name')!r}: {_reason(exc)}") from None

    @model_validator(mode="after")
    def _finite(self) -> "Objective":
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"Objective {self.name!r}: threshold must be finite")
        return self

    @property
    def sign(self) -> float:
        """+1 to maximize, -1 to minimize: ``sign * value`` is maximized."""
        return 1.0 if self.direction == "maximize" else -1.0


class Outcome(BaseModel):
    """An outcome constraint: the measured ``name`` must be ``op`` (``"<="`` or ``">="``) ``bound``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    op: Literal["<=", ">="]
    bound: float

    def __init__(self, name: str | None = None, op: str | None = None, bound: float | None = None,
                 **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, op=op, bound=bound)
        try:
            super().__init__(**kw)
        except Exception as exc:
            raise ConfigurationError(f"Outcome {kw.get('name')!r}: {_reason(exc)}") from None

    @model_validator(mode="after")
    def _finite(self) -> "Outcome":
        if not math.isfinite(self.bound):
            raise ValueError(f"Outcome {self.name!r}: bound must be finite")
        return self

    def slack(self, value: float) -> float:
        """How far inside the constraint ``value`` is (>= 0 where met)."""
        return self.bound - value if self.op == "<=" else value - self.bound

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.bound:g}"


class OutcomeSpec(BaseModel):
    """A site's objectives and outcome constraints; ``names``: every outcome ``tell`` expects."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    objectives: tuple[Objective, ...] = Field(min_length=1)
    constraints: tuple[Outcome, ...] = ()

    @model_validator(mode="after")
    def _distinct(self) -> "OutcomeSpec":
        names = [o.name for o in self.objectives]
        if len(set(names)) != len(names):
            raise ValueError(f"objective names must be distinct, got {names}")
        return self

    @classmethod
    def build(cls, objective: Any, constraints: Sequence[Outcome] | None) -> "OutcomeSpec | None":
        """The spec of ``Optimizer(objective=..., outcome_constraints=...)``; None for the plain
        ``"minimize"`` / ``"maximize"`` of one unnamed value without constraints."""
        if isinstance(objective, str) and not constraints:
            return None
        if isinstance(objective, str):
            raise ConfigurationError("outcome constraints need a named objective: objective=labfbo.Objective("
                                     "'yield', 'maximize'), so tell can say which value is which")
        objs = list(objective) if isinstance(objective, (list, tuple)) else [objective]
        if not objs or not all(isinstance(o, Objective) for o in objs):
            raise ConfigurationError("objective must be 'minimize', 'maximize', a labfbo.Objective or a list of them")
        cons = list(constraints or ())
        if not all(isinstance(c, Outcome) for c in cons):
            raise ConfigurationError("outcome_constraints must be a list of labfbo.Outcome")
        try:
            return cls(objectives=tuple(objs), constraints=tuple(cons))
        except Exception as exc:
            raise ConfigurationError(_reason(exc)) from None

    @property
    def names(self) -> list[str]:
        out = [o.name for o in self.objectives]
        for c in self.constraints:
            if c.name not in out:
                out.append(c.name)
        return out

    @property
    def multi(self) -> bool:
        return len(self.objectives) > 1

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        """The first objective's: ``Observation.value`` and ``best`` refer to it."""
        return self.objectives[0].direction

    def parse(self, value: Any) -> dict[str, tuple[float, float | None]]:
        """``{name: number or (mean, sem)}`` with every outcome -> ``{name: (mean, sem or None)}``."""
        if not isinstance(value, dict):
            raise ValidationError(f"this campaign measures {self.names}: tell takes a dict with a value for each "
                                  f"(a number or (mean, sem)), got {type(value).__name__}")
        missing = [n for n in self.names if n not in value]
        unknown = sorted(str(n) for n in value if n not in self.names)
        if missing or unknown:
            raise ValidationError(f"outcomes: missing {missing}, unknown {unknown}; expected {self.names}")
        out = {}
        for n in self.names:
            try:
                out[n] = parse_value(value[n])
            except ValidationError as exc:
                raise ValidationError(f"outcome {n!r}: {exc}") from None
        return out

    def feasible(self, means: dict[str, float]) -> bool:
        return all(c.slack(means[c.name]) >= 0.0 for c in self.constraints)

    def feasible_only(self, observations: Sequence[Any]) -> tuple[Any, ...]:
        """The observations whose measured means meet every outcome constraint."""
        return tuple(o for o in observations if o.outcomes is not None and self.feasible(o.outcomes))

    def objective_matrix(self, rows: Sequence[dict[str, float]]) -> np.ndarray:
        """``(n, m)`` objective values in the maximization orientation."""
        return np.array([[o.sign * r[o.name] for o in self.objectives] for r in rows],
                        dtype=np.float64).reshape(len(rows), len(self.objectives))

    def outcome_matrix(self, rows: Sequence[dict[str, float]]) -> np.ndarray:
        """``(n, k)`` model targets: the objectives (maximization orientation), then each outcome
        constraint's outcome as measured."""
        cons = np.array([[r[c.name] for c in self.constraints] for r in rows],
                        dtype=np.float64).reshape(len(rows), len(self.constraints))
        return np.concatenate([self.objective_matrix(rows), cons], axis=1)

    def variance_matrix(self, rows: Sequence[dict[str, float | None]]) -> np.ndarray:
        """``(n, k)`` squared standard errors in :meth:`outcome_matrix`'s columns (NaN where none)."""
        cols = [o.name for o in self.objectives] + [c.name for c in self.constraints]
        sem = np.array([[np.nan if r.get(n) is None else r[n] for n in cols] for r in rows], dtype=np.float64)
        return np.square(sem.reshape(len(rows), len(cols)))

    def reference_point(self) -> list[float] | None:
        """The objectives' thresholds in the maximization orientation (None unless all are set)."""
        if any(o.threshold is None for o in self.objectives):
            return None
        return [o.sign * float(o.threshold) for o in self.objectives]  # type: ignore[arg-type]

    def chebyshev(self, Y: np.ndarray, seed: int, round: int) -> np.ndarray:
        """The ParEGO target of BO round ``round``: the augmented Chebyshev scalarization of the
        objectives ``Y (n, m)`` (maximization orientation), weights drawn from ``(seed, round)``."""
        import torch
        from botorch.utils.multi_objective.scalarization import get_chebyshev_scalarization
        from botorch.utils.sampling import sample_simplex

        from labfbo.core.seeding import int_seed

        m = Y.shape[1]
        w = sample_simplex(m, seed=int_seed(seed, 0, round, "parego") % (2**31), dtype=torch.float64).reshape(m)
        Yt = torch.as_tensor(Y, dtype=torch.float64)
        return get_chebyshev_scalarization(w, Yt, alpha=CHEBYSHEV_ALPHA)(Yt).numpy().reshape(-1).copy()
