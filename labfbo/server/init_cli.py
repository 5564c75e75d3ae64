"""``labfbo coordinator init``: a study's ``consortium.yaml``, its space pinned, a token per site.

The space comes from a lab's space file: the JSON ``SearchSpace.to_json()`` writes, the same
in YAML, a bare list of parameters, or a ``site.yaml`` (its ``space:``). Pinned in the
configuration it is the study's space: every lab joins with it or is refused, with each
difference named (:mod:`labfbo.space.diff`); no lab's join defines it.

The configuration holds only the tokens' SHA-256 digests. The tokens themselves go once into
a separate file for the operator to hand out. Both are written 0600 whatever the umask, never
through a symbolic link, never over the space file; ``--force`` names what it replaces and moves
an existing state file aside, so the new study starts with a new state.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from labfbo.core.exceptions import ConfigurationError
from labfbo.core.names import check_site_name

DEFAULT_SITES = ("lab-a", "lab-b", "lab-c")


def read_space(path: str | os.PathLike[str]) -> Any:
    """The :class:`~labfbo.SearchSpace` in a space file (JSON or YAML; see the module docstring)."""
    import yaml

    from labfbo.space.search import SearchSpace

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the space file {path}: {exc}") from None
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: not JSON or YAML ({exc})") from None
    if isinstance(data, dict) and "params" not in data and "space" in data:  # a site.yaml
        data = data["space"]
    if isinstance(data, list):
        data = {"params": data}
    if not isinstance(data, dict) or "params" not in data:
        raise ConfigurationError(f"{path}: expected a search space (SearchSpace.to_json(), or a `params:` list), "
                                 f"got {type(data).__name__}")
    try:
        return SearchSpace.model_validate(data)
    except Exception as exc:
        raise ConfigurationError(f"{path}: not a valid search space: {exc}") from None


def build(args: argparse.Namespace, space: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config, tokens)``: the configuration (checked as ``coordinator serve`` will load it)
    and the tokens it was made for (``{"admin": ..., "sites": {name: token}}``); ``space``: the
    space of ``args.space`` when the caller has read it already."""
    from labfbo.server.config import ServerConfig, new_token

    space = read_space(args.space) if space is None else space
    sites = list(args.sites)
    for site in sites:  # a name becomes a file name, a URL path segment and an audit field
        check_site_name(site, "--sites:")
    if len(set(sites)) != len(sites):
        raise ConfigurationError(f"--sites: site names must be unique, got {sites}")
    tokens = {s: new_token() for s in sites}
    admin, admin_digest = new_token()
    config: dict[str, Any] = {"study": args.study, "protocol": args.protocol, "seed": args.seed}
    optional = {"horizon": args.horizon, "quorum": args.quorum, "deadline": args.deadline}
    config.update({k: v for k, v in optional.items() if v is not None})
    if args.option:
        config["options"] = dict(_option(o) for o in args.option)
    if args.privacy_floor is not None:
        config["privacy_floor"] = {"epsilon": args.privacy_floor}
    config["space"] = space.shared().model_dump(mode="json", exclude_none=True)  # a lab's stock stays with it
    config["admin_token_sha256"] = admin_digest
    config["sites"] = {s: digest for s, (_, digest) in tokens.items()}
    if args.state:
        config["state"] = args.state
    if args.audit_log:
        config["audit_log"] = args.audit_log
    try:
        checked = ServerConfig.model_validate(config)
    except Exception as exc:
        raise ConfigurationError(f"the configuration would not load: {exc}") from None
    checked.coordinator()  # the protocol, its options, the space and the horizon, as `serve` will check them
    if args.privacy_floor is not None and args.horizon is None:
        raise ConfigurationError("--privacy-floor: every site joins with a budget, DP(epsilon=...), planned over the "
                                 "campaign's rounds: give the study --horizon")
    return config, {"admin": admin, "sites": {s: token for s, (token, _) in tokens.items()}}


