"""Record the golden proposals and journals that ``tests/test_golden.py`` replays.

Run from the project root when a deliberate change of behaviour lands (say so in the commit)::

    .venv/bin/python tests/golden/record.py             # proposals, and what the kept journals propose
    .venv/bin/python tests/golden/record.py --journals  # also journals of the current format (drops the old ones)

It writes ``tests/golden/proposals.json`` (every protocol, on a continuous and a mixed
space: the proposals of a small lock-step campaign from seed 7) and two journals of the
current format under ``tests/golden/journals/`` with what their sites propose next. The
commit it was recorded at is written next to the numbers.

One record holds on every x86 machine class. Two machines' math kernels (MKL's and OpenBLAS's
code paths for the CPU's vendor and vector width, torch's ``ATEN_CPU_CAPABILITY``) add float64
sums in other orders, so their proposals differ in the last bits; a DP draw never depends on
those bits (:mod:`labfbo.privacy.streams`), and an acquisition optimized by L-BFGS ends within
about ``sqrt(ftol) ~ 5e-5`` of where the other machine's ended. :func:`differences` holds every
numeric parameter to :data:`UNIT_TOL` of its range (in the unit cube the models work in: a log
parameter on its log scale) and every categorical, integer and stepped choice exactly: far above
round-off, far below what a change of behaviour moves (``tests/test_golden.py`` shows both:
the campaigns under every math kernel this machine offers, and a changed default failing).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/campaign.py

from campaign import run_campaign  # noqa: E402

import labfbo  # noqa: E402
from labfbo.protocols import available_protocols, get_protocol  # noqa: E402

FAST: dict[str, Any] = {"num_restarts": 2, "raw_samples": 32}


def _quick(name: str) -> dict[str, Any]:
    return dict(get_protocol(name).quick_options)


#: every registered protocol with its quick options (``Protocol.quick_options``), then the variants
#: ``<protocol>-<variant>`` recorded beside them (a new protocol is recorded without an edit here)
PROTOCOLS: dict[str, dict[str, Any]] = {
    **{name: _quick(name) for name in available_protocols()},
    "gradient-dp-sa": {**_quick("gradient"), "secure_aggregation": True,
                       "privacy": {"noise_multiplier": 1.0, "clip": 1.0}},
    "surface-dp": {**_quick("surface"), "privacy": {"noise_multiplier": 2.0, "clip": 2.0}},
    "distribution-dp": {**_quick("distribution"), "privacy": {"noise_multiplier": 1.0, "clip": 1.0}},
}
#: also recorded on the mixed space: the protocols that take categorical parameters
MIXED_TOO = {name for name in available_protocols() if "categorical" in get_protocol(name).supported_types}
ROUNDS_OF = {"pooled": 1}  # a MultiTaskGP fit is slow
SITES = ["lab-a", "lab-b", "lab-c"]
SEED, N_INIT, ROUNDS = 7, 4, 2

CONT = labfbo.SearchSpace([labfbo.Real("x", -1.0, 2.0), labfbo.Real("rate", 1e-3, 1.0, log=True)])
MIXED = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0, step=0.05), labfbo.Categorical("c", ["a", "b", "c"]),
                            labfbo.Integer("n", 1, 4)])


def cont_f(i: int, p: dict[str, Any]) -> float:
    return (p["x"] - 0.5 - 0.2 * i) ** 2 + (math.log10(p["rate"]) + 1.5) ** 2


def mixed_f(i: int, p: dict[str, Any]) -> float:
    return (p["x"] - 0.3 - 0.1 * i) ** 2 + {"a": 0.0, "b": -0.5, "c": 0.2}[p["c"]] + 0.1 * (p["n"] - 2) ** 2


def options(name: str) -> dict[str, Any]:
    opts = {**FAST, **PROTOCOLS[name]}
    if "privacy" in opts:
        opts["privacy"] = labfbo.DP(**opts["privacy"])
    return opts


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch and the BLAS on one thread: a GP fit's sums are then added in one order, so the
    proposals are the same whether pytest runs under ``make test`` (OMP_NUM_THREADS=1) or not."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        torch.set_num_threads(before)


def campaign(name: str, space: labfbo.SearchSpace, f: Callable[[int, dict], float]) -> list[list[dict]]:
    """The proposals of a lock-step campaign of three sites (``independent``: three lone labs)."""
    with one_thread():
        return _campaign(name, space, f)


def _campaign(name: str, space: labfbo.SearchSpace, f: Callable[[int, dict], float]) -> list[list[dict]]:
    protocol, opts = name if name in available_protocols() else name.split("-")[0], options(name)
    federated = get_protocol(protocol).federated
    rounds = ROUNDS_OF.get(name, ROUNDS)
    coord = labfbo.Coordinator(protocol, sites=SITES, seed=SEED, horizon=rounds, **opts) if federated else None
    sites = [labfbo.Optimizer(space, protocol=protocol, coordinator=coord, site=s, seed=SEED, n_init=N_INIT,
                              secret=1000 + i, **opts) for i, s in enumerate(SITES)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run_campaign(sites, f, N_INIT, rounds)
    finally:
        for s in sites:
            s.close()


def _journal_campaign(path: Path) -> list[dict[str, Any]]:
    """A lone lab's journal with every kind of record; returns what it proposes next (not journaled)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = labfbo.Optimizer(MIXED, protocol="independent", site="lab-a", seed=SEED, n_init=3, secret=42,
                               storage=str(path), **FAST)
        opt.add_observations([{"x": 0.25, "c": "b", "n": 2}, {"x": 0.9, "c": "a", "n": 4}], [0.1, (0.8, 0.05)])
        first = opt.enqueue({"x": 0.5, "c": "c", "n": 1})
        opt.tell(first, 0.4, metadata={"operator": "ana"})
        for t in opt.ask(n=2):
            opt.tell(t, mixed_f(0, t.params))
        t = opt.ask()
        opt.annotate(t, run_handle="R-17")
        opt.tell_failed(t, reason="clogged line")
        t = opt.ask()
        opt.tell(t, mixed_f(0, t.params))
        pending = opt.ask()  # left pending in the journal
        del pending
        opt.close()
    return _next_from(path)


