"""The coordinator's live dashboard (``GET /dashboard``): its login, its cookie, and what it shows
in headless Chromium while a 3-site HTTP campaign runs."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from browser import chromium, console_errors

import labfbo
from labfbo.server.app import CoordinatorServer, ServerThread
from labfbo.server.config import ServerConfig, hash_token, new_token
from labfbo.server.dashboard import COOKIE, DashboardStatus, Sessions
from labfbo.transport.http import HTTPCoordinator

pytestmark = pytest.mark.integration  # a real server, a real browser

pytest.importorskip("fastapi")
SPACE = labfbo.SearchSpace([labfbo.Real("x", -1, 1), labfbo.Real("y", -1, 1)])
SITES = ("a", "b", "c")


def _config(tmp_path, **kw) -> tuple[ServerConfig, dict[str, str], str]:
    tokens = {s: new_token() for s in SITES}
    admin, admin_hash = new_token()
    cfg = ServerConfig(**{"protocol": "distribution", "study": "dash-study",
                          "sites": {s: h for s, (_, h) in tokens.items()}, "admin_token_sha256": admin_hash,
                          "space": SPACE.model_dump(mode="json"), "audit_log": str(tmp_path / "audit.jsonl"), **kw})
    return cfg, {s: t for s, (t, _) in tokens.items()}, admin


# ------------------------------------------------------------------ login, cookie, refusals (no browser)
def test_refused_logins_from_one_address_are_throttled(tmp_path) -> None:
    from fastapi.testclient import TestClient

    cfg, tokens, admin = _config(tmp_path)
    server = CoordinatorServer(cfg)
    server.dashboard.throttled_delay = 0.2
    client = TestClient(server.app)
    assert [client.post("/dashboard/login", data={"token": "guess"}).status_code for _ in range(5)] == [401] * 5
    start = time.monotonic()
    r = client.post("/dashboard/login", data={"token": "guess"}, follow_redirects=False)  # slowed, then 429
    assert time.monotonic() - start >= 0.2
    assert r.status_code == 429 and 0 < int(r.headers["retry-after"]) <= 60 and "Too many refused logins" in r.text
    r = client.post("/dashboard/login", data={"token": admin}, follow_redirects=False)  # the right one gets in
    assert r.status_code == 303 and COOKIE in r.headers["set-cookie"]
    other = TestClient(server.app, client=("10.0.0.9", 4000))  # another address is not held up
    assert other.post("/dashboard/login", data={"token": admin}, follow_redirects=False).status_code == 303
    assert "10.0.0.9" not in server.dashboard.throttle.refused  # an address without refusals takes no memory


def test_login_refuses_site_and_unknown_tokens_and_sets_a_strict_session_cookie(tmp_path) -> None:
    from fastapi.testclient import TestClient

    cfg, tokens, admin = _config(tmp_path)
    server = CoordinatorServer(cfg)
    client = TestClient(server.app)  # http://testserver: no TLS
    page = client.get("/dashboard")
    assert page.status_code == 200 and 'id="login"' in page.text and 'type="password"' in page.text
    assert 'id="sites"' not in page.text
    assert client.get("/dashboard/status.json").status_code == 401
    # a token in the URL is never read
    assert 'id="login"' in client.get("/dashboard", params={"token": admin}).text
    assert client.get("/dashboard/status.json", params={"token": admin}).status_code == 401
    # the bearer header of the API is not a dashboard session either
    assert client.get("/dashboard/status.json", headers={"Authorization": f"Bearer {admin}"}).status_code == 401
    for wrong in (tokens["a"], "not-a-token", ""):
        r = client.post("/dashboard/login", data={"token": wrong}, follow_redirects=False)
        assert r.status_code == 401 and 'id="login-message"' in r.text and 'id="login"' in r.text
        assert "set-cookie" not in r.headers
    assert "site tokens are refused" in client.post("/dashboard/login", data={"token": tokens["b"]}).text
    assert client.post("/dashboard/login", data={"token": "x" * 10_000}).status_code == 413  # before it is read

    r = client.post("/dashboard/login", data={"token": admin}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    cookie = r.headers["set-cookie"]
    flags = [f.strip().lower() for f in cookie.split(";")]
    assert "httponly" in flags and "samesite=strict" in flags and "path=/dashboard" in flags
    assert "secure" not in flags  # plain HTTP here
    sid = client.cookies[COOKIE]
    assert admin not in cookie and hash_token(admin) not in cookie and len(sid) >= 40

    status = client.get("/dashboard/status.json")
    assert status.status_code == 200 and status.headers["cache-control"] == "no-store"
    parsed = DashboardStatus.model_validate(status.json())
    assert parsed.study == "dash-study" and [s.name for s in parsed.sites] == list(SITES)
    assert all(s.state == "not joined" for s in parsed.sites) and parsed.current.round == 0
    assert parsed.counting_since.startswith("bytes, answers and round timings count since the coordinator started")
    page = client.get("/dashboard")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    nonce = csp.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in page.text and f'<style nonce="{nonce}">' in page.text
    assert 'id="sites"' in page.text and 'id="current-round"' in page.text and 'id="counting-since"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no external resource

    r = client.post("/dashboard/logout", follow_redirects=False)
    assert r.status_code == 303 and COOKIE in r.headers["set-cookie"]
    assert "max-age=0" in r.headers["set-cookie"].lower()
    # the session is over on the server, even for a client that kept the cookie
    assert client.get("/dashboard/status.json", cookies={COOKIE: sid}).status_code == 401
    assert "session has ended" in client.get("/dashboard", cookies={COOKIE: sid}).text

    # over TLS the cookie is Secure
    tls = TestClient(server.app, base_url="https://testserver")
    r = tls.post("/dashboard/login", data={"token": admin}, follow_redirects=False)
    assert "secure" in [f.strip().lower() for f in r.headers["set-cookie"].split(";")]

    # the audit log has the logins, never their body: no token, no digest, no size
    text = (tmp_path / "audit.jsonl").read_text()
    logins = [e for e in map(json.loads, text.splitlines()) if e["route"] == "POST /dashboard/login"]
    assert [e["decision"] for e in logins] == [401, 401, 401, 401, 413, 303, 303]
    assert all(e["sha256"] is None and e["size"] == 0 for e in logins)
    assert logins[-2]["site"] == "admin" and logins[0]["site"] == "-"
    for t in (admin, *tokens.values()):
        assert t not in text and hash_token(t) not in text
    server.close()


def test_sessions_expire() -> None:
    sessions = Sessions(ttl=0.2)
    sid = sessions.new()
    assert sessions.valid(sid) and not sessions.valid(sid + "x") and not sessions.valid(None)
    time.sleep(0.3)
    assert not sessions.valid(sid)


def test_without_an_admin_token_the_dashboard_is_off(tmp_path) -> None:
    from fastapi.testclient import TestClient

    cfg, tokens, _ = _config(tmp_path, admin_token_sha256=None)
    client = TestClient(CoordinatorServer(cfg).app)
    assert 'id="login"' not in client.get("/dashboard").text
    r = client.post("/dashboard/login", data={"token": tokens["a"]})
    assert r.status_code == 401 and "no admin token" in r.text


@pytest.mark.parametrize("protocol", ["distribution", "gradient", "surface"])
def test_the_coordinators_epsilon_is_the_sites_own(protocol: str) -> None:
    """From the DP fields of the answers alone, the coordinator accounts what each site's journal says."""
    import types

    from campaign import run_campaign

    from labfbo.server.dashboard import PrivacyView

    extra = {"distribution": {"M": 32, "candidates": 64}, "surface": {},
             "gradient": {"warmup_steps": 3, "svgd_steps": 2, "n_particles": 4, "hidden": (8,)}}[protocol]
    dp = labfbo.DP(clip=1.0, noise_multiplier=3.0, delta=1e-6)
    kw = {"num_restarts": 2, "raw_samples": 32, "privacy": dp, **extra}
    coord = labfbo.Coordinator(protocol, sites=["a", "b"], seed=0, space=SPACE, **kw)
    view = PrivacyView(types.SimpleNamespace(coordinator=coord))
    opts = [labfbo.Optimizer(SPACE, protocol=protocol, coordinator=coord, site=s, seed=0, n_init=3, **kw) for s in "ab"]
    run_campaign(opts, lambda i, p: p["x"] ** 2 + 0.1 * i, 3, 2)  # the coordinator accounts what it accepts
    for o in opts:
        view.epsilon(o.site)
        while view.worker is not None:
            time.sleep(0.02)
        eps, text = view.epsilon(o.site)
        n = len(o.releases())
        assert eps == pytest.approx(o.epsilon()) and text == f"{o.epsilon():.3g} at δ = 1e-06 ({n} releases)"


