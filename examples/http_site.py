"""One site of an HTTP consortium: the lab script a site runs (copy this one).

The site needs the coordinator's URL, its own name and its token (from the consortium's
operator, who keeps only the token's SHA-256). Its measurements stay here: the
journal (``storage=``) is local, and ``sent_messages()`` shows what left.

The same script serves a Flower consortium (``flower_consortium.py``): ``LABFBO_URL`` is
then ``flower://127.0.0.1:PORT``, the bridge this script opens for its lab's SuperNode.

Environment:
    LABFBO_URL, LABFBO_SITE, LABFBO_TOKEN   the coordinator (https://... or flower://...), this site, its token
    LABFBO_EXAMPLE_BUDGET                   BO rounds after the initial design (default 10)
    LABFBO_EXAMPLE_OUT                      where the journal goes (default: current directory)
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import labfbo  # noqa: E402

URL, SITE, TOKEN = os.environ["LABFBO_URL"], os.environ["LABFBO_SITE"], os.environ["LABFBO_TOKEN"]
BUDGET = int(os.environ.get("LABFBO_EXAMPLE_BUDGET", "10"))
OUT = os.environ.get("LABFBO_EXAMPLE_OUT", ".")

space = labfbo.SearchSpace([labfbo.Real("temperature", 150.0, 250.0), labfbo.Real("pressure", 1.0, 10.0)])
OPTIMUM = {"lab-a": (195.0, 4.0), "lab-b": (205.0, 5.0)}[SITE]


def run_experiment(params: dict) -> float:
    """This lab's instrument (simulated): the yield, to be maximized."""
    t0, p0 = OPTIMUM
    return 100.0 * math.exp(
        -0.5 * (((params["temperature"] - t0) / 25.0) ** 2 + ((params["pressure"] - p0) / 2.5) ** 2)
    )


with labfbo.Optimizer(space, objective="maximize", protocol="distribution", coordinator=URL, token=TOKEN,
                      site=SITE, seed=0, n_init=5, storage=os.path.join(OUT, f"{SITE}.journal")) as opt:
    # restarted from its journal: first the experiments asked before the stop, then what is left
    for trial in opt.pending:
        opt.tell(trial, run_experiment(trial.params))
    if len(opt.observations) < opt.n_init:
        for trial in opt.ask(n=opt.n_init - len(opt.observations)):
            opt.tell(trial, run_experiment(trial.params))
    while len(opt.observations) < opt.n_init + BUDGET:
        trial = opt.ask(timeout=300)  # never waits forever for the federation
        opt.tell(trial, run_experiment(trial.params))
    kinds = sorted({m.kind for m in opt.sent_messages()})
    print(f"{SITE}: best yield {opt.best.value:.2f} at {opt.best.params}; sent {kinds}")
