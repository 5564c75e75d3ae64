"""The consortium's server configuration (``consortium.yaml``) and bearer tokens.

Tokens are never stored: the configuration holds their SHA-256 hex digests, compared in
constant time (:func:`hmac.compare_digest`). ``labfbo coordinator init --space FILE`` writes a
whole configuration (the study's space pinned, a token per site: :mod:`labfbo.server.init_cli`);
``labfbo coordinator token`` prints one new token and the digest to put in the file.

Example::

    study: catalyst-2027
    protocol: distribution
    seed: 0
    options: {acquisition: ucb}
    space: {params: [...]}        # the study's SearchSpace (omit: the first site to join sets it)
    admin_token_sha256: 5e88...
    sites:
      lab-a: 9f86...
      lab-b: 2c26...
    state: coordinator.sqlite     # durable state (omit: in memory only)
    audit_log: audit.jsonl
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.names import check_site_name

if TYPE_CHECKING:
    from labfbo.coordinator import Coordinator


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """``(token, sha256)``: give the token to the site, put the digest in the config."""
    token = secrets.token_urlsafe(32)
    return token, hash_token(token)


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    study: str = "labfbo-study"
    protocol: str
    seed: int = Field(0, ge=0)
    horizon: int | None = Field(None, ge=1)
    quorum: int | None = Field(None, ge=1)
    deadline: float | None = Field(None, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
    privacy_floor: dict[str, float] | None = Field(None, description="every site joins with DP(epsilon<=..., "
                                                   "delta<=...): {epsilon: 4, delta: 1e-5} (labfbo.PrivacyFloor)")
    space: dict[str, Any] | None = None
    sites: dict[str, str] | list[str] = Field(
        description="site name -> SHA-256 hex digest of its token (HTTP); a plain list of names under MPI")
    admin_token_sha256: str | None = None
    state: str | None = Field(None, description="SQLite file for durable state (None: memory only)")
    audit_log: str | None = None
    retention_rounds: int | None = Field(None, ge=1, description="keep only the last N rounds' replies")
    audit_retention_days: float | None = Field(None, gt=0)
    audit_max_mb: float = Field(50.0, gt=0, le=1e6, description="rotate audit_log to <audit_log>.1 at this size "
                                "(the log and its predecessor stay within twice it)")
    max_body_bytes: int = Field(4_000_000, ge=1024, description="larger bodies: 413, from Content-Length "
                                "before the body is read, and while it streams")
    max_array_items: int = Field(2_000_000, ge=1)
    max_params: int = Field(1000, ge=1, le=1000, description="parameters of a joining space (more: 422)")
    max_join_bytes: int = Field(1_000_000, ge=1024, description="a join's body limit (413 before it is read): "
                                "a 1000-parameter space of reals is about 90 kB")
    poll_wait_max: float = Field(30.0, gt=0, le=30.0)
    body_timeout: float = Field(30.0, gt=0, description="seconds a client may take to send each part of a "
                                "body (slower: 408)")
    max_connections: int = Field(1000, ge=8, description="concurrent connections; beyond: 503 (uvicorn's "
                                 "limit_concurrency)")
    keep_alive: float = Field(65.0, ge=1.0, description="seconds an idle connection is kept, and a later request's "
                              "headers may take (longer than poll_wait_max)")
    header_timeout: float = Field(10.0, gt=0, description="seconds a fresh connection may take to send its first "
                                  "request's headers (slower: closed)")
    tokenless_per_minute: int = Field(120, ge=1, description="requests without a known token one client address "
                                      "may make in a minute; beyond: 429 at its connections, unparsed and unaudited, "
                                      "for the rest of the minute")
    max_connections_per_address: int = Field(100, ge=1, description="connections one client address may hold at "
                                             "once; beyond: 503 at once (a host trickling headers over many "
                                             "connections cannot take the others' slots)")
    dashboard_secure_cookie: bool | None = Field(None, description="the dashboard cookie's Secure flag (None: when "
                                                 "the request came over TLS; true behind a TLS-terminating proxy)")
    dashboard_session: float = Field(8 * 3600, gt=0, le=7 * 86400, description="seconds a dashboard login "
                                     "lasts (GET /dashboard, admin token)")

    @field_validator("sites")
    @classmethod
    def _digests(cls, v: dict[str, str] | list[str]) -> dict[str, str] | list[str]:
        if not v:
            raise ValueError("a consortium needs at least one site")
        for site in v:  # a name becomes a file name, a URL path segment and an audit field
            check_site_name(site, "sites:")
        if isinstance(v, list):
            if len(set(v)) != len(v):
                raise ValueError("site names must be unique")
            return v
        for site, digest in v.items():
            _check_digest(digest, f"sites.{site}")
        return v

    @model_validator(mode="after")
    def _keep_alive_outlasts_a_poll(self) -> "ServerConfig":
        if self.keep_alive <= self.poll_wait_max:
            raise ValueError(f"keep_alive ({self.keep_alive:g} s) must be longer than poll_wait_max "
                             f"({self.poll_wait_max:g} s), or idle site connections are cut mid-reuse")
        return self

    def coordinator(self) -> "Coordinator":
        """The study's :class:`labfbo.Coordinator` (its rounds, aggregation and schedules)."""
        from labfbo.coordinator import Coordinator
        from labfbo.space.search import SearchSpace

        space = SearchSpace.model_validate(self.space) if self.space is not None else None
        return Coordinator(self.protocol, sites=list(self.sites), space=space, seed=self.seed, horizon=self.horizon,
                           quorum=self.quorum, deadline=self.deadline, study=self.study,
                           privacy_floor=self.privacy_floor, **self.options)

    def token_digests(self) -> dict[str, str]:
        """The sites' token digests; an HTTP server refuses a config without them."""
        if isinstance(self.sites, list):
            raise ConfigurationError("an HTTP coordinator needs a token digest per site (sites: {name: sha256}); "
                                     "a plain list of site names is for MPI only (`coordinator serve --mpi`)")
        return self.sites

    @field_validator("admin_token_sha256")
    @classmethod
    def _admin(cls, v: str | None) -> str | None:
        return None if v is None else _check_digest(v, "admin_token_sha256")

    @classmethod
    def load(cls, path: str | Path) -> "ServerConfig":
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigurationError(f"cannot read {path}: {exc}") from None
        try:
            return cls.model_validate(data)
        except Exception as exc:
            raise ConfigurationError(f"{path}: {exc}") from None


