"""A lab scientist's script: one site, plain Bayesian optimization (`independent`).

The "experiment" is a simulated reactor on the mixed search space of the labfbo
specification (two reals, one of them on a log scale, an integer and a categorical).
Replace ``run_experiment`` with your instrument call.

Environment:
    LABFBO_EXAMPLE_BUDGET  number of experiments to run in the loop (default 20)
    LABFBO_EXAMPLE_OUT     directory for the journal and the CSV (default: a new temp dir)
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one torch thread: GP fits are much faster

import labfbo  # noqa: E402
from labfbo.report import write_report  # noqa: E402

BUDGET = int(os.environ.get("LABFBO_EXAMPLE_BUDGET", "20"))
OUT = os.environ.get("LABFBO_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="labfbo-single-site-")
os.makedirs(OUT, exist_ok=True)

space = labfbo.SearchSpace([
    labfbo.Real("temperature", 150.0, 250.0),
    labfbo.Real("feed_rate", 1e-3, 1.0, log=True),
    labfbo.Integer("passes", 1, 8),
    labfbo.Categorical("solvent", ["water", "ethanol", "dmso"]),
])

SOLVENT_PENALTY = {"water": 0.4, "ethanol": 0.0, "dmso": 0.8}


def run_experiment(temperature: float, feed_rate: float, passes: int, solvent: str) -> tuple[float, float]:
    """A simulated impurity measurement (lower is better): returns (mean, standard error)."""
    if solvent == "water" and temperature > 240.0:
        raise RuntimeError("boiled over")
    impurity = ((temperature - 205.0) / 40.0) ** 2 + (math.log10(feed_rate) + 1.3) ** 2 \
        + 0.05 * (passes - 5) ** 2 + SOLVENT_PENALTY[solvent]
    return impurity, 0.02


journal = os.path.join(OUT, "site-a.journal")
# n_init=6: the initial design is the 3 historical runs below plus one plate of 3 (the
# default would be max(5, 2 * dimension) = 8). Historical data counts towards it.
opt = labfbo.Optimizer(space, objective="minimize", site="site-a", seed=0, storage=journal, n_init=6)
print(f"journal: {journal}; initial design: {opt.n_init} points")

# Past experiments of this lab (S_i^(0)). One was run at 260 degC, outside today's bounds:
# it is kept as given (with a warning) and the model sees it clipped to 250.
if not opt.observations:  # a resumed journal already has them
    historical = [
        {"temperature": 180.0, "feed_rate": 0.05, "passes": 3, "solvent": "water"},
        {"temperature": 220.0, "feed_rate": 0.2, "passes": 6, "solvent": "dmso"},
        {"temperature": 260.0, "feed_rate": 0.01, "passes": 2, "solvent": "ethanol"},
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.add_observations(historical, [1.9, 1.7, 2.6])  # floats or (mean, sem)
    for w in caught:
        print(f"warning: {w.message}")

# A plate of three reactor slots: a pending-aware batch.
for trial in opt.ask(n=3):
    try:
        opt.tell(trial, run_experiment(**trial.params))
    except RuntimeError as exc:
        opt.tell_failed(trial, str(exc))

# The sequential loop: Bayesian optimization proper.
for _ in range(BUDGET):
    trial = opt.ask()
    try:
        y = run_experiment(**trial.params)
    except RuntimeError as exc:
        opt.tell_failed(trial, str(exc))
        print(f"trial {trial.id} failed: {exc}")
        continue
    opt.tell(trial, y)  # a float, or (mean, sem)
    print(f"trial {trial.id:3d} [{trial.metadata['source']:>6}] impurity={y[0]:.3f}  {trial.params}")

opt.to_csv(os.path.join(OUT, "history.csv"))
opt.close()

# Re-opening the journal restores everything (this is also how a crashed script resumes).
resumed = labfbo.Optimizer(space, objective="minimize", site="site-a", seed=0, storage=journal, n_init=6)
best = resumed.best
print(f"resumed from the journal: {len(resumed.observations)} observations, {len(resumed.pending)} pending")
print(f"best impurity: {best.value:.4f} at {best.params}")
resumed.close()

# The campaign report: one HTML page (and PNGs) from the journal alone; also `labfbo report <journal>`.
report = write_report(journal, os.path.join(OUT, "report.html"), objective_label="impurity")
print(f"report: {report.html}")
