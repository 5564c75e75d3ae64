"""Setting up a consortium: ``labfbo coordinator init --space`` pins the study's space, and a
lab whose space differs (or whose DP budget has no horizon) is refused at its join, over HTTP
as in process, with nothing half-joined."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

import labfbo
from labfbo.cli import main
from labfbo.core.messages import JoinRequest, PrivacyDeclaration
from labfbo.server.config import ServerConfig, hash_token, new_token
from labfbo.server.init_cli import read_space

pytest.importorskip("fastapi")
SPACE = labfbo.SearchSpace([labfbo.Categorical("ligand", ["XPhos", "SPhos", "tBuXPhos", "BrettPhos"]),
                            labfbo.Real("T", 40.0, 100.0), labfbo.Discrete("conc", [0.05, 0.1, 0.2])])
OTHER = labfbo.SearchSpace([labfbo.Categorical("ligand", ["XPhos", "SPhos", "tBuXPhos", "RuPhos"]),
                            labfbo.Real("T", 40.0, 120.0), labfbo.Discrete("conc", [0.05, 0.1, 0.2])])
DISTRIBUTION = {"P": 5, "merge_threshold": 0.05, "temperature_scale": 0.1, "min_temperature": 0.01,
                "value_reweighting": True, "merging": True, "agent_specific": True}


def _init(tmp_path: Path, *extra: str, space: labfbo.SearchSpace = SPACE) -> int:
    (tmp_path / "lab-a-space.json").write_text(space.to_json())
    return main(["coordinator", "init", "--space", str(tmp_path / "lab-a-space.json"), "--sites", "a", "b", "c",
                 "--out", str(tmp_path / "consortium.yaml"), "--state", "", "--audit-log", "", *extra])


def _join(space: labfbo.SearchSpace, site: str, **kw) -> JoinRequest:
    return JoinRequest(site=site, protocol="distribution", space_hash=space.fingerprint(),
                       space=space.model_dump(mode="json"), n_init=2, shared_options=DISTRIBUTION, **kw)


# ------------------------------------------------------------------ init
def test_init_writes_a_config_that_loads_with_the_space_pinned_and_tokens_apart(tmp_path, capsys) -> None:
    assert _init(tmp_path, "--study", "buchwald-2027", "--horizon", "20", "--option", "acquisition=ucb") == 0
    out = capsys.readouterr().out
    cfg = ServerConfig.load(tmp_path / "consortium.yaml")
    assert cfg.study == "buchwald-2027" and cfg.protocol == "distribution" and cfg.horizon == 20
    assert cfg.options == {"acquisition": "ucb"} and cfg.state is None and cfg.audit_log is None
    assert labfbo.SearchSpace.model_validate(cfg.space).fingerprint() == SPACE.fingerprint()
    tokens_file = tmp_path / "consortium.tokens.yaml"
    assert stat.S_IMODE(tokens_file.stat().st_mode) == 0o600
    tokens = yaml.safe_load(tokens_file.read_text())
    assert {s: hash_token(t) for s, t in tokens["sites"].items()} == cfg.sites
    assert hash_token(tokens["admin"]) == cfg.admin_token_sha256
    text = (tmp_path / "consortium.yaml").read_text()
    for t in (tokens["admin"], *tokens["sites"].values()):  # the config holds digests only; stdout neither
        assert t not in text and t not in out
    assert f"wrote {tmp_path / 'consortium.yaml'}" in out and "mode 0600" in out
    assert cfg.coordinator().space.fingerprint() == SPACE.fingerprint()


def test_init_from_a_lab_space_with_stock_pins_the_parameters_only(tmp_path, capsys) -> None:
    stock = labfbo.SearchSpace(list(SPACE.params), allowed=[{"ligand": "XPhos"}, {"ligand": "SPhos"}])
    assert _init(tmp_path, "--horizon", "20", space=stock) == 0
    assert "a lab's stock, which stays with the lab" in capsys.readouterr().out
    cfg = ServerConfig.load(tmp_path / "consortium.yaml")
    assert "allowed" not in cfg.space and cfg.coordinator().space.fingerprint() == SPACE.fingerprint()


def test_init_refuses_to_overwrite_without_force_and_force_makes_new_tokens(tmp_path, capsys) -> None:
    assert _init(tmp_path) == 0
    before = (tmp_path / "consortium.yaml").read_text()
    assert _init(tmp_path) == 2
    assert "already exist" in capsys.readouterr().err and (tmp_path / "consortium.yaml").read_text() == before
    (tmp_path / "consortium.tokens.yaml").chmod(0o644)
    assert _init(tmp_path, "--force") == 0
    assert (tmp_path / "consortium.yaml").read_text() != before
    assert stat.S_IMODE((tmp_path / "consortium.tokens.yaml").stat().st_mode) == 0o600


@pytest.mark.parametrize("extra, why", [
    (("--protocol", "consensus"), "'consensus' does not support categorical parameters (ligand)"),
    (("--protocol", "distribtion"), "did you mean 'distribution'"),
    (("--privacy-floor", "4"), "give the study --horizon"),
    (("--option", "acquisiton=ucb"), "did you mean 'acquisition'"),
    (("--sites", "a", "a"), "unique"),
])
def test_init_refuses_what_serve_would_refuse_and_writes_nothing(tmp_path, capsys, extra, why) -> None:
    assert _init(tmp_path, *extra) == 2
    assert why in capsys.readouterr().err
    assert not (tmp_path / "consortium.yaml").exists() and not (tmp_path / "consortium.tokens.yaml").exists()


def test_init_asks_for_the_horizon_a_protocol_needs(tmp_path, capsys) -> None:
    ordered = labfbo.SearchSpace([labfbo.Real("T", 40.0, 100.0), labfbo.Real("t", 1.0, 24.0)])
    assert _init(tmp_path, "--protocol", "consensus", space=ordered) == 2
    assert "needs the planned number of rounds" in capsys.readouterr().err
    assert _init(tmp_path, "--protocol", "consensus", "--horizon", "30", space=ordered) == 0
    assert ServerConfig.load(tmp_path / "consortium.yaml").coordinator().horizon == 30


def test_a_space_file_may_be_yaml_a_parameter_list_or_a_site_yaml(tmp_path) -> None:
    params = SPACE.model_dump(mode="json")["params"]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE.model_dump(mode="json")))
    (tmp_path / "list.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({"site": "lab-a", "space": params, "protocol": "distribution"}))
    for name in ("space.yaml", "list.yaml", "site.yaml"):
        assert read_space(tmp_path / name).fingerprint() == SPACE.fingerprint(), name
    (tmp_path / "bad.json").write_text(json.dumps({"params": [{"name": "x", "type": "real", "low": 2, "high": 1}]}))
    with pytest.raises(labfbo.ConfigurationError, match="bad.json: not a valid search space"):
        read_space(tmp_path / "bad.json")
    with pytest.raises(labfbo.ConfigurationError, match="cannot read"):
        read_space(tmp_path / "missing.json")


# ------------------------------------------------------------------ served: refusals over HTTP
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration  # `labfbo coordinator serve` in a subprocess
def test_coordinator_serve_serves_an_init_config_and_refuses_another_space_by_name(tmp_path) -> None:
    assert _init(tmp_path, "--horizon", "10") == 0
    tokens = yaml.safe_load((tmp_path / "consortium.tokens.yaml").read_text())
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "labfbo.cli", "coordinator", "serve", "--config",
                             str(tmp_path / "consortium.yaml"), "--port", str(port)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        start_by = time.monotonic() + 120  # importing torch takes a while on a busy machine
        while True:
            assert proc.poll() is None and time.monotonic() < start_by, proc.stderr.read()[-2000:]
            try:
                if requests.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)

        def join(req: JoinRequest) -> requests.Response:
            return requests.post(f"{url}/v1/join", data=req.model_dump_json(), timeout=30,
                                 headers={"Authorization": f"Bearer {tokens['sites'][req.site]}"})

        bad = join(_join(OTHER, "b"))  # the first to join, with another space: the pinned one stands
        assert bad.status_code == 409
        detail = bad.json()["detail"]
        assert detail.startswith("site 'b' has a different search space than the study: parameter 'ligand': choices "
                                 "only in the study's space: ['BrettPhos'] and only in this lab's space: ['RuPhos']")
        assert "parameter 'T': bounds: the study's space has [40.0, 100.0], this lab's space [40.0, 120.0]" in detail
        assert "pinned in its configuration" in detail
        assert join(_join(SPACE, "a")).status_code == 200
        assert join(_join(SPACE, "b")).status_code == 200  # a correct lab joining second is admitted
        status = requests.get(f"{url}/v1/admin/status", timeout=10,
                              headers={"Authorization": f"Bearer {tokens['admin']}"}).json()
        assert status["members"] == ["a", "b"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.integration  # a real uvicorn server
def test_refusals_over_http_are_the_coordinators_words_and_leave_nothing_half_joined(tmp_path) -> None:
    from labfbo.server.app import CoordinatorServer, ServerThread

    tokens = {s: new_token() for s in ("a", "b", "c")}
    admin, admin_hash = new_token()
    cfg = ServerConfig(protocol="distribution", sites={s: h for s, (_, h) in tokens.items()},
                       admin_token_sha256=admin_hash, state=str(tmp_path / "coord.sqlite"))  # no space, no horizon
    dp = PrivacyDeclaration(epsilon=1.0, delta=1e-5)
    refused = [_join(OTHER, "b"), _join(SPACE, "c", privacy=dp)]
    local = cfg.coordinator()  # the same study, in process
    local.join(_join(SPACE, "a"))
    said = []
    for req in refused:
        with pytest.raises(labfbo.FederationError) as err:
            local.join(req)
        said.append(str(err.value))
    assert "the study's space was set by 'a', the first site to join, because the study pins none" in said[0]
    assert "DP(epsilon=1), and no horizon to plan its releases over, and the study sets none" in said[1]

    def post(url: str, req: JoinRequest) -> requests.Response:
        return requests.post(f"{url}/v1/join", data=req.model_dump_json(), timeout=30,
                             headers={"Authorization": f"Bearer {tokens[req.site][0]}"})

    with ServerThread(CoordinatorServer(cfg)) as srv:
        assert post(srv.url, _join(SPACE, "a")).status_code == 200
        for req, words in zip(refused, said):
            r = post(srv.url, req)
            assert r.status_code == 409 and r.json()["detail"] == words
        # a site that plans its budget over its own horizon declares it, and is admitted
        assert post(srv.url, _join(SPACE, "c", privacy=dp.model_copy(update={"horizon": 8}))).status_code == 200
        status = requests.get(f"{srv.url}/v1/admin/status", headers={"Authorization": f"Bearer {admin}"},
                              timeout=10).json()
        assert status["members"] == ["a", "c"] and status["privacy"]["c"]["horizon"] == 8
    with ServerThread(CoordinatorServer(cfg)) as srv:  # restarted from its state: the refused never joined
        assert sorted(srv.server.coordinator.members) == ["a", "c"]


@pytest.mark.integration  # a real uvicorn server and sites
def test_a_dp_site_without_a_horizon_is_refused_over_http_before_it_joins(tmp_path) -> None:
    from labfbo.server.app import CoordinatorServer, ServerThread
    from labfbo.transport.http import HTTPCoordinator

    tokens = {s: new_token() for s in ("a", "b")}
    cfg = ServerConfig(protocol="surface", sites={s: h for s, (_, h) in tokens.items()},
                       space=SPACE.model_dump(mode="json"))
    with ServerThread(CoordinatorServer(cfg)) as srv:
        with pytest.raises(labfbo.FederationError, match="no horizon to plan its releases over"):
            labfbo.Optimizer(SPACE, protocol="surface", site="a", coordinator=HTTPCoordinator(srv.url, tokens["a"][0]),
                             privacy=labfbo.DP(epsilon=2.0), storage=str(tmp_path / "a.journal"))
        assert srv.server.coordinator.members == {} and not (tmp_path / "a.journal").exists()


@pytest.mark.integration  # a real uvicorn server
def test_a_site_below_the_privacy_floor_is_refused_over_http_and_not_listed(tmp_path) -> None:
    from labfbo.server.app import CoordinatorServer, ServerThread

    tokens = {s: new_token() for s in ("a", "b")}
    admin, admin_hash = new_token()
    cfg = ServerConfig(protocol="distribution", horizon=5, privacy_floor={"epsilon": 2.0},
                       admin_token_sha256=admin_hash, sites={s: h for s, (_, h) in tokens.items()},
                       space=SPACE.model_dump(mode="json"))
    with ServerThread(CoordinatorServer(cfg)) as srv:
        for site, dp in (("a", None), ("b", PrivacyDeclaration(epsilon=4.0, delta=1e-5))):
            r = requests.post(f"{srv.url}/v1/join", data=_join(SPACE, site, privacy=dp).model_dump_json(),
                              headers={"Authorization": f"Bearer {tokens[site][0]}"}, timeout=30)
            assert r.status_code == 409 and "the study requires DP(epsilon<=2" in r.json()["detail"]
        status = requests.get(f"{srv.url}/v1/admin/status", headers={"Authorization": f"Bearer {admin}"},
                              timeout=10).json()
        assert status["members"] == [] and status["privacy"] == {}
