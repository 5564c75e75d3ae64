"""Restoring an :class:`~labfbo.Optimizer` from a snapshot (:meth:`~labfbo.Optimizer.save`).

The snapshot is read, never modified: it is replayed into a new optimizer (whose
``storage=``, if any, then journals it), and anything it cannot account for is a
:class:`~labfbo.exceptions.JournalError` naming the file and line.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from labfbo.exceptions import JournalError
from labfbo.journal import check_header, read_records
from labfbo.records import dump_record, parse_record
from labfbo.objectives import OutcomeSpec
from labfbo.space import SearchSpace

if TYPE_CHECKING:
    from labfbo.optimizer import Optimizer


def load_snapshot(cls: type["Optimizer"], path: str, coordinator: Any, storage: str | None,
                  options: dict[str, Any]) -> "Optimizer":
    """An optimizer of class ``cls`` restored from the snapshot at ``path``."""
    if not os.path.isfile(path):
        raise JournalError(f"{path}: no such snapshot")
    records, lines = read_records(path, repair=False)  # a snapshot is never modified
    if not records:
        raise JournalError(f"{path} is not a labfbo snapshot (it is empty)")
    head = records[0]
    saved = {k: v for k, v in head.get("options", {}).items() if v is not None}
    # ``space=``: the site's own space object, to re-attach its nonlinear constraints (code is not journaled)
    space = options.pop("space", None) or SearchSpace.model_validate(head["space"])
    objective: Any = head["objective"]
    if head.get("outcomes") is not None:  # named objectives and outcome constraints, as declared
        spec = OutcomeSpec.model_validate(head["outcomes"])
        objective = list(spec.objectives)
        options.setdefault("outcome_constraints", list(spec.constraints) or None)
    opt = cls(space, objective=objective, protocol=head["protocol"],
              site=head["site"], seed=head["seed"], n_init=head["n_init"], storage=storage,
              secret=options.pop("secret", head.get("secret")),
              coordinator=coordinator, **{**saved, **options})
    try:  # the same check as a resumed journal's (its releases of version 1 need the same DP settings)
        check_header(parse_record(head, f"{path}:{lines[0]}"), opt._header)
    except JournalError:
        opt.close()
        raise
    if any(r["op"] not in ("header", "join", "traffic") for r in opt._journal.records()):
        opt.close()
        raise JournalError("load() into a storage that already has history")
    kept = [(rec, line) for rec, line in zip(records[1:], lines[1:]) if rec["op"] != "join"]
    try:
        opt._replay([rec for rec, _ in kept], lambda i: f"{path}:{kept[i][1]}")
    except JournalError:
        opt.close()
        raise
    for rec, line in kept:  # all of it replayed: now journal it (storage=), at the current version
        opt._journal.append(dump_record(parse_record(rec, f"{path}:{line}")))
    return opt
