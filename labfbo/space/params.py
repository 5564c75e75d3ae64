r"""Parameter types: what a lab can set, and how each maps to one unit-cube column.

* ``Real(low, high)``: :math:`u = (v - l)/(h - l)` (on :math:`\log v` with ``log=True``);
  with ``step=s`` the values are the grid :math:`l + k s` and the column is discrete.
* ``Integer(low, high)``: :math:`u = (v - l)/(h - l)`; decoding rounds.
* ``Discrete(values)``: an ordered set of numbers, :math:`u = (v - v_{\min})/(v_{\max} - v_{\min})`,
  so the model sees their real spacing (0.057 / 0.1 / 0.153 M are not equidistant).
* ``Categorical(choices, descriptors=None)``: :math:`u = j/(k-1)` for the :math:`j`-th of
  :math:`k` choices. This code only *names* the choice: models see a categorical kernel
  (no descriptors) or the choice's scaled descriptors (:mod:`labfbo.models.encoding`),
  never the code as a number. ``Categorical.from_smiles(name, {choice: smiles})`` computes
  the descriptors from each choice's structure (:mod:`labfbo.space.chem`, RDKit).

Decoding clamps to the box and snaps to the parameter's values, so it always returns a
value the lab can set. Every parameter may name its ``unit=`` (``"degC"``, ``"mol%"``): the
campaign report labels its axes with it, and it is part of the space's identity (partners
that measure temperature in different units do not share a study by mistake).
"""

from __future__ import annotations

import math
import numbers
from typing import Annotated, Any, Literal, Mapping, Sequence, Union

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError as PydanticValidationError,
    field_validator,
    model_validator,
)

from labfbo.core.exceptions import SearchSpaceError

Choice = Union[bool, int, float, str]

#: a ``step`` grid longer than this is optimized as a continuous column and then snapped
MAX_STEP_GRID = 10_000


def choice_index(u: Any, k: int) -> Any:
    r"""The choice (of ``k``) a unit-cube value names: :math:`\min(\lfloor u k\rfloor, k - 1)`.

    Equal shares of [0, 1] per choice, so uniform designs pick every choice equally often,
    and the code :math:`j/(k-1)` of choice :math:`j` maps back to :math:`j`. Works on floats,
    numpy arrays and torch tensors.
    """
    import numpy as _np

    if hasattr(u, "floor") and not isinstance(u, (float, _np.ndarray)):  # a torch tensor
        return (u.clamp(0.0, 1.0) * k).floor().long().clamp(0, k - 1)
    idx = _np.minimum(_np.floor(_np.clip(u, 0.0, 1.0) * k), k - 1).astype(int)
    return int(idx) if _np.ndim(idx) == 0 else idx


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _tidy(v: float) -> float:
    """``0.30000000000000004`` -> ``0.3``: a grid value as a person would type it."""
    return float(f"{v:.12g}")


class _Checked(BaseModel):
    """Turns pydantic's validation errors into :class:`SearchSpaceError`."""

    def __init__(self, **kw: Any) -> None:
        try:
            super().__init__(**kw)
        except PydanticValidationError as exc:
            where = kw.get("name")
            problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            prefix = ("" if where is not None and repr(where) in problems
                      else f"{type(self).__name__}{'' if where is None else f' {where!r}'}: ")
            raise SearchSpaceError(prefix + problems) from None


class _Param(_Checked):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1)
    unit: str | None = Field(None, max_length=32, description="the lab's unit, for labels (e.g. 'degC', 'mol%')")

    @property
    def is_discrete(self) -> bool:
        """True if the parameter takes finitely many values (its column has a grid)."""
        return False

    def grid(self) -> list[float]:
        raise SearchSpaceError(f"parameter {self.name!r} is continuous: it has no grid")


