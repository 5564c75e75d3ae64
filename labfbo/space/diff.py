"""How two search spaces differ, said parameter by parameter with each side named.

:func:`space_differences` lists what a person must change: a parameter missing on one side,
a changed type, the categorical choices or discrete values only on each side, other bounds,
scales or steps, then the shared constraints and ``allowed`` combinations (both part of the
study's identity, :meth:`labfbo.SearchSpace.fingerprint`). A site's own nonlinear
constraints never differ: they are not part of a space's identity.

:func:`study_difference` is the coordinator's wording: the study's side and the joining
lab's side.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence


class SearchSpace(Protocol):
    """What a comparison reads of a :class:`labfbo.SearchSpace` (this module is imported by
    ``labfbo.space.search``, so it names the type structurally instead of importing it)."""

    params: Any
    constraints: Any
    allowed: Any

    @property
    def names(self) -> list[str]: ...

    @property
    def allowed_names(self) -> Any: ...

    def fingerprint(self) -> str: ...

MAX_LISTED = 8  # values listed per side before "... and N more"


def _listed(values: Sequence[Any]) -> str:
    values = list(values)
    if len(values) <= MAX_LISTED:
        return repr(values)
    return repr(values[:MAX_LISTED])[:-1] + f", ... and {len(values) - MAX_LISTED} more]"


def _only(a: Sequence[Any], b: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The items of ``a`` not in ``b`` and of ``b`` not in ``a`` (each in its own order; ``1`` and
    ``True`` are different choices)."""
    key = lambda v: (type(v).__name__, v)  # noqa: E731
    ka, kb = {key(v) for v in a}, {key(v) for v in b}
    return [v for v in a if key(v) not in kb], [v for v in b if key(v) not in ka]


def _set_difference(what: str, a: Sequence[Any], b: Sequence[Any], sa: str, sb: str) -> str:
    only_a, only_b = _only(a, b)
    if not only_a and not only_b:
        return (f"the same {what} in another order (the order sets the encoding, it must match): "
                f"{sa} has {_listed(a)}, {sb} {_listed(b)}")
    parts = []
    if only_a:
        parts.append(f"{what} only in {sa}: {_listed(only_a)}")
    if only_b:
        parts.append(f"{'only' if parts else what + ' only'} in {sb}: {_listed(only_b)}")
    return " and ".join(parts) + f" ({sa} has {_listed(a)}, {sb} {_listed(b)})"


def _choice_difference(a: Sequence[Any], b: Sequence[Any], sa: str, sb: str) -> str:
    """How two choice lists differ; with no choice in common said so, and a list that is part of
    the other's told how a lab stocks only some choices (``allowed=``, which stays with the lab)."""
    only_a, only_b = _only(a, b)
    if len(only_a) == len(a) and len(only_b) == len(b):
        return f"{sa} and {sb} have no choice in common ({sa}: {_listed(a)}, {sb}: {_listed(b)})"
    text = _set_difference("choices", a, b, sa, sb)
    if bool(only_a) != bool(only_b):
        text += (" - a lab that stocks only some choices lists them all, in the same order, and gives its "
                 "stock with allowed= (the stock stays with the lab, partners may stock others)")
    return text


def _describe(p: Any) -> str:
    """A parameter's type and range, in a few words (``real [150.0, 250.0]``)."""
    if p.type == "categorical":
        return f"categorical {_listed(p.choices)}"
    if p.type == "discrete":
        return f"discrete {_listed(p.values)}"
    extra = (", log scale" if getattr(p, "log", False) else "") + \
        (f", step {p.step:g}" if getattr(p, "step", None) is not None else "")
    return f"{p.type} [{p.low}, {p.high}]{extra}"


