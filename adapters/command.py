"""``command``: run a program for each trial and read the measurement from its output.

    load_adapter("command", command=["python", "measure.py", "--temp", "{temperature}"], parse="json")

* ``command`` is a list of arguments (or a string split like a shell would, but never run
  by a shell); ``{name}`` placeholders are filled with the trial's parameters and
  ``{trial_id}`` with its id. The parameters are also in the environment as
  ``LABFBO_PARAM_<NAME>`` and ``LABFBO_TRIAL_ID``. Only ``{identifier}`` is a placeholder
  (other braces, as in JSON, are left alone); an unknown identifier is an error.
* ``parse``: ``"last_number"`` (default: the last number printed on stdout), ``"json"``
  (the last stdout line is ``{"value": ..., "sem": ..., "failed": ..., "reason": ...}``, or
  with named outcomes ``{"outcomes": {"yield": 81.2, "impurity": [0.3, 0.02]}}``),
  or a regular expression with a named group ``value`` (and optionally ``sem``).
* A non-zero exit status, a time-out or unparsable output is a failed trial whose reason
  carries the end of stderr.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
from typing import Any

from labfbo.adapters import Adapter, AdapterContext, Measurement
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.trial import Trial

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.\-]*)\}")  # only {name}: other braces (JSON, code) stay as they are
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?\b(?:nan|inf(?:inity)?)\b", re.IGNORECASE)


class CommandAdapter(Adapter):
    """Args: ``command``, ``parse``, ``timeout`` (s), ``cwd``, ``env`` (extra variables)."""

    name = "command"

    def __init__(self, command: str | list[str], parse: str = "last_number", timeout: float | None = 3600.0,
                 cwd: str | None = None, env: dict[str, str] | None = None) -> None:
        self.command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        if not self.command:
            raise ConfigurationError("command adapter: empty command")
        self.parse = parse
        self._regex = None
        if parse not in ("last_number", "json"):
            try:
                self._regex = re.compile(parse)
            except re.error as exc:
                raise ConfigurationError(f"command adapter: parse is not a regular expression: {exc}") from None
            if "value" not in self._regex.groupindex:
                raise ConfigurationError("command adapter: the parse pattern needs a named group (?P<value>...)")
        self.timeout, self.cwd = timeout, cwd
        self.env = {str(k): str(v) for k, v in (env or {}).items()}

    def prepare(self, context: AdapterContext) -> None:
        known = {*context.space.names, "trial_id"}
        unknown = sorted({m.group(1) for arg in self.command for m in _PLACEHOLDER.finditer(arg)} - known)
        if unknown:
            raise ConfigurationError(f"command adapter: placeholders {unknown} in {self.command} are neither "
                                     f"parameters ({', '.join(context.space.names)}) nor trial_id")

    def _argv(self, trial: Trial) -> list[str]:
        values = {**{k: str(v) for k, v in trial.params.items()}, "trial_id": str(trial.id)}

        def fill(m: re.Match[str]) -> str:
            if m.group(1) not in values:
                raise ConfigurationError(f"command adapter: {m.group(0)} in {self.command} is neither a "
                                         f"parameter ({', '.join(trial.params)}) nor trial_id")
            return values[m.group(1)]

        return [_PLACEHOLDER.sub(fill, arg) for arg in self.command]

    def run(self, trial: Trial) -> Measurement:
        env = {**os.environ, **self.env, "LABFBO_TRIAL_ID": str(trial.id),
               **{f"LABFBO_PARAM_{k.upper()}": str(v) for k, v in trial.params.items()}}
        try:
            proc = subprocess.run(self._argv(trial), capture_output=True, text=True, timeout=self.timeout,
                                  cwd=self.cwd, env=env)
        except subprocess.TimeoutExpired:
            return Measurement.failure(f"command timed out after {self.timeout} s")
        except OSError as exc:
            return Measurement.failure(f"command could not start: {exc}")
        if proc.returncode != 0:
            return Measurement.failure(f"command exited with status {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return self._measurement(proc.stdout)

    def _measurement(self, stdout: str) -> Measurement:
        if self.parse == "json":
            lines = [line for line in stdout.splitlines() if line.strip()]
            try:
                body: dict[str, Any] = json.loads(lines[-1]) if lines else {}
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                return Measurement.failure(f"last output line is not a JSON object ({exc}): {stdout[-200:]!r}")
            if body.get("failed"):
                return Measurement.failure(str(body.get("reason") or "the command reported a failure"))
            if isinstance(body.get("outcomes"), dict):  # named outcomes: {"outcomes": {"yield": 81, ...}}
                meta = {k: v for k, v in body.items() if k not in ("outcomes", "failed", "reason")}
                try:
                    return Measurement.of({k: tuple(v) if isinstance(v, list) else v
                                           for k, v in body["outcomes"].items()}, **meta)
                except ValueError as exc:
                    return Measurement.failure(f"unusable outcomes {body['outcomes']}: {exc}")
            if body.get("value") is None:
                return Measurement.failure(f"JSON output has no value: {body}")
            meta = {k: v for k, v in body.items() if k not in ("value", "sem", "failed", "reason")}
            return Measurement.ok(float(body["value"]), None if body.get("sem") is None else float(body["sem"]), **meta)
        if self._regex is not None:
            m = None
            for m in self._regex.finditer(stdout):  # noqa: B007 - the last match is the one read
                pass
            if m is None:
                return Measurement.failure(f"output does not match {self.parse!r}: {stdout[-200:]!r}")
            sem = m.groupdict().get("sem")
            return Measurement.ok(float(m.group("value")), None if sem is None else float(sem))
        numbers = _NUMBER.findall(stdout)
        if not numbers:
            return Measurement.failure(f"no number in the output: {stdout[-200:]!r}")
        if not math.isfinite(float(numbers[-1])):
            return Measurement.failure(f"the last number in the output is {numbers[-1]}: {stdout[-200:]!r}")
        return Measurement.ok(float(numbers[-1]))
