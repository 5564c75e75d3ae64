"""The adapter interface, its discovery, and the four bundled adapters (simulated, csv, http, command)."""

from __future__ import annotations

import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import labfbo
from labfbo.adapters import Adapter, AdapterContext, InstrumentBusy, Measurement, load_adapter
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.trial import Trial
from tests.fake_instrument import FakeInstrument

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Categorical("solvent", ["water", "ethanol"])])
CTX = AdapterContext(site="lab-a", space=SPACE, campaign="c0ffee")


def total(params: dict) -> float:
    """A user's model of the process, measured by the simulated instrument."""
    return params["a"] + params["b"]


def _trial(i: int, x: float = 0.25, solvent: str = "water") -> Trial:
    return Trial(id=i, params={"x": x, "solvent": solvent})


# -- interface and discovery ------------------------------------------------------------------
def test_bundled_adapters_are_registered_entry_points() -> None:
    names = {ep.name for ep in entry_points(group="labfbo.adapters")}
    assert {"simulated", "csv", "http", "command"} <= names
    for name in ("simulated", "csv", "command"):
        assert isinstance(load_adapter(name, **({"command": "echo 1"} if name == "command" else {})), Adapter)


def test_load_adapter_names_the_problem() -> None:
    with pytest.raises(ConfigurationError, match="no adapter 'nope'; installed: command, csv, http, simulated"):
        load_adapter("nope")
    with pytest.raises(ConfigurationError, match="adapter 'simulated': bad configuration.*colour"):
        load_adapter("simulated", colour="red")
    with pytest.raises(ConfigurationError, match="failure_rate must be in"):
        load_adapter("simulated", failure_rate=2.0)


def test_measurement_is_validated() -> None:
    assert Measurement.coerce(1.5) == Measurement(value=1.5)
    assert Measurement.coerce((1.5, 0.1)).sem == 0.1
    assert Measurement.failure("", why=1).reason == "failed"
    for bad in (dict(value=float("nan")), dict(value=None), dict(failed=True, value=1.0), dict(value=1.0, sem=-1.0)):
        with pytest.raises(ValueError):
            Measurement(**bad)
    with pytest.raises(labfbo.core.exceptions.ValidationError):
        Measurement.coerce(float("inf"))


def test_an_adapter_must_implement_run_or_submit_and_poll() -> None:
    class Half(Adapter):
        def submit(self, trial):  # no poll
            return {}

    class Async(Adapter):
        def submit(self, trial):
            return {"id": trial.id, "t": time.time()}

        def poll(self, handle):
            return 2.0 * handle["id"] if time.time() > handle["t"] + 0.05 else None

    assert not Half().implemented and Async().implemented and Async().asynchronous
    Async.poll_interval = 0.01
    assert Async().run(_trial(3)) == 6.0  # the default run() submits and polls


# -- simulated --------------------------------------------------------------------------------------
def test_simulated_is_deterministic_noisy_and_fails_at_its_rate(tmp_path: Path) -> None:
    sim = load_adapter("simulated", problem="branin", noise_std=0.5, seed=3)
    t = Trial(id=7, params={"x1": 1.0, "x2": 2.0})
    assert sim.run(t) == sim.run(t)  # keyed by (seed, site, trial id)
    clean = load_adapter("simulated", problem="branin").run(t).value
    assert sim.run(t).value != clean
    flaky = load_adapter("simulated", problem="branin", failure_rate=0.3)
    fails = sum(flaky.run(Trial(id=i, params=t.params)).failed for i in range(200))
    assert 35 <= fails <= 85
    with pytest.raises(ConfigurationError, match="not the simulated problem's"):
        sim.prepare(CTX)


def test_simulated_user_function_async_and_recover_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    sim = load_adapter("simulated", function="tests.test_adapters:total", run_time=0.2, log=str(log))
    assert sim.asynchronous and sim.space is None
    trial = Trial(id=4, params={"a": 1.0, "b": 2.0})
    handle = sim.submit(trial)
    assert sim.poll(handle) is None
    assert sim.recover(trial)["ready_at"] == pytest.approx(handle["ready_at"])
    assert sim.recover(Trial(id=5, params={})) is None
    time.sleep(0.25)
    assert sim.poll(handle).value == 3.0
    with pytest.raises(ConfigurationError, match="cannot import function"):
        load_adapter("simulated", function="math:nope")


