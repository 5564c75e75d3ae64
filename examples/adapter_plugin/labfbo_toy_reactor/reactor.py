"""``toy_reactor``: the adapter of a (simulated) flow reactor.

An adapter turns one :class:`labfbo.Trial` into one instrument run and returns the
measurement: a float, or ``(mean, sem)``. Raising an exception means the run failed;
the caller then reports it with ``opt.tell_failed(trial, str(exc))``.

Replace the body of :meth:`run` with your instrument's API (serial port, OPC UA, a
vendor SDK...). Keep everything the instrument needs (addresses, credentials,
calibration) in the constructor's keyword arguments, which ``load_adapter(name,
**config)`` passes through.
"""

from __future__ import annotations

import math

from labfbo.adapter import InstrumentAdapter
from labfbo.trial import Trial


class ToyReactorAdapter(InstrumentAdapter):
    """Expects ``temperature`` (degC) and ``residence_time`` (min); returns (yield %, sem)."""

    name = "toy_reactor"

    def __init__(self, host: str = "localhost", replicates: int = 3, max_temperature: float = 240.0) -> None:
        self.host = host                      # where the real instrument would be
        self.replicates = int(replicates)
        self.max_temperature = float(max_temperature)
        self._connected = True                # e.g. open a socket / session here

    def run(self, trial: Trial) -> tuple[float, float]:
        if not self._connected:
            raise RuntimeError("adapter is closed")
        t = float(trial.params["temperature"])
        tau = float(trial.params["residence_time"])
        if t > self.max_temperature:
            raise RuntimeError(f"safety interlock: {t:.1f} degC > {self.max_temperature} degC")
        # A deterministic stand-in for the instrument: replicate readings around a yield surface.
        true_yield = 90.0 * math.exp(-(((t - 185.0) / 35.0) ** 2) - ((math.log(tau) - 1.5) ** 2))
        readings = [true_yield + 0.5 * math.sin(7.0 * trial.id + r) for r in range(self.replicates)]
        mean = sum(readings) / len(readings)
        var = sum((x - mean) ** 2 for x in readings) / max(len(readings) - 1, 1)
        return mean, math.sqrt(var / len(readings))

    def close(self) -> None:
        self._connected = False
