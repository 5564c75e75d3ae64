r"""Search spaces: parameter definitions, validation, and the unit-cube encoding.

Every model in labfbo works on the unit cube :math:`[0, 1]^d` with **one column per
parameter**, in the order the parameters were declared:

* ``Real(low, high)``: :math:`u = (v - l)/(h - l)`; with ``log=True`` the same on
  :math:`\log v`.
* ``Integer(low, high)``: :math:`u = (v - l)/(h - l)`; decoding rounds to the nearest
  integer. The acquisition optimizer treats the column as discrete (grid
  :math:`\{j/(h-l)\}`).
* ``Categorical(choices)``: :math:`u = j/(k-1)` for the :math:`j`-th of :math:`k`
  choices. Models treat the column as *categorical* (BoTorch's ``CategoricalKernel``
  and the discrete or mixed optimizers), so the ordering carries no meaning there;
  protocols that average points (consensus) snap to the nearest code.

Decoding clamps to the box, so ``decode`` always returns valid params in user units.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from typing import Annotated, Any, Iterable, Literal, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from labfbo.exceptions import SearchSpaceError

Choice = Union[bool, int, float, str]


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


class _Checked(BaseModel):
    """Turns pydantic's validation errors into :class:`SearchSpaceError`."""

    def __init__(self, **kw: Any) -> None:
        try:
            super().__init__(**kw)
        except PydanticValidationError as exc:
            where = kw.get("name", type(self).__name__)
            problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            prefix = "" if repr(where) in problems else f"{type(self).__name__} {where!r}: "
            raise SearchSpaceError(prefix + problems) from None


class _Param(_Checked):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1)


