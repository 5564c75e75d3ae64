"""Module paths of earlier releases, kept importable: ``import labfbo.priors`` gives
:mod:`labfbo.models.priors` (with a :class:`DeprecationWarning` naming the new path).

The folders are the layers since this release (``docs/architecture.md``); a lab's script or an
instrument adapter written against the former flat layout keeps working until it is updated.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Sequence

#: former module (below ``labfbo.``) -> its module now
MOVED = {
    "acquisition": "models.acquisition",
    "chem": "space.chem",
    "constraints": "space.constraints",
    "demo": "apps.demo.screen",
    "demo_cli": "apps.demo.cli",
    "demo_plot": "apps.demo.plot",
    "demo_runs": "apps.demo.runs",
    "design": "space.design",
    "exceptions": "core.exceptions",
    "harness": "apps.harness",
    "journal": "core.journal",
    "keywords": "protocols.keywords",
    "messages": "core.messages",
    "models.design_tilt": "protocols.surface.design_tilt",
    "models.surface": "protocols.surface.model",
    "names": "core.names",
    "objectives": "core.objectives",
    "params": "space.params",
    "polytope": "space.polytope",
    "priors": "models.priors",
    "privacy.attacks": "apps.attacks",
    "privacy.audit_cli": "apps.audit_cli",
    "privacy.release": "core.release",
    "progress": "core.progress",
    "protocols.distribution_messages": "protocols.distribution.messages",
    "protocols.gradient_messages": "protocols.gradient.messages",
    "protocols.gradient_wire": "protocols.gradient.wire",
    "protocols.surface_aggregate": "protocols.surface.aggregate",
    "protocols.surface_messages": "protocols.surface.messages",
    "protocols.surface_options": "protocols.surface.options",
    "protocols.surface_secure": "protocols.surface.secure",
    "protocols.vote_messages": "protocols.vote.messages",
    "protocols.vote_sealed": "protocols.vote.sealed",
    "records": "core.records",
    "seeding": "core.seeding",
    "simulation": "apps.simulation",
    "space_diff": "space.diff",
    "suggest": "core.suggest",
    "trial": "core.trial",
    "wire": "core.wire",
}


def _target(fullname: str) -> str | None:
    """The module now at ``fullname`` of an earlier release (a submodule of a moved package too)."""
    name = fullname.removeprefix("labfbo.")
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return "labfbo." + new + name[len(old):]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a former path and loads it as the module that is there now."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("labfbo.") or _target(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _target(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)  # type: ignore[arg-type]

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the one at its new path."""


def install() -> None:
    """Make the former paths importable (once per process)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # before the path finder: a moved package's submodule too
