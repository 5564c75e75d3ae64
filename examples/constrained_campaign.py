"""A formulation campaign with constraints and two objectives (one site, `independent`).

Three solvent fractions that must add up to 1, a temperature that must stay lower when
more DMSO is in the mix, a base/solvent pair that must never be run, and a dose limit
only this lab applies. Each experiment reports a yield (maximize), a cost (minimize) and
an impurity that must stay under 0.5 %. Replace ``run_experiment`` with your instrument.

Environment:
    LABFBO_EXAMPLE_BUDGET  number of experiments after the initial design (default 15)
    LABFBO_EXAMPLE_OUT     directory for the journal and the CSV (default: a new temp dir)
"""

from __future__ import annotations

import math
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one torch thread: GP fits are much faster

import labfbo  # noqa: E402
from labfbo import Categorical, Forbidden, LinearConstraint, NonlinearConstraint, Objective, Outcome, Real  # noqa: E402

BUDGET = int(os.environ.get("LABFBO_EXAMPLE_BUDGET", "15"))
OUT = os.environ.get("LABFBO_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="labfbo-constrained-")
os.makedirs(OUT, exist_ok=True)

space = labfbo.SearchSpace(
    [Real("water", 0.0, 1.0), Real("ethanol", 0.0, 1.0), Real("dmso", 0.0, 1.0),
     Real("temperature", 40.0, 140.0), Categorical("base", ["KOAc", "K2CO3", "DBU"]),
     Categorical("solvent", ["DMAc", "NMP"])],
    constraints=[
        LinearConstraint({"water": 1, "ethanol": 1, "dmso": 1}, "==", 1.0),       # fractions add up to 1
        LinearConstraint({"temperature": 1, "dmso": 60}, "<=", 150.0),            # hot DMSO is unsafe
        Forbidden({"base": "KOAc", "solvent": "DMAc"}),                           # incompatible pair
        NonlinearConstraint("dose", lambda p: 0.6 - p["dmso"] * p["temperature"] / 140),  # this lab's rule
    ])


def run_experiment(p: dict) -> dict:
    """A simulated formulation: yield peaks in an ethanol-rich mix near 95 °C with DBU."""
    base = {"KOAc": 0.0, "K2CO3": 6.0, "DBU": 10.0}[p["base"]]
    yield_ = (60 + base + 25 * math.exp(-((p["ethanol"] - 0.6) ** 2 + ((p["temperature"] - 95) / 40) ** 2) * 4)
              - (4.0 if p["solvent"] == "NMP" else 0.0))
    cost = 2 + 8 * p["dmso"] + 5 * p["ethanol"] + (3.0 if p["base"] == "DBU" else 1.0)
    impurity = 0.1 + 0.5 * p["water"] * p["temperature"] / 140 + 0.2 * p["dmso"]
    return {"yield": yield_, "cost": cost, "impurity": (impurity, 0.01)}


opt = labfbo.Optimizer(space, objective=[Objective("yield", "maximize"), Objective("cost", "minimize", threshold=12)],
                       outcome_constraints=[Outcome("impurity", "<=", 0.5)], seed=0, n_init=6,
                       storage=os.path.join(OUT, "formulation.journal"))
for _ in range(opt.n_init + BUDGET):
    trial = opt.ask()
    assert not space.violations(trial.params), trial.params  # every proposal meets every constraint
    opt.tell(trial, run_experiment(trial.params))

print(f"best feasible yield: {opt.best.outcomes['yield']:.1f} % at {opt.best.params}")
print(f"trade-off (Pareto front of feasible experiments), {len(opt.pareto_front())} points:")
for o in sorted(opt.pareto_front(), key=lambda o: o.outcomes["cost"]):
    print(
        f"  yield {o.outcomes['yield']:5.1f} %  cost {o.outcomes['cost']:5.2f}  impurity {o.outcomes['impurity']:.2f}"
    )
opt.to_csv(os.path.join(OUT, "formulation.csv"))
print(f"history: {os.path.join(OUT, 'formulation.csv')}")
opt.close()