class Real(_Param):
    """A continuous parameter in ``[low, high]`` (log-uniform scale if ``log``)."""

    type: Literal["real"] = "real"
    low: float
    high: float
    log: bool = False

    def __init__(self, name: str | None = None, low: float | None = None,
                 high: float | None = None, log: bool = False, **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, low=low, high=high, log=log)
        super().__init__(**kw)

    @model_validator(mode="after")
    def _check(self) -> "Real":
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"Real {self.name!r}: bounds must be finite")
        if not self.low < self.high:
            raise ValueError(f"Real {self.name!r}: low={self.low} must be < high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"Real {self.name!r}: log scale needs low > 0, got {self.low}")
        return self

    def to_unit(self, v: float) -> float:
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            return (math.log(max(v, self.low)) - lo) / (hi - lo)
        return (v - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        if u in (0.0, 1.0):
            return self.low if u == 0.0 else self.high
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            v = math.exp(lo + u * (hi - lo))
        else:
            v = self.low + u * (self.high - self.low)
        return min(max(v, self.low), self.high)

    def check(self, v: Any) -> tuple[float, bool]:
        """Return ``(value, in_bounds)``; raise on a wrong type or a non-finite value."""
        if not _is_number(v):
            raise SearchSpaceError(
                f"parameter {self.name!r} expects a real number, got {type(v).__name__} {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise SearchSpaceError(f"parameter {self.name!r} must be finite, got {v}")
        if self.log and v <= 0:
            raise SearchSpaceError(f"parameter {self.name!r} is on a log scale; got {v} <= 0")
        return v, self.low <= v <= self.high


class Integer(_Param):
    """An integer parameter in ``[low, high]`` (both inclusive)."""

    type: Literal["integer"] = "integer"
    low: int
    high: int

    def __init__(self, name: str | None = None, low: int | None = None,
                 high: int | None = None, **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, low=low, high=high)
        super().__init__(**kw)

    @model_validator(mode="after")
    def _check(self) -> "Integer":
        if not self.low < self.high:
            raise ValueError(f"Integer {self.name!r}: low={self.low} must be < high={self.high}")
        return self

    def to_unit(self, v: float) -> float:
        return (v - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> int:
        u = min(max(float(u), 0.0), 1.0)
        return int(min(max(round(self.low + u * (self.high - self.low)), self.low), self.high))

    def grid(self) -> list[float]:
        n = self.high - self.low
        return [j / n for j in range(n + 1)]

    def check(self, v: Any) -> tuple[int, bool]:
        if not _is_number(v):
            raise SearchSpaceError(
                f"parameter {self.name!r} expects an integer, got {type(v).__name__} {v!r}")
        fv = float(v)
        if not math.isfinite(fv) or fv != round(fv):
            raise SearchSpaceError(f"parameter {self.name!r} expects an integer, got {v!r}")
        iv = int(round(fv))
        return iv, self.low <= iv <= self.high


class Categorical(_Param):
    """A parameter taking one of ``choices`` (strings, numbers or booleans)."""

    type: Literal["categorical"] = "categorical"
    choices: tuple[Choice, ...]

    def __init__(self, name: str | None = None, choices: Sequence[Choice] | None = None,
                 **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, choices=tuple(choices) if choices is not None else None)
        super().__init__(**kw)

    @field_validator("choices")
    @classmethod
    def _check_choices(cls, v: tuple[Choice, ...]) -> tuple[Choice, ...]:
        if len(v) < 2:
            raise ValueError("a Categorical needs at least two choices")
        keys = [(type(c).__name__, c) for c in v]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate choices in {list(v)}")
        return v

    def index(self, v: Any) -> int:
        for j, c in enumerate(self.choices):
            if type(c) is type(v) and c == v:
                return j
        for j, c in enumerate(self.choices):  # numpy scalars / int-vs-float for numbers
            if _is_number(c) and _is_number(v) and float(c) == float(v):
                return j
            if isinstance(c, str) and isinstance(v, str) and c == v:  # e.g. numpy.str_
                return j
            if isinstance(c, bool) and isinstance(v, np.bool_) and c == bool(v):
                return j
        raise SearchSpaceError(
            f"parameter {self.name!r}: unknown category {v!r}; choices are {list(self.choices)}")

    def to_unit(self, v: Any) -> float:
        return self.index(v) / (len(self.choices) - 1)

    def from_unit(self, u: float) -> Choice:
        u = min(max(float(u), 0.0), 1.0)
        return self.choices[int(round(u * (len(self.choices) - 1)))]

    def grid(self) -> list[float]:
        k = len(self.choices) - 1
        return [j / k for j in range(k + 1)]

    def check(self, v: Any) -> tuple[Choice, bool]:
        return self.choices[self.index(v)], True


Param = Annotated[Union[Real, Integer, Categorical], Field(discriminator="type")]


class SearchSpace(_Checked):
    """An ordered set of named parameters; encodes params to the unit cube and back.

    >>> space = SearchSpace([Real("t", 150, 250), Categorical("s", ["water", "dmso"])])
    >>> space.decode(space.encode([{"t": 200.0, "s": "dmso"}]))
    [{'t': 200.0, 's': 'dmso'}]
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    params: tuple[Param, ...]

    def __init__(self, params: Iterable[Any] | None = None, **kw: Any) -> None:
        if params is not None:
            kw["params"] = tuple(params)
        super().__init__(**kw)

    @field_validator("params")
    @classmethod
    def _check_params(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        if not v:
            raise ValueError("a SearchSpace needs at least one parameter")
        names = [p.name for p in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate parameter names: {dup}")
        return v

    # -- structure -------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def dim(self) -> int:
        return len(self.params)

    def __len__(self) -> int:
        return self.dim

    def kinds(self) -> set[str]:
        return {p.type for p in self.params}

    def cat_dims(self) -> dict[int, list[float]]:
        """Categorical columns and their unit-cube codes."""
        return {i: p.grid() for i, p in enumerate(self.params) if isinstance(p, Categorical)}

    def discrete_dims(self) -> dict[int, list[float]]:
        """Integer columns and their unit-cube grid."""
        return {i: p.grid() for i, p in enumerate(self.params) if isinstance(p, Integer)}

    @property
    def is_continuous(self) -> bool:
        return all(isinstance(p, Real) for p in self.params)

    def fingerprint(self) -> str:
        """A stable hash of the space's canonical JSON (used when a site joins)."""
        canon = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> "SearchSpace":
        return cls.model_validate_json(text)

    # -- validation ------------------------------------------------------------------
    def validate_params(self, params: Any, *, strict: bool = True) -> tuple[dict[str, Any], list[str]]:
        """Check one params dict; return ``(clean, out_of_bounds_names)``.

        Raises :class:`SearchSpaceError` on a non-dict, unknown or missing names, wrong
        types, non-finite numbers and unknown categories; with ``strict`` also on numeric
        values outside the bounds (otherwise they are returned in ``out_of_bounds``).
        """
        if not isinstance(params, dict):
            raise SearchSpaceError(f"params must be a dict of name -> value, got {type(params).__name__}")
        unknown = sorted(set(params) - set(self.names), key=str)
        if unknown:
            raise SearchSpaceError(f"unknown parameter name(s) {unknown}; the space has {self.names}")
        missing = [n for n in self.names if n not in params]
        if missing:
            raise SearchSpaceError(f"missing parameter(s) {missing}")
        clean: dict[str, Any] = {}
        oob: list[str] = []
        for p in self.params:
            value, inside = p.check(params[p.name])
            if not inside:
                if strict:
                    raise SearchSpaceError(
                        f"parameter {p.name!r}={value!r} is outside [{p.low}, {p.high}]")
                oob.append(p.name)
            clean[p.name] = value
        return clean, oob

    # -- encoding --------------------------------------------------------------------
    def encode(self, params_list: Sequence[dict[str, Any]]) -> np.ndarray:
        """Params dicts (already validated) -> ``(n, d)`` float64 array in the unit cube.

        Numeric values outside the bounds are clipped to the box.
        """
        out = np.empty((len(params_list), self.dim), dtype=np.float64)
        for r, params in enumerate(params_list):
            for c, p in enumerate(self.params):
                out[r, c] = p.to_unit(params[p.name])
        return np.clip(out, 0.0, 1.0)

    def decode(self, X: np.ndarray | Sequence[Sequence[float]]) -> list[dict[str, Any]]:
        """``(n, d)`` unit-cube points -> params dicts in user units (clamped, rounded)."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[1] != self.dim:
            raise SearchSpaceError(f"expected points with {self.dim} columns, got {X.shape[1]}")
        return [{p.name: p.from_unit(x[c]) for c, p in enumerate(self.params)} for x in X]

    def snap(self, X: np.ndarray) -> np.ndarray:
        """Round unit-cube points to feasible values (integer grid, category codes)."""
        X = np.clip(np.array(X, dtype=np.float64), 0.0, 1.0)
        for c, grid in {**self.discrete_dims(), **self.cat_dims()}.items():
            g = np.asarray(grid)
            X[..., c] = g[np.abs(X[..., c, None] - g).argmin(-1)]
        return X

    def vector(self, params: dict[str, Any]) -> list[Any]:
        """Params in the space's parameter order (user units)."""
        return [params[n] for n in self.names]
