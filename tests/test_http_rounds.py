"""How an HTTP round runs: two requests per site and round, nothing between rounds, an ask()
that gives up hands its round to the agent, the polling routes' own parameter checks, and the
coordinator's O(1) token book and deferred account writes."""

from __future__ import annotations

import collections
import json
import threading
import time

import pytest
import requests

import labfbo
from labfbo.server.app import CoordinatorServer, ServerThread
from labfbo.server.config import ServerConfig, TokenBook, new_token
from labfbo.server.store import Store
from labfbo.transport.http import HTTPCoordinator

pytestmark = pytest.mark.integration  # a real uvicorn server

SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
FAST = {"num_restarts": 2, "raw_samples": 32, "M": 64, "candidates": 128}
SITES = ("a", "b", "c")


@pytest.fixture
def study(tmp_path):
    tokens = {s: new_token() for s in SITES}
    audit = tmp_path / "audit.jsonl"
    cfg = ServerConfig(protocol="distribution", seed=0, sites={s: h for s, (_, h) in tokens.items()},
                       space=SPACE.model_dump(mode="json"), audit_log=str(audit), state=str(tmp_path / "s.sqlite"),
                       options=FAST)
    with ServerThread(CoordinatorServer(cfg)) as srv:
        opts = [labfbo.Optimizer(SPACE, protocol="distribution", site=s, seed=0, n_init=2, **FAST,
                                 coordinator=HTTPCoordinator(srv.url, tokens[s][0])) for s in SITES]
        for o in opts:
            for t in o.ask(n=2):
                o.tell(t, t.params["x"] ** 2 + t.params["y"])
        yield srv, opts, audit, {s: t for s, (t, _) in tokens.items()}
        for o in opts:
            o.close()


def _rounds(opts, n: int, timeout: float | None = 60) -> None:
    for _ in range(n):
        trials = [None] * len(opts)

        def one(i: int) -> None:
            trials[i] = opts[i].ask(timeout=timeout)  # noqa: B023 - runs within this round

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(opts))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for o, t in zip(opts, trials):
            o.tell(t, t.params["x"] ** 2 + t.params["y"])


def _site_requests(audit) -> collections.Counter:
    """(site, route kind) -> requests, from the audit log."""
    out: collections.Counter = collections.Counter()
    for line in audit.read_text().splitlines():
        entry = json.loads(line)
        route = entry["route"]
        if entry["site"] in SITES and "/v1/sites/" in route:
            out[entry["site"], route.split()[0] + " " + route.split("/")[-1 if "/want" in route else 4]] += 1
    return out


def test_a_round_of_one_exchange_costs_each_site_two_requests_and_nothing_between_rounds(study) -> None:
    srv, opts, audit, _ = study
    _rounds(opts, 3)
    time.sleep(1.5)  # a site waiting between rounds sends nothing (no agent poll)
    counts = _site_requests(audit)
    for s in SITES:
        assert counts[s, "POST want"] == 3 and counts[s, "POST answers"] == 3, counts
        assert counts[s, "GET work"] == 0, counts  # every want and answer long-polled its next work
    assert all(o.trials[-1].metadata["source"] == "model" for o in opts)


def test_an_ask_that_gives_up_leaves_its_round_to_the_agent(study) -> None:
    srv, opts, audit, _ = study
    a, b, c = opts
    with pytest.warns(UserWarning, match="no guidance"):
        t = c.ask(timeout=0.5)  # c asked for round 0; a and b have not yet: it gives up
    c.tell(t, 0.5)
    _rounds([a, b], 1, timeout=60)  # round 0 needs c's answer: c's agent gives it, a and b are guided
    assert [tr.metadata["source"] for tr in (a.trials[-1], b.trials[-1])] == ["model", "model"]
    assert srv.server.coordinator.contributors == {0: [["a", "b", "c"]]}  # c's agent answered for it
    start = time.monotonic()
    got = c.ask(timeout=30)  # the agent kept round 0's guidance: c's next ask is served from it at once
    assert time.monotonic() - start < 10 and got.metadata == {"source": "model", "round": 0}


