"""What a lab script can get wrong is refused with a labfbo error that names it (and never prints a
secret), before anything changes: a malformed token, a journal path that is a folder, DP settings out
of range, a non-positive ask timeout, an array where one measurement belongs; ``verify=`` reaches the
HTTP client."""

from __future__ import annotations

import numpy as np
import pytest

import labfbo
from labfbo.core.exceptions import ConfigurationError, ValidationError
from labfbo.transport.http import HTTPCoordinator, HTTPLink

SPACE = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0)])
TOKEN = "s3cr3t-Token_value.42"


@pytest.mark.parametrize("token, says", [(TOKEN + "\n", "trailing whitespace"), (" " + TOKEN, "leading whitespace"),
                                         (TOKEN[:5] + " " + TOKEN[5:], "position 6"),
                                         (TOKEN + "é", "non-ASCII")])
def test_a_malformed_token_is_named_and_never_printed(token: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as err:
        HTTPCoordinator("http://127.0.0.1:9", token)
    assert TOKEN not in str(err.value) and TOKEN[:8] not in str(err.value)
    with pytest.raises(ConfigurationError, match=says) as err:
        labfbo.Optimizer(SPACE, protocol="surface", coordinator="http://127.0.0.1:9", token=token, site="a")
    assert TOKEN not in str(err.value)


def test_an_unreachable_coordinator_error_never_quotes_the_token() -> None:
    link = HTTPLink(HTTPCoordinator("http://127.0.0.1:9", TOKEN, retries=1, timeout=0.5), "a")
    with pytest.raises(labfbo.core.exceptions.FederationError) as err:
        link._call("GET", "/v1/health")
    assert "unreachable" in str(err.value) and TOKEN not in str(err.value)


def test_verify_reaches_the_http_client_and_is_refused_where_it_cannot_apply(tmp_path) -> None:
    from labfbo.transport import connect

    ca = tmp_path / "consortium-ca.pem"
    link = connect("https://coord.example:8750", "a", True, "surface", TOKEN, verify=str(ca))
    assert link.cfg.verify == str(ca)
    assert connect("https://coord.example:8750", "a", True, "surface", TOKEN).cfg.verify is True
    coord = labfbo.Coordinator("surface", sites=["a", "b", "c"], space=SPACE)
    with pytest.raises(ConfigurationError, match="verify= applies to an https:// coordinator"):
        connect(coord, "a", True, "surface", None, verify=False)


def test_a_journal_path_that_is_a_folder_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="is a directory") as err:
        labfbo.Optimizer(SPACE, storage=str(tmp_path))
    assert "site.jsonl" in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw, says", [({"epsilon": -1}, "epsilon"), ({"epsilon": 0.0}, "epsilon"),
                                      ({"clip": 0}, "clip"), ({"delta": 1.5}, "delta")])
def test_dp_settings_out_of_range_raise_a_labfbo_error(kw: dict, says: str) -> None:
    with pytest.raises(ConfigurationError, match=f"DP settings: {says}"):
        labfbo.DP(**kw)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "10", True])
def test_ask_refuses_a_timeout_that_is_not_a_positive_number(timeout) -> None:
    opt = labfbo.Optimizer(SPACE, n_init=1, seed=0)
    with pytest.raises(ValidationError, match="timeout must be a number of seconds > 0"):
        opt.ask(timeout=timeout)
    assert len(opt.trials) == 0  # nothing was asked


@pytest.mark.parametrize("value", [np.array([[1.0]]), np.array([1.0]), np.array([1.0, 0.1])])
def test_tell_refuses_an_array_where_one_measurement_belongs(value: np.ndarray) -> None:
    opt = labfbo.Optimizer(SPACE, n_init=1, seed=0)
    t = opt.ask()
    with pytest.raises(ValidationError, match="shape"):
        opt.tell(t, value)
    assert len(opt.observations) == 0
    opt.tell(t, (np.float64(0.5), np.float64(0.1)))  # a (mean, sem) pair is a tuple
    opt.tell(opt.ask(), np.array(0.25))  # a 0-d array holds one number
    assert [o.value for o in opt.observations] == [0.5, 0.25] and opt.observations[0].sem == 0.1


def test_a_site_config_passes_its_ca_bundle_to_the_optimizer(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import labfbo.lab.run as run
    from labfbo.lab import SiteConfig

    (tmp_path / "site.yaml").write_text("site: lab-a\nprotocol: surface\ncoordinator: https://coord.example:8750\n"
                                        "token_file: token.txt\nverify: consortium-ca.pem\n"
                                        "space: [{name: x, type: real, low: 0, high: 1}]\nadapter: {name: simulated}\n")
    (tmp_path / "token.txt").write_text(TOKEN + "\n")
    cfg = SiteConfig.load(tmp_path / "site.yaml")
    with pytest.raises(ConfigurationError, match="no CA bundle at"):
        cfg.tls_verify()
    (tmp_path / "consortium-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    seen: dict = {}
    monkeypatch.setattr(run, "Optimizer", lambda *a, **kw: seen.update(kw))
    run.open_optimizer(cfg, labfbo.adapters.load_adapter("simulated", problem="branin"), secret=1)
    assert seen["verify"] == str(tmp_path / "consortium-ca.pem") and seen["token"] == TOKEN