# -- csv file drop ----------------------------------------------------------------------------------
def test_csv_queue_results_partial_writes_duplicates_and_recovery(tmp_path: Path) -> None:
    q, r = tmp_path / "queue.csv", tmp_path / "results.csv"
    a = load_adapter("csv", queue=str(q), results=str(r))
    a.prepare(CTX)
    h0, h1 = a.submit(_trial(0)), a.submit(_trial(1, 0.5, "ethanol"))
    a.submit(_trial(0))  # idempotent
    assert q.read_text() == "trial_id,campaign,x,solvent\n0,c0ffee,0.25,water\n1,c0ffee,0.5,ethanol\n"
    assert a.poll(h0) is None and a.recover(_trial(1)) == h1 and a.recover(_trial(2)) is None

    r.write_bytes(b"\xef\xbb\xbftrial_id,value,sem,operator\r\n0,1.5")  # BOM, CRLF, a half-written row
    assert a.poll(h0) is None
    with open(r, "ab") as fh:
        fh.write(b"0,0.01,ok\r\n")
    assert a.poll(h0) == Measurement.ok(1.50, 0.01, operator="ok")
    with pytest.warns(UserWarning, match="2 result rows for trial 0; using the first"):
        with open(r, "a") as fh:
            fh.write("0,9.9,,\n")
        assert a.poll(h0).value == 1.5  # never double-counted, never replaced

    with pytest.warns(UserWarning, match="trial 1.*waiting for a corrected row"):
        with open(r, "a") as fh:
            fh.write("1,abc,,,too,many,fields\n")  # unparsable, and longer than the header
        assert a.poll(h1) is None and a.poll(h0).value == 1.5  # one bad row fails nobody
    with open(r, "a") as fh:
        fh.write("1,2.5,,\n")  # the correction, appended
    assert a.poll(h1).value == 2.5
    r.write_text("Trial_ID ; Value ; Failed ; Reason\n1;;yes;column blocked\n")  # another spreadsheet's dialect
    assert a.poll(h1) == Measurement.failure("column blocked")
    r.write_text("id,value\n1,3.0\n")
    with pytest.warns(UserWarning, match="no trial_id column"):
        assert a.poll(h1) is None

    with pytest.raises(ConfigurationError, match="holds trials of another campaign \\(c0ffee; this one is 'beef'"):
        load_adapter("csv", queue=str(q), results=str(r)).prepare(CTX.model_copy(update={"campaign": "beef"}))
    with open(q, "ab") as fh:
        fh.write(b"2,c0ffee,0.1,water")  # an operator saved the queue without a final newline
    a.submit(_trial(3))
    assert q.read_text().endswith("2,c0ffee,0.1,water\n3,c0ffee,0.25,water\n")
    other = labfbo.SearchSpace([labfbo.Real("y", 0.0, 1.0)])
    with pytest.raises(ConfigurationError, match="use another queue file"):
        load_adapter("csv", queue=str(q), results=str(r)).prepare(
            AdapterContext(site="a", space=other, campaign="c0ffee")
        )
    with pytest.raises(ConfigurationError, match="different files"):
        load_adapter("csv", queue=str(q), results=str(q))


