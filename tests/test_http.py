"""The HTTP transport: a real uvicorn server on 127.0.0.1 (ephemeral port), real clients."""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pytest
import requests
from fastapi import HTTPException

import labfbo
from labfbo.core.messages import Abstain, Array
from labfbo.protocols import available_protocols, get_protocol
from labfbo.protocols.distribution.protocol import OptimumBelief
from labfbo.server.app import CoordinatorServer, ServerThread
from labfbo.server.config import ServerConfig, hash_token, new_token
from labfbo.transport.http import HTTPCoordinator

pytestmark = pytest.mark.integration  # HTTP: a real uvicorn server

pytest.importorskip("fastapi")
FAST = {"num_restarts": 2, "raw_samples": 32}
EXTRA = {"distribution": {"M": 64, "candidates": 128}, "gradient": {"warmup_steps": 5, "svgd_steps": 2},
         "gradient-sa": {"warmup_steps": 5, "svgd_steps": 2, "secure_aggregation": True},  # masked uplink
         "consensus": {}, "independent": {}, "surface": {},
         "vote-budget": {"privacy": labfbo.DP(epsilon=1.0)}}  # randomized responses, calibrated at every site
SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])


#: every registered protocol but the raw-data references, and the variants of EXTRA (``<protocol>-<variant>``)
PROTOCOLS = [p for p in available_protocols() if not get_protocol(p).shares_raw_data] + \
    [v for v in EXTRA if v not in available_protocols()]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_http_gives_the_same_proposals_as_local(protocol: str, cpu_load) -> None:
    """Sites in their own threads, both cores busy with another process: timing must not matter."""
    name = protocol if protocol in available_protocols() else protocol.split("-")[0]
    options = EXTRA.get(protocol, get_protocol(name).quick_options)
    kw = dict(problem="branin", protocol=name, n_sites=3, n_init=3, budget=2, seed=4, **FAST, **options)
    http = labfbo.simulate(transport="http", **kw)
    local = labfbo.simulate(**kw)
    np.testing.assert_array_equal(http.proposals, local.proposals)
    np.testing.assert_array_equal(http.bytes_up, local.bytes_up)
    assert http.epsilon == local.epsilon


def test_a_site_that_does_not_ask_for_frames_gets_and_sends_json(monkeypatch) -> None:
    """The JSON envelope (curl, a script, an older site) carries the same messages: same proposals."""
    import labfbo.transport.http as http_transport

    kw = dict(problem="branin", protocol="gradient", n_sites=3, n_init=3, budget=2, seed=4, **FAST,
              **EXTRA["gradient"])
    local = labfbo.simulate(**kw)
    monkeypatch.setattr(http_transport, "ACCEPT", None)
    sent: list[str] = []
    post = http_transport.HTTPLink._call

    def spy(self, method, path, **kwargs):
        if "/answers/" in path:
            sent.append(kwargs["body"][:4].decode(errors="replace"))
        return post(self, method, path, **kwargs)

    monkeypatch.setattr(http_transport.HTTPLink, "_call", spy)
    json_only = labfbo.simulate(transport="http", **kw)
    np.testing.assert_array_equal(json_only.proposals, local.proposals)
    assert sent and all(head.startswith("{") for head in sent)  # every answer went as JSON


@pytest.fixture
def study(tmp_path):
    """A 3-site distribution study; yields (server thread, tokens, admin token, audit path)."""
    tokens = {s: new_token() for s in ("a", "b", "c")}
    admin, admin_hash = new_token()
    audit = tmp_path / "audit.jsonl"
    cfg = ServerConfig(protocol="distribution", seed=0, sites={s: h for s, (_, h) in tokens.items()},
                       admin_token_sha256=admin_hash, space=SPACE.model_dump(mode="json"), audit_log=str(audit),
                       max_body_bytes=20_000, options={**FAST, **EXTRA["distribution"]})
    with ServerThread(CoordinatorServer(cfg)) as srv:
        yield srv, {s: t for s, (t, _) in tokens.items()}, admin, audit


