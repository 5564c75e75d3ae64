"""Same seed, same proposals as recorded before a change; journals of a previous release still open.

The fixtures under ``tests/golden/`` were written by ``tests/golden/record.py`` at the
commit named in them. A deliberate change of behaviour records them again (and says so in
its commit); anything else that changes a proposal fails here.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from golden.record import FAST, MIXED, SEED, UNIT_TOL, campaign, differences, one_thread, space_of

import labfbo

GOLDEN = Path(__file__).resolve().parent / "golden"
RECORDED = json.loads((GOLDEN / "proposals.json").read_text())
EXPECTED_JOURNALS = json.loads((GOLDEN / "journals" / "expected.json").read_text())
#: the math kernels one machine can switch between (``tests/golden/kernels.py``): torch's ATen vector
#: width, and MKL's instruction set (torch's BLAS and LAPACK on x86)
KERNELS = {"aten-default": {"ATEN_CPU_CAPABILITY": "default"}, "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
           "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"}, "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}}
#: the ATen kernel this process runs: test_same_seed_gives_the_recorded_proposals checks it, not a subprocess again
NATIVE = f"aten-{torch.backends.cpu.get_cpu_capability().lower()}"


def _same_params(got: list[list[dict[str, Any]]], want: list[list[dict[str, Any]]], tol: float = 1e-12,
                 rel: float = 1e-9) -> None:
    assert len(got) == len(want)
    for r, (g_round, w_round) in enumerate(zip(got, want)):
        for s, (g, w) in enumerate(zip(g_round, w_round, strict=True)):
            assert g.keys() == w.keys(), (r, s)
            for k in g:
                if isinstance(w[k], float):
                    assert g[k] == pytest.approx(w[k], rel=rel, abs=tol), (r, s, k, g[k], w[k])
                else:
                    assert g[k] == w[k], (r, s, k)


@pytest.mark.integration  # campaigns of every protocol
@pytest.mark.parametrize("key", sorted(RECORDED["proposals"]))
def test_same_seed_gives_the_recorded_proposals(key: str) -> None:
    space, f = space_of(key)
    wrong = differences(campaign(key.split("/")[0], space, f), RECORDED["proposals"][key], space)
    assert not wrong, f"{key} proposes other points than recorded:\n" + "\n".join(wrong)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))


@pytest.mark.integration  # every campaign again, in a process of its own per kernel
@pytest.mark.parametrize("kernel", sorted(set(KERNELS) - {NATIVE}))
def test_the_record_holds_under_every_math_kernel_of_this_machine(kernel: str) -> None:
    """What another x86 machine class would run, on this one: the same record holds (the kernel this
    process runs is checked by :func:`test_same_seed_gives_the_recorded_proposals`)."""
    env = KERNELS[kernel]
    needs = {"default": None, "avx2": "avx2", "avx512": "avx512f", "AVX2": "avx2"}[next(iter(env.values()))]
    if platform.machine() not in ("x86_64", "AMD64") or (needs and _cpu_flags() and needs not in _cpu_flags()):
        pytest.skip(f"{kernel} needs an x86 CPU with {needs}")
    script = GOLDEN / "kernels.py"
    run = subprocess.run([sys.executable, str(script)], env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"under {env}:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    checked = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(checked["campaigns"]) == sorted(RECORDED["proposals"])


@pytest.mark.integration
@pytest.mark.parametrize("changed", [{"num_restarts": 1}, {"raw_samples": 64}, {"kernel": "rbf"}])
def test_a_changed_default_fails_the_comparison(changed: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The tolerance that lets every machine class pass still catches a change of behaviour: the
    acquisition's restarts or raw samples, or the GP's kernel, changed from what the record used.
    (Three restarts instead of two find the same optima: no proposal moves by more than 3e-6 of a
    range, which is no change a user could see, and within what another CPU's round-off moves.)"""
    import golden.record as record

    monkeypatch.setattr(record, "FAST", {**record.FAST, **changed})
    moved = []
    for key in ("independent/cont", "surface/mixed", "vote/cont", "gradient-dp-sa/cont"):
        space, f = space_of(key)
        moved += differences(campaign(key.split("/")[0], space, f), RECORDED["proposals"][key], space)
    assert moved, f"{changed} changed no recorded proposal by more than {UNIT_TOL} of a range"


def test_a_journal_of_the_previous_format_opens_and_proposes_what_it_did(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    shutil.copy(GOLDEN / "journals" / "independent-mixed.jsonl", path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = labfbo.Optimizer(MIXED, protocol="independent", site="lab-a", seed=SEED, n_init=3, storage=str(path),
                               **FAST)
    told = {o.trial_id for o in opt.observations if o.trial_id is not None}
    pending = {t.id for t in opt.pending}
    failed = [t for t in opt.trials if t.id not in told | pending]
    assert len(opt.trials) == 6 and len(told) == 4 and len(pending) == 1
    assert len(opt.observations) == 6 and opt.observations[1].sem == 0.05
    assert failed[0].metadata["run_handle"] == "R-17"
    with one_thread():
        nxt = [t.params for t in opt.ask(n=2)]
    _same_params([nxt], [EXPECTED_JOURNALS["independent-mixed"]["next_proposals"]])
    opt.close()


def test_a_federated_journal_of_the_previous_format_gives_the_same_privacy_report() -> None:
    """Its version-1 release records are declared by the protocol now (`legacy_release`) and fold
    into the report the site printed when it wrote them."""
    from labfbo.core.journal import read_records
    from labfbo.core.records import LegacyRelease, parse_record
    from labfbo.privacy.report import report
    from labfbo.protocols import SiteContext, get_protocol, parse_options
    from labfbo.site.state import SiteState

    raw, _ = read_records(GOLDEN / "journals" / "gradient-dp-sa.jsonl", repair=False)
    head, *rest = [parse_record(r) for r in raw]
    assert head.v == 1 and any(isinstance(r, LegacyRelease) for r in rest)
    space = labfbo.SearchSpace.model_validate(head.space)
    protocol = get_protocol(head.protocol)
    state = SiteState(space, protocol.federated)
    for rec in rest:
        state.apply(rec, replay=True)
    logic = protocol.site_logic(space, parse_options(protocol, head.options), SiteContext(site=head.site))
    rows = report([logic.legacy_release(r.model_dump()) for r in state.releases])
    want = EXPECTED_JOURNALS["gradient-dp-sa"]["privacy_report"]
    assert len(rows) == len(want) > 0
    for got, old in zip(rows, want):
        for key, value in old.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert got[key] == value, key


def test_a_federated_journal_with_dp_of_the_previous_format_resumes() -> None:
    """DP settings journaled before budgets existed (no ``epsilon`` key) are the same settings: the
    header an optimizer writes for them today passes the resume check against the old journal's."""
    from labfbo.core.journal import check_header, read_records
    from labfbo.core.records import parse_record
    from labfbo.privacy import DP

    head = parse_record(read_records(GOLDEN / "journals" / "gradient-dp-sa.jsonl", repair=False)[0][0])
    dp = DP(**head.options["privacy"])
    ours = head.model_copy(update={"options": {**head.options, "privacy": dp.model_dump(mode="json")}})
    check_header(head, ours)  # raised "resume with the same setting" when the dump added "epsilon": null
    assert "epsilon" not in dp.model_dump() and DP(epsilon=2.0).model_dump()["epsilon"] == 2.0
