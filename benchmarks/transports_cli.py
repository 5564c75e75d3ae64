r"""``labfbo bench transports``: one campaign on every transport, side by side.

The same campaign (a protocol with its options, ``N`` sites of a built-in family, a budget
and a seed) runs on ``local`` and ``http`` in this process and on ``mpi`` under
``mpiexec -n N+1`` (a subprocess). Per transport: the round latency (a round's slowest
site ``ask()``; median over the rounds after the first, and the first alone — under
``gradient`` it holds the warm-up), the campaign's wall time, the bytes per site and round
each way (the sites' ledgers: wire frames), and whether its proposals equal ``local``'s.

    labfbo bench transports --protocol gradient --sites 3 --budget 3
    labfbo bench transports --protocol gradient --option wire=compact

``flower`` runs a real Flower deployment on 127.0.0.1 (a SuperLink, one SuperNode per site,
labfbo's ServerApp via ``flwr run``; :mod:`labfbo.transport.flower_deploy`) and adds, from
the ServerApp's log, the Flower exchanges per round: the protocol's own (each one Flower
exchange with the participating sites) and in all (with the polls that admit sites,
deliver guidance and hear who wants the next round). Each costs seconds (SuperNodes pull
every 3 s): give Flower small campaigns, e.g.

    labfbo bench transports --protocol gradient --option warmup_steps=5 --transports local flower
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

TRANSPORTS = ("local", "http", "mpi", "flower")


def _campaign(args: argparse.Namespace) -> dict[str, Any]:
    options = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option takes key=value, got {item!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value  # a bare string, e.g. wire=compact
    return {"problem": args.problem, "protocol": args.protocol, "n_sites": args.sites, "budget": args.budget,
            "seed": args.seed, **options}


def _row(transport: str, res: Any) -> dict[str, Any]:
    latency = np.asarray(res.ask_seconds).max(axis=0)
    up, down = np.asarray(res.bytes_up), np.asarray(res.bytes_down)
    return {"transport": transport, "first_round_s": float(latency[0]),
            "round_s": float(np.median(latency[1:])) if latency.size > 1 else float("nan"),
            "wall_s": float(res.wall_time), "mb_up": float(up.mean() / 1e6), "mb_down": float(down.mean() / 1e6),
            "proposals": np.asarray(res.proposals).tolist()}


def _mpi(campaign: dict[str, Any], timeout: float) -> dict[str, Any]:
    exe = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if exe is None:
        return {"transport": "mpi", "error": "mpiexec not found (pip install 'labfbo[mpi]')"}
    cmd = [exe, "-n", str(campaign["n_sites"] + 1), sys.executable, "-m", "mpi4py", "-m",
           "labfbo_bench.transports_cli", "--mpi-rank", json.dumps(campaign)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
    if proc.returncode != 0 or not lines:
        return {"transport": "mpi", "error": f"mpiexec exited {proc.returncode}: {proc.stderr[-500:]}"}
    return json.loads(lines[0][4:])


def _flower(campaign: dict[str, Any]) -> dict[str, Any]:
    """The flower row: a deployment of its own; the exchanges counted from the ServerApp's log."""
    import re
    import tempfile

    from labfbo.apps.simulation import simulate
    from labfbo.transport.flower_deploy import LocalFlowerDeployment

    with tempfile.TemporaryDirectory(prefix="labfbo-bench-flower-") as tmp:
        with LocalFlowerDeployment(campaign["n_sites"], tmp) as fl:
            row = _row("flower", simulate(transport="flower", flower_deployment=fl, **campaign))
            log = "".join(p.read_text(errors="replace") for p in Path(tmp).glob("run-*.log"))
    rounds = [json.loads(m) for m in re.findall(r"round \d+ done in [0-9.]+ s; contributions (\[.*\])", log)]
    total = re.search(r"(\d+) Flower exchanges", log)
    if rounds:
        row["protocol_exchanges_per_round"] = float(np.mean([len(c) for c in rounds]))
    if total and rounds:
        row["flower_exchanges_per_round"] = int(total.group(1)) / len(rounds)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["transport"] == "local" and "error" not in r), None)
    out = ["| transport | first round (s) | later rounds, median (s) | wall (s) | wall / local | MB up / site / round "
           "| MB down / site / round | same proposals as local |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['transport']} | {r['error']} |||||||")
            continue
        same = "—" if base is None or r is base else ("yes" if r["proposals"] == base["proposals"] else "**no**")
        ratio = f"{r['wall_s'] / base['wall_s']:.2f}x" if base is not None else "—"
        out.append(f"| {r['transport']} | {r['first_round_s']:.2f} | {r['round_s']:.3f} | {r['wall_s']:.1f} | {ratio} "
                   f"| {r['mb_up']:.3f} | {r['mb_down']:.3f} | {same} |")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    import torch

    from labfbo.apps.simulation import simulate

    torch.set_num_threads(1)
    campaign = _campaign(args)
    cmd = "labfbo bench transports " + " ".join(sys.argv[3:])
    print(f"{cmd}\ncampaign: {json.dumps(campaign)}")
    rows = []
    for transport in args.transports:
        if transport == "mpi":
            rows.append(_mpi(campaign, args.timeout))
        elif transport == "flower":
            rows.append(_flower(campaign))
        else:
            rows.append(_row(transport, simulate(transport=transport, **campaign)))
        print(f"{transport}: done", flush=True)
    text = table(rows)
    counted = [r for r in rows if "flower_exchanges_per_round" in r]
    for r in counted:
        text += (f"\n\nFlower exchanges per round: {r['protocol_exchanges_per_round']:.1f} of the protocol, "
                 f"{r['flower_exchanges_per_round']:.1f} in all (with the polls, the joins and the leave)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "transports.json").write_text(json.dumps({"command": cmd, "campaign": campaign, "rows": rows}))
    (out / "transports.md").write_text(f"`{cmd}`\n\n{text}\n")
    print(text)
    return 0


BENCH_ORDER = 170  # where `labfbo bench --help` lists it


def add_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = bsub.add_parser("transports", help="one campaign on local, HTTP, MPI and Flower: round latency, bytes, "
                                      "proposals")
    p.add_argument("--protocol", default="gradient")
    p.add_argument("--problem", default="hartmann3")
    p.add_argument("--sites", type=int, default=3)
    p.add_argument("--budget", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a protocol option for every site and the coordinator (JSON value), e.g. wire=compact")
    p.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the mpiexec run")
    p.add_argument("--out", default="runs/bench/transports")
    p.set_defaults(func=run)


if __name__ == "__main__":  # one rank of the mpi row: mpiexec -n N+1 python -m mpi4py -m ...transports_cli --mpi-rank
    import torch

    from labfbo.apps.simulation import simulate

    torch.set_num_threads(1)
    result = simulate(transport="mpi", **json.loads(sys.argv[sys.argv.index("--mpi-rank") + 1]))
    if result is not None:
        print("ROW " + json.dumps(_row("mpi", result)), flush=True)
