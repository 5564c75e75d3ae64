"""Three sites and a coordinator in one Python process (the `local` transport).

Each site runs the same kind of process but under its own conditions, so each has a
different optimum. The coordinator admits the sites (checks that everyone has the same
search space and protocol options) and deals each site its part of one collaborative
Latin-hypercube initial design. Under ``protocol="distribution"`` (GUIDE-FBO) every BO
round each site sends one Gaussian belief about where its optimum lies (2d + 2 numbers)
and gets up to 5 merged beliefs of the federation back; ``sent_messages()`` lists
exactly what left each site. Swap in ``"consensus"``, ``"gradient"`` or
``"independent"`` by changing the one ``PROTOCOL`` line.

The same script runs over MPI or HTTP by giving the Optimizers another coordinator:
see ``mpi_campaign.py`` and ``http_consortium.py``.

Environment:
    LABFBO_EXAMPLE_BUDGET  BO rounds after the initial design (default 15)
    LABFBO_EXAMPLE_OUT     output directory (default: a new temp dir)
"""

from __future__ import annotations

import math
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import labfbo  # noqa: E402

BUDGET = int(os.environ.get("LABFBO_EXAMPLE_BUDGET", "15"))
OUT = os.environ.get("LABFBO_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="labfbo-federation-")
os.makedirs(OUT, exist_ok=True)

space = labfbo.SearchSpace([
    labfbo.Real("temperature", 150.0, 250.0),
    labfbo.Real("feed_rate", 1e-3, 1.0, log=True),
    labfbo.Real("pressure", 1.0, 10.0),
])

# Each site's optimum: (temperature, log10 feed rate, pressure).
SITES = {"site-a": (200.0, -1.5, 4.0), "site-b": (210.0, -1.2, 5.0), "site-c": (190.0, -1.8, 3.5)}


def experiment(site: str, params: dict) -> float:
    """The yield at one site (to be maximized); stays inside that site."""
    t0, lf0, p0 = SITES[site]
    d2 = ((params["temperature"] - t0) / 30.0) ** 2 + (math.log10(params["feed_rate"]) - lf0) ** 2 \
        + ((params["pressure"] - p0) / 3.0) ** 2
    return 100.0 * math.exp(-0.5 * d2)


PROTOCOL = "distribution"
coordinator = labfbo.Coordinator(protocol=PROTOCOL, sites=list(SITES), seed=0)
optimizers = {
    name: labfbo.Optimizer(space, objective="maximize", protocol=PROTOCOL, coordinator=coordinator,
                           site=name, seed=0, n_init=6,
                           storage=os.path.join(OUT, f"{name}.journal"))
    for name in SITES
}

# Initial design: each site runs its cells of the collaborative design as one batch.
for name, opt in optimizers.items():
    for trial in opt.ask(n=opt.n_init):
        opt.tell(trial, experiment(name, trial.params))

# Lock-step BO rounds: every site asks, runs its experiment, tells.
for rnd in range(BUDGET):
    trials = {name: opt.ask() for name, opt in optimizers.items()}
    for name, trial in trials.items():
        optimizers[name].tell(trial, experiment(name, trial.params))
    print(f"round {rnd}: " + "  ".join(f"{n}={o.best.value:6.2f}" for n, o in optimizers.items()))

for name, opt in optimizers.items():
    sent = opt.sent_messages()
    kinds = sorted(set(m.kind for m in sent))
    print(f"{name}: best yield {opt.best.value:.2f} at "
          f"{ {k: round(v, 4) for k, v in opt.best.params.items()} }; "
          f"sent {len(sent)} message(s) {kinds}, {sum(m.nbytes() for m in sent)} bytes")
    opt.close()
