"""``toy_reactor``: the adapter of a (simulated) flow reactor.

An adapter turns one :class:`labfbo.Trial` into one instrument run and returns a
:class:`labfbo.adapters.Measurement` (or simply a float, or ``(mean, sem)``). Raising an
exception, or returning ``Measurement.failure(reason)``, marks the run failed;
``labfbo site run`` records the reason with the trial and carries on.

Replace the body of :meth:`run` with your instrument's API (serial port, OPC UA, a
vendor SDK...). Keep everything the instrument needs (addresses, calibration) in the
constructor's keyword arguments: ``load_adapter(name, **config)`` and the ``adapter:
config:`` block of ``site.yaml`` pass them through. For long experiments implement
``submit`` / ``poll`` instead of ``run`` (see ``docs/adapters.md``).
"""

from __future__ import annotations

import math

from labfbo import Real, SearchSpace
from labfbo.adapters import Adapter, AdapterContext, Measurement
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.trial import Trial


class ToyReactorAdapter(Adapter):
    """Expects ``temperature`` (degC) and ``residence_time`` (min); measures yield % with its sem.

    ``space`` is the reactor's operating window, used by ``labfbo site run`` when the
    site's config gives none.
    """

    name = "toy_reactor"
    space = SearchSpace([Real("temperature", 120.0, 260.0), Real("residence_time", 0.5, 30.0, log=True)])

    def __init__(self, host: str = "localhost", replicates: int = 3, max_temperature: float = 240.0) -> None:
        self.host = host                      # where the real instrument would be
        self.replicates = int(replicates)
        self.max_temperature = float(max_temperature)
        self._connected = True                # e.g. open a socket / session here

    def prepare(self, context: AdapterContext) -> None:
        missing = {"temperature", "residence_time"} - set(context.space.names)
        if missing:
            raise ConfigurationError(f"toy_reactor needs the parameters {sorted(missing)}")

    def run(self, trial: Trial) -> Measurement:
        if not self._connected:
            raise RuntimeError("adapter is closed")
        t = float(trial.params["temperature"])
        tau = float(trial.params["residence_time"])
        if t > self.max_temperature:
            return Measurement.failure(f"safety interlock: {t:.1f} degC > {self.max_temperature} degC")
        # A deterministic stand-in for the instrument: replicate readings around a yield surface.
        true_yield = 90.0 * math.exp(-(((t - 185.0) / 35.0) ** 2) - ((math.log(tau) - 1.5) ** 2))
        readings = [true_yield + 0.5 * math.sin(7.0 * trial.id + r) for r in range(self.replicates)]
        mean = sum(readings) / len(readings)
        var = sum((x - mean) ** 2 for x in readings) / max(len(readings) - 1, 1)
        return Measurement.ok(mean, math.sqrt(var / len(readings)), replicates=self.replicates, host=self.host)

    def close(self) -> None:
        self._connected = False
