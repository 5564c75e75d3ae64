"""A federation as one MPI job: the coordinator at rank 0, one site per other rank.

    mpiexec -n 3 python -m mpi4py examples/mpi_campaign.py

(``pip install 'labfbo[mpi]'`` puts ``mpiexec`` in the virtual environment; ``-m mpi4py``
makes an exception on one rank abort the whole job instead of leaving the others waiting.)
Each site rank runs an ordinary ask/tell loop; the coordinator rank serves until every
site has closed its optimizer. For a benchmark campaign, ``labfbo.simulate(...,
transport="mpi")`` does all of this in one call.

Environment:
    LABFBO_EXAMPLE_BUDGET  BO rounds after the initial design (default 10)
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from mpi4py import MPI  # noqa: E402

import labfbo  # noqa: E402
from labfbo.transport.mpi import MPICoordinator, serve  # noqa: E402

BUDGET = int(os.environ.get("LABFBO_EXAMPLE_BUDGET", "10"))
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
names = [f"plant-{i}" for i in range(1, size)]
space = labfbo.SearchSpace([labfbo.Real("temperature", 150.0, 250.0), labfbo.Real("pressure", 1.0, 10.0)])

if rank == 0:
    serve(labfbo.Coordinator("distribution", sites=names, space=space, seed=0))
    print(f"coordinator: {len(names)} sites done", flush=True)
else:
    site = names[rank - 1]
    t0 = 190.0 + 5.0 * rank

    def run_experiment(p: dict) -> float:
        return ((p["temperature"] - t0) / 25.0) ** 2 + ((p["pressure"] - 4.0) / 2.5) ** 2 + 0.1 * math.sin(rank)

    with labfbo.Optimizer(space, protocol="distribution", coordinator=MPICoordinator(), site=site, seed=0,
                          n_init=5) as opt:
        for trial in opt.ask(n=opt.n_init):
            opt.tell(trial, run_experiment(trial.params))
        for _ in range(BUDGET):
            trial = opt.ask()
            opt.tell(trial, run_experiment(trial.params))
        print(f"{site}: best {opt.best.value:.4f} after {len(opt.observations)} experiments; "
              f"sent {sorted({m.kind for m in opt.sent_messages()})}", flush=True)