def param_differences(a: Any, b: Any, sa: str, sb: str) -> list[str]:
    """How parameter ``b`` (in space ``sb``) differs from ``a`` (in ``sa``), same name; empty if equal."""
    if a == b:
        return []
    head = f"parameter {a.name!r}"
    if a.type != b.type:
        return [f"{head}: {sa} has it {_describe(a)}, {sb} {_describe(b)}"]
    out = []
    if a.type == "categorical":
        if a.choices != b.choices:
            out.append(f"{head}: {_choice_difference(a.choices, b.choices, sa, sb)}")
        elif a.descriptors != b.descriptors:
            if a.descriptors is None or b.descriptors is None:
                has, lacks = (sa, sb) if b.descriptors is None else (sb, sa)
                out.append(f"{head}: {has} gives its choices descriptors, {lacks} does not")
            else:
                changed = [c for c, x, y in zip(a.choices, a.descriptors, b.descriptors) if x != y]
                out.append(f"{head}: the descriptors of {_listed(changed)} differ ({sa}: "
                           f"{[list(a.descriptors[a.choices.index(c)]) for c in changed[:3]]}, {sb}: "
                           f"{[list(b.descriptors[b.choices.index(c)]) for c in changed[:3]]})")
    elif a.type == "discrete":
        if a.values != b.values:
            out.append(f"{head}: {_set_difference('values', a.values, b.values, sa, sb)}")
    else:  # real, integer
        if (a.low, a.high) != (b.low, b.high):
            out.append(f"{head}: bounds: {sa} has [{a.low}, {a.high}], {sb} [{b.low}, {b.high}]")
        for field, what in (("log", "log scale"), ("step", "step")):
            if getattr(a, field, None) != getattr(b, field, None):
                out.append(f"{head}: {what}: {sa} has {getattr(a, field, None)!r}, {sb} {getattr(b, field, None)!r}")
    if a.unit != b.unit:
        out.append(f"{head}: unit: {sa} has {a.unit!r}, {sb} {b.unit!r}")
    if not out:  # a field this module does not know yet: say so rather than nothing
        out.append(f"{head}: {sa} has {a.model_dump(exclude={'name'})}, {sb} {b.model_dump(exclude={'name'})}")
    return out


def space_differences(a: "SearchSpace", b: "SearchSpace", sa: str = "this space",
                      sb: str = "the other space") -> list[str]:
    """Every way ``b`` differs from ``a`` as sentences; empty if the two have the same identity
    (:meth:`~labfbo.SearchSpace.fingerprint`). ``sa``, ``sb``: what to call each space ("the
    study's space")."""
    if a.fingerprint() == b.fingerprint():
        return []
    out: list[str] = []
    only_a, only_b = _only(a.names, b.names)
    if only_a:
        out.append(f"parameter(s) only in {sa}: " + ", ".join(
            f"{p.name!r} ({_describe(p)})" for p in a.params if p.name in only_a))
    if only_b:
        out.append(f"parameter(s) only in {sb}: " + ", ".join(
            f"{p.name!r} ({_describe(p)})" for p in b.params if p.name in only_b))
    theirs = {p.name: p for p in b.params}
    for p in a.params:
        if p.name in theirs:
            out += param_differences(p, theirs[p.name], sa, sb)
    common_a = [n for n in a.names if n in theirs]
    common_b = [n for n in b.names if n in set(a.names)]
    if common_a != common_b:
        out.append(f"the parameters are in another order (the order sets the columns, it must match): "
                   f"{sa} has {common_a}, {sb} {common_b}")
    if a.constraints != b.constraints:
        ca, cb = [str(c) for c in a.constraints or ()], [str(c) for c in b.constraints or ()]
        oa, ob = _only(ca, cb)
        out.append("shared constraints differ (LinearConstraint, Forbidden): "
                   + " and ".join([f"only in {sa}: {_listed(oa)}"] * bool(oa)
                               + [f"only in {sb}: {_listed(ob)}"] * bool(ob)))
    if a.allowed_names != b.allowed_names:
        out.append(f"allowed combinations: {sa} lists them over {list(a.allowed_names or ()) or 'none'}, "
                   f"{sb} over {list(b.allowed_names or ()) or 'none'}")
    elif a.allowed != b.allowed:
        ra, rb = _only([tuple(r) for r in a.allowed or ()], [tuple(r) for r in b.allowed or ()])
        out.append(f"allowed combinations (over {list(a.allowed_names or ())}) differ: {len(ra)} only in "
                   f"{sa} (e.g. {ra[:2]}), {len(rb)} only in {sb} "
                   f"(e.g. {rb[:2]})")
    return out or [f"{sa} and {sb} differ in a field this version does not describe"]


def study_difference(study: "SearchSpace", lab: "SearchSpace") -> str:
    """How a joining lab's space differs from the study's, one clause per difference ("" if none)."""
    return "; ".join(space_differences(study, lab, "the study's space", "this lab's space"))