# -- command ------------------------------------------------------------------------------------------
def _cmd(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_command_fills_parameters_and_parses_its_output(tmp_path: Path) -> None:
    a = load_adapter("command", command=_cmd("import sys; print('T =', sys.argv[1], 'yield 42.5%')") + ["{x}"])
    assert a.run(_trial(0, x=0.75)) == Measurement.ok(42.5)
    env = _cmd("import os, json; print(json.dumps({'value': float(os.environ['LABFBO_PARAM_X']), "
               "'sem': 0.1, 'batch': os.environ['LABFBO_TRIAL_ID']}))")
    assert load_adapter("command", command=env, parse="json").run(_trial(9, 0.5)) == Measurement.ok(0.5, 0.1, batch="9")
    rx = load_adapter("command", command=_cmd("print('purity=0.93 +/- 0.02; 17 ms')"),
                      parse=r"purity=(?P<value>[\d.]+) \+/- (?P<sem>[\d.]+)")
    assert rx.run(_trial(0)) == Measurement.ok(0.93, 0.02)


def test_command_failures_become_failed_measurements() -> None:
    crash = load_adapter("command", command=_cmd("import sys; sys.stderr.write('no sample loaded'); sys.exit(4)"))
    m = crash.run(_trial(0))
    assert m.failed and "status 4" in m.reason and "no sample loaded" in m.reason
    assert (
        "timed out"
        in load_adapter("command", command=_cmd("import time; time.sleep(5)"), timeout=0.5).run(_trial(0)).reason
    )
    assert "no number" in load_adapter("command", command=_cmd("print('done')")).run(_trial(0)).reason
    assert (
        "is nan" in load_adapter("command", command=_cmd("print('step 3/10 done; purity nan')")).run(_trial(0)).reason
    )
    assert load_adapter("command", command=_cmd("print('{\"failed\": true, \"reason\": \"clog\"}')"),
                        parse="json").run(_trial(0)).reason == "clog"
    assert "could not start" in load_adapter("command", command=["/no/such/program"]).run(_trial(0)).reason
    with pytest.raises(ConfigurationError, match="named group"):
        load_adapter("command", command="echo 1", parse=r"\d+")
    with pytest.raises(ConfigurationError, match="temperature} in .* is neither a parameter"):
        load_adapter("command", command="echo {temperature}").run(_trial(0))
    with pytest.raises(ConfigurationError, match=r"placeholders \['flow-rate'\] .* are neither parameters"):
        load_adapter("command", command="echo {flow-rate} {x}").prepare(CTX)  # refused before any trial runs
    assert (
        load_adapter("command", command=_cmd("import os; print(os.environ['GAIN'])"), env={"GAIN": 2})
        .run(_trial(0))
        .value
        == 2
    )


# -- http (a fake REST instrument on 127.0.0.1) ---------------------------------------------------------
def test_http_adapter_submits_polls_and_never_starts_a_trial_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INSTRUMENT_TOKEN", "s3cret")
    with FakeInstrument(lambda p: 10 * p["x"], polls_to_finish=3, token="s3cret") as inst:
        a = load_adapter("http", url=inst.url, token_env="INSTRUMENT_TOKEN", poll_interval=0.01)
        a.prepare(CTX)
        h = a.submit(_trial(0, 0.3))
        assert a.submit(_trial(0, 0.3)) == h and inst.started == ["lab-a/c0ffee/0"]  # the key makes submit idempotent
        assert a.poll(h) is None and a.poll(h) is None
        m = a.poll(h)
        assert m.value == pytest.approx(3.0) and m.sem == 0.01 and m.metadata == {"instrument_run": h["id"]}
        assert a.recover(_trial(0)) == h and a.recover(_trial(1)) is None
        assert a.run(_trial(2, 0.5)).value == pytest.approx(5.0)  # the synchronous form

        inst.fail_above = 0.9
        assert a.run(_trial(3, 0.95)) == Measurement.failure("pump blocked", instrument_run="r-3")
        assert a.poll({"id": "r-99"}).failed
        inst.busy = True
        with pytest.raises(InstrumentBusy, match="503"):
            a.poll(h)
        inst.busy = False
        inst.token = "rotated"
        with pytest.raises(InstrumentBusy, match="401.*check the token"):
            a.poll(h)  # the run goes on while the token is renewed
        inst.token = "s3cret"
        monkeypatch.setenv("INSTRUMENT_TOKEN", "wrong")
        bad = load_adapter("http", url=inst.url, token_env="INSTRUMENT_TOKEN")
        with pytest.raises(RuntimeError, match="refused the run \\(401\\)"):
            bad.submit(_trial(5))
    with pytest.raises(InstrumentBusy, match="unreachable"):
        a.poll(h)  # the instrument is gone: transient, the loop retries
    with pytest.raises(ConfigurationError, match="INSTRUMENT_TOKEN_UNSET is not set"):
        load_adapter("http", url="http://127.0.0.1:1", token_env="INSTRUMENT_TOKEN_UNSET")
    with pytest.raises(ConfigurationError, match="must start with http"):
        load_adapter("http", url="ftp://x")