def test_the_dashboard_shows_each_sites_budget_and_when_it_is_spent() -> None:
    import types

    from campaign import run_campaign

    from labfbo.server.dashboard import PrivacyView

    kw = {"num_restarts": 2, "raw_samples": 32, "fourier_features": 4}
    coord = labfbo.Coordinator("surface", sites=["a", "b"], seed=0, space=SPACE, horizon=1,
                               privacy=labfbo.DP(epsilon=1.0, delta=1e-6), **kw)
    view = PrivacyView(types.SimpleNamespace(coordinator=coord))
    opts = [labfbo.Optimizer(SPACE, protocol="surface", coordinator=coord, site=s, seed=0, n_init=3,
                             privacy=labfbo.DP(epsilon=1.0, delta=1e-6) if s == "a" else labfbo.DP(delta=1e-6), **kw)
            for s in "ab"]
    with pytest.warns(UserWarning, match="privacy budget spent"):
        run_campaign(opts, lambda i, p: p["x"] ** 2 + 0.1 * i, 3, 3)
    shown = {}
    for o in opts:
        view.epsilon(o.site)
        while view.worker is not None:
            time.sleep(0.02)
        shown[o.site] = view.budget(o.site)
    assert opts[0].privacy_budget()["exhausted"]
    a = shown["a"]
    assert a.budget == 1.0 and a.budget_text == "ε ≤ 1 at δ = 1e-06" and a.discarded == 0
    assert a.remaining == pytest.approx(1.0 - opts[0].epsilon()) and a.epsilon == pytest.approx(opts[0].epsilon())
    assert a.remaining_text.endswith("but the site's own plan is spent: it releases nothing more")
    assert shown["b"].budget is None and shown["b"].budget_text == shown["b"].remaining_text == "—"  # no budget