def _next_from(path: Path) -> list[dict[str, Any]]:
    """What the lone lab of the journal at ``path`` proposes next (asked on a copy: nothing is journaled)."""
    tmp = Path(tempfile.mkdtemp()) / "copy.jsonl"
    shutil.copy(path, tmp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = labfbo.Optimizer(MIXED, protocol="independent", site="lab-a", seed=SEED, n_init=3, storage=str(tmp),
                                 **FAST)
        nxt = [t.params for t in again.ask(n=2)]
        again.close()
    return nxt


def _federated_journal(path: Path) -> list[dict[str, Any]]:
    """A `gradient` site's journal under DP and secure aggregation; returns its privacy report."""
    opts = options("gradient-dp-sa")
    coord = labfbo.Coordinator("gradient", sites=SITES, seed=SEED, horizon=ROUNDS, **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sites = [labfbo.Optimizer(CONT, protocol="gradient", coordinator=coord, site=s, seed=SEED, n_init=3,
                                  secret=7 + i, storage=str(path) if i == 0 else None, **opts)
                 for i, s in enumerate(SITES)]
        run_campaign(sites, cont_f, 3, 2)
        report = sites[0].privacy_report()
        for s in sites:
            s.close()
    return report


def numerics() -> str:
    """The floating-point class of this machine: ``<cpu vendor>-<avx512|avx2|other>`` (Linux; else the platform)."""
    import platform

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() or "unknown"
    vendor = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("vendor_id")), "unknown")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    return f"{vendor}-{'avx512' if 'avx512f' in flags else 'avx2' if 'avx2' in flags else 'other'}"


#: how far a numeric proposal may be from the record, as a share of its parameter's range (unit cube)
UNIT_TOL = 1e-3


