"""What an operator's files and a coordinator must hold to: private file modes and no symlink
followed, ``coordinator init --force`` that says what it replaces, site names by one rule,
dashboard logins throttled without locking out the admin, and DP releases accounted at the
noise the study declares."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import yaml
from toy_protocol import NoisedMean, ToyProtocol

import labfbo
from labfbo.cli import main
from labfbo.core.journal import write_snapshot
from labfbo.core.messages import Abstain, JoinRequest, PrivacyDeclaration
from labfbo.core.names import MAX_SITE_NAME, check_site_name
from labfbo.server.config import ServerConfig, new_token

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)




def _init(tmp_path: Path, *extra: str, sites: tuple[str, ...] = ("a", "b")) -> int:
    space = tmp_path / "space.json"
    if not space.exists():
        space.write_text(SPACE.to_json())
    return main(["coordinator", "init", "--space", str(space), "--sites", *sites,
                 "--out", str(tmp_path / "consortium.yaml"), "--state", "", "--audit-log", "", *extra])


# ------------------------------------------------------------------ 1. 0600 whatever the umask, no symlink followed
def test_the_site_journal_and_its_snapshots_are_0600_and_never_written_through_a_symlink(tmp_path, umask_022) -> None:
    path = tmp_path / "lab.journal"
    opt = labfbo.Optimizer(SPACE, storage=str(path), seed=0, n_init=1)
    opt.tell(opt.ask(), 1.0)
    assert _mode(path) == 0o600  # the key seed, the secret and every raw measurement
    opt.save(str(tmp_path / "lab.snapshot"))
    assert _mode(tmp_path / "lab.snapshot") == 0o600
    opt.close()
    path.chmod(0o644)  # a journal an older labfbo wrote: made private when it is opened again
    labfbo.Optimizer(SPACE, storage=str(path), seed=0, n_init=1).close()
    assert _mode(path) == 0o600

    target = tmp_path / "elsewhere.txt"
    target.write_text("not a journal\n")
    for link, to in ((tmp_path / "link.journal", target), (tmp_path / "dangling.journal", tmp_path / "nothing")):
        link.symlink_to(to)
        with pytest.raises(labfbo.JournalError, match="symbolic link"):
            labfbo.Optimizer(SPACE, storage=str(link), seed=0, n_init=1)
        assert link.is_symlink()  # refused, left as it was
    assert target.read_text() == "not a journal\n" and not (tmp_path / "nothing").exists()
    (tmp_path / "snap").symlink_to(target)
    with pytest.raises(labfbo.JournalError, match="symbolic link"):
        write_snapshot(tmp_path / "snap", [{"op": "header", "v": 1}])
    assert target.read_text() == "not a journal\n"


def test_the_sites_log_of_sent_messages_is_0600_and_never_written_through_a_symlink(tmp_path, umask_022) -> None:
    from labfbo.core.messages import Abstain
    from labfbo.site.ledger import SiteLedger

    path = tmp_path / "sent.jsonl"
    SiteLedger(str(path)).record_sent(Abstain(reason="held", round=1))
    assert _mode(path) == 0o600  # what left the site, statistics of its data included
    (tmp_path / "link.jsonl").symlink_to(path)
    with pytest.raises(labfbo.JournalError, match="symbolic link"):
        SiteLedger(str(tmp_path / "link.jsonl")).record_sent(Abstain(reason="held", round=2))
    assert path.read_text().count("\n") == 1


def test_the_coordinators_state_and_audit_log_are_0600_and_never_written_through_a_symlink(tmp_path,
                                                                                          umask_022) -> None:
    from labfbo.server.store import AuditLog, Store

    store = Store(str(tmp_path / "coordinator.sqlite"))
    store.add_join("a", "{}")  # the WAL now exists: SQLite gives it the database's mode
    assert _mode(tmp_path / "coordinator.sqlite") == 0o600
    assert _mode(tmp_path / "coordinator.sqlite-wal") == 0o600
    store.close()
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    audit.write("a", "POST /v1/join", None, b"{}", 200)
    audit.close()
    assert _mode(tmp_path / "audit.jsonl") == 0o600

    target = tmp_path / "other.sqlite"
    sqlite3.connect(target).close()
    before = target.read_bytes()
    (tmp_path / "linked.sqlite").symlink_to(target)
    with pytest.raises(labfbo.ConfigurationError, match="symbolic link"):
        Store(str(tmp_path / "linked.sqlite"))
    (tmp_path / "s.sqlite-wal").symlink_to(target)
    with pytest.raises(labfbo.ConfigurationError, match="s.sqlite-wal is a symbolic link"):
        Store(str(tmp_path / "s.sqlite"))
    assert target.read_bytes() == before


def test_init_writes_the_config_and_tokens_0600_under_umask_022(tmp_path, umask_022) -> None:
    assert _init(tmp_path) == 0
    assert _mode(tmp_path / "consortium.yaml") == 0o600
    assert _mode(tmp_path / "consortium.tokens.yaml") == 0o600


# ------------------------------------------------------------------ 2. coordinator init --force
def test_init_force_never_writes_through_a_symlink_at_tokens_out(tmp_path, capsys) -> None:
    assert _init(tmp_path) == 0
    before = (tmp_path / "consortium.yaml").read_text()
    target = tmp_path / "shared" / "readable.txt"
    target.parent.mkdir()
    target.write_text("someone else's file\n")
    (tmp_path / "consortium.tokens.yaml").unlink()
    (tmp_path / "consortium.tokens.yaml").symlink_to(target)
    assert _init(tmp_path, "--force") == 2
    err = capsys.readouterr().err
    assert "--tokens-out" in err and "symbolic link" in err
    assert target.read_text() == "someone else's file\n" and (tmp_path / "consortium.tokens.yaml").is_symlink()
    assert (tmp_path / "consortium.yaml").read_text() == before  # nothing half-changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["consortium.tokens.yaml", "consortium.yaml", "shared",
                                                          "space.json"]


def test_init_refuses_to_write_over_the_space_file_even_with_force(tmp_path, capsys) -> None:
    space = tmp_path / "space.json"
    space.write_text(SPACE.to_json())
    for flag in ("--out", "--tokens-out"):
        code = main(["coordinator", "init", "--space", str(space), "--sites", "a", "b", "--state", "",
                     "--audit-log", "", "--force", flag, str(space)])
        err = capsys.readouterr().err
        assert code == 2 and flag in err and "--space" in err and str(space) in err and "same file" in err
        assert space.read_text() == SPACE.to_json()


def test_init_force_says_what_it_replaces_and_starts_a_new_state(tmp_path, capsys) -> None:
    state = tmp_path / "coordinator.sqlite"
    db = sqlite3.connect(state)
    db.execute("CREATE TABLE old_study (x)")
    db.commit()
    db.close()
    (tmp_path / "coordinator.sqlite-wal").write_bytes(b"old wal")
    space = tmp_path / "space.json"
    space.write_text(SPACE.to_json())
    args = ["coordinator", "init", "--space", str(space), "--sites", "a", "b", "--out", str(tmp_path / "c.yaml"),
            "--state", str(state), "--audit-log", ""]
    assert main(args) == 2  # an old study's state is not taken over silently
    assert "coordinator.sqlite" in capsys.readouterr().err and not (tmp_path / "c.yaml").exists()
    assert main([*args, "--force"]) == 0
    out = capsys.readouterr().out
    aside = sorted(tmp_path.glob("coordinator.sqlite.replaced-*"))
    assert [p.name.rpartition("-")[2] for p in aside] != [] and not state.exists()
    assert not (tmp_path / "coordinator.sqlite-wal").exists()  # its WAL went with it (else replayed into the new)
    assert any(p.name.endswith("-wal") and p.read_bytes() == b"old wal" for p in aside)
    main_copy = next(p for p in aside if not p.name.endswith("-wal"))
    assert sqlite3.connect(main_copy).execute("SELECT name FROM sqlite_master").fetchall() == [("old_study",)]
    assert f"moved the old study's state {state} aside to {main_copy}" in out
    assert ServerConfig.load(tmp_path / "c.yaml").state == str(state)
    assert main([*args, "--force"]) == 0  # once more: now it replaces the configuration and its tokens
    out = capsys.readouterr().out
    assert f"replaced {tmp_path / 'c.yaml'} and {tmp_path / 'c.tokens.yaml'} (--force)" in out
    assert "every token of the old configuration stops working" in out


# ------------------------------------------------------------------ 3. site names
@pytest.mark.parametrize("bad", ["a/b", "../x", "c d", ".hidden", "-x", "", "é", "a" * (MAX_SITE_NAME + 1)])
def test_a_site_name_outside_the_rule_is_refused_naming_the_rule(bad) -> None:
    with pytest.raises(labfbo.ValidationError, match=r"\[A-Za-z0-9\]\[A-Za-z0-9\._-\]\*"):
        check_site_name(bad)


def test_the_names_in_use_follow_the_rule() -> None:
    for good in ("lab-a", "site-0", "reactor-1", "s0", "plant_2", "l.3", "A", "a" * MAX_SITE_NAME):
        assert check_site_name(good) == good


def test_site_names_are_checked_at_init_and_by_both_config_loaders(tmp_path, capsys) -> None:
    from labfbo.lab import SiteConfig

    assert _init(tmp_path, sites=("lab-a", "c d")) == 2
    assert "'c d'" in capsys.readouterr().err and not (tmp_path / "consortium.yaml").exists()
    _, digest = new_token()
    (tmp_path / "consortium.yaml").write_text(yaml.safe_dump({"protocol": "distribution",
                                                              "sites": {"lab-a": digest, "../x": digest}}))
    with pytest.raises(labfbo.ConfigurationError, match=r"'\.\./x': a site name must match \[A-Za-z0-9\]"):
        ServerConfig.load(tmp_path / "consortium.yaml")
    (tmp_path / "mpi.yaml").write_text(yaml.safe_dump({"protocol": "distribution", "sites": ["a/b", "c"]}))
    with pytest.raises(labfbo.ConfigurationError, match=r"'a/b': a site name must match"):
        ServerConfig.load(tmp_path / "mpi.yaml")
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({"site": "a/b"}))
    with pytest.raises(labfbo.ConfigurationError, match=r"'a/b': a site name must match"):
        SiteConfig.load(tmp_path / "site.yaml")
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({"site": "lab-a"}))
    assert SiteConfig.load(tmp_path / "site.yaml").storage_path().endswith("lab-a.journal")


def test_a_join_naming_a_site_outside_the_rule_is_refused_by_the_server(tmp_path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from labfbo.server.app import CoordinatorServer

    (token, digest), (other, other_digest) = new_token(), new_token()
    # a configuration built past its loader (model_construct skips the check): the join still refuses the name
    cfg = ServerConfig.model_construct(protocol="independent", sites={"a/b": digest, "lab-a": other_digest},
                                       space=SPACE.model_dump(mode="json"))
    server = CoordinatorServer(cfg)
    try:
        client = TestClient(server.app)
        for bad, tok in (("a/b", token), ("../x", other)):
            req = JoinRequest(site=bad, protocol="independent", space_hash=SPACE.fingerprint(),
                              space=SPACE.model_dump(mode="json"))
            r = client.post("/v1/join", content=req.model_dump_json(), headers={"Authorization": f"Bearer {tok}"})
            assert r.status_code == 422 and "a site name must match [A-Za-z0-9][A-Za-z0-9._-]*" in r.text
            assert tok not in r.text
        assert server.coordinator.members == {}
    finally:
        server.close()


# ------------------------------------------------------------------ 4. dashboard login throttling
def test_wrong_logins_never_lock_the_admin_token_out_and_guesses_stay_slow(tmp_path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from labfbo.server.app import CoordinatorServer

    admin, admin_digest = new_token()
    _, digest = new_token()
    server = CoordinatorServer(ServerConfig(protocol="independent", sites={"a": digest},
                                            admin_token_sha256=admin_digest))
    server.dashboard.throttled_delay = 0.3
    try:
        attacker = TestClient(server.app, client=("10.0.0.66", 5000))
        assert [attacker.post("/dashboard/login", data={"token": f"guess{i}"}).status_code
                for i in range(5)] == [401] * 5
        # the right token from the same address gets in (after the same wait as any guess)
        r = attacker.post("/dashboard/login", data={"token": admin}, follow_redirects=False)
        assert r.status_code == 303 and "labfbo_dashboard=" in r.headers["set-cookie"]
        start = time.monotonic()
        slowed = [attacker.post("/dashboard/login", data={"token": f"more{i}"}) for i in range(2)]
        assert [r.status_code for r in slowed] == [429, 429] and 0 < int(slowed[-1].headers["retry-after"]) <= 60
        assert time.monotonic() - start >= 0.6  # wrong guesses stay throttled: brute force stays slow
        # and from another address, whatever the attacker did
        other = TestClient(server.app, client=("10.0.0.7", 5000))
        r = other.post("/dashboard/login", data={"token": admin}, follow_redirects=False)
        assert r.status_code == 303 and admin not in r.text
    finally:
        server.close()


# ------------------------------------------------------------------ 5. DP accounting at the study's noise
def _dp_study(declared: float | None) -> labfbo.Coordinator:
    extra = {} if declared is None else {"privacy": labfbo.DP(noise_multiplier=declared)}
    coord = labfbo.Coordinator(ToyProtocol.name, sites=["a", "b"], seed=0, space=SPACE, horizon=5, **extra)
    for site in ("a", "b"):
        coord.join(JoinRequest(site=site, protocol=ToyProtocol.name, space_hash=SPACE.fingerprint(),
                               space=SPACE.model_dump(mode="json"),
                               privacy=PrivacyDeclaration(epsilon=50.0, delta=1e-5)))
    return coord


def test_a_release_stating_less_noise_than_the_study_declares_is_refused(toy) -> None:
    coord = _dp_study(4.0)
    for i, stated in enumerate((0.5, None)):
        with pytest.warns(UserWarning, match=r"site 'b' was left out: it states DP noise multiplier "
                                             rf"{0.5 if stated else 0:g}, less than the 4 the study declares"):
            out = coord.admit("b", NoisedMean(mean=0.3, dp_noise_multiplier=stated, round=7 + i))
        assert isinstance(out, Abstain) and out.reason.startswith("rejected: ") and "4" in coord.rejected[7 + i]["b"]
    acc = coord.ledger.account("b")
    assert acc.releases == 0 and not acc.events and not acc.exposed and acc.discarded == 0  # never accounted
    assert coord.ledger.epsilon("b") == 0.0

    # a round: the understated release is left out of the aggregate, the honest one is not
    def gather(requests, quorum, deadline):
        return {"a": NoisedMean(mean=0.1, dp_noise_multiplier=4.0, round=0),
                "b": NoisedMean(mean=0.9, dp_noise_multiplier=1.0, round=0)}

    with pytest.warns(UserWarning, match="site 'b' was left out"):
        replies = coord.run_round(0, gather)
    assert replies["a"].mean == pytest.approx(0.1) and "b" in coord.rejected[0] and "a" not in coord.rejected[0]
    assert coord.ledger.account("a").events == Counter({4.0: 1})


def test_a_release_is_accounted_at_the_noise_the_study_declares(toy) -> None:
    coord, honest = _dp_study(4.0), _dp_study(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # more noise than declared is admitted, without a warning
        claimed = NoisedMean(mean=0.2, dp_noise_multiplier=400.0, round=0)
        assert coord.admit("a", claimed) is claimed  # forwarded as it came
    honest.admit("a", NoisedMean(mean=0.2, dp_noise_multiplier=4.0, round=0))
    assert coord.ledger.account("a").events == honest.ledger.account("a").events == Counter({4.0: 1})
    assert coord.ledger.epsilon("a") == pytest.approx(honest.ledger.epsilon("a"))
    # a study that declares no noise accounts what the release states, as before
    free = _dp_study(None)
    free.admit("a", NoisedMean(mean=0.2, dp_noise_multiplier=400.0, round=0))
    assert free.ledger.account("a").events == Counter({400.0: 1})