class Real(_Param):
    """A continuous parameter in ``[low, high]`` (log-uniform scale if ``log``); with
    ``step`` an instrument's dial: only ``low + k * step`` are proposed."""

    type: Literal["real"] = "real"
    low: float
    high: float
    log: bool = False
    step: float | None = None

    def __init__(self, name: str | None = None, low: float | None = None,
                 high: float | None = None, log: bool = False, step: float | None = None, **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, low=low, high=high, log=log, step=step)
        super().__init__(**kw)

    @model_validator(mode="after")
    def _check(self) -> "Real":
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"Real {self.name!r}: bounds must be finite")
        if not self.low < self.high:
            raise ValueError(f"Real {self.name!r}: low={self.low} must be < high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"Real {self.name!r}: log scale needs low > 0, got {self.low}")
        if self.step is not None:
            if self.log:
                raise ValueError(f"Real {self.name!r}: step= and log=True cannot be combined (a log-scale "
                                 "parameter has no constant step); use Discrete(values) for a log-spaced grid")
            if not (math.isfinite(self.step) and self.step > 0):
                raise ValueError(f"Real {self.name!r}: step must be > 0, got {self.step}")
            k = (self.high - self.low) / self.step
            if abs(k - round(k)) > 1e-9 * max(1.0, k):
                raise ValueError(f"Real {self.name!r}: high - low = {self.high - self.low:g} is not a multiple "
                                 f"of step={self.step:g}")
        return self

    @property
    def n_steps(self) -> int:
        return 0 if self.step is None else int(round((self.high - self.low) / self.step))

    @property
    def is_discrete(self) -> bool:
        return self.step is not None and self.n_steps <= MAX_STEP_GRID

    def grid(self) -> list[float]:
        if self.step is None:
            return super().grid()
        k = self.n_steps
        return [j / k for j in range(k + 1)]

    def to_unit(self, v: float) -> float:
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            return (math.log(max(v, self.low)) - lo) / (hi - lo)
        return (v - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        if self.step is not None:
            return _tidy(min(self.low + round(u * self.n_steps) * self.step, self.high))
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

    def bounds_text(self) -> str:
        return f"[{self.low}, {self.high}]"


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

    @property
    def is_discrete(self) -> bool:
        return True

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

    def bounds_text(self) -> str:
        return f"[{self.low}, {self.high}]"


class Discrete(_Param):
    """A number from an ordered set, e.g. the concentrations a lab stocks (0.057, 0.1, 0.153 M)."""

    type: Literal["discrete"] = "discrete"
    values: tuple[float, ...]

    def __init__(self, name: str | None = None, values: Sequence[float] | None = None, **kw: Any) -> None:
        if name is not None:
            kw.update(name=name, values=tuple(values) if values is not None else None)
        super().__init__(**kw)

    @field_validator("values", mode="before")
    @classmethod
    def _numbers(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)) and not all(_is_number(x) for x in v):
            raise ValueError(f"Discrete values must be numbers, got {list(v)}")
        return v

    @field_validator("values")
    @classmethod
    def _check_values(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not all(math.isfinite(x) for x in v):
            raise ValueError(f"Discrete values must be finite, got {list(v)}")
        s = tuple(sorted(set(v)))
        if len(s) != len(v):
            raise ValueError(f"duplicate values in {list(v)}")
        if len(s) < 2:
            raise ValueError("a Discrete parameter needs at least two values")
        return s

    @property
    def is_discrete(self) -> bool:
        return True

    @property
    def low(self) -> float:
        return self.values[0]

    @property
    def high(self) -> float:
        return self.values[-1]

    def to_unit(self, v: float) -> float:
        return (v - self.low) / (self.high - self.low)

    def grid(self) -> list[float]:
        return [self.to_unit(v) for v in self.values]

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        return self.values[int(np.argmin([abs(g - u) for g in self.grid()]))]

    def check(self, v: Any) -> tuple[float, bool]:
        if not _is_number(v) or not math.isfinite(float(v)):
            raise SearchSpaceError(
                f"parameter {self.name!r} expects one of {list(self.values)}, got {type(v).__name__} {v!r}")
        v = float(v)
        return v, any(abs(v - x) <= 1e-9 * max(1.0, abs(x)) for x in self.values)

    def bounds_text(self) -> str:
        return f"{list(self.values)}"


class Categorical(_Param):
    """A parameter taking one of ``choices`` (strings, numbers or booleans).

    ``descriptors`` (optional) gives each choice the same number of numeric features, e.g.
    ``{"DMSO": [46.7, 189.0], "water": [80.1, 100.0]}`` (dielectric constant, boiling
    point): models then compare choices through these features (scaled to [0, 1]) instead
    of treating every pair of choices alike.

    Reagents can be given by structure instead: ``choices`` as a dict choice -> SMILES
    (``None`` or ``""`` for a choice without one, e.g. "no additive"), and ``encoding``
    (``"rdkit"``, the default, or ``"morgan"``) with ``n_components`` (default 5): the
    descriptors are then computed with RDKit (``pip install 'labfbo[chem]'``) and reduced by
    :mod:`labfbo.space.chem`; see also :meth:`from_smiles`. The SMILES and the encoding are kept
    on the parameter for display; the computed ``descriptors`` are what models see and what
    the space's identity holds, so a journal replays without RDKit.
    """

    type: Literal["categorical"] = "categorical"
    choices: tuple[Choice, ...]
    descriptors: tuple[tuple[float, ...], ...] | None = None
    smiles: tuple[str | None, ...] | None = Field(None, description="each choice's structure (None: no structure)")
    encoding: str | None = Field(None, description="how the descriptors were computed from the SMILES")

    def __init__(self, name: str | None = None,
                 choices: Sequence[Choice] | Mapping[Choice, str | None] | None = None,
                 descriptors: Mapping[Any, Sequence[float]] | Sequence[Sequence[float]] | None = None,
                 *, encoding: str | None = None, n_components: int | None = None, **kw: Any) -> None:
        if name is None:
            kw.update({k: v for k, v in (("choices", choices), ("descriptors", descriptors),
                                         ("encoding", encoding)) if v is not None})
        else:
            smiles = kw.pop("smiles", None)
            if isinstance(choices, Mapping):
                if smiles is not None:
                    raise SearchSpaceError(f"Categorical {name!r}: give the SMILES either as the choices dict "
                                           "or as smiles=, not both")
                smiles, choices = tuple(choices.values()), tuple(choices)
            kw.update(name=name, choices=tuple(choices) if choices is not None else None)
            if smiles is not None:
                from labfbo.space.chem import DEFAULT_COMPONENTS, has_structure, smiles_descriptors

                smiles = tuple(s if s is None or not isinstance(s, str) or has_structure(s) else None
                               for s in smiles)
                if descriptors is None:
                    encoding = encoding or "rdkit"
                    descriptors = smiles_descriptors(name, kw["choices"] or (), smiles, encoding,
                                                     DEFAULT_COMPONENTS if n_components is None else n_components)
                kw.update(smiles=smiles, encoding=encoding)
            elif encoding is not None or n_components is not None:
                raise SearchSpaceError(f"Categorical {name!r}: encoding= and n_components= describe choices by "
                                       "structure; give the choices as a dict choice -> SMILES "
                                       "(or use Categorical.from_smiles)")
            if descriptors is not None:
                kw["descriptors"] = _descriptor_rows(name, kw["choices"], descriptors)
        super().__init__(**kw)

    @classmethod
    def from_smiles(cls, name: str, smiles: Mapping[Choice, str | None], encoding: str = "rdkit",
                    n_components: int = 5, unit: str | None = None) -> "Categorical":
        """Choices described by their structure: ``{choice: SMILES}`` (``None`` for a choice
        without one), descriptors computed with RDKit and reduced (:mod:`labfbo.space.chem`)."""
        if not isinstance(smiles, Mapping):
            raise SearchSpaceError(f"Categorical {name!r}: from_smiles needs a dict choice -> SMILES, "
                                   f"got {type(smiles).__name__}")
        return cls(name, smiles, encoding=encoding, n_components=n_components, unit=unit)

    @field_validator("choices")
    @classmethod
    def _check_choices(cls, v: tuple[Choice, ...]) -> tuple[Choice, ...]:
        if len(v) < 2:
            raise ValueError("a Categorical needs at least two choices")
        keys = [(type(c).__name__, c) for c in v]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate choices in {list(v)}")
        return v

    @model_validator(mode="after")
    def _check_descriptors(self) -> "Categorical":
        D = self.descriptors
        if D is None:
            return self
        if len(D) != len(self.choices):
            raise ValueError(f"Categorical {self.name!r}: {len(D)} descriptor rows for {len(self.choices)} choices")
        lengths = {len(r) for r in D}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"Categorical {self.name!r}: every choice needs the same number (>= 1) of "
                             f"descriptors, got lengths {sorted(lengths)}")
        if not all(math.isfinite(x) for r in D for x in r):
            raise ValueError(f"Categorical {self.name!r}: descriptors must be finite numbers")
        if len(set(D)) < len(D):
            raise ValueError(f"Categorical {self.name!r}: two choices have identical descriptors, so no model "
                             "could tell them apart")
        return self

    @model_validator(mode="after")
    def _check_smiles(self) -> "Categorical":
        if self.smiles is None:
            if self.encoding is not None:
                raise ValueError(f"Categorical {self.name!r}: encoding={self.encoding!r} without SMILES")
            return self
        if len(self.smiles) != len(self.choices):
            raise ValueError(f"Categorical {self.name!r}: {len(self.smiles)} SMILES for {len(self.choices)} choices")
        if self.descriptors is None:
            raise ValueError(f"Categorical {self.name!r}: SMILES without descriptors; build it with "
                             "Categorical.from_smiles (or Categorical(name, {choice: smiles}))")
        return self

    @property
    def is_discrete(self) -> bool:
        return True

    def scaled_descriptors(self) -> np.ndarray:
        """``(k, m)`` descriptors, each column min-max scaled to [0, 1] over the choices."""
        if self.descriptors is None:
            raise SearchSpaceError(f"parameter {self.name!r} has no descriptors")
        D = np.asarray(self.descriptors, dtype=np.float64)
        lo, span = D.min(0), D.max(0) - D.min(0)
        return np.where(span > 0, (D - lo) / np.where(span > 0, span, 1.0), 0.0)

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
        return self.choices[choice_index(float(u), len(self.choices))]

    def grid(self) -> list[float]:
        k = len(self.choices) - 1
        return [j / k for j in range(k + 1)]

    def check(self, v: Any) -> tuple[Choice, bool]:
        return self.choices[self.index(v)], True


def _descriptor_rows(name: str, choices: tuple[Choice, ...] | None,
                     descriptors: Mapping[Any, Sequence[float]] | Sequence[Sequence[float]]) -> Any:
    """A dict choice -> features (or rows aligned with ``choices``) as rows in choice order."""
    if not isinstance(descriptors, Mapping) or choices is None:
        return [tuple(r) for r in descriptors] if not isinstance(descriptors, Mapping) else descriptors
    missing = [c for c in choices if c not in descriptors]
    extra = [c for c in descriptors if c not in choices]
    if missing or extra:
        raise SearchSpaceError(f"Categorical {name!r}: descriptors must cover exactly the choices"
                               + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else ""))
    rows = []
    for c in choices:
        row = descriptors[c]
        if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__") or not all(_is_number(x) for x in row):
            raise SearchSpaceError(f"Categorical {name!r}: descriptors of {c!r} must be numbers, got {row!r}")
        rows.append(tuple(float(x) for x in row))
    return rows


Param = Annotated[Union[Real, Integer, Discrete, Categorical], Field(discriminator="type")]