# ------------------------------------------------------------------ the page in Chromium, during a campaign


def _wait(browser, condition, what: str, timeout: float = 30.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda b: condition(), message=what)


def _text(browser, css: str) -> str:
    """The element's visible text, read in one script call: the page re-renders every 2 s, so an
    element found in one call may be gone (stale) by the next."""
    text = browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css)
    return (text or "").strip()


def _login(browser, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{url}/dashboard")
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


@pytest.mark.timeout(120, method="signal")
def test_the_dashboard_follows_a_live_campaign_in_chromium(toy, tmp_path) -> None:
    """Three sites over HTTP; site c's answer is held back: the page shows round 0 waiting for c,
    then (without a reload) round 1 once c answers. Epsilon is the sites' own."""
    from selenium.webdriver.common.by import By

    dp = labfbo.DP(clip=1.0, noise_multiplier=2.0, delta=1e-6)
    budgeted = dp.model_copy(update={"epsilon": 5.0})  # site a: the same noise, and a budget the coordinator enforces
    cfg, tokens, admin = _config(tmp_path, protocol="toy-noised-mean", options={"privacy": dp.model_dump()})
    release = threading.Event()
    with ServerThread(CoordinatorServer(cfg)) as srv, chromium(width=1280, height=1100) as browser, \
            ThreadPoolExecutor(3) as pool:
        # a and b add DP noise; c does not (privacy is not a shared option), and its operator
        # approves its answer only once released (the review runs outside the process's compute lock)
        opts = [labfbo.Optimizer(SPACE, protocol="toy-noised-mean", site=s, seed=0, n_init=2,
                                 coordinator=HTTPCoordinator(srv.url, tokens[s]),
                                 **({"approve": lambda msg: release.wait(60)} if s == "c" else
                                    {"privacy": budgeted if s == "a" else dp}))
                for s in SITES]
        for i, o in enumerate(opts):
            for t in o.ask(n=2):
                o.tell(t, t.params["x"] + 0.1 * i)
        asks = [pool.submit(o.ask, timeout=90) for o in opts]

        # no session: the login form; a site token is refused
        browser.get(f"{srv.url}/dashboard")
        assert browser.find_elements(By.ID, "login") and not browser.find_elements(By.ID, "sites")
        _login(browser, srv.url, tokens["a"])
        _wait(browser, lambda: "not the admin token" in _text(browser, "#login-message"), "the refusal")
        assert not browser.get_cookies() and not browser.find_elements(By.ID, "sites")
        assert srv.url + "/dashboard" in browser.current_url and tokens["a"] not in browser.current_url
        console_errors(browser)  # the refusal's 401 may be logged; only the dashboard's own console counts

        _login(browser, srv.url, admin)
        _wait(browser, lambda: browser.find_elements(By.ID, "sites"), "the dashboard")
        assert browser.current_url == f"{srv.url}/dashboard"  # no token in any URL
        assert [c["name"] for c in browser.get_cookies()] == [COOKIE]
        assert browser.get_cookies()[0]["httpOnly"] and browser.get_cookies()[0]["sameSite"] == "Strict"
        assert _text(browser, "#study") == "dash-study" and _text(browser, "#protocol") == "toy-noised-mean"
        browser.execute_script("window.notReloaded = true;")
        _wait(browser, lambda: _text(browser, "#waiting-for") == "c" and _text(browser, "#current-round") == "0",
              "round 0 waiting for site c")
        assert _text(browser, "#site-c .state") == "waiting"
        _wait(browser, lambda: _text(browser, "#site-a .state") == _text(browser, "#site-b .state") == "answered",
              "sites a and b answered")
        assert _text(browser, "#last-round") == "none" and "running" in _text(browser, "#round-state")
        assert _text(browser, "#rounds tbody tr .status") == "running"
        assert "/v1/sites/" in _text(browser, "#events")
        for o in opts[:2]:  # their releases are journaled; the accountant runs in the background
            _wait(browser, lambda o=o: _text(browser, f"#site-{o.site} .epsilon_text")
                  == f"{o.epsilon():.3g} at δ = 1e-06 (1 release)", f"site {o.site}'s epsilon")
        # site a's budget, spent and remaining as the coordinator accounts them; b declared none
        assert [th.get_attribute("data-key") for th in browser.find_elements(By.CSS_SELECTOR, "#sites th")][-4:] \
            == ["budget_text", "remaining_text", "discarded", "reported"]
        assert _text(browser, "#site-a .reported") == "kept at the lab"  # the toy protocol estimates nothing
        _wait(browser, lambda: _text(browser, "#site-a .remaining_text") == f"{5.0 - opts[0].epsilon():.3g}",
              "site a's remaining budget")
        assert _text(browser, "#site-a .budget_text") == "ε ≤ 5 at δ = 1e-06"
        assert _text(browser, "#site-a .discarded") == "0"
        assert _text(browser, "#site-b .budget_text") == _text(browser, "#site-b .remaining_text") == "—"
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        shutil.copyfile(tmp_path / "dashboard.png", "/tmp/dashboard.png")  # for a person to look at
        assert console_errors(browser) == []

        release.set()  # c answers: round 0 closes, and the page follows by itself
        trials = [f.result(timeout=60) for f in asks]
        assert all(t.metadata["source"] == "model" for t in trials)
        _wait(browser, lambda: _text(browser, "#last-round") == "0" and _text(browser, "#current-round") == "1",
              "round 0 completed, round 1 next")
        _wait(browser, lambda: _text(browser, "#site-c .state") == "answered", "site c answered")
        assert _text(browser, "#waiting-for") == "nobody"
        assert browser.execute_script("return window.notReloaded === true;")  # updated in place
        assert _text(browser, "#rounds tbody tr .status") == "done"
        assert _text(browser, "#rounds tbody tr .participants") == "a, b, c"

        # epsilon: the coordinator's account of a and b is the sites' own; c sent without the noise the
        # study declares, so the coordinator refused its release: nothing of it accounted or aggregated
        status = srv.server.dashboard.status()
        sites = {s.name: s for s in status.sites}
        for o in opts[:2]:
            assert sites[o.site].epsilon == pytest.approx(o.epsilon())
        assert "less than the 2 the study declares" in srv.server.coordinator.rejected[0]["c"]
        assert sites["c"].epsilon == 0.0 and _text(browser, "#site-c .epsilon_text").startswith("0")
        # bytes: what the coordinator counted is what each site's ledger says crossed its boundary
        for o in opts:
            assert sites[o.site].received == sum(o.ledger.bytes_up.values())
            assert sites[o.site].sent == sum(o.ledger.bytes_down.values())
        assert _text(browser, "#site-a .received_text") == sites["a"].received_text

        # never a message's contents, never a token
        page = browser.page_source
        guidance = srv.server.coordinator.rounds[0]["a"]
        assert repr(guidance.mean) not in page
        for t in (admin, *tokens.values()):
            assert t not in page
        browser.save_screenshot(str(tmp_path / "dashboard-after.png"))
        assert console_errors(browser) == []
        for o in opts:
            o.close()


@pytest.mark.timeout(60, method="signal")
def test_status_shows_a_late_site_and_a_site_that_left(toy, tmp_path) -> None:
    """Quorum 2: site c never asks for round 0, which starts without it (late); then c leaves."""
    import requests

    cfg, tokens, admin = _config(tmp_path, protocol="toy-noised-mean", quorum=2, deadline=0.3)
    with ServerThread(CoordinatorServer(cfg)) as srv, requests.Session() as http, ThreadPoolExecutor(2) as pool:
        opts = [labfbo.Optimizer(SPACE, protocol="toy-noised-mean", site=s, seed=0, n_init=2,
                                 coordinator=HTTPCoordinator(srv.url, tokens[s])) for s in SITES]
        for o in opts:
            for t in o.ask(n=2):
                o.tell(t, t.params["y"])
        assert all(t.metadata["source"] == "model" for t in pool.map(lambda o: o.ask(timeout=30), opts[:2]))
        assert http.post(f"{srv.url}/dashboard/login", data={"token": admin}, allow_redirects=False).status_code == 303

        def status() -> tuple[DashboardStatus, dict]:
            st = DashboardStatus.model_validate(http.get(f"{srv.url}/dashboard/status.json", timeout=10).json())
            return st, {s.name: s for s in st.sites}

        st, sites = status()
        assert st.last_completed == 0 and st.current.state == "idle" and st.rules == "quorum 2, deadline 0.3 s"
        assert sites["c"].state == "late" and "missed round 0" in sites["c"].detail
        assert sites["a"].state == sites["b"].state == "answered" and sites["c"].answers == 0
        assert st.rounds[0].round == 0 and st.rounds[0].participants == "a, b" and st.rounds[0].status == "done"
        assert st.rounds[0].seconds is not None and st.rounds[0].seconds >= 0
        assert sites["a"].epsilon is None and sites["a"].epsilon_text.startswith("∞")  # no DP: no finite guarantee
        assert sites["c"].epsilon == 0.0 and sites["c"].sent > 0 and sites["c"].received > 0  # its join
        opts[2].close()
        st, sites = status()
        assert sites["c"].state == "left"
        for o in opts[:2]:
            o.close()


@pytest.mark.timeout(120, method="signal")
def test_the_dashboard_says_the_study_ended_when_every_site_has_left_in_chromium(toy, tmp_path) -> None:
    """Three sites run rounds 0 and 1, then each closes its optimizer: the page (without a reload)
    says the study ended after round 1, not that round 2 waits for the sites."""
    cfg, tokens, admin = _config(tmp_path, protocol="toy-noised-mean", horizon=5)
    with ServerThread(CoordinatorServer(cfg)) as srv, chromium(width=1280, height=1100) as browser, \
            ThreadPoolExecutor(3) as pool:
        opts = [labfbo.Optimizer(SPACE, protocol="toy-noised-mean", site=s, seed=0, n_init=2,
                                 coordinator=HTTPCoordinator(srv.url, tokens[s])) for s in SITES]
        for i, o in enumerate(opts):
            for t in o.ask(n=2):
                o.tell(t, t.params["x"] + 0.1 * i)
        _login(browser, srv.url, admin)
        _wait(browser, lambda: _text(browser, "#study") == "dash-study", "the dashboard")
        browser.execute_script("window.notReloaded = true;")
        for _ in range(2):  # rounds 0 and 1
            for o, t in zip(opts, pool.map(lambda o: o.ask(timeout=60), opts)):
                o.tell(t, t.params["y"])
        _wait(browser, lambda: _text(browser, "#last-round") == "1" and _text(browser, "#current-round") == "2",
              "round 1 completed")
        opts[0].close()
        _wait(browser, lambda: _text(browser, "#site-a .state") == "left", "site a left")
        assert "ended" not in _text(browser, "#round-state")  # b and c are still in the study
        for o in opts[1:]:
            o.close()
        _wait(browser, lambda: _text(browser, "#round-state").startswith("study ended"), "the study's end")
        assert _text(browser, "#round-state") == "study ended: all 3 sites left after round 1 (2 of 5 planned rounds)"
        assert _text(browser, "#current-round") == "—" and _text(browser, "#waiting-for") == "—"
        assert "nobody" not in _text(browser, "#round") and "starts when" not in _text(browser, "#round")
        assert [_text(browser, f"#site-{s} .state") for s in SITES] == ["left"] * 3
        assert browser.execute_script("return window.notReloaded === true;")  # updated in place
        browser.save_screenshot(str(tmp_path / "ended.png"))
        shutil.copyfile(tmp_path / "ended.png", "/tmp/dashboard-ended.png")  # for a person to look at
        browser.refresh()  # the page as first served says the same
        _wait(browser, lambda: _text(browser, "#round-state").startswith("study ended"), "the served page")
        assert _text(browser, "#current-round") == "—"
        st = srv.server.dashboard.status()
        assert st.current.state == "ended" and st.current.round == 1 and st.last_completed == 1
        assert console_errors(browser) == []


def test_a_study_whose_only_site_left_before_any_round_has_ended_and_a_partial_one_has_not(tmp_path) -> None:
    from fastapi.testclient import TestClient

    one, tokens, admin = _config(tmp_path)
    one = one.model_copy(update={"sites": {"a": one.sites["a"]}})
    server = CoordinatorServer(one)
    client = TestClient(server.app)
    req = labfbo.core.messages.JoinRequest(site="a", protocol="distribution", space_hash=SPACE.fingerprint(),
                                      space=SPACE.model_dump(mode="json"))
    server.engine.join(req)
    assert server.dashboard.status().current.state == "idle"
    assert client.post("/v1/sites/a/leave", headers={"Authorization": f"Bearer {tokens['a']}"}).status_code == 200
    current = server.dashboard.status().current
    assert (current.state, current.text) == ("ended", "study ended: the only site left before any round ran")
    server.close()

    cfg, tokens, _ = _config(tmp_path)  # a and b join and leave, c never joined: not over
    server = CoordinatorServer(cfg)
    for s in "ab":
        server.engine.join(req.model_copy(update={"site": s}))
        server.engine.leave(s)
    assert server.dashboard.status().current.state == "idle"
    server.close()


def test_the_dashboard_shows_the_agreement_a_lab_chose_to_share_in_chromium(tmp_path) -> None:
    """A surface study of three labs over HTTP (secure sums): a and b share their agreement with the
    partners' surface (share_agreement=True), c keeps it; the operator's page shows what each chose."""
    fast = {"num_restarts": 2, "raw_samples": 32, "fourier_features": 4}
    cfg, tokens, admin = _config(tmp_path, protocol="surface", options=fast)
    with ServerThread(CoordinatorServer(cfg)) as srv, chromium(width=1280, height=900) as browser, \
            ThreadPoolExecutor(3) as pool:
        opts = [labfbo.Optimizer(SPACE, protocol="surface", site=s, seed=0, n_init=3, share_agreement=s != "c",
                                 coordinator=HTTPCoordinator(srv.url, tokens[s]), **fast) for s in SITES]
        for i, o in enumerate(opts):
            for t in o.ask(n=3):
                o.tell(t, (t.params["x"] - 0.2 * i) ** 2 + t.params["y"] ** 2)
        for _ in range(2):
            trials = list(pool.map(lambda o: o.ask(timeout=90), opts))
            for i, (o, t) in enumerate(zip(opts, trials)):
                o.tell(t, (t.params["x"] - 0.2 * i) ** 2 + t.params["y"] ** 2)
        shared = {o.site: o.transfer_estimates()[-2][1].agreement for o in opts[:2]}  # sent with the last upload
        sent = [m for m in opts[2].sent_messages() if m.kind == "masked_score"]
        assert sent and all(m.agreement is None for m in sent)  # c keeps its estimate
        _login(browser, srv.url, admin)
        _wait(browser, lambda: _text(browser, "#site-a .reported").startswith("agreement"), "site a's agreement")
        for s in ("a", "b"):
            assert _text(browser, f"#site-{s} .reported") == f"agreement {shared[s]:.2f}"
        assert _text(browser, "#site-c .reported") == "kept at the lab"
        browser.save_screenshot(str(tmp_path / "agreement.png"))
        assert console_errors(browser) == []
        for o in opts:
            o.close()



def test_after_a_restart_the_dashboard_says_since_when_its_counters_count() -> None:
    from labfbo.server.dashboard import Dashboard

    said = Dashboard._counting_since(0.0, 3)
    assert "1970-01-01 00:00:00 UTC, after round 3" in said and "their traffic is not" in said
    assert "after round" not in Dashboard._counting_since(0.0, -1)  # a new study: nothing came before


def test_a_round_that_left_labs_without_guidance_names_them() -> None:
    from labfbo.core.messages import Abstain, NoGuidance
    from labfbo.server.dashboard import Dashboard, _without_guidance

    replies = {"a": NoGuidance(), "b": NoGuidance(), "c": Abstain(reason="a stand-in for c's guidance")}
    alone = _without_guidance(replies, ["a", "b", "c"])
    assert alone == ["a", "b"]
    row = Dashboard._round(4, 0.0, 1.0, "done", ["a", "b", "c"], None, alone)
    assert row.status == "done; no guidance for a, b (they propose alone)"
    assert Dashboard._round(4, 0.0, 1.0, "done", ["a"], None, []).status == "done"
