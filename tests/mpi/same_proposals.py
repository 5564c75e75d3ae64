"""Run under mpiexec -n 4: every protocol over MPI; rank 0 compares with the local transport."""

import json
import sys

import numpy as np

import labfbo

FAST = {"num_restarts": 2, "raw_samples": 32}
EXTRA = {"distribution": {"M": 64, "candidates": 128}, "gradient": {"warmup_steps": 5, "svgd_steps": 2},
         "gradient-sa": {"warmup_steps": 5, "svgd_steps": 2, "secure_aggregation": True},  # masked uplink
         "gradient-compact": {"warmup_steps": 5, "svgd_steps": 2, "wire": "compact"},  # 8-bit codes both ways
         "consensus": {}, "independent": {}, "surface": {},
         "surface-budget": {"privacy": labfbo.DP(epsilon=1.0)},  # a campaign budget, calibrated at every rank
         "vote-budget": {"privacy": labfbo.DP(epsilon=1.0)}}  # one randomized response per site

out = {}
for protocol in sys.argv[1:]:
    kw = dict(problem="branin", protocol=protocol.split("-")[0], n_sites=3, n_init=3, budget=2, seed=4, **FAST, **EXTRA[protocol])
    res = labfbo.simulate(transport="mpi", **kw)
    if res is not None:
        local = labfbo.simulate(**kw)
        out[protocol] = {"mpi": res.proposals.tolist(), "local": local.proposals.tolist(),
                         "bytes_mpi": res.bytes_up.tolist(), "bytes_local": local.bytes_up.tolist(),
                         "regret_equal": bool(np.array_equal(res.simple_regret, local.simple_regret)),
                         "epsilon_mpi": res.epsilon, "epsilon_local": local.epsilon}
if out:
    print("RESULT " + json.dumps(out))
