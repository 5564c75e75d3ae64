"""Run under mpiexec -n 4: every protocol over MPI; rank 0 compares with the local transport."""

import json
import sys

import numpy as np

import labfbo
from labfbo.protocols import available_protocols, get_protocol

FAST = {"num_restarts": 2, "raw_samples": 32}
EXTRA = {"distribution": {"M": 64, "candidates": 128}, "gradient": {"warmup_steps": 5, "svgd_steps": 2},
         "gradient-sa": {"warmup_steps": 5, "svgd_steps": 2, "secure_aggregation": True},  # masked uplink
         "gradient-compact": {"warmup_steps": 5, "svgd_steps": 2, "wire": "compact"},  # 8-bit codes both ways
         "consensus": {}, "independent": {}, "surface": {},
         "surface-budget": {"privacy": labfbo.DP(epsilon=1.0)},  # a campaign budget, calibrated at every rank
         "vote-budget": {"privacy": labfbo.DP(epsilon=1.0)}}  # one randomized response per site

out = {}
for protocol in sys.argv[1:]:
    name = protocol if protocol in available_protocols() else protocol.split("-")[0]  # a variant: <protocol>-<variant>
    options = EXTRA.get(protocol, get_protocol(name).quick_options)  # a protocol not listed: its quick options
    kw = dict(problem="branin", protocol=name, n_sites=3, n_init=3, budget=2, seed=4, **FAST, **options)
    res = labfbo.simulate(transport="mpi", **kw)
    if res is not None:
        local = labfbo.simulate(**kw)
        out[protocol] = {"mpi": res.proposals.tolist(), "local": local.proposals.tolist(),
                         "bytes_mpi": res.bytes_up.tolist(), "bytes_local": local.bytes_up.tolist(),
                         "regret_equal": bool(np.array_equal(res.simple_regret, local.simple_regret)),
                         "epsilon_mpi": res.epsilon, "epsilon_local": local.epsilon}
if out:
    print("RESULT " + json.dumps(out))