def differences(got: list[list[dict[str, Any]]], want: list[list[dict[str, Any]]], space: labfbo.SearchSpace,
                unit_tol: float = UNIT_TOL) -> list[str]:
    """Where the proposals ``got`` differ from ``want`` (empty: the same): a numeric parameter by more
    than ``unit_tol`` of its range, anything else at all."""
    out: list[str] = []
    if len(got) != len(want):
        return [f"{len(got)} rounds, recorded {len(want)}"]
    for r, (g_round, w_round) in enumerate(zip(got, want)):
        if len(g_round) != len(w_round):
            out.append(f"round {r}: {len(g_round)} sites, recorded {len(w_round)}")
            continue
        for s, (g, w) in enumerate(zip(g_round, w_round)):
            if g.keys() != w.keys():
                out.append(f"round {r} site {s}: parameters {sorted(g)}, recorded {sorted(w)}")
                continue
            for p in space.params:
                a, b = g[p.name], w[p.name]
                numeric = isinstance(p, labfbo.Real) and getattr(p, "step", None) is None
                if numeric and isinstance(a, (int, float)) and isinstance(b, (int, float)):
                    gap = abs(p.to_unit(a) - p.to_unit(b))
                    if not gap <= unit_tol:
                        out.append(f"round {r} site {s} {p.name}: {a!r}, recorded {b!r} ({gap:.2g} of its range)")
                elif a != b and not (
                    isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-9 * max(1.0, abs(b))
                ):
                    out.append(f"round {r} site {s} {p.name}: {a!r}, recorded {b!r}")
    return out


def space_of(key: str) -> tuple[labfbo.SearchSpace, Callable[[int, dict], float]]:
    """The space and objective of a recorded campaign ``<name>/<cont|mixed>``."""
    return (CONT, cont_f) if key.split("/")[1] == "cont" else (MIXED, mixed_f)


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "labfbo"], capture_output=True, text=True,
                                cwd=HERE).stdout.strip())
    out: dict[str, Any] = {
        "commit": commit + ("+changes" if dirty else ""),
        "numerics": numerics(),
        "seed": SEED,
        "n_init": N_INIT,
        "rounds": ROUNDS,
        "rounds_of": ROUNDS_OF,
        "mixed_too": sorted(MIXED_TOO),
        "protocols": PROTOCOLS,
        "proposals": {},
    }
    for name in PROTOCOLS:
        for label, space, f in (("cont", CONT, cont_f), ("mixed", MIXED, mixed_f)):
            if label == "mixed" and name not in MIXED_TOO:
                continue
            start = time.perf_counter()
            out["proposals"][f"{name}/{label}"] = campaign(name, space, f)
            print(f"{name} / {label}: {time.perf_counter() - start:.1f} s", flush=True)
    (HERE / "proposals.json").write_text(json.dumps(out, indent=1) + "\n")

    jdir = HERE / "journals"
    if "--journals" in sys.argv[1:]:  # journals of the current format, replacing those of the previous one
        if jdir.exists():
            shutil.rmtree(jdir)
        jdir.mkdir()
        with one_thread():
            nxt = _journal_campaign(jdir / "independent-mixed.jsonl")
            report = _federated_journal(jdir / "gradient-dp-sa.jsonl")
        meta = {"commit": out["commit"], "independent-mixed": {"next_proposals": nxt},
                "gradient-dp-sa": {"privacy_report": report}}
    else:  # the kept journals: only what the lone lab now proposes from its journal
        meta = json.loads((jdir / "expected.json").read_text())
        with one_thread():
            meta["independent-mixed"] = {"next_proposals": _next_from(jdir / "independent-mixed.jsonl"),
                                         "proposed_at": out["commit"]}
    (jdir / "expected.json").write_text(json.dumps(meta, indent=1, default=float) + "\n")
    print("written", os.path.relpath(HERE / "proposals.json"), os.path.relpath(jdir / "expected.json"))


if __name__ == "__main__":
    main()
