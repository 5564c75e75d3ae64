r"""Search spaces: an ordered set of parameters, the unit-cube encoding, allowed combinations.

Every model in labfbo works on the unit cube :math:`[0, 1]^d` with **one column per
parameter**, in the order the parameters were declared (each parameter's coding is in
:mod:`labfbo.space.params`). Columns with finitely many values (``Integer``, ``Discrete``,
``Real(step=...)``, ``Categorical``) have a grid; the acquisition optimizer searches only
the grid, and :meth:`SearchSpace.snap` rounds any point onto it.

``allowed`` (optional) lists the combinations of discrete parameters a lab can run (the
reagents in stock, the plate layouts that exist): every proposal is one of them. It is the
lab's own stock: partners may stock different combinations of the same parameters.
``constraints`` (optional, :mod:`labfbo.space.constraints`): linear constraints over real
parameters, forbidden combinations, and site-local nonlinear constraints. Forbidden
combinations and ``allowed`` compile into one table of feasible combinations (the
*table*); every grid method below reads it. The study's identity is :meth:`SearchSpace.shared`
(parameters, linear constraints, forbidden combinations): partners must agree on it; a lab's
``allowed`` stock and its nonlinear constraints are not part of it and stay with their site
(never sent). :meth:`SearchSpace.fingerprint` is the whole space's (a journal's) identity.

Decoding clamps to the box, so ``decode`` always returns valid params in user units.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter
from typing import Annotated, Any, Iterable, Sequence

import numpy as np
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator
from scipy.stats import qmc

from labfbo.core.exceptions import SearchSpaceError
from labfbo.space.constraints import (
    REL_TOL,
    Forbidden,
    LinearConstraint,
    NonlinearConstraint,
    UnitPolytope,
    compile_table,
    nearest_unused,
)
from labfbo.space.diff import space_differences
from labfbo.space.params import Categorical, Choice, Discrete, Integer, Param, Real, _Checked, choice_index  # noqa: F401 (re-exported)

#: allowed combinations x the other grid values: a larger table is refused
MAX_TABLE_CANDIDATES = 200_000
MAX_PARAMS = 1000  # parameters per space; also bounds what a coordinator parses from a join

__all__ = ["Categorical", "Discrete", "Integer", "Real", "SearchSpace", "Choice", "Param"]


class SearchSpace(_Checked):
    """An ordered set of named parameters; encodes params to the unit cube and back.

    >>> space = SearchSpace([Real("t", 150, 250), Categorical("s", ["water", "dmso"])])
    >>> space.decode(space.encode([{"t": 200.0, "s": "dmso"}]))
    [{'t': 200.0, 's': 'dmso'}]

    ``allowed``: a list of dicts (or a pandas DataFrame) over some of the discrete
    parameters; only those combinations are ever proposed. ``constraints``: a list of
    :class:`~labfbo.LinearConstraint`, :class:`~labfbo.Forbidden` and (site-local)
    :class:`~labfbo.NonlinearConstraint`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    params: tuple[Param, ...]
    allowed_names: tuple[str, ...] | None = None
    allowed: tuple[tuple[Choice, ...], ...] | None = None
    constraints: tuple[Annotated[LinearConstraint | Forbidden, Field(discriminator="type")], ...] | None = None
    _table_names: tuple[str, ...] | None = PrivateAttr(None)
    _table: tuple[tuple[Choice, ...], ...] | None = PrivateAttr(None)
    _polytope: UnitPolytope | None = PrivateAttr(None)
    _local: tuple[NonlinearConstraint, ...] = PrivateAttr(())

    def __init__(self, params: Iterable[Any] | None = None, allowed: Any = None,
                 constraints: Iterable[Any] | None = None, **kw: Any) -> None:
        if params is not None:
            kw["params"] = tuple(params)
        local: list[NonlinearConstraint] = []
        if constraints is not None:
            shared = []
            for c in constraints:
                if isinstance(c, NonlinearConstraint):
                    local.append(c)
                elif isinstance(c, (LinearConstraint, Forbidden, dict)):
                    shared.append(c)
                else:
                    raise SearchSpaceError(f"constraints: expected LinearConstraint, Forbidden or "
                                           f"NonlinearConstraint, got {type(c).__name__}")
            kw["constraints"] = tuple(shared) or None
        if allowed is not None and "allowed_names" in kw:  # the stored form (names + value rows), e.g. from JSON
            kw["allowed"] = tuple(tuple(r) for r in allowed)
        elif allowed is not None:
            rows = allowed.to_dict("records") if hasattr(allowed, "to_dict") else list(allowed)
            if not rows or not all(isinstance(r, dict) for r in rows):
                raise SearchSpaceError("allowed must be a non-empty list of dicts (or a DataFrame) of combinations")
            names = list(rows[0])
            for r in rows:
                if list(r) != names and set(r) != set(names):
                    raise SearchSpaceError(f"allowed: every combination needs the same parameters; "
                                           f"{sorted(r, key=str)} != {sorted(names, key=str)}")
            kw["allowed_names"] = tuple(names)
            kw["allowed"] = tuple(tuple(r[n] for n in names) for r in rows)
        super().__init__(**kw)
        names = [c.name for c in local]
        if len(set(names)) != len(names):
            raise SearchSpaceError(f"constraints: nonlinear constraint names must be unique, got {names}")
        self._local = tuple(local)

    def _compile_constraints(self) -> "SearchSpace":
        """Canonical constraints (checked, values canonical, sorted: the fingerprint does not depend
        on how they were written), then the table of feasible combinations (from the canonical
        ``allowed``) and the linear constraints' polytope."""
        by_name = {p.name: p for p in self.params}
        canon: list[LinearConstraint | Forbidden] = []
        for c in self.constraints or ():
            if isinstance(c, LinearConstraint):
                c.check_space(by_name)
                canon.append(c)
            else:
                canon.append(Forbidden(c.check_space(by_name)))
        canon = [c for _, c in sorted({c.model_dump_json(): c for c in canon}.items())]
        if self.constraints is not None:
            object.__setattr__(self, "constraints", tuple(canon))
        linear = [c for c in canon if isinstance(c, LinearConstraint)]
        self._polytope = UnitPolytope(self.params, linear) if linear else None
        forbidden = [c.combination for c in canon if isinstance(c, Forbidden)]
        self._table_names, self._table = self.allowed_names, self.allowed
        if forbidden:
            self._table_names, self._table = compile_table(self.params, self.allowed_names, self.allowed, forbidden,
                                                           MAX_TABLE_CANDIDATES)
        return self

    @field_validator("params")
    @classmethod
    def _check_params(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        if not v:
            raise ValueError("a SearchSpace needs at least one parameter")
        if len(v) > MAX_PARAMS:
            raise ValueError(f"a SearchSpace has at most {MAX_PARAMS} parameters, got {len(v)} (a GP model "
                             "cannot learn from so many inputs with a lab's budget)")
        counts = Counter(p.name for p in v)
        dup = sorted(n for n, c in counts.items() if c > 1)
        if dup:
            raise ValueError(f"duplicate parameter names: {dup}")
        return v

    @model_validator(mode="after")
    def _check_allowed(self) -> "SearchSpace":
        if (self.allowed is None) != (self.allowed_names is None):
            raise ValueError("allowed and allowed_names go together")
        if self.allowed is None:
            return self._compile_constraints()
        by_name = {p.name: p for p in self.params}
        names = list(self.allowed_names or ())
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"allowed: unknown parameter(s) {unknown}; the space has {self.names}")
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"allowed: duplicate or no parameter names {names}")
        cont = [n for n in names if not by_name[n].is_discrete]
        if cont:
            raise ValueError(f"allowed: {cont} can take any value in a range; allowed combinations are over "
                             "categorical, discrete, integer and stepped parameters")
        order = [p.name for p in self.params if p.name in names]  # canonical: the space's order
        canon = set()
        for row in self.allowed:
            values = dict(zip(names, row))
            clean = []
            for n in order:
                v, inside = by_name[n].check(values[n])
                if not inside:
                    raise ValueError(f"allowed: {n}={values[n]!r} is not a value of the parameter "
                                     f"({by_name[n].bounds_text() if hasattr(by_name[n], 'bounds_text') else ''})")
                clean.append(by_name[n].from_unit(by_name[n].to_unit(v)))
            canon.add(tuple(clean))
        if not canon:
            raise ValueError("allowed: the table lists no combination")
        codes = {row: tuple(by_name[n].to_unit(v) for n, v in zip(order, row)) for row in canon}
        object.__setattr__(self, "allowed_names", tuple(order))
        object.__setattr__(self, "allowed", tuple(sorted(canon, key=lambda r: codes[r])))
        self._compile_constraints()
        if self._n_feasible() > MAX_TABLE_CANDIDATES:
            raise ValueError(f"allowed: {len(canon)} combinations times the other discrete parameters' values make "
                             f"{self._n_feasible()} candidates (at most {MAX_TABLE_CANDIDATES}); restrict fewer "
                             "parameters or list fewer combinations")
        return self

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
        """Ordered discrete columns (integer, discrete, stepped real) and their unit-cube grid."""
        return {i: p.grid() for i, p in enumerate(self.params) if p.is_discrete and not isinstance(p, Categorical)}

    def descriptor_dims(self) -> list[int]:
        """Categorical columns whose choices carry descriptors."""
        return [i for i, p in enumerate(self.params) if isinstance(p, Categorical) and p.descriptors is not None]

    @property
    def is_continuous(self) -> bool:
        """True if no column is restricted to a grid."""
        return not any(p.is_discrete for p in self.params)

    @property
    def restricted(self) -> bool:
        """True if a table (``allowed`` or forbidden combinations) restricts the grid columns."""
        return self._table is not None

    @property
    def linear(self) -> UnitPolytope | None:
        """The linear constraints in unit-cube coordinates (None without any)."""
        return self._polytope

    @property
    def local_constraints(self) -> tuple[NonlinearConstraint, ...]:
        """This site's nonlinear constraints (never part of the study's identity)."""
        return self._local

    @property
    def constrained(self) -> bool:
        """True if anything besides the box and the grids restricts the proposals."""
        return self._table is not None or self._polytope is not None or bool(self._local)

    def allowed_dims(self) -> list[int]:
        """Columns the table of feasible combinations restricts (empty without one)."""
        names = set(self._table_names or ())
        return [i for i, p in enumerate(self.params) if p.name in names]

    def allowed_codes(self) -> np.ndarray:
        """``(m, len(allowed_dims))`` unit-cube codes of the table's combinations."""
        dims = self.allowed_dims()
        return np.array([[self.params[j].to_unit(v) for j, v in zip(dims, row)] for row in self._table or ()],
                        dtype=np.float64).reshape(-1, len(dims))

    def feasible_grid(self, limit: int, seed: int = 0) -> np.ndarray | None:
        """Every feasible combination of the grid columns, ``(m, n_grid)`` in column order, or
        None if there are more than ``limit`` (with ``allowed``: a seeded random ``limit`` of them,
        since no local search could respect the table). A fully discrete space's rows are points."""
        grids = {**self.discrete_dims(), **self.cat_dims()}
        cols = sorted(grids)
        restricted = self.allowed_dims()
        free = [j for j in cols if j not in restricted]
        if self._n_feasible() > limit and self._table is None:
            return None
        A = self.allowed_codes() if self._table is not None else np.zeros((1, 0))
        rows = [np.concatenate([a, f]) for a in A for f in itertools.product(*(grids[j] for j in free))]
        out = np.empty((len(rows), len(cols)))
        out[:, [cols.index(j) for j in restricted + free]] = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
        if len(out) > limit:
            out = out[np.sort(np.random.default_rng(seed).choice(len(out), limit, replace=False))]
        return out

    def _n_feasible(self) -> int:
        """The number of feasible combinations of the grid columns."""
        grids = {**self.discrete_dims(), **self.cat_dims()}
        free = [j for j in grids if j not in self.allowed_dims()]
        return (len(self._table or ()) or 1) * math.prod(len(grids[j]) for j in free)

    def shared(self) -> "SearchSpace":
        """The study's part of this space: its parameters and shared constraints (linear,
        forbidden), without the lab's stock (``allowed``) or its nonlinear constraints. A site sends
        only this at join; the coordinator, the study's design and every public seed a protocol
        derives from the space (a Fourier basis, a codebook) read only this, so labs with other
        stock share them. A space without ``allowed`` has the same fingerprint as its shared part."""
        if self.allowed is None and not self._local:
            return self
        data = self.model_dump(mode="json", exclude_none=True)
        data.pop("allowed", None)
        data.pop("allowed_names", None)
        return SearchSpace.model_validate(data)

    def fingerprint(self) -> str:
        """A stable hash of the space's canonical JSON, stock included (a journal's space; the
        study's identity is ``shared().fingerprint()``)."""
        canon = json.dumps(self.model_dump(mode="json", exclude_none=True), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def difference(self, other: "SearchSpace", mine: str = "this space", theirs: str = "the other space") -> str:
        """How ``other`` differs from this space, every difference named ("" if it does not);
        ``mine``, ``theirs``: what to call each (:mod:`labfbo.space.diff`)."""
        return "; ".join(space_differences(self, other, mine, theirs))

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
        values outside the bounds or not among a ``Discrete``'s values (otherwise they are
        returned in ``out_of_bounds``).
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
                    where = "one of" if isinstance(p, Discrete) else "outside"
                    raise SearchSpaceError(f"parameter {p.name!r}={value!r} is {'not ' if where == 'one of' else ''}"
                                           f"{where} {p.bounds_text()}")
                oob.append(p.name)
            clean[p.name] = value
        return clean, oob

    def is_allowed(self, params: dict[str, Any]) -> bool:
        """True if ``params`` is one of the table's combinations (always, without a table)."""
        if self._table is None:
            return True
        names = self._table_names or ()
        code = np.array([[self.params[j].to_unit(params[n]) for j, n in zip(self.allowed_dims(), names)]])
        return bool((np.abs(self.allowed_codes() - code).max(1) < 1e-9).any())

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

    def snap(self, X: np.ndarray, restrict: bool = True) -> np.ndarray:
        """Round unit-cube points to feasible values: every grid column onto its grid, then
        (with a table and ``restrict``) the restricted columns onto the nearest feasible
        combination (L1 distance of the codes; the first one on ties), and (``restrict``) the
        real columns onto the linear constraints (the nearest feasible point). Site-local
        nonlinear constraints are :meth:`repair`'s."""
        X = np.clip(np.array(X, dtype=np.float64), 0.0, 1.0)
        for c, p in enumerate(self.params):
            if isinstance(p, Categorical):
                k = len(p.choices)
                X[..., c] = choice_index(X[..., c], k) / (k - 1)
            elif isinstance(p, Discrete):
                g = np.asarray(p.grid())
                X[..., c] = g[np.abs(X[..., c, None] - g).argmin(-1)]
            elif isinstance(p, Integer) or p.step is not None:  # an evenly spaced grid of n + 1 values
                n = p.high - p.low if isinstance(p, Integer) else p.n_steps
                X[..., c] = np.round(X[..., c] * n) / n
        if restrict and self._polytope is not None and X.size:
            X = self._polytope.project(X)
        if restrict and self._table is not None and X.size:
            dims = self.allowed_dims()
            A = self.allowed_codes()
            flat = X.reshape(-1, self.dim)
            nearest = np.abs(flat[:, None, dims] - A[None]).sum(-1).argmin(1)
            flat[:, dims] = A[nearest]
            X = flat.reshape(X.shape)
        return X

    # -- constraints -----------------------------------------------------------------------
    def local_ok(self, X: np.ndarray) -> np.ndarray:
        """Which unit-cube points meet every site-local nonlinear constraint (``g >= 0``)."""
        X = np.atleast_2d(X)
        if not self._local:
            return np.ones(len(X), dtype=bool)
        return np.array([all(g(p) >= 0.0 for g in self._local) for p in self.decode(X)], dtype=bool)

    def feasible(self, X: np.ndarray) -> np.ndarray:
        """Which unit-cube points are proposals this site may make: on the grids, in the table,
        on the linear constraints' polytope and meeting its nonlinear constraints."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        return (np.abs(self.snap(X) - X).max(1) < 1e-9) & self.local_ok(X)

    def violations(self, params: dict[str, Any]) -> list[str]:
        """The constraints validated ``params`` (user units) break, described (empty if none)."""
        out = []
        if not self.is_allowed(params):
            out.append(f"{dict((n, params[n]) for n in self._table_names or ())} is not a feasible combination "
                       "(allowed= / Forbidden)")
        by_name = {p.name: p for p in self.params}
        for c in self.constraints or ():
            if isinstance(c, LinearConstraint) and (off := c.violation(params, c.span(by_name))) > REL_TOL:
                out.append(f"linear constraint {c} (off by {off:.2g}, relative)")
        out += [f"nonlinear constraint {g.name!r} ({g(params):.4g} < 0)" for g in self._local if g(params) < 0.0]
        return out

    def sample(self, n: int, seed: int) -> np.ndarray:
        """Up to ``n`` feasible unit-cube points spread over the space: scrambled Sobol points (with
        linear constraints, hit-and-run over their polytope), snapped; with nonlinear constraints
        only those that meet them (drawing up to 16x more). Raises if none does."""
        parts, m, drawn = [], n, 0
        for attempt in range(4 if self._local else 1):
            if self._polytope is not None:
                U = self._polytope.sample(m, seed + attempt)
            else:
                k = int(np.ceil(np.log2(max(m, 2))))
                U = qmc.Sobol(self.dim, scramble=True, seed=np.random.default_rng(seed + attempt)).random_base2(k)[:m]
            U = self.snap(U)
            drawn += len(U)
            parts.append(U[self.local_ok(U)])
            if sum(map(len, parts)) >= n:
                break
            m *= 2
        X = np.concatenate(parts)[:n]
        if not len(X):
            raise SearchSpaceError(f"no point meets the nonlinear constraint(s) {[g.name for g in self._local]} "
                                   f"among {drawn} samples of the space; check that they can be met")
        return X

    def repair(self, X: np.ndarray, seed: int, avoid: np.ndarray | None = None) -> np.ndarray:
        """Snap ``X`` (:meth:`snap`), then replace each point that breaks a nonlinear constraint by
        the nearest feasible point of a seeded sample (:meth:`sample`) that is neither another
        row of ``X`` nor one of ``avoid`` (e.g. the pending points) while there is one."""
        X = self.snap(X)
        bad = np.flatnonzero(~self.local_ok(X))
        if not len(bad):
            return X
        pool = self.sample(max(1024, 4 * len(X)), seed)
        taken = np.concatenate([np.delete(X, bad, axis=0), np.zeros((0, self.dim)) if avoid is None else avoid])
        if len(taken):
            fresh = np.abs(pool[:, None, :] - taken[None]).max(-1).min(1) > 1e-9
            pool = pool[fresh] if fresh.any() else pool
        X[bad] = nearest_unused(pool, X[bad])
        return X

    def design(self, U: np.ndarray, seed: int) -> np.ndarray:
        """Snap a space-filling design ``U (n, d)``; on a fully discrete space (where snapping
        can merge points, e.g. onto few allowed combinations) repeated rows are replaced by
        seeded random unused combinations while there are any. With linear or nonlinear
        constraints each row of ``U`` takes the nearest unused point of a feasible sample of
        ``max(512, 32 n)`` points instead, so the design stays spread and feasible."""
        if self._polytope is not None or self._local:
            return nearest_unused(self.sample(max(512, 32 * len(U)), seed), np.atleast_2d(U))
        X = self.snap(U)
        if len(self.discrete_dims()) + len(self.cat_dims()) < self.dim or len(X) < 2:
            return X
        grid = self.feasible_grid(MAX_TABLE_CANDIDATES, seed)
        if grid is None:
            return X
        gen = np.random.default_rng(seed)
        key = lambda row: tuple(np.round(row, 12))  # noqa: E731
        seen: set[tuple[float, ...]] = set()
        unused = [g for g in grid[gen.permutation(len(grid))] if key(g) not in {key(x) for x in X}]
        for i in range(len(X)):
            if key(X[i]) in seen and unused:
                X[i] = unused.pop()
            seen.add(key(X[i]))
        return X

    def vector(self, params: dict[str, Any]) -> list[Any]:
        """Params in the space's parameter order (user units)."""
        return [params[n] for n in self.names]
