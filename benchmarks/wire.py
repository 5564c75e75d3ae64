"""Bytes and round time of a `gradient` campaign with its defaults: 3 sites, a 3-D space.

Uses only the public ``labfbo.simulate``, so the same script measures any build: run it
with ``PYTHONPATH`` pointing at an older checkout for the "before" row.

    python benchmarks/wire.py --transport local http --budget 4
    PYTHONPATH=/tmp/before python benchmarks/wire.py --label before ...

Prints, per transport: MB per site each way in the warm-up round (round 0) and in the
later rounds (mean), and the round latency (slowest site's ``ask()``; later rounds:
median) — one JSON line per transport, for ``docs/benchmarks/transports.md``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import labfbo


def run(transport: str, budget: int, seed: int, **options: object) -> dict[str, object]:
    start = time.perf_counter()
    res = labfbo.simulate("hartmann3", "gradient", n_sites=3, budget=budget, seed=seed, transport=transport,
                          **options)
    wall = time.perf_counter() - start
    up, down = np.asarray(res.bytes_up) / 1e6, np.asarray(res.bytes_down) / 1e6  # (sites, rounds)
    latency = np.asarray(res.ask_seconds).max(axis=0)
    warm = int(np.argmax(up.mean(axis=0)))  # the warm-up round (the first model round)
    later = [t for t in range(up.shape[1]) if t > warm and up[:, t].sum() > 0]
    return {
        "labfbo": labfbo.__version__,
        "transport": transport,
        "budget": budget,
        "seed": seed,
        "options": options,
        "warmup_round": warm,
        "warmup_MB_up": round(float(up[:, warm].mean()), 3),
        "warmup_MB_down": round(float(down[:, warm].mean()), 3),
        "later_MB_up": round(float(up[:, later].mean()), 3),
        "later_MB_down": round(float(down[:, later].mean()), 3),
        "warmup_latency_s": round(float(latency[warm]), 2),
        "later_latency_s": round(float(np.median(latency[later])), 3),
        "wall_s": round(wall, 1),
        "final_best": float(np.asarray(res.best_values)[:, -1].mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", nargs="+", default=["local", "http"])
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--wire", default=None, help="gradient's wire option (e.g. compact), if this build has it")
    args = ap.parse_args()
    opts = {"wire": args.wire} if args.wire else {}
    for transport in args.transport:
        print(json.dumps({"label": args.label, **run(transport, args.budget, args.seed, **opts)}), flush=True)


if __name__ == "__main__":
    main()
