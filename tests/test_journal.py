"""storage=: durable journals, crash recovery, resume, save/load."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import labfbo
from labfbo import Optimizer, Real, SearchSpace


def f(params):
    return (params["x"] - 0.5) ** 2 + (math.log10(params["rate"]) + 1.5) ** 2


def campaign(opt: Optimizer, n_tells: int, pending: int = 0) -> None:
    """Ask/tell ``n_tells`` times, then leave ``pending`` trials asked but untold."""
    for _ in range(n_tells):
        t = opt.ask()
        opt.tell(t, f(t.params))
    for _ in range(pending):
        opt.ask()


@pytest.mark.integration  # a multi-site campaign
def test_resume_equals_uninterrupted_run(cont_space, tmp_path, fast):
    path = tmp_path / "site-a.journal"
    opt = Optimizer(cont_space, n_init=3, seed=7, storage=str(path), **fast)
    campaign(opt, 6, pending=1)
    opt.tell_failed(opt.ask(), "broken vial")
    pending = opt.pending
    observations = opt.observations
    trials = opt.trials
    opt.close()
    assert path.read_bytes().count(b"\n") == 1 + 6 + 6 + 2 + 1  # header, 6 asks, 6 tells, 2 asks, 1 fail

    resumed = Optimizer(cont_space, n_init=3, seed=7, storage=str(path), **fast)
    assert resumed.observations == observations
    assert resumed.pending == pending and len(pending) == 1
    assert resumed.trials == trials

    twin = Optimizer(cont_space, n_init=3, seed=7, **fast)
    campaign(twin, 6, pending=1)
    twin.tell_failed(twin.ask(), "broken vial")
    assert twin.trials == trials
    a, b = resumed.ask(), twin.ask()
    assert a.id == b.id and a.params == b.params and a.metadata == b.metadata
    resumed.tell(a, f(a.params))
    twin.tell(b, f(b.params))
    assert resumed.ask(n=2) == twin.ask(n=2)
    resumed.close()


def test_resume_preserves_mixed_types(mixed_space, tmp_path, fast):
    path = tmp_path / "mixed.journal"
    opt = Optimizer(mixed_space, n_init=8, seed=0, storage=str(path), **fast)
    trials = opt.ask(n=8)
    for t in trials[:5]:
        opt.tell(t, 1.0)
    with pytest.warns(UserWarning, match="outside the bounds"):
        opt.add_observations([{"temperature": 300.0, "feed_rate": 0.5, "passes": 9, "solvent": True}], [2.0])
    before = opt.observations
    opt.close()
    again = Optimizer(mixed_space, n_init=8, seed=0, storage=str(path), **fast)
    assert again.trials == opt.trials
    for t1, t2 in zip(opt.trials, again.trials):
        assert [type(v) for v in t1.params.values()] == [type(v) for v in t2.params.values()]
    assert again.observations == before
    assert [type(v) for v in again.observations[0].params.values()] == [float, float, int, bool]
    again.close()


CHILD = textwrap.dedent("""
    import json, math, os, signal, sys
    import labfbo
    path, k = sys.argv[1], int(sys.argv[2])
    space = labfbo.SearchSpace([labfbo.Real("x", -2.0, 3.0), labfbo.Real("rate", 1e-3, 1.0, log=True)])
    def f(p):
        return (p["x"] - 0.5) ** 2 + (math.log10(p["rate"]) + 1.5) ** 2
    opt = labfbo.Optimizer(space, n_init=3, seed=11, storage=path, num_restarts=2, raw_samples=64)
    for i in range(k):
        t = opt.ask()
        y = f(t.params)
        opt.tell(t, y)
        print(json.dumps({"id": t.id, "value": y}), flush=True)
    t = opt.ask()
    print(json.dumps({"pending": t.id, "params": t.params}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    print("survived", flush=True)
""")


@pytest.mark.integration  # a subprocess
def test_sigkill_drill(cont_space, tmp_path, fast):
    path = tmp_path / "killed.journal"
    k = 5
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(k)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    told = {d["id"]: d["value"] for d in lines if "id" in d}
    pend = [d for d in lines if "pending" in d]
    assert len(told) == k and len(pend) == 1 and "survived" not in proc.stdout

    resumed = Optimizer(cont_space, n_init=3, seed=11, storage=str(path), **fast)
    assert {o.trial_id: o.value for o in resumed.observations} == told
    assert [(t.id, t.params) for t in resumed.pending] == [(pend[0]["pending"], pend[0]["params"])]

    twin = Optimizer(cont_space, n_init=3, seed=11, **fast)
    campaign(twin, k, pending=1)
    assert twin.trials == resumed.trials  # the child proposed what this process proposes
    assert resumed.ask() == twin.ask()
    resumed.close()


def test_torn_last_line_is_dropped(cont_space, tmp_path, fast):
    path = tmp_path / "torn.journal"
    opt = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)
    campaign(opt, 4, pending=1)
    observations, trials = opt.observations, opt.trials
    opt.close()
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"v":1,"op":"tel')
    with pytest.warns(UserWarning, match="torn"):
        resumed = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)
    assert path.read_bytes() == good  # the torn tail is cut from the file
    assert resumed.observations == observations and resumed.trials == trials
    twin = Optimizer(cont_space, n_init=3, seed=2, **fast)
    campaign(twin, 4, pending=1)
    t = resumed.ask()
    assert t == twin.ask()
    resumed.tell(t, 1.0)
    resumed.close()
    again = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)  # no warning, readable
    assert len(again.observations) == 5
    again.close()


def test_complete_last_record_without_newline_is_kept(cont_space, tmp_path, fast):
    path = tmp_path / "nonl.journal"
    opt = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)
    t = opt.ask()
    opt.tell(t, 1.5)
    opt.close()
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    again = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)
    assert [o.value for o in again.observations] == [1.5]
    t2 = again.ask()
    again.tell(t2, 2.5)
    again.close()
    third = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)
    assert [o.value for o in third.observations] == [1.5, 2.5]
    third.close()


def test_corrupt_middle_line_is_an_error(cont_space, tmp_path, fast):
    path = tmp_path / "bad.journal"
    opt = Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)
    campaign(opt, 2)
    opt.close()
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"{garbage"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(labfbo.JournalError):
        Optimizer(cont_space, n_init=3, seed=2, storage=str(path), **fast)


@pytest.mark.parametrize("change", [
    {"space": SearchSpace([Real("x", -2.0, 3.0), Real("rate", 1e-3, 2.0, log=True)])},
    {"seed": 4},
    {"objective": "maximize"},
    {"site": "site-b"},
])
def test_journal_of_another_study_is_refused(cont_space, tmp_path, change, fast):
    path = tmp_path / "study.journal"
    opt = Optimizer(cont_space, n_init=3, seed=3, storage=str(path), **fast)
    campaign(opt, 2)
    opt.close()
    content = path.read_bytes()
    kw = {"space": cont_space, "seed": 3, "n_init": 3, **fast, **change}
    with pytest.raises(labfbo.JournalError):
        Optimizer(storage=str(path), **kw)
    assert path.read_bytes() == content


def test_newer_journal_version_is_refused(cont_space, tmp_path, fast):
    path = tmp_path / "future.journal"
    opt = Optimizer(cont_space, n_init=3, seed=3, storage=str(path), **fast)
    opt.close()
    with open(path, "ab") as fh:
        fh.write(b'{"v":99,"op":"tell","id":0,"value":1.0}\n')
    with pytest.raises(labfbo.JournalError, match="newer"):
        Optimizer(cont_space, n_init=3, seed=3, storage=str(path), **fast)


def test_save_load_round_trip(cont_space, tmp_path, fast):
    opt = Optimizer(cont_space, n_init=3, seed=5, **fast)
    opt.add_observations([{"x": 0.0, "rate": 0.05}], [3.0])
    campaign(opt, 4, pending=1)
    snap = tmp_path / "snapshot.jsonl"
    opt.save(str(snap))
    loaded = Optimizer.load(str(snap), **fast)
    assert loaded.observations == opt.observations
    assert loaded.trials == opt.trials and loaded.pending == opt.pending
    assert (loaded.seed, loaded.objective, loaded.n_init, loaded.space) == (5, "minimize", 3, cont_space)
    assert loaded.ask() == opt.ask()

    # load(storage=...) journals what follows; that journal resumes like any other
    store = tmp_path / "continued.journal"
    cont = Optimizer.load(str(snap), storage=str(store), **fast)
    t = cont.ask()
    cont.tell(t, 0.25)
    cont.close()
    resumed = Optimizer(cont_space, n_init=3, seed=5, storage=str(store), **fast)
    assert resumed.observations == cont.observations and resumed.observations[-1].value == 0.25
    resumed.close()
    with pytest.raises(labfbo.JournalError):
        Optimizer.load(str(store), storage=str(store), **fast)  # history already there


def test_load_refuses_non_snapshots(tmp_path):
    path = tmp_path / "nothing.jsonl"
    path.write_text('{"v":1,"op":"tell","id":0,"value":1.0}\n')
    with pytest.raises(labfbo.JournalError):
        Optimizer.load(str(path))


def test_annotate_and_tell_metadata_are_journaled_and_validated(cont_space, tmp_path, fast):
    path = tmp_path / "j"
    opt = labfbo.Optimizer(cont_space, storage=str(path), seed=0, n_init=2, **fast)
    a, b = opt.ask(n=2)
    assert opt.annotate(a, dispatch={"state": "submitted", "handle": {"run": "r-1"}}).metadata["dispatch"][
        "handle"
    ] == {"run": "r-1"}
    n_records = len(path.read_text().splitlines())
    for bad, match in (({"x": float("nan")}, "JSON-serializable"), ({"x": object()}, "JSON-serializable"),
                       ({"source": "me"}, "labfbo's own")):
        with pytest.raises(labfbo.core.exceptions.ValidationError, match=match):
            opt.annotate(a, **bad)
    with pytest.raises(labfbo.core.exceptions.ValidationError, match="JSON-serializable"):
        opt.tell(a, 1.0, metadata={"t": {1, 2}})
    # nothing changed
    assert len(path.read_text().splitlines()) == n_records and opt.state.trials[a.id].state == "pending"
    opt.tell(a, 1.0, metadata={"operator": "kf"})
    opt.tell_failed(b, "pump blocked", metadata={"code": 7})
    with pytest.raises(labfbo.core.exceptions.TrialError, match="already complete"):
        opt.annotate(a, late=True)
    opt.close()
    again = labfbo.Optimizer(cont_space, storage=str(path), seed=0, n_init=2, **fast)
    meta = {t.id: t.metadata for t in again.trials}
    assert meta[a.id]["dispatch"]["state"] == "submitted" and meta[a.id]["operator"] == "kf"
    assert meta[b.id]["code"] == 7 and meta[a.id]["source"] == "design"
    again.close()


def _journal(cont_space, path, seed, fast) -> bytes:
    opt = Optimizer(cont_space, n_init=3, seed=seed, storage=str(path), **fast)
    campaign(opt, 3)
    opt.close()
    return path.read_bytes()


def _edit(path, op: str, change) -> None:
    """Apply ``change`` to the first ``op`` record of the journal at ``path``."""
    lines = path.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if json.loads(line)["op"] == op)
    lines[i] = change(lines[i])
    path.write_text("\n".join(lines) + "\n")


def test_two_journals_concatenated_are_refused_naming_the_line(cont_space, tmp_path, fast):
    a = _journal(cont_space, tmp_path / "a.jsonl", 1, fast)
    b = _journal(cont_space, tmp_path / "b.jsonl", 2, fast)
    both = tmp_path / "ab.jsonl"
    both.write_bytes(a + b)  # cat a.jsonl b.jsonl > ab.jsonl
    second_header = len(a.splitlines()) + 1
    with pytest.raises(labfbo.JournalError, match=rf"ab.jsonl:{second_header}: a second header"):
        Optimizer(cont_space, n_init=3, seed=1, storage=str(both), **fast)
    assert both.read_bytes() == a + b


@pytest.mark.parametrize("op, change, message", [
    ("tell", lambda line: line.replace('"value":', '"value":NaN,"x":', 1), "NaN is not a finite number"),
    ("tell", lambda line: line.replace('"value":', '"value":1e999,"x":', 1), "value: Input should be a finite number"),
    ("tell", lambda line: json.dumps({k: v for k, v in json.loads(line).items() if k != "id"}),
     "'tell' record does not replay \\(id: Field required"),
    ("tell", lambda line: line.replace('"value":', '"value":"high","x":', 1), "value: Input should be a valid number"),
    ("ask", lambda line: line + "\n" + line, "trial id 0 appears twice"),
    ("tell", lambda line: line + "\n" + line, "which is already complete"),
    ("tell", lambda line: line.replace('"id":0', '"id":77', 1), "trial 77, which was never asked"),
])
def test_a_record_that_cannot_be_accounted_for_is_refused_with_its_line(cont_space, tmp_path, fast, op, change,
                                                                         message):
    path = tmp_path / "edited.jsonl"
    _journal(cont_space, path, 3, fast)
    _edit(path, op, change)
    content = path.read_bytes()
    with pytest.raises(labfbo.JournalError, match=rf"edited.jsonl:\d+: .*{message}"):
        Optimizer(cont_space, n_init=3, seed=3, storage=str(path), **fast)
    assert path.read_bytes() == content


def test_load_never_modifies_the_snapshot(cont_space, tmp_path, fast):
    opt = Optimizer(cont_space, n_init=3, seed=5, **fast)
    campaign(opt, 3)
    snap = tmp_path / "snap.jsonl"
    opt.save(str(snap))
    whole = snap.read_bytes()
    snap.write_bytes(whole + b'{"v":1,"op":"te')  # a torn tail: damaged, or still being copied
    with pytest.raises(labfbo.JournalError, match=r"snap.jsonl:\d+: the last record is cut off"):
        Optimizer.load(str(snap), **fast)
    assert snap.read_bytes() == whole + b'{"v":1,"op":"te'
    snap.write_bytes(whole[:-1])  # a complete last record without its newline is read as it is
    assert Optimizer.load(str(snap), **fast).observations == opt.observations
    assert snap.read_bytes() == whole[:-1]
    with pytest.raises(labfbo.JournalError, match="no such snapshot"):
        Optimizer.load(str(tmp_path / "missing.jsonl"))


def test_a_value_beyond_the_float_range_is_a_validation_error(cont_space, fast):
    opt = Optimizer(cont_space, n_init=3, seed=5, **fast)
    t = opt.ask()
    with pytest.raises(labfbo.ValidationError, match="beyond the float range"):
        opt.tell(t, 10 ** 400)
    with pytest.raises(labfbo.ValidationError, match="beyond the float range"):
        opt.tell(t, (1.0, -(10 ** 400)))
    assert opt.pending == [t]


def test_a_hand_edited_last_record_is_refused_not_dropped_as_torn(cont_space, tmp_path, fast):
    path = tmp_path / "last.jsonl"
    _journal(cont_space, path, 3, fast)
    lines = path.read_text().splitlines()
    lines[-1] = lines[-1].replace('"value":', '"value":NaN,"x":', 1)  # the last tell, edited by hand
    path.write_text("\n".join(lines) + "\n")
    content = path.read_bytes()
    with pytest.raises(labfbo.JournalError, match=rf"last.jsonl:{len(lines)}: .*NaN is not a finite number"):
        Optimizer(cont_space, n_init=3, seed=3, storage=str(path), **fast)
    assert path.read_bytes() == content


class _ListBackend:
    """A journal backend of one's own: records in a list (what storage= accepts besides a path)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.closed = 0

    def append(self, record: dict) -> None:
        self.rows.append(json.loads(json.dumps(record)))

    def records(self) -> list[dict]:
        return list(self.rows)

    def close(self) -> None:
        self.closed += 1


def test_a_journal_backend_object_is_storage(cont_space, fast):
    backend = _ListBackend()
    opt = Optimizer(cont_space, storage=backend, seed=0, n_init=2, **fast)
    t = opt.ask()
    opt.tell(t, 1.5)
    opt.close()
    assert [r["op"] for r in backend.rows] == ["header", "ask", "tell"] and backend.closed == 1
    again = Optimizer(cont_space, storage=backend, seed=0, n_init=2, **fast)
    assert again.observations[0].value == 1.5 and again.state.next_id == 1
    with pytest.raises(labfbo.ConfigurationError, match="a path or a journal backend"):
        Optimizer(cont_space, storage=42, **fast)


def test_a_refused_start_leaves_a_new_backend_empty(cont_space, fast):
    backend = _ListBackend()
    coord = labfbo.Coordinator("consensus", sites=["a"], seed=0, horizon=2, **fast)
    with pytest.raises(labfbo.FederationError):
        Optimizer(cont_space, protocol="consensus", coordinator=coord, site="b", storage=backend, **fast)
    assert backend.rows == []
    Optimizer(cont_space, protocol="consensus", coordinator=coord, site="a", storage=backend, **fast).close()
    # the join request and reply, then the reply itself
    assert [r["op"] for r in backend.rows] == ["header", "traffic", "join"]


def test_a_journal_that_does_not_start_with_a_good_header_is_refused_and_released(cont_space, fast):
    backend = _ListBackend()
    backend.rows = [{"v": 2, "op": "tell", "id": 0, "value": 1.0}]
    with pytest.raises(labfbo.JournalError, match="does not start with a header"):
        Optimizer(cont_space, storage=backend, **fast)
    assert backend.closed == 1
    backend.rows = [{"v": 2, "op": "header", "space_hash": "x", "objective": "max", "protocol": "independent",
                     "seed": 0, "site": "site-0", "n_init": 2}]
    with pytest.raises(labfbo.JournalError, match="objective"):
        Optimizer(cont_space, storage=backend, **fast)
    assert backend.closed == 2


@pytest.mark.parametrize("change, message", [
    (lambda r: {**r, "value": True}, "value: Input should be a valid number"),
    (lambda r: {**r, "value": "1.5"}, "value: Input should be a valid number"),
    (lambda r: {**r, "id": 0.0}, "id: Input should be a valid integer"),
])
def test_typed_records_do_not_coerce_a_hand_edited_value(cont_space, tmp_path, fast, change, message):
    path = tmp_path / "j.jsonl"
    opt = Optimizer(cont_space, storage=str(path), seed=0, n_init=2, **fast)
    opt.tell(opt.ask(), 1.0)
    opt.close()
    lines = path.read_text().splitlines()
    lines[-1] = json.dumps(change(json.loads(lines[-1])))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(labfbo.JournalError, match=message):
        Optimizer(cont_space, storage=str(path), seed=0, n_init=2, **fast)