def test_the_polling_routes_check_their_parameters(study) -> None:
    srv, _, _, tokens = study
    h = {"Authorization": f"Bearer {tokens['a']}"}
    bad = [("get", "/v1/sites/a/work?wait=31"), ("get", "/v1/sites/a/work?wait=nan"),
           ("get", "/v1/sites/a/work?round=-1"), ("get", "/v1/sites/a/work?round=1_0"),
           ("post", "/v1/sites/a/rounds/1000000001/want"), ("post", "/v1/sites/a/rounds/x/want"),
           ("post", "/v1/sites/a/rounds/0/want?wait=-1"), ("post", "/v1/sites/a/answers/-5"),
           ("post", "/v1/sites/a/answers/1?wait=1e9")]
    for method, path in bad:
        r = getattr(requests, method)(srv.url + path, headers=h, timeout=10)
        assert r.status_code == 422 and isinstance(r.json()["detail"], str), (path, r.status_code, r.text)
    assert requests.get(srv.url + "/v1/sites/b/work?wait=0", headers=h, timeout=10).status_code == 403
    assert requests.get(srv.url + "/v1/sites/a/work?wait=0", timeout=10).status_code == 401
    r = requests.post(srv.url + "/v1/sites/a/rounds/0/want", headers=h, timeout=10)
    assert r.status_code == 202 and r.json() == {"accepted": True, "repeat": False}


def test_the_token_book_looks_a_token_up_by_digest_and_follows_rotation() -> None:
    (ta, ha), (tb, hb) = new_token(), new_token()
    book = TokenBook({"a": ha, "b": hb}, None)
    assert book.site_of(ta) == "a" and book.site_of(tb) == "b" and book.site_of("nope") is None
    tc, hc = new_token()
    book.rotate("a", hc)
    assert book.site_of(ta) is None and book.site_of(tc) == "a" and book.site_of(tb) == "b"


def test_an_account_without_a_budget_is_written_with_the_round_one_with_a_budget_at_once(tmp_path) -> None:
    store = Store(str(tmp_path / "s.sqlite"))
    store.set_budget("a", {"releases": 1, "budget": None})
    store.set_budget("b", {"releases": 1, "budget": 2.0})
    assert store.budgets() == {"b": {"releases": 1, "budget": 2.0}}  # the budgeted one: before its release is used
    store.add_round(0, {"replies": {}})
    assert store.budgets()["a"] == {"releases": 1, "budget": None}  # the other: with the round
    store.set_budget("a", {"releases": 2, "budget": None})
    store.close()  # and on close
    assert Store(str(tmp_path / "s.sqlite")).budgets()["a"]["releases"] == 2


def test_a_site_restarted_with_its_journal_lost_does_not_stall_the_round_under_way(tmp_path) -> None:
    """Round 1 runs with c's request left unanswered (its process hangs: as good as dead); c's process is
    started again with an empty journal. Its link answers the request left for it at once (it has no
    data: it abstains), so a and b get round 1 without waiting out their timeout, and are told that no
    secure sum formed (``model-alone``)."""
    import warnings

    QUICK = {"num_restarts": 2, "raw_samples": 32}  # noqa: N806
    tokens = {s: new_token() for s in SITES}
    cfg = ServerConfig(protocol="surface", seed=0, sites={s: h for s, (_, h) in tokens.items()},
                       space=SPACE.model_dump(mode="json"), state=str(tmp_path / "s.sqlite"), options=QUICK)
    hang = threading.Event()

    def approve(msg) -> bool:  # from round 1 on c's operator never answers
        if msg.round >= 1:
            hang.wait(120)
        return True

    with ServerThread(CoordinatorServer(cfg)) as srv, warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def site(s: str, storage: str, **kw) -> labfbo.Optimizer:
            return labfbo.Optimizer(SPACE, protocol="surface", site=s, seed=0, n_init=2, storage=storage, **QUICK,
                                    coordinator=HTTPCoordinator(srv.url, tokens[s][0]), **kw)

        opts = [site(s, str(tmp_path / f"{s}.jsonl"), **({"approve": approve} if s == "c" else {})) for s in SITES]
        for o in opts:
            for t in o.ask(n=2):
                o.tell(t, t.params["x"] ** 2 + t.params["y"])
        _rounds(opts, 1)
        got: dict[str, object] = {}

        def ask(i: int) -> None:
            try:
                got[SITES[i]] = opts[i].ask(timeout=45)
            except Exception as exc:  # noqa: BLE001 - the hung site's ask, once released
                got[SITES[i]] = exc

        threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(3)]
        for th in threads:
            th.start()
        time.sleep(2.0)  # round 1 is under way; c hangs in its answer
        start = time.monotonic()
        again = site("c", str(tmp_path / "c-lost.jsonl"))  # its journal is lost
        threads[0].join()
        threads[1].join()
        waited = time.monotonic() - start
        hang.set()
        threads[2].join(60)
        assert waited < 30, f"a and b waited {waited:.0f} s for the restarted site"
        assert [got[s].metadata["source"] for s in "ab"] == ["model-alone", "model-alone"]
        assert [got[s].metadata["round"] for s in "ab"] == [1, 1]
        again.close()
        for o in opts:
            o.close()
