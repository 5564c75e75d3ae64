"""Bytes a lab sends per round under `surface`, per space shape.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/surface_bytes.py

Three labs on a local coordinator, six rounds of random results; prints, per space shape,
the number of features p of the shared surface and the size of one `surface_stats` upload
(the message as JSON, what `opt.sent_messages()` lists).
"""

from __future__ import annotations

import numpy as np

import labfbo
from labfbo import Categorical, Discrete, Real, SearchSpace

BASE = Categorical("base", ["P2Et", "BTMG", "MTBD"])
LIGAND = Categorical("ligand", ["XPhos", "t-BuXPhos", "t-BuBrettPhos", "AdBrettPhos"])
SHAPES: dict[str, list] = {
    "3 x 4 x 23 categorical": [BASE, LIGAND, Categorical("additive", [f"additive-{i}" for i in range(23)])],
    "3 x 4 categorical + 1 Discrete": [BASE, LIGAND, Discrete("conc", [0.057, 0.1, 0.153])],
    "3 x 4 categorical + 1 Discrete + 1 Real": [BASE, LIGAND, Discrete("conc", [0.057, 0.1, 0.153]),
                                                Real("temperature", 40.0, 100.0, step=0.5)],
    "3 Real": [Real(f"x{i}", 0.0, 1.0) for i in range(3)],
    "6 Real": [Real(f"x{i}", 0.0, 1.0) for i in range(6)],
}


def upload_bytes(params: list, rounds: int = 6) -> int:
    """The largest `surface_stats` message one of three labs sent, in bytes of JSON."""
    space = SearchSpace(params)
    sites = ["lab-a", "lab-b", "lab-c"]
    coord = labfbo.Coordinator("surface", sites=sites, space=space, seed=0, horizon=rounds + 2)
    opts = [labfbo.Optimizer(space, objective="maximize", protocol="surface", coordinator=coord, site=s, seed=0,
                             n_init=3, horizon=rounds + 2) for s in sites]
    gen = np.random.default_rng(0)
    try:
        for _ in range(rounds):
            for o in opts:
                trial = o.ask()
                o.tell(trial, float(gen.normal()))
        return max(len(m.model_dump_json().encode()) for m in opts[0].sent_messages()
                   if type(m).__name__ == "SurfaceStats")
    finally:
        for o in opts:
            o.close()


def main() -> None:
    from labfbo.protocols.surface.model import SurfaceFeatures

    print("| space | features p | floats p(p+1)/2 + p | `surface_stats` per lab and round |")
    print("|---|---:|---:|---:|")
    for name, params in SHAPES.items():
        p = SurfaceFeatures(SearchSpace(params), fourier=100).p
        nbytes = upload_bytes(params)
        print(f"| {name} | {p} | {p * (p + 1) // 2 + p:,} | {nbytes / 1000:.1f} kB |")


if __name__ == "__main__":
    main()