def _ask_all(opts, **kw) -> list:
    """Every site asks at once, as separate labs do (a round starts when all have asked)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(opts)) as pool:
        return list(pool.map(lambda o: o.ask(**kw), opts))


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def _join(srv, tokens, site: str) -> None:
    req = labfbo.core.messages.JoinRequest(site=site, protocol="distribution", space_hash=SPACE.fingerprint(),
                                      space=SPACE.model_dump(mode="json"), n_init=2,
                                      shared_options={"P": 5, "merge_threshold": 0.05, "temperature_scale": 0.1,
                                                      "min_temperature": 0.01, "value_reweighting": True,
                                                      "merging": True, "agent_specific": True})
    r = requests.post(f"{srv.url}/v1/join", data=req.model_dump_json(), headers=_h(tokens[site]), timeout=10)
    assert r.status_code == 200, r.text


def test_auth_conflicts_and_limits(study) -> None:
    srv, tokens, admin, audit = study
    url = srv.url
    assert requests.get(f"{url}/v1/sites/a/work", headers=_h("wrong"), timeout=10).status_code == 401
    assert requests.get(f"{url}/v1/sites/a/work", timeout=10).status_code == 401
    for s in ("a", "b", "c"):
        _join(srv, tokens, s)
    # site a reading or posting as site b
    assert requests.get(f"{url}/v1/sites/b/work", headers=_h(tokens["a"]), timeout=10).status_code == 403
    assert (
        requests.post(f"{url}/v1/sites/b/answers/1", data="{}", headers=_h(tokens["a"]), timeout=10).status_code == 403
    )
    # no site can skip rounds for everyone (the state would survive a restart)
    for t in (1, 999_999_999):
        r = requests.post(f"{url}/v1/sites/a/rounds/{t}/want", headers=_h(tokens["a"]), timeout=10)
        assert r.status_code == 409 and "the next is 0" in r.json()["detail"]
    # round 0 starts once every site has asked for it; take site a's request
    assert requests.post(f"{url}/v1/sites/a/rounds/0/want", headers=_h(tokens["a"]), timeout=10).status_code == 202
    status = requests.get(f"{url}/v1/admin/status", headers=_h(admin), timeout=10).json()
    assert status["waiting_for"] == {"0/start": ["b", "c"]}
    for s in ("b", "c"):
        assert requests.post(f"{url}/v1/sites/{s}/rounds/0/want", headers=_h(tokens[s]), timeout=10).status_code == 202
    work = requests.get(f"{url}/v1/sites/a/work", params={"wait": 5}, headers=_h(tokens["a"]), timeout=20).json()
    assert work["type"] == "request"
    seq = work["seq"]
    status = requests.get(f"{url}/v1/admin/status", headers=_h(admin), timeout=10).json()
    assert status["waiting_for"] == {f"0/{seq}": ["a", "b", "c"]}
    belief = OptimumBelief(weight=0.5, mean=Array.of([0.2, 0.3]), variance=Array.of([0.01, 0.01]), value=0.1,
                           round=0).model_dump_json()
    r1 = requests.post(f"{url}/v1/sites/a/answers/{seq}", data=belief, headers=_h(tokens["a"]), timeout=10)
    assert r1.status_code == 200 and r1.json() == {"accepted": True, "repeat": False}
    r2 = requests.post(f"{url}/v1/sites/a/answers/{seq}", data=belief, headers=_h(tokens["a"]), timeout=10)
    assert r2.status_code == 200 and r2.json()["repeat"]                       # identical replay
    other = Abstain(reason="changed my mind", round=0).model_dump_json()
    assert requests.post(f"{url}/v1/sites/a/answers/{seq}", data=other, headers=_h(tokens["a"]),
                         timeout=10).status_code == 409                        # different body
    big = json.dumps({"kind": "abstain", "reason": "x" * 30_000})
    assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=big, headers=_h(tokens["b"]),
                         timeout=10).status_code == 413
    nan = belief.replace('"value":0.1', '"value":NaN')
    assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=nan, headers=_h(tokens["b"]),
                         timeout=10).status_code == 422
    bad = OptimumBelief.model_construct(kind="optimum_belief", weight=0.5, mean=Array.of([np.inf, 0.1]),
                                        variance=Array.of([0.01, 0.01]), value=0.0).model_dump_json()
    assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=bad, headers=_h(tokens["b"]),
                         timeout=10).status_code == 422
    huge = json.dumps(
        {
            "kind": "optimum_belief",
            "weight": 0.5,
            "value": 0.0,
            "variance": {"dtype": "float64", "shape": [1], "data": ""},
            "mean": {"dtype": "float64", "shape": [2**70], "data": ""},
        }
    )
    deep = "[" * 9_000 + "]" * 9_000  # under the 20 kB limit, deeper than the JSON parser recurses
    roundless = json.dumps({"kind": "abstain", "reason": "no round field"})  # would count in any round
    assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=roundless, headers=_h(tokens["b"]),
                         timeout=10).status_code == 409
    unhashable = [json.dumps({"kind": ["abstain"], "reason": "x"}), json.dumps({"kind": {"k": 1}, "reason": "x"})]
    utf16 = json.dumps({"kind": "abstain", "reason": "x", "round": 0}).encode("utf-16")  # json.loads would take it
    for body in (huge, deep, b"\xff\xfe", utf16, *unhashable):
        assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=body, headers=_h(tokens["b"]),
                             timeout=10).status_code == 422
    # frames: site b reads its request as one; damaged frames and non-finite arrays in frames are refused
    framed = {**_h(tokens["b"]), "Accept": labfbo.core.wire.MEDIA_TYPE}
    r = requests.get(f"{url}/v1/sites/b/work", params={"wait": 5}, headers=framed, timeout=20)
    assert r.headers["content-type"] == labfbo.core.wire.MEDIA_TYPE and r.headers["X-Labfbo-Work"] == "request"
    assert int(r.headers["X-Labfbo-Seq"]) == seq and labfbo.core.messages.parse(r.content).round == 0
    post_frame = {**_h(tokens["b"]), "Content-Type": labfbo.core.wire.MEDIA_TYPE}
    for body in (
        labfbo.core.wire.pack_json(belief)[:-3],
        labfbo.core.wire.pack_json(bad),
        b"LFBW\x01\xff\xff\xff\xff{}",
    ):
        assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=body, headers=post_frame,
                             timeout=10).status_code == 422
    assert requests.post(f"{url}/v1/sites/b/answers/{seq}", data=labfbo.core.wire.pack_json(belief), headers=post_frame,
                         timeout=10).json() == {"accepted": True, "repeat": False}
    one = SPACE.model_dump(mode="json")["params"][0]
    wide = {"kind": "join", "site": "b", "protocol": "distribution", "space_hash": "0" * 64, "n_init": 1,
            "space": {"params": [{**one, "name": f"x{i}"} for i in range(40_000)]}}
    r = requests.post(f"{url}/v1/join", data=json.dumps(wide), headers=_h(tokens["b"]), timeout=60)
    assert r.status_code == 413  # over this study's body limit: refused before it is read
    with pytest.raises(HTTPException) as refused:  # under a larger limit, before the space is built
        srv.server.join(json.dumps(wide).encode(), "b")
    assert refused.value.status_code == 422 and "40000 parameters (at most 1000: max_params)" in refused.value.detail
    for body in (utf16, *unhashable):  # the join reads the same way
        assert requests.post(f"{url}/v1/join", data=body, headers=_h(tokens["b"]), timeout=10).status_code == 422
    # the audit log has every decision and no token or payload
    text = audit.read_text()
    entries = [json.loads(ln) for ln in text.splitlines()]
    assert {e["decision"] for e in entries} >= {200, 202, 401, 403, 409, 413, 422}
    for t in tokens.values():
        assert t not in text and hash_token(t) not in text
    assert Array.of([0.2, 0.3]).data not in text and "changed my mind" not in text


def _raw(url: str, head: bytes, body: bytes = b"", wait: float = 10.0) -> tuple[bytes, float]:
    """Send raw bytes and return the first bytes of the answer and how long it took."""
    import socket
    import time

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        start = time.monotonic()
        sock.sendall(head + body)
        data = sock.recv(4096)
        return data, time.monotonic() - start


def test_tokens_are_checked_before_the_body_and_slow_bodies_time_out(tmp_path) -> None:
    tokens = {"a": new_token()}
    cfg = ServerConfig(protocol="distribution", sites={"a": tokens["a"][1]}, space=SPACE.model_dump(mode="json"),
                       body_timeout=1.0, options={**FAST, **EXTRA["distribution"]})
    with ServerThread(CoordinatorServer(cfg)) as srv:
        # 3 MB announced (under the 4 MB limit), none of it sent: refused on the token alone
        head = (b"POST /v1/join HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                b"Content-Type: application/json\r\nContent-Length: 3000000\r\n\r\n")
        data, took = _raw(srv.url, head)
        assert data.startswith(b"HTTP/1.1 401") and took < 5
        # a known token, a body that stops arriving: 408 after body_timeout, not a held connection
        head = head.replace(b"Bearer nope", f"Bearer {tokens['a'][0]}".encode()).replace(b"3000000", b"500000")
        data, took = _raw(srv.url, head, b'{"kind": "join", ')
        assert data.startswith(b"HTTP/1.1 408") and 0.9 < took < 10
        limits = srv.server.uvicorn_limits()
        assert limits["limit_concurrency"] == srv.uv.config.limit_concurrency == 1000
        assert requests.get(f"{srv.url}/v1/health", timeout=10).status_code == 200  # no token needed


def test_a_client_that_trickles_its_headers_is_cut_off(tmp_path) -> None:
    import socket
    import time

    tokens = {"a": new_token()}
    cfg = ServerConfig(protocol="distribution", sites={"a": tokens["a"][1]}, space=SPACE.model_dump(mode="json"),
                       poll_wait_max=1.0, keep_alive=2.0, header_timeout=2.0, options={**FAST, **EXTRA["distribution"]})
    with pytest.raises(ValueError, match="keep_alive"):
        ServerConfig(protocol="distribution", sites={"a": tokens["a"][1]}, keep_alive=10.0)  # poll_wait_max 30
    with ServerThread(CoordinatorServer(cfg)) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(20)]
        start = time.monotonic()
        for s in socks:  # slowloris: a byte now and then, never the end of the headers
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        closed = 0
        for s in socks:
            s.sendall(b"X-Slow: 1\r\n")
            try:
                closed += s.recv(100) == b""  # the server closed the connection
            except ConnectionResetError:
                closed += 1
        assert closed == 20 and time.monotonic() - start < 8
        for s in socks:
            s.close()
        # a well-behaved client on a kept-alive connection is unaffected
        with requests.Session() as session:
            for _ in range(3):
                assert session.get(f"{srv.url}/v1/health", timeout=10).status_code == 200
                time.sleep(0.5)


def test_one_address_holds_at_most_its_connections_and_the_others_are_served() -> None:
    import socket

    tokens = {"a": new_token()}
    cfg = ServerConfig(protocol="distribution", sites={"a": tokens["a"][1]}, space=SPACE.model_dump(mode="json"),
                       max_connections_per_address=5, options={**FAST, **EXTRA["distribution"]})
    with ServerThread(CoordinatorServer(cfg)) as srv:
        host, port = srv.url.removeprefix("http://").split(":")

        def connect(source: str) -> socket.socket:
            s = socket.socket()
            s.settimeout(10)
            s.bind((source, 0))
            s.connect((host, int(port)))
            return s

        held = [connect("127.0.0.2") for _ in range(5)]
        for s in held:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        extra = connect("127.0.0.2")
        answer = extra.recv(200)
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in extra.recv(200) + answer
        # another address is served at once, and the held ones still count
        assert requests.get(f"{srv.url}/v1/health", timeout=10).status_code == 200
        for s in [*held, extra]:
            s.close()
        time.sleep(0.5)
        again = connect("127.0.0.2")  # closed connections free their address's slots
        again.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert again.recv(200).startswith(b"HTTP/1.1 200")
        again.close()


def test_an_address_flooding_without_a_token_is_shut_out_unaudited_and_the_sites_are_served(tmp_path) -> None:
    import socket

    tokens = {"a": new_token()}
    audit = tmp_path / "audit.jsonl"
    cfg = ServerConfig(protocol="distribution", sites={"a": tokens["a"][1]}, space=SPACE.model_dump(mode="json"),
                       tokenless_per_minute=5, audit_log=str(audit), options={**FAST, **EXTRA["distribution"]})
    with ServerThread(CoordinatorServer(cfg)) as srv:
        host, port = srv.url.removeprefix("http://").split(":")

        def get(path: str) -> bytes:
            with socket.socket() as s:
                s.settimeout(10)
                s.bind(("127.0.0.4", 0))
                s.connect((host, int(port)))
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                return s.recv(200)

        codes = [get("/v1/sites/a/work")[9:12] for _ in range(8)]
        assert codes == [b"401"] * 5 + [b"429"] * 3
        assert get("/v1/health").startswith(b"HTTP/1.1 429")  # shut out at its connections, whatever it asks
        r = requests.get(f"{srv.url}/v1/sites/a/work", params={"wait": 0}, headers=_h(tokens["a"][0]), timeout=10)
        assert r.status_code == 409 and "join" in r.text  # a site at another address passes the guard (not yet joined)
        refused = [ln for ln in audit.read_text().splitlines() if '"decision": 401' in ln]
        assert len(refused) == 5  # the flood past the limit leaves no audit line


def test_token_rotation_without_restart(study) -> None:
    srv, tokens, admin, _ = study
    url = srv.url
    assert (
        requests.post(f"{url}/v1/admin/sites/a/token", json={}, headers=_h(tokens["a"]), timeout=10).status_code == 401
    )
    r = requests.post(f"{url}/v1/admin/sites/a/token", json={}, headers=_h(admin), timeout=10)
    assert r.status_code == 200
    fresh = r.json()["token"]
    _join(srv, {"a": fresh}, "a")
    old = requests.get(f"{url}/v1/sites/a/work", headers=_h(tokens["a"]), timeout=10)
    assert old.status_code == 401
    status = requests.get(f"{url}/v1/admin/status", headers=_h(admin), timeout=10).json()
    assert status["members"] == ["a"] and status["waiting_for"] == {}


def test_a_silent_site_is_left_out_with_quorum(tmp_path) -> None:
    names = ["s0", "s1", "s2", "s3"]
    tokens = {s: new_token() for s in names}
    cfg = ServerConfig(
        protocol="distribution",
        seed=1,
        quorum=3,
        deadline=1.0,
        sites={s: h for s, (_, h) in tokens.items()},
        space=SPACE.model_dump(mode="json"),
        options={**FAST, **EXTRA["distribution"]},
    )
    with ServerThread(CoordinatorServer(cfg)) as srv:
        opts = [
            labfbo.Optimizer(
                SPACE,
                protocol="distribution",
                site=s,
                seed=1,
                n_init=3,
                **FAST,
                **EXTRA["distribution"],
                coordinator=HTTPCoordinator(srv.url, tokens[s][0]),
            )
            for s in names
        ]
        for i, o in enumerate(opts):
            for t in o.ask(n=3):
                o.tell(t, (t.params["x"] - 0.1 * i) ** 2 + t.params["y"] ** 2)
        opts[3].close()  # s3 stops answering
        for _r in range(3):
            for i, (o, t) in enumerate(zip(opts[:3], _ask_all(opts[:3], timeout=60))):
                assert t.metadata["source"] == "model"
                o.tell(t, (t.params["x"] - 0.1 * i) ** 2 + t.params["y"] ** 2)
        contributors = srv.server.coordinator.contributors
        assert sorted(contributors) == [0, 1, 2]
        assert all(c == [["s0", "s1", "s2"]] for c in contributors.values()), contributors


def test_ask_with_timeout_falls_back_when_the_coordinator_is_unreachable(study) -> None:
    srv, tokens, _, _ = study
    link = HTTPCoordinator(srv.url, tokens["a"], retries=2, backoff=0.05)
    opt = labfbo.Optimizer(SPACE, protocol="distribution", site="a", seed=0, n_init=2, coordinator=link, **FAST,
                           **EXTRA["distribution"])
    for t in opt.ask(n=2):
        opt.tell(t, t.params["x"] ** 2)
    # sites b and c never join: round 0 cannot run
    with pytest.warns(UserWarning, match="no guidance"):
        t = opt.ask(timeout=1.0)
    assert t.metadata["source"] == "model-local"
    with pytest.raises(labfbo.FederationError):
        labfbo.Optimizer(SPACE, protocol="distribution", site="b", seed=0, n_init=2, **FAST,
                         coordinator=HTTPCoordinator("http://127.0.0.1:9", tokens["b"], retries=2, backoff=0.01))


def test_approve_mode_sends_abstain_when_declined(study) -> None:
    srv, tokens, _, _ = study
    seen = []

    def approve(msg):
        seen.append(msg.kind)
        return False

    opts = [labfbo.Optimizer(SPACE, protocol="distribution", site=s, seed=0, n_init=2, **FAST, **EXTRA["distribution"],
                             coordinator=HTTPCoordinator(srv.url, tokens[s]), approve=approve if s == "a" else None)
            for s in ("a", "b", "c")]
    for o in opts:
        for t in o.ask(n=2):
            o.tell(t, t.params["x"] ** 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ask_all(opts)
    assert seen == ["optimum_belief"]
    assert [m.kind for m in opts[0].sent_messages()] == ["join", "abstain"]
    assert srv.server.coordinator.contributors[0] == [["b", "c"]]
    # no site can make everyone skip rounds
    r = requests.post(f"{srv.url}/v1/sites/a/rounds/5/want", headers=_h(tokens["a"]), timeout=10)
    assert r.status_code == 409 and "last completed round is 0" in r.text


def test_failing_and_leaving_sites_are_not_waited_for(study) -> None:
    srv, tokens, _, _ = study
    opts = [labfbo.Optimizer(SPACE, protocol="distribution", site=s, seed=0, n_init=2, **FAST, **EXTRA["distribution"],
                             coordinator=HTTPCoordinator(srv.url, tokens[s])) for s in ("a", "b", "c")]
    for o in opts:
        for t in o.ask(n=2):
            o.tell(t, t.params["x"] ** 2)

    def broken(*args, **kwargs):
        raise RuntimeError("instrument PC out of memory")

    opts[1].agent.logic.answer = broken  # site b cannot answer: the round must not wait for it
    opts[2].close()                  # site c leaves: the round must not wait for it either
    import time

    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"round 0 failed: .*'b': 'FederationError'") as caught:  # no quorum:
        trials = _ask_all(opts[:2], timeout=60)  # the round fails at once, naming the site that failed
    assert time.monotonic() - start < 30
    assert not any("out of memory" in str(w.message) for w in caught)  # never what site b's error said
    assert all(t.metadata["source"] == "model-local" for t in trials)
    assert [m.kind for m in opts[1].sent_messages()] == ["join"]  # nothing but the join left site b


def _campaign(opts, rounds: range, log: list) -> None:
    for _ in rounds:
        trials = _ask_all(opts)
        for i, (o, t) in enumerate(zip(opts, trials)):
            o.tell(t, (t.params["x"] - 0.2 * i) ** 2 + (t.params["y"] + 0.1) ** 2)
            log.append((i, t.params["x"], t.params["y"]))


def _sites(url: str, tokens: dict, tmp_path, tag: str) -> list:
    opts = [labfbo.Optimizer(SPACE, protocol="distribution", site=s, seed=2, n_init=3,
                             storage=str(tmp_path / f"{tag}-{s}.jsonl"),
                             coordinator=HTTPCoordinator(url, tokens[s][0], retries=10, backoff=0.2), **FAST,
                             **EXTRA["distribution"]) for s in ("a", "b", "c")]
    for i, o in enumerate(opts):
        for t in o.ask(n=3):
            o.tell(t, (t.params["x"] - 0.2 * i) ** 2 + (t.params["y"] + 0.1) ** 2)
    return opts


@pytest.mark.timeout(300, method="signal")
def test_coordinator_killed_and_restarted_loses_no_round(tmp_path) -> None:
    import subprocess

    import yaml
    from coordinator_process import free_port, start_coordinator

    tokens = {s: new_token() for s in ("a", "b", "c")}
    cfg = {"protocol": "distribution", "seed": 2, "sites": {s: h for s, (_, h) in tokens.items()},
           "space": SPACE.model_dump(mode="json"), "options": {**FAST, **EXTRA["distribution"]},
           "state": str(tmp_path / "coord.sqlite")}
    (tmp_path / "consortium.yaml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen:
        return start_coordinator(tmp_path / "consortium.yaml", port, tmp_path / "coord.err")

    proc = start()
    try:
        log: list = []
        opts = _sites(url, tokens, tmp_path, "run")
        _campaign(opts, range(2), log)
        proc.kill()  # SIGKILL
        proc.wait()
        proc = start()
        _campaign(opts, range(2), log)
        assert all(len(o.observations) == 3 + 4 for o in opts)
    finally:
        proc.kill()
        proc.wait()
    # an uninterrupted twin gives the same proposals: no round was lost or re-run differently
    twin_cfg = ServerConfig(**{**cfg, "state": None})
    with ServerThread(CoordinatorServer(twin_cfg)) as srv:
        twin_log: list = []
        _campaign(_sites(srv.url, tokens, tmp_path, "twin"), range(4), twin_log)
    assert log == twin_log


def test_a_restarted_server_does_not_wait_for_a_site_that_left_and_refuses_another_studys_state(tmp_path) -> None:
    tokens = {s: new_token() for s in ("a", "b", "c")}
    cfg = ServerConfig(protocol="distribution", seed=2, sites={s: h for s, (_, h) in tokens.items()},
                       space=SPACE.model_dump(mode="json"), options={**FAST, **EXTRA["distribution"]},
                       state=str(tmp_path / "coord.sqlite"))
    with ServerThread(CoordinatorServer(cfg)) as srv:
        opts = _sites(srv.url, tokens, tmp_path, "run")
        _campaign(opts, range(1), [])
        opts[2].close()  # c leaves
    restarted = CoordinatorServer(cfg)
    assert restarted.engine.gone == {"c"} and restarted.coordinator.last_round == 0
    restarted.close()
    other = ServerConfig(**{**cfg.model_dump(), "protocol": "consensus", "horizon": 4, "options": FAST})
    with pytest.raises(labfbo.core.exceptions.ConfigurationError, match="another study's state file"):
        CoordinatorServer(other)


def test_serve_refuses_a_public_address_without_tls(tmp_path, capsys) -> None:
    import yaml

    from labfbo.cli import main

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"protocol": "distribution", "sites": {"a": new_token()[1]}}))
    assert main(["coordinator", "serve", "--config", str(tmp_path / "c.yaml"), "--host", "0.0.0.0"]) == 2
    assert "without TLS" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"protocol": "distribution", "sites": {"a": "not-a-digest"}}))
    assert main(["coordinator", "serve", "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "SHA-256" in capsys.readouterr().err


def test_store_retention_and_audit_pruning(tmp_path) -> None:
    import time

    from labfbo.server.store import AuditLog, Store

    store = Store(str(tmp_path / "s.sqlite"))
    for t in range(6):
        store.add_round(t, {"round": t}, keep=2)
    assert [r["round"] for r in store.rounds()] == [4, 5]
    store.close()
    log = tmp_path / "audit.jsonl"
    log.write_text(json.dumps({"time": time.time() - 10 * 86400, "route": "old"}) + "\n"
                   + json.dumps({"time": time.time(), "route": "new"}) + "\n")
    AuditLog(str(log), retention_days=1)
    assert [json.loads(ln)["route"] for ln in log.read_text().splitlines()] == ["new"]


@pytest.mark.parametrize("how", ["blocking", "async"])
def test_a_newer_poll_of_a_site_ends_the_older_one(how: str) -> None:
    """A site polls from one agent: a poll still waiting when the same site polls again is a killed
    process's, and it ends at once instead of taking the restarted process's work."""
    import asyncio
    import threading
    import time

    from labfbo.server.engine import RoundEngine

    engine = RoundEngine(labfbo.Coordinator("distribution", sites=["a", "b"], space=SPACE))
    got: list[dict] = []

    def poll() -> dict:
        return engine.poll("a", None, 20.0) if how == "blocking" else asyncio.run(engine.apoll("a", None, 20.0))

    old = threading.Thread(target=lambda: got.append(poll()), daemon=True)
    old.start()
    time.sleep(0.3)  # the old poll is waiting
    new = threading.Thread(target=lambda: got.append(poll()), daemon=True)
    new.start()
    old.join(timeout=5.0)
    assert not old.is_alive() and got == [{"type": "wait"}]  # ended by the newer poll, long before its 20 s
    assert new.is_alive()  # the newest keeps waiting for the site's work
    engine.stopped = True
    with engine.cv:
        engine._notify()
    new.join(timeout=5.0)


def test_the_audit_log_caps_its_lines_and_rotates(tmp_path) -> None:
    """A flood of tokenless requests with 60 kB paths: every line under 1 kB, the log and its one
    predecessor within twice the configured size."""
    from labfbo.server.store import AuditLog

    log = tmp_path / "audit.jsonl"
    audit = AuditLog(str(log), max_bytes=20_000)
    for _ in range(300):
        audit.write(None, "/v1/" + "x" * 60_000, None, b"", 401)
    lines = log.read_text().splitlines() + (tmp_path / "audit.jsonl.1").read_text().splitlines()
    assert max(len(ln.encode()) for ln in lines) < 1024
    assert log.stat().st_size <= 20_000 and (tmp_path / "audit.jsonl.1").stat().st_size <= 20_000
    assert len(audit.recent) == 200 and len(audit.recent[-1]["route"]) == 200
    audit.write("lab-a", "/v1/ask", 3, b"{}", 200)  # an ordinary request still lands in the current file
    assert json.loads(log.read_text().splitlines()[-1])["site"] == "lab-a"


def test_a_site_restarted_from_its_journal_rejoins(study, tmp_path) -> None:
    srv, tokens, _, _ = study

    def site(s: str):
        return labfbo.Optimizer(SPACE, protocol="distribution", site=s, seed=0, n_init=2,
                                storage=str(tmp_path / f"{s}.jsonl"), coordinator=HTTPCoordinator(srv.url, tokens[s]),
                                **FAST, **EXTRA["distribution"])

    opts = [site(s) for s in ("a", "b", "c")]
    for o in opts:
        for t in o.ask(n=2):
            o.tell(t, t.params["x"] ** 2)
    first = _ask_all(opts)
    for o, t in zip(opts, first):
        o.tell(t, t.params["x"] ** 2)
    opts[1].close()
    opts[1] = site("b")  # restarted from its journal: same index, round 1 next
    assert len(opts[1].observations) == 3 and opts[1].context.site_index == 1
    second = _ask_all(opts)
    assert all(t.metadata["round"] == 1 and t.metadata["source"] == "model" for t in second)


def test_constrained_spaces_give_the_same_feasible_proposals_over_http() -> None:
    """Constraints are the sites' business: the transport changes nothing, and nothing breaks them."""
    from labfbo import FederatedProblem, LinearConstraint, NonlinearConstraint

    space = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1), labfbo.Real("z", 0, 1)],
                               constraints=[LinearConstraint({"x": 1, "y": 1, "z": 1}, "==", 0.5),
                                            NonlinearConstraint("disc", lambda p: 0.8 - p["x"] ** 2 - p["y"] ** 2)])
    problem = FederatedProblem(
        space=space,
        optima=[0.0, 0.0],
        objectives=[lambda p, s=s: (p["x"] - 0.2 * s) ** 2 + (p["y"] + 0.1) ** 2 for s in (0, 1)],
    )
    kw = dict(problem=problem, protocol="distribution", n_init=3, budget=3, seed=2, **FAST, **EXTRA["distribution"])
    http, local = labfbo.simulate(transport="http", **kw), labfbo.simulate(**kw)
    np.testing.assert_array_equal(http.proposals, local.proposals)
    for x, y, z in local.proposals.reshape(-1, 3):
        assert abs(x + y + z - 0.5) <= 1e-6 and x ** 2 + y ** 2 <= 0.8
