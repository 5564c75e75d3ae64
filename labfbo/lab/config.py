"""``site.yaml``: one site's closed-loop campaign — its study, its coordinator, its instrument.

Example::

    site: lab-a
    space:                          # omit to use the adapter's own (the simulated one has one)
      - {name: temperature, type: real, low: 150, high: 250}
      - {name: solvent, type: categorical, choices: [water, ethanol]}
    objective: minimize             # or named outcomes (then the adapter reports each):
    # objective: [{name: yield, direction: maximize}, {name: cost, direction: minimize, threshold: 12}]
    # outcome_constraints: [{name: impurity, op: "<=", bound: 0.5}]
    protocol: distribution          # independent (default), gradient, distribution, consensus
    options: {acquisition: ucb}
    coordinator: https://consortium.example:8443   # or "mpi", or flower://127.0.0.1:9500, or omit for independent
    token_env: LABFBO_TOKEN         # the bearer token comes from the environment (or token_file:)
    verify: consortium-ca.pem       # the consortium's own CA (default: the system's CAs)
    seed: 0
    n_init: 6
    budget: 30                      # BO experiments after the initial design
    storage: lab-a.journal          # default: <site>.journal next to this file
    max_in_flight: 2                # asynchronous adapters only
    stop: {target: 0.05, patience: 15, max_consecutive_failures: 5, max_hours: 48}
    adapter:
      name: simulated               # `--adapter` on the command line overrides it
      config: {problem: branin, noise_std: 0.1, run_time: 2.0}

Relative paths (``storage``, ``token_file``, ``verify``) are relative to the file's folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.names import check_site_name
from labfbo.core.objectives import Objective, Outcome
from labfbo.space.search import SearchSpace


class StopRule(BaseModel):
    """When a campaign ends before its budget. In-flight runs are always waited for."""

    model_config = ConfigDict(extra="forbid")
    target: float | None = Field(None, description="stop once the best value reaches it (<= for minimize)")
    patience: int | None = Field(None, ge=1, description="stop after this many completed runs without improvement")
    max_consecutive_failures: int | None = Field(5, ge=1, description="stop: the instrument looks broken")
    max_hours: float | None = Field(None, gt=0, description="stop dispatching after this wall time")


class AdapterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class SiteConfig(BaseModel):
    """A site's ``labfbo site run`` configuration (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    site: str = "site-0"
    space: SearchSpace | None = None
    objective: Literal["minimize", "maximize"] | Objective | list[Objective] | None = None
    outcome_constraints: list[Outcome] = Field(default_factory=list)
    protocol: str = "independent"
    options: dict[str, Any] = Field(default_factory=dict)
    coordinator: str | None = None
    token_env: str | None = "LABFBO_TOKEN"
    token_file: str | None = None
    verify: bool | str = Field(True, description="an https:// coordinator's certificate check: true (the system's "
                               "CAs), the path of a CA bundle (the consortium's own CA), or false (none)")
    seed: int = Field(0, ge=0)
    n_init: int | None = Field(None, ge=0)
    budget: int = Field(20, ge=0)
    horizon: int | None = Field(None, ge=1)
    storage: str | None = None
    max_in_flight: int = Field(1, ge=1)
    poll_interval: float | None = Field(None, gt=0)
    ask_timeout: float | None = Field(None, gt=0, description="propose locally if the coordinator is this late")
    stop: StopRule = Field(default_factory=StopRule)
    adapter: AdapterSpec = Field(default_factory=AdapterSpec)
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, v: Any) -> Any:
        return {"params": v} if isinstance(v, list) else v  # a bare list of parameters is enough

    @field_validator("site")
    @classmethod
    def _site(cls, v: str) -> str:
        return check_site_name(v, "site:")  # it names the journal file and the server's routes

    @field_validator("coordinator")
    @classmethod
    def _coordinator(cls, v: str | None) -> str | None:
        if v is not None and v != "mpi" and not v.startswith(("http://", "https://", "flower://")):
            raise ValueError(f"coordinator must be an http(s):// URL, a flower://HOST:PORT bridge address or 'mpi', "
                             f"got {v!r}")
        return v

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "SiteConfig":
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigurationError(f"cannot read {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigurationError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
        try:
            return cls.model_validate({**data, "base_dir": path.resolve().parent})
        except Exception as exc:
            raise ConfigurationError(f"{path}: {exc}") from None

    def path(self, value: str) -> str:
        """``value`` resolved against the config file's folder."""
        return str(value if os.path.isabs(value) else self.base_dir / value)

    def storage_path(self) -> str:
        return self.path(self.storage or f"{self.site}.journal")

    def token(self) -> str | None:
        """The bearer token: from ``token_file`` if given, else from the ``token_env`` variable."""
        if self.token_file:
            try:
                return Path(self.path(self.token_file)).read_text().strip()
            except OSError as exc:
                raise ConfigurationError(f"cannot read token_file: {exc}") from None
        if self.coordinator and self.coordinator.startswith(("http", "flower")):
            token = os.environ.get(self.token_env or "")
            if not token:
                raise ConfigurationError(f"the coordinator needs this site's token: set the environment variable "
                                         f"{self.token_env} or give token_file")
            return token
        return None

    def tls_verify(self) -> bool | str:
        """``verify`` for the HTTP client: a CA bundle's path resolved against the config's folder."""
        if isinstance(self.verify, bool):
            return self.verify
        path = self.path(self.verify)
        if not os.path.isfile(path):
            raise ConfigurationError(f"verify: no CA bundle at {path} (give the consortium's CA certificate, "
                                     "true for the system's CAs)")
        return path

    def connector(self) -> Any:
        """What ``Optimizer(coordinator=...)`` takes: None, the URL, or an MPI connector."""
        if self.coordinator == "mpi":
            from labfbo.transport.mpi import MPICoordinator

            return MPICoordinator()
        return self.coordinator
