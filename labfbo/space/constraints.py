r"""Parameter constraints: what a lab may not propose.

* :class:`LinearConstraint` — :math:`\sum_i a_i v_i \;(\le, \ge, =)\; b` over linear-scale,
  unstepped ``Real`` parameters (user units). In the unit cube, where
  :math:`v_i = l_i + u_i (h_i - l_i)`, it is :math:`\sum_i a_i (h_i - l_i) u_i \;\mathrm{op}\;
  b - \sum_i a_i l_i`: still linear, so BoTorch's ``optimize_acqf`` enforces it (SLSQP) and
  its initial conditions are drawn from the polytope (hit-and-run).
* :class:`Forbidden` — a combination of categorical / discrete values that may not be run
  together. It compiles into the space's table of feasible combinations, the same table
  ``allowed=`` gives (:mod:`labfbo.space.search`): one mechanism.
* :class:`NonlinearConstraint` — a named callable ``g(params) -> float``, feasible when
  :math:`g \ge 0`. It is **site-local**: code cannot be hashed or sent, so each site
  enforces its own; its name is listed when the site joins.

Linear constraints and forbidden combinations belong to the :class:`~labfbo.space.search.SearchSpace`
and so to the study's identity (its fingerprint). The feasible set of the linear
constraints and the box is convex: :func:`project` maps any unit-cube point to its nearest
feasible point (Dykstra's alternating projections, vectorized over points), which is what
``SearchSpace.snap`` does after rounding the grid columns.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from labfbo.core.exceptions import SearchSpaceError
from labfbo.space.params import Choice, Real, _Checked

#: an equality holds, and an inequality is met, to this fraction of max(|rhs|, sum |a_i v_i|, 1e-12)
REL_TOL = 1e-6
_PROJECT_ITERS = 500


class LinearConstraint(_Checked):
    """``sum(coefficients[name] * value) op rhs`` over linear-scale, unstepped ``Real`` parameters.

    >>> LinearConstraint({"a": 1, "b": 1, "c": 1}, "==", 1.0)   # three fractions add up to 1
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["linear"] = "linear"
    coefficients: dict[str, float] = Field(min_length=1)
    op: Literal["<=", ">=", "=="]
    rhs: float

    def __init__(self, coefficients: dict[str, float] | None = None, op: str | None = None,
                 rhs: float | None = None, **kw: Any) -> None:
        if coefficients is not None:
            kw.update(coefficients=coefficients, op=op, rhs=rhs)
        if kw.get("op") not in ("<=", ">=", "=="):
            raise SearchSpaceError(f"LinearConstraint: op must be '<=', '>=' or '==', got {kw.get('op')!r}")
        super().__init__(**kw)

    @field_validator("coefficients")
    @classmethod
    def _finite(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [n for n, a in v.items() if not math.isfinite(a)]
        if bad:
            raise ValueError(f"LinearConstraint: coefficients of {bad} are not finite")
        if all(a == 0 for a in v.values()):
            raise ValueError("LinearConstraint: every coefficient is 0")
        return v

    @field_validator("rhs")
    @classmethod
    def _finite_rhs(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"LinearConstraint: rhs must be finite, got {v}")
        return v

    def __str__(self) -> str:
        lhs = " + ".join(f"{a:g}*{n}" for n, a in self.coefficients.items())
        return f"{lhs} {self.op} {self.rhs:g}"

    def span(self, by_name: dict[str, Any]) -> float:
        r"""The range of the left side over the parameters' box: :math:`\sum_i |a_i| (h_i - l_i)`."""
        return math.fsum(abs(a) * (by_name[n].high - by_name[n].low) for n, a in self.coefficients.items())

    def check_space(self, by_name: dict[str, Any]) -> None:
        for n in self.coefficients:
            p = by_name.get(n)
            if p is None:
                raise SearchSpaceError(f"linear constraint {self}: unknown parameter {n!r}; the space has "
                                       f"{list(by_name)}")
            if not isinstance(p, Real) or p.log or p.step is not None:
                what = ("log-scaled" if isinstance(p, Real) and p.log else "stepped" if isinstance(p, Real)
                        else p.type)
                raise SearchSpaceError(f"linear constraint {self}: parameter {n!r} is {what}; a linear constraint "
                                       "is over Real parameters on a linear scale without step")

    def violation(self, values: dict[str, float], span: float = 0.0) -> float:
        r"""How far ``values`` (user units) are from meeting it, relative to ``max(|rhs|, span,
        sum |a_i v_i|)`` (0 when met); ``span``: the left side's range over the box,
        :math:`\sum_i |a_i| (h_i - l_i)` (:meth:`span`), so a right side of 0 is no special case."""
        terms = [a * float(values[n]) for n, a in self.coefficients.items()]
        lhs = math.fsum(terms)
        scale = max(abs(self.rhs), span, math.fsum(abs(t) for t in terms), 1e-12)
        gap = {"<=": lhs - self.rhs, ">=": self.rhs - lhs, "==": abs(lhs - self.rhs)}[self.op]
        return max(gap, 0.0) / scale


class Forbidden(_Checked):
    """A combination of categorical / discrete values that is never proposed.

    >>> Forbidden({"base": "KOAc", "solvent": "DMAc"})
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["forbidden"] = "forbidden"
    combination: dict[str, Choice] = Field(min_length=1)

    def __init__(self, combination: dict[str, Choice] | None = None, **kw: Any) -> None:
        if combination is not None:
            kw.update(combination=combination)
        super().__init__(**kw)

    def __str__(self) -> str:
        return "forbidden " + ", ".join(f"{n}={v!r}" for n, v in self.combination.items())

    def check_space(self, by_name: dict[str, Any]) -> dict[str, Any]:
        """The combination with each value checked against its parameter (canonical values)."""
        out = {}
        for n, v in self.combination.items():
            p = by_name.get(n)
            if p is None:
                raise SearchSpaceError(f"{self}: unknown parameter {n!r}; the space has {list(by_name)}")
            if not p.is_discrete:
                raise SearchSpaceError(f"{self}: {n!r} can take any value in a range; forbidden combinations are "
                                       "over categorical, discrete, integer and stepped parameters (use a "
                                       "LinearConstraint or a NonlinearConstraint for a continuous one)")
            value, inside = p.check(v)
            if not inside:
                raise SearchSpaceError(f"{self}: {n}={v!r} is not a value of the parameter")
            out[n] = p.from_unit(p.to_unit(value))
        return out


SpaceConstraint = LinearConstraint | Forbidden


class NonlinearConstraint:
    """A site-local constraint: ``fn(params) >= 0`` where feasible (``params`` in user units).

    Never sent: partners see only its ``name`` (listed when the site joins). Each site
    enforces its own, on every proposal it makes.
    """

    def __init__(self, name: str, fn: Callable[[dict[str, Any]], float]) -> None:
        if not isinstance(name, str) or not name:
            raise SearchSpaceError("a NonlinearConstraint needs a non-empty name")
        if not callable(fn):
            raise SearchSpaceError(f"NonlinearConstraint {name!r}: fn must be callable, got {type(fn).__name__}")
        self.name, self.fn = name, fn

    def __call__(self, params: dict[str, Any]) -> float:
        try:
            g = float(self.fn(params))
        except Exception as exc:  # the lab's own code: name it in the error
            raise SearchSpaceError(f"nonlinear constraint {self.name!r} raised {type(exc).__name__}: {exc} "
                                   f"at {params}") from exc
        if math.isnan(g):
            raise SearchSpaceError(f"nonlinear constraint {self.name!r} returned NaN at {params}")
        return g

    def __repr__(self) -> str:
        return f"NonlinearConstraint({self.name!r})"


def compile_table(params: tuple[Any, ...], allowed_names: tuple[str, ...] | None,
                  allowed: tuple[tuple[Choice, ...], ...] | None, forbidden: list[dict[str, Any]],
                  limit: int) -> tuple[tuple[str, ...], tuple[tuple[Choice, ...], ...]]:
    """The table of feasible combinations: ``allowed`` (or every combination), over the
    parameters it or a forbidden combination names (in the space's order), without the rows
    a forbidden combination matches; sorted by their unit-cube codes."""
    by_name = {p.name: p for p in params}
    names = set(allowed_names or ()).union(*forbidden)
    order = [p.name for p in params if p.name in names]
    extra = [n for n in order if n not in (allowed_names or ())]
    values = {n: [by_name[n].from_unit(u) for u in by_name[n].grid()] for n in extra}
    base = [dict(zip(allowed_names or (), r)) for r in allowed] if allowed is not None else [{}]
    if len(base) * math.prod(len(v) for v in values.values()) > limit:
        raise SearchSpaceError(f"forbidden combinations over {order}: more than {limit} combinations to list; "
                               "restrict fewer parameters")
    rows = []
    for b in base:
        for combo in itertools.product(*(values[n] for n in extra)):
            row = {**b, **dict(zip(extra, combo))}
            if not any(all(row[n] == v for n, v in f.items()) for f in forbidden):
                rows.append(tuple(row[n] for n in order))
    if not rows:
        raise SearchSpaceError("the forbidden combinations forbid every combination")
    codes = {r: tuple(by_name[n].to_unit(v) for n, v in zip(order, r)) for r in rows}
    return tuple(order), tuple(sorted(rows, key=lambda r: codes[r]))


def nearest_unused(pool: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """For each target in turn, the nearest (Euclidean) pool point not taken yet (repeated pool
    rows count once; the pool is reused once every point is taken)."""
    _, first = np.unique(np.round(pool, 12), axis=0, return_index=True)
    pool = pool[np.sort(first)]
    free = np.ones(len(pool), dtype=bool)
    out = np.empty((len(targets), pool.shape[1]))
    for i, u in enumerate(targets):
        j = int(np.argmin(np.where(free, ((pool - u) ** 2).sum(1), np.inf)))
        out[i], free[j] = pool[j], False
        if not free.any():
            free[:] = True
    return out


# -- the linear part in unit-cube coordinates -------------------------------------------------
class UnitPolytope:
    r"""The linear constraints in the unit cube: :math:`A_{\ge} u \ge b_{\ge}`, :math:`A_= u = b_=`."""

    def __init__(self, params: tuple[Any, ...], constraints: list[LinearConstraint]) -> None:
        d = len(params)
        index = {p.name: j for j, p in enumerate(params)}
        ge, eq, ge_names = [], [], []
        for c in constraints:
            a = np.zeros(d)
            b = c.rhs
            for n, coef in c.coefficients.items():
                p = params[index[n]]
                a[index[n]] = coef * (p.high - p.low)
                b -= coef * p.low
            if c.op == "<=":
                a, b = -a, -b
            (eq if c.op == "==" else ge).append((a, b))
            if c.op != "==":
                ge_names.append(str(c))
        self.dim = d
        self.A_ge = np.array([a for a, _ in ge]).reshape(-1, d)
        self.b_ge = np.array([b for _, b in ge], dtype=np.float64)
        self.A_eq = np.array([a for a, _ in eq]).reshape(-1, d)
        self.b_eq = np.array([b for _, b in eq], dtype=np.float64)
        self.check_feasible(ge_names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnitPolytope) and all(
            np.array_equal(a, b) for a, b in zip((self.A_ge, self.b_ge, self.A_eq, self.b_eq),
                                                 (other.A_ge, other.b_ge, other.A_eq, other.b_eq)))

    def _lp(self, c: np.ndarray) -> Any:
        from scipy.optimize import linprog

        return linprog(c, A_ub=-self.A_ge if len(self.A_ge) else None, b_ub=-self.b_ge if len(self.b_ge) else None,
                       A_eq=self.A_eq if len(self.A_eq) else None, b_eq=self.b_eq if len(self.b_eq) else None,
                       bounds=[(0.0, 1.0)] * self.dim, method="highs")

    def check_feasible(self, names: list[str]) -> None:
        """Refuse constraints that leave no point of the box, and inequalities that can only hold
        with equality (an interior-less polytope cannot be sampled: declare those with ``==``)."""
        if self._lp(np.zeros(self.dim)).status != 0:
            raise SearchSpaceError("the linear constraints leave no feasible point inside the parameters' bounds")
        for a, b, name in zip(self.A_ge, self.b_ge, names):
            res = self._lp(-a)  # the most slack this inequality can have
            if res.status == 0 and -res.fun - b < 1e-9 * max(1.0, float(np.abs(a).sum())):
                raise SearchSpaceError(f"linear constraint {name} can only hold with equality given the others and "
                                       "the bounds: declare it with '==' (or drop the redundant one)")

    def botorch(self) -> tuple[list[tuple[Any, Any, float]] | None, list[tuple[Any, Any, float]] | None]:
        """``(inequality_constraints, equality_constraints)`` in BoTorch's ``(indices, coefficients,
        rhs)`` form, meaning ``sum(X[indices] * coefficients) >= rhs`` (resp. ``==``)."""
        import torch

        def rows(A: np.ndarray, b: np.ndarray) -> list[tuple[Any, Any, float]] | None:
            out = []
            for a, r in zip(A, b):
                idx = np.flatnonzero(a)
                out.append((torch.as_tensor(idx, dtype=torch.long), torch.as_tensor(a[idx], dtype=torch.float64),
                            float(r)))
            return out or None

        return rows(self.A_ge, self.b_ge), rows(self.A_eq, self.b_eq)

    def residual(self, U: np.ndarray) -> np.ndarray:
        """The largest violation per point, in unit-cube units (0 where feasible)."""
        U = np.atleast_2d(U)
        r = np.zeros(len(U))
        if len(self.A_ge):
            r = np.maximum(r, (self.b_ge[None] - U @ self.A_ge.T).max(1))
        if len(self.A_eq):
            r = np.maximum(r, np.abs(U @ self.A_eq.T - self.b_eq[None]).max(1))
        return np.maximum(r, 0.0)

    def project(self, U: np.ndarray, tol: float = 1e-12) -> np.ndarray:
        r"""The Euclidean projection of each row of ``U`` onto {box} ∩ {constraints}: Dykstra's
        algorithm over the half-spaces, hyperplanes and the box (each projection closed-form).
        Rows that are already feasible are returned unchanged."""
        U = np.array(U, dtype=np.float64)
        flat = U.reshape(-1, self.dim)
        bad = self.residual(flat) > tol
        bad |= ((flat < 0.0) | (flat > 1.0)).any(1)
        if not bad.any():
            return U
        x = flat[bad].copy()
        sets: list[Callable[[np.ndarray], np.ndarray]] = [lambda z: np.clip(z, 0.0, 1.0)]
        for a, b in zip(self.A_ge, self.b_ge):
            sets.append(lambda z, a=a, b=b: z + np.maximum(b - z @ a, 0.0)[:, None] * a / (a @ a))
        for a, b in zip(self.A_eq, self.b_eq):
            sets.append(lambda z, a=a, b=b: z + (b - z @ a)[:, None] * a / (a @ a))
        incr = [np.zeros_like(x) for _ in sets]
        for _ in range(_PROJECT_ITERS):
            prev = x
            for k, proj in enumerate(sets):
                y = proj(x + incr[k])
                incr[k] = x + incr[k] - y
                x = y
            if np.abs(x - prev).max() < tol and self.residual(x).max() < 1e-10:
                break
        x = np.clip(x, 0.0, 1.0)
        stuck = np.flatnonzero(self.residual(x) > 1e-10)
        for i in stuck:  # Dykstra converges slowly at nearly parallel faces: solve the projection exactly
            x[i] = self._exact_projection(flat[bad][i])
        flat[bad] = x
        return flat.reshape(U.shape)

    def _exact_projection(self, u: np.ndarray) -> np.ndarray:
        """argmin ||x - u||^2 over the polytope, by SLSQP from the feasible point nearest to u that a
        linear program finds; raises if no point within 1e-9 of the constraints is found."""
        from scipy.optimize import minimize

        act = np.flatnonzero(np.abs(np.vstack([self.A_ge, self.A_eq])).sum(0) > 0)  # columns the constraints use
        Ag, Ae = self.A_ge[:, act], self.A_eq[:, act]
        cons = [{"type": "ineq", "fun": lambda z: Ag @ z - self.b_ge, "jac": lambda z: Ag}] if len(Ag) else []
        if len(Ae):
            cons.append({"type": "eq", "fun": lambda z: Ae @ z - self.b_eq, "jac": lambda z: Ae})
        start = np.clip(self._lp(np.zeros(self.dim)).x, 0.0, 1.0)
        res = minimize(lambda z: float(((z - u[act]) ** 2).sum()), start[act], jac=lambda z: 2 * (z - u[act]),
                       method="SLSQP", bounds=[(0.0, 1.0)] * len(act), constraints=cons,
                       options={"ftol": 1e-15, "maxiter": 500})
        x = np.clip(np.array(u, dtype=np.float64), 0.0, 1.0)  # the other columns stay as they are
        x[act] = np.clip(res.x, 0.0, 1.0)
        if self.residual(x)[0] > 1e-9:
            x[act] = start[act]
        if self.residual(x)[0] > 1e-9:
            raise SearchSpaceError("cannot find a point that meets the linear constraints to 1e-9; check them")
        return x

    def sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` points spread over the feasible polytope (hit-and-run, many chains at once:
        :func:`labfbo.space.polytope.hit_and_run`, seeded); an interior-less polytope (equalities that pin
        a column to a bound) gets seeded uniform points projected onto it."""
        from labfbo.space.polytope import hit_and_run

        X = hit_and_run(self.A_ge, self.b_ge, self.A_eq, self.b_eq, n, seed)
        if X is None:
            X = np.random.default_rng(seed).random((n, self.dim))
        return self.project(X)