def _option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` (the value read as YAML: ``acquisition=ucb``, ``M=64``)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigurationError(f"--option {text!r}: expected KEY=VALUE, e.g. acquisition=ucb")
    return key.strip(), yaml.safe_load(value)


def _refuse_existing(paths: list[Path], force: bool) -> None:
    there = [str(p) for p in paths if os.path.lexists(p)]
    if there and not force:
        raise ConfigurationError(f"{', '.join(there)} already exist(s): not overwritten (--force replaces the "
                                 "configuration, whose tokens all stop working, and moves an old state aside)")


def _refuse_links(paths: dict[str, Path]) -> None:
    """A symbolic link at an output path is refused, with ``--force`` too: the file is never written through it."""
    for flag, p in paths.items():
        if p.is_symlink():
            raise ConfigurationError(f"{flag} {p} is a symbolic link: refused (init writes the file itself, never "
                                     "through a link; remove the link or give the real path)")


def _refuse_same(paths: dict[str, Path]) -> None:
    """Every path init writes or replaces is distinct from the others and from the space file."""
    seen: dict[Path, str] = {}
    for flag, p in paths.items():
        real = p.resolve()
        for other_real, other in seen.items():
            if real == other_real or (p.exists() and other_real.exists() and os.path.samefile(p, other_real)):
                raise ConfigurationError(f"{flag} {p} and {other} are the same file: init would overwrite one "
                                         "with the other (give each its own path)")
        seen[real] = f"{flag} {p}"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable and writable by its owner only (0600) from the start, whatever
    the umask; a symbolic link at ``path`` is refused (ConfigurationError)."""
    from labfbo.core.journal import open_private

    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC, ConfigurationError), "w") as f:
        f.write(text)


def state_paths(state: str | None, out: Path) -> list[Path]:
    """Where ``coordinator serve`` (the working folder) and a Flower ServerApp (the configuration's
    folder) open the configuration's ``state:``; the same path once when they agree."""
    if not state:
        return []
    here = Path(state).expanduser()
    paths = [here.resolve(), (out.resolve().parent / here).resolve()]
    return list(dict.fromkeys(paths))


def _set_aside(states: list[Path], stamp: str) -> list[tuple[Path, Path]]:
    """Move each existing state file (with its SQLite companions) to ``<name>.replaced-<stamp>``."""
    moved: list[tuple[Path, Path]] = []
    for state in states:
        if not os.path.lexists(state):
            continue
        for companion in ("", "-wal", "-shm", "-journal"):  # a WAL left behind would be replayed into the new state
            src = state.with_name(state.name + companion)
            if os.path.lexists(src):
                dst = state.with_name(f"{state.name}.replaced-{stamp}{companion}")
                try:
                    os.replace(src, dst)
                except OSError as exc:
                    for done_src, done_dst in reversed(moved):  # put back what was moved: nothing half-changed
                        os.replace(done_dst, done_src)
                    raise ConfigurationError(
                        f"--force: cannot move the old state {src} aside: {exc.strerror}"
                    ) from None
                moved.append((src, dst))
    return moved


def run(args: argparse.Namespace) -> int:
    """The command: write the configuration and the tokens file, say what to do next.

    With ``--force`` it says what it replaces, and an existing state file at the configuration's
    ``state:`` is moved aside (``<state>.replaced-<time>``): the new study starts with a new state."""
    import time

    import yaml

    out = Path(args.out)
    tokens_out = Path(args.tokens_out) if args.tokens_out else out.with_name(out.stem + ".tokens.yaml")
    states = state_paths(args.state, out)
    _refuse_same({"--space": Path(args.space), "--out": out, "--tokens-out": tokens_out,
                  **{f"--state{' (beside --out)' * i}": p for i, p in enumerate(states)}})
    _refuse_links({"--out": out, "--tokens-out": tokens_out})
    _refuse_existing([out, tokens_out, *states], args.force)
    space = read_space(args.space)
    config, tokens = build(args, space)
    head = (f"# labfbo consortium configuration, written by `labfbo coordinator init --space {args.space}`.\n"
            "# `space:` is the study's search space: every lab joins with exactly this space (a lab whose space\n"
            "# differs is refused, each difference named). Tokens are stored as SHA-256 digests only.\n")
    replaced = [p for p in (out, tokens_out) if p.exists()]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    temps = {p: p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in (out, tokens_out)}
    try:  # both files whole first, then renamed into place: an error leaves the old ones as they were
        write_private(temps[out], head + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
        write_private(temps[tokens_out], "# labfbo consortium tokens: hand each site its own token (LABFBO_TOKEN); "
                      "keep the\n# admin token for the dashboard and /v1/admin. The configuration holds their SHA-256 "
                      "only.\n" + yaml.safe_dump(tokens, sort_keys=False))
        moved = _set_aside(states, stamp)
    except BaseException:
        for tmp in temps.values():
            if os.path.lexists(tmp):
                os.unlink(tmp)
        raise
    os.replace(temps[out], out)
    os.replace(temps[tokens_out], tokens_out)
    if replaced:
        print(f"replaced {' and '.join(map(str, replaced))} (--force): every token of the old configuration stops "
              "working")
    for src, dst in moved:
        print(f"moved the old study's state {src} aside to {dst} (--force): the new study starts with a new state")
    n = len(config["space"]["params"])
    print(f"wrote {out} (mode 0600): study {config['study']!r}, protocol {config['protocol']!r}, "
          f"{len(config['sites'])} sites ({', '.join(config['sites'])}), the space of {args.space} pinned "
          f"({n} parameter{'s' * (n != 1)})")
    print(f"wrote {tokens_out} (mode 0600): each site's token and the admin token, shown nowhere else; "
          "give each lab its own token over a private channel")
    if space.allowed is not None:
        print(f"note: {args.space} lists allowed combinations: a lab's stock, which stays with the lab; the "
              "study pins the parameters only, and each lab gives its own allowed= (partners may stock others)")
    print(f"next: labfbo coordinator serve --config {out}")
    return 0


def add_parser(sub: Any) -> None:
    """Add ``init`` to the ``coordinator`` subcommands."""
    p = sub.add_parser("init", help="write a consortium.yaml with the study's space pinned and a token per site")
    p.add_argument("--space", required=True, help="a lab's space file: SearchSpace.to_json() (JSON), the same in "
                   "YAML, a list of parameters, or a site.yaml")
    p.add_argument("--protocol", default="distribution")
    p.add_argument("--sites", nargs="+", default=list(DEFAULT_SITES), help="site names (default: lab-a lab-b lab-c)")
    p.add_argument("--study", default="labfbo-study")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--horizon", type=int, default=None, help="the planned number of rounds (some protocols, and "
                   "sites with a DP budget, need it)")
    p.add_argument("--quorum", type=int, default=None)
    p.add_argument("--deadline", type=float, default=None)
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a protocol option (repeat it), e.g. --option acquisition=ucb")
    p.add_argument("--privacy-floor", type=float, default=None, metavar="EPSILON",
                   help="every site joins with DP(epsilon<=EPSILON)")
    p.add_argument("--state", default="coordinator.sqlite", help="durable state file ('' for memory only)")
    p.add_argument("--audit-log", default="audit.jsonl", help="audit log file ('' for none)")
    p.add_argument("--out", default="consortium.yaml")
    p.add_argument("--tokens-out", default=None, help="where the tokens go (default: <out>.tokens.yaml, mode 0600)")
    p.add_argument("--force", action="store_true", help="overwrite existing files (their tokens stop working) and "
                   "move an existing state file aside (the new study starts with a new state)")
    p.set_defaults(func=run)