def _check_digest(v: str, name: str) -> str:
    if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise ValueError(f"{name} must be a SHA-256 hex digest (64 lowercase hex characters)")
    return v


class TokenBook:
    """Who a bearer token belongs to; rotatable at run time.

    A token is looked up by its SHA-256 digest (O(1) per request, whatever the consortium's
    size): the digest is what the book keeps, and a lookup's timing depends on the digest of
    what was sent, which an attacker cannot steer towards a stored one.
    """

    def __init__(self, sites: dict[str, str], admin: str | None) -> None:
        self.sites = dict(sites)
        self.admin = admin
        self.by_digest = {d: s for s, d in self.sites.items()}

    def site_of(self, token: str) -> str | None:
        digest = hash_token(token)
        site = self.by_digest.get(digest)
        return site if site is not None and hmac.compare_digest(digest, self.sites[site]) else None

    def is_admin(self, token: str) -> bool:
        return self.admin is not None and hmac.compare_digest(hash_token(token), self.admin)

    def rotate(self, site: str, digest: str) -> None:
        """Replace ``site``'s digest (ConfigurationError: unknown site; ValueError: not a digest)."""
        if site not in self.sites:
            raise ConfigurationError(f"unknown site {site!r}")
        digest = _check_digest(digest, "token_sha256")
        self.by_digest.pop(self.sites[site], None)
        self.sites[site] = digest
        self.by_digest[digest] = site
