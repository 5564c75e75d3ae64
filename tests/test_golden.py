"""Same seed, same proposals as recorded before a change; journals of a previous release still open.

The fixtures under ``tests/golden/`` were written by ``tests/golden/record.py`` at the
commit named in them. A deliberate change of behaviour records them again (and says so in
its commit); anything else that changes a proposal fails here.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

import labfbo
from golden.record import CONT, FAST, MIXED, SEED, campaign, cont_f, mixed_f

GOLDEN = Path(__file__).resolve().parent / "golden"
RECORDED = json.loads((GOLDEN / "proposals.json").read_text())
EXPECTED_JOURNALS = json.loads((GOLDEN / "journals" / "expected.json").read_text())


def _same_params(got: list[list[dict[str, Any]]], want: list[list[dict[str, Any]]]) -> None:
    assert len(got) == len(want)
    for r, (g_round, w_round) in enumerate(zip(got, want)):
        for s, (g, w) in enumerate(zip(g_round, w_round, strict=True)):
            assert g.keys() == w.keys(), (r, s)
            for k in g:
                if isinstance(w[k], float):
                    assert g[k] == pytest.approx(w[k], rel=1e-9, abs=1e-12), (r, s, k, g[k], w[k])
                else:
                    assert g[k] == w[k], (r, s, k)


@pytest.mark.parametrize("key", sorted(RECORDED["proposals"]))
def test_same_seed_gives_the_recorded_proposals(key: str) -> None:
    name, label = key.split("/")
    space, f = (CONT, cont_f) if label == "cont" else (MIXED, mixed_f)
    _same_params(campaign(name, space, f), RECORDED["proposals"][key])


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
    _same_params([[t.params for t in opt.ask(n=2)]], [EXPECTED_JOURNALS["independent-mixed"]["next_proposals"]])
    opt.close()
