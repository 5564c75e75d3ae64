"""``simulated``: a benchmark or a user function as a virtual instrument.

It has what a real instrument has: measurement noise, a run time, and random failures.
With ``run_time > 0`` it is asynchronous (``submit`` / ``poll``), so several runs can be
in flight, and a restarted site re-polls what it had started.

    load_adapter("simulated", problem="branin", noise_std=0.1, run_time=2.0, failure_rate=0.05)
    load_adapter("simulated", function="my_lab.models:impurity", seed=0)

Every random draw (noise, failure) is keyed by (seed, site, trial id): re-measuring the
same trial gives the same result. ``log=`` names a file to which the instrument appends
one line per run it *starts* — the lab notebook a drill checks for experiments run twice.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from labfbo.adapters import Adapter, AdapterContext, Handle, Measurement
from labfbo.benchmarks import get_problem
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.seeding import rng
from labfbo.core.trial import Trial


def _import_function(spec: str) -> Callable[[dict[str, Any]], float]:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigurationError(f"function must be 'module:callable', got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import function {spec!r}: {exc}") from exc
    if not callable(fn):
        raise ConfigurationError(f"{spec!r} is not callable")
    return fn


class SimulatedAdapter(Adapter):
    """A virtual instrument.

    Args:
        problem: a built-in problem (``labfbo.benchmarks.list_problems()``); its site
            ``site`` is measured. Exposes ``.space`` and ``.problem`` for the campaign.
        function: instead, ``"module:callable"`` taking a params dict and returning a float.
        site, n_sites, heterogeneity, seed: passed to ``get_problem``; ``seed`` also keys the noise.
        noise_std: Gaussian measurement noise.
        run_time: seconds a run takes (``> 0``: asynchronous).
        failure_rate: probability that a run fails ("simulated instrument fault").
        report_sem: return ``(value, noise_std)`` instead of the bare value.
        log: a file the instrument appends ``{"trial": id, "started": time}`` to on every run it starts.
    """

    name = "simulated"

    def __init__(self, problem: str | None = "branin", function: str | None = None, site: int = 0,
                 n_sites: int = 1, heterogeneity: float | None = None, seed: int = 0, noise_std: float = 0.0,
                 run_time: float = 0.0, failure_rate: float = 0.0, report_sem: bool = False,
                 log: str | None = None) -> None:
        if not 0.0 <= failure_rate <= 1.0:
            raise ConfigurationError(f"failure_rate must be in [0, 1], got {failure_rate}")
        if noise_std < 0 or run_time < 0:
            raise ConfigurationError("noise_std and run_time must be >= 0")
        self.problem = None if function else get_problem(problem or "branin", n_sites=max(n_sites, site + 1),
                                                         heterogeneity=heterogeneity, seed=seed)
        self.space = None if self.problem is None else self.problem.space
        self._function = _import_function(function) if function else None
        self.site, self.seed = int(site), int(seed)
        self.noise_std, self.run_time, self.failure_rate = float(noise_std), float(run_time), float(failure_rate)
        self.report_sem = bool(report_sem)
        self.log = Path(log) if log else None
        self.poll_interval = min(1.0, max(self.run_time / 4, 0.01))

    @property
    def asynchronous(self) -> bool:
        return self.run_time > 0

    def prepare(self, context: AdapterContext) -> None:
        if self.space is not None and set(context.space.names) != set(self.space.names):
            raise ConfigurationError(f"the campaign's parameters {context.space.names} are not the simulated "
                                     f"problem's {self.space.names}")

    def measure(self, trial_id: int, params: dict[str, Any]) -> Measurement:
        """The instrument's reading of one run (deterministic in (seed, site, trial id))."""
        gen = rng(self.seed, self.site, int(trial_id), "simulated-adapter")
        fail_draw, noise = gen.random(), gen.standard_normal()
        if fail_draw < self.failure_rate:
            return Measurement.failure("simulated instrument fault")
        value = self._function(params) if self._function else self.problem.evaluate(self.site, params)
        value = float(value) + self.noise_std * noise
        return Measurement.ok(value, self.noise_std if self.report_sem else None)

    def _started(self, trial: Trial) -> None:
        if self.log is not None:
            with open(self.log, "a") as fh:
                fh.write(json.dumps({"trial": trial.id, "started": time.time()}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def run(self, trial: Trial) -> Measurement:
        self._started(trial)
        time.sleep(self.run_time)
        return self.measure(trial.id, trial.params)

    def submit(self, trial: Trial) -> Handle:
        self._started(trial)
        return {"trial": trial.id, "params": trial.params, "ready_at": time.time() + self.run_time}

    def poll(self, handle: Handle) -> Measurement | None:
        if time.time() < handle["ready_at"]:
            return None
        return self.measure(handle["trial"], handle["params"])

    def recover(self, trial: Trial) -> Handle | None:
        """A run this instrument's log says was started (its start time gives the ready time)."""
        if self.log is None or not self.log.exists():
            return None
        for line in self.log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn last line: that start was never completed
            if entry.get("trial") == trial.id:
                return {"trial": trial.id, "params": trial.params, "ready_at": entry["started"] + self.run_time}
        return None
