"""The campaign report's privacy statements are the journal's facts, for every protocol.

Each test runs a tiny journaled campaign (two sites, three design points, two BO rounds on
Branin), writes site 0's report and checks what the page states about privacy against what
the journal records: which messages left, whether the site's measurements were among them,
and — only when DP noise was used — the cumulative epsilon (the live site's own accounting,
``SimulationResult.epsilon``) and the delta of the configured ``DP(...)``.
"""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path
from typing import Any, Callable

import pytest

import labfbo
from labfbo.core.journal import read_records
from labfbo.core.release import Release
from labfbo.privacy import DP
from labfbo.protocols import available_protocols, get_protocol
from labfbo.report import Campaign, write_report
from tests.browser import chromium, console_errors

pytestmark = pytest.mark.integration  # a campaign per protocol (module fixture)

FAST = {"num_restarts": 2, "raw_samples": 64}
SMALL_PACOH = {"warmup_steps": 4, "svgd_steps": 2}  # a few SVGD steps: the releases, not the meta-learning
DELTA = 1e-5

CAMPAIGNS: dict[str, tuple[Any, dict[str, Any]]] = {
    "independent": ("independent", FAST),
    "surface": (labfbo.protocols.Surface(**FAST), {}),
    "surface_dp": (labfbo.protocols.Surface(privacy=DP(epsilon=2.0, delta=DELTA), **FAST), {}),
    "distribution": (labfbo.protocols.Distribution(**FAST), {}),
    "gradient": (labfbo.protocols.Gradient(**SMALL_PACOH, **FAST), {}),
    "vote": ("vote", FAST),
    "vote_dp": ("vote", {"privacy": DP(epsilon=2.0, delta=DELTA), **FAST}),
    "consensus": ("consensus", FAST),
    "pooled": (labfbo.protocols.Pooled(**FAST), {}),
    "centralized": (labfbo.protocols.Centralized(**SMALL_PACOH, **FAST), {}),
}


class Page:
    """A written report's privacy statements, as text."""

    def __init__(self, path: Path) -> None:
        self.html = path.read_text(encoding="utf-8")
        self.privacy = _text(re.search(r'<section id="privacy">(.*?)</section>', self.html, re.S).group(1))

    def text(self, element: str) -> str | None:
        m = re.search(rf'<p[^>]* id="{element}"[^>]*>(.*?)</p>', self.html, re.S)
        return None if m is None else _text(m.group(1))

    def epsilon_delta(self) -> tuple[float, float]:
        m = re.search(r"ε = ([0-9.e+-]+|∞) at δ = ([0-9.e+-]+)", self.text("epsilon") or "")
        assert m, self.text("epsilon")
        return float(m.group(1).replace("∞", "inf")), float(m.group(2))


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


Run = Callable[[str], tuple[Path, Page, labfbo.SimulationResult]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``run(name)``: site 0's journal of the campaign ``name``, its report, the simulation (once each)."""
    done: dict[str, tuple[Path, Page, labfbo.SimulationResult]] = {}

    def get(name: str) -> tuple[Path, Page, labfbo.SimulationResult]:
        if name not in done:
            folder = tmp_path_factory.mktemp(name)
            proto, options = CAMPAIGNS.get(name) or (name, {**FAST, **get_protocol(name).quick_options})
            res = labfbo.simulate("branin", protocol=proto, n_sites=2, n_init=3, budget=2, seed=0,
                                  storage_dir=folder, **options)
            journal = folder / "site-0.journal"
            done[name] = journal, Page(write_report(journal, folder / "report.html").html), res
        return done[name]

    return get


def sent_kinds(journal: Path) -> dict[str, int]:
    """What the journal's traffic records say left the site: message kind -> count."""
    out: dict[str, int] = {}
    for m in Campaign.from_journal(journal).state.traffic:
        if m.direction == "sent":
            out[m.kind] = out.get(m.kind, 0) + 1
    return out


def assert_no_dp(page: Page, released: str | None) -> None:
    """The page says plainly that no DP was used, with no epsilon or delta to misread."""
    said = page.text("epsilon")
    assert said is not None and said.startswith("No differential privacy was used"), said
    if released is None:
        assert "nothing computed from the site's data left it" in said
    else:
        assert f"({released}) carried no noise" in said
    assert "no differential privacy was used" in page.text("privacy-summary")
    for wrong in ("ε =", "δ =", "∞", "None"):
        assert wrong not in page.privacy, (wrong, page.privacy)
    assert 'id="privacy-table"' not in page.html  # no DP table without DP


def assert_private_federation(page: Page, journal: Path, protocol: str, data_kind: str) -> None:
    """No red raw-data box; the page says no measurement left and names every message kind that did."""
    assert page.text("raw-data") is None
    assert 'class="warn"' not in re.search(r'<section id="privacy">(.*?)</section>', page.html, re.S).group(1)
    said = page.text("no-raw-data")
    assert said.startswith("No measurement left this site. What left:")
    kinds = sent_kinds(journal)
    assert "join" in kinds and data_kind in kinds, kinds
    for kind, n in kinds.items():
        assert f"{kind} ({n} message{'s' if n != 1 else ''})" in said, (kind, said)
    assert page.text("privacy-summary").startswith("Privacy: no measurement left this site;")
    assert f"protocol <b>{protocol}</b>" in page.html


def assert_dp(page: Page, res: labfbo.SimulationResult, budget: float) -> None:
    """ε is the live site's own accounting, within the budget, stated at the configured δ."""
    eps, delta = page.epsilon_delta()
    assert res.epsilon and 0 < res.epsilon[0] <= budget + 1e-6
    assert eps == pytest.approx(res.epsilon[0], rel=1e-3)
    assert delta == pytest.approx(DELTA, rel=1e-12)
    assert f"ε = {eps:g} at δ = {delta:g}" in page.text("privacy-summary")
    assert "ε ≤ 2" in page.text("budget")
    assert "∞" not in page.privacy and "None" not in page.privacy


# -- one test per protocol -----------------------------------------------------------------
def test_independent_says_nothing_computed_from_the_data_left(run: Run) -> None:
    journal, page, _ = run("independent")
    assert sent_kinds(journal) == {"join": 1}  # the study's join, nothing else
    assert page.text("raw-data") is None
    assert page.text("no-raw-data").startswith("No measurement left this site. What left: join (1 message)")
    assert_no_dp(page, released=None)


def test_surface_without_dp_sends_statistics_not_measurements(run: Run) -> None:
    journal, page, _ = run("surface")
    assert Campaign.from_journal(journal).shares_raw_data is False  # the record loop no longer overwrites it
    assert_private_federation(page, journal, "surface", "surface_stats")
    assert_no_dp(page, released="surface_stats")


def test_surface_under_a_dp_budget_states_its_epsilon_and_delta(run: Run) -> None:
    journal, page, res = run("surface_dp")
    assert_private_federation(page, journal, "surface", "surface_stats")
    assert_dp(page, res, budget=2.0)
    assert "over 2 noised releases (surface_stats)" in page.text("epsilon")
    assert 'id="privacy-table"' in page.html


def test_distribution_sends_beliefs_not_measurements(run: Run) -> None:
    journal, page, _ = run("distribution")
    assert_private_federation(page, journal, "distribution", "optimum_belief")
    assert_no_dp(page, released="optimum_belief")


def test_gradient_sends_scores_not_measurements(run: Run) -> None:
    journal, page, _ = run("gradient")
    assert_private_federation(page, journal, "gradient", "score")
    assert_no_dp(page, released="score")


def test_vote_sends_sealed_votes_not_measurements(run: Run) -> None:
    journal, page, _ = run("vote")
    assert_private_federation(page, journal, "vote", "sealed_vote")
    assert_no_dp(page, released="sealed_vote")


def test_vote_under_a_dp_budget_states_its_epsilon_and_delta(run: Run) -> None:
    journal, page, res = run("vote_dp")
    assert_private_federation(page, journal, "vote", "sealed_vote")
    assert_dp(page, res, budget=2.0)


def test_consensus_sends_proposals_not_measurements(run: Run) -> None:
    journal, page, _ = run("consensus")
    assert_private_federation(page, journal, "consensus", "consensus_proposal")
    assert_no_dp(page, released="consensus_proposal")


@pytest.mark.parametrize("protocol", [p for p in available_protocols() if get_protocol(p).shares_raw_data])
def test_raw_data_protocols_say_the_measurements_left(run: Run, protocol: str) -> None:
    journal, page, _ = run(protocol)
    assert Campaign.from_journal(journal).shares_raw_data is True
    n = sent_kinds(journal)["raw_data"]
    said = page.text("raw-data")
    assert said is not None and said.startswith(f"The site's measurements themselves left it: raw_data ({n} messages)")
    assert f"The {protocol} protocol is a non-private reference" in said
    assert page.text("no-raw-data") is None
    assert page.text("privacy-summary").startswith("Privacy: the site's measurements left it")
    assert_no_dp(page, released="raw_data")


def test_a_single_site_without_a_coordinator_says_nothing_left(tmp_path: Path) -> None:
    space = labfbo.SearchSpace([labfbo.Real("x", 0.0, 1.0), labfbo.Real("y", 0.0, 1.0)])
    with labfbo.Optimizer(space, "minimize", seed=0, n_init=3, storage=tmp_path / "alone.journal", **FAST) as opt:
        for _ in range(4):
            t = opt.ask()
            opt.tell(t, float(t.params["x"] + t.params["y"]))
    page = Page(write_report(tmp_path / "alone.journal", tmp_path / "alone.html").html)
    assert page.text("no-raw-data").startswith("Nothing left this site: the independent protocol runs on the "
                                               "site's own data alone")
    assert_no_dp(page, released=None)


def test_a_protocol_this_installation_lacks_claims_nothing_about_raw_data(run: Run, tmp_path: Path) -> None:
    journal, _, _ = run("surface")
    records, _ = read_records(journal, repair=False, torn="skip")
    records = [{**records[0], "protocol": "someone_elses"}] + records[1:]
    campaign = Campaign.from_records(records, where="edited")
    assert campaign.shares_raw_data is None
    from labfbo.report.build import build

    page = Page(build(campaign, tmp_path / "unknown.html").html)
    said = page.text("raw-data")
    assert said is not None and "cannot be told" in said and "surface_stats" in said
    assert page.text("no-raw-data") is None  # "no measurement left" would be a guess


def _report_of(records: list[dict], path: Path) -> Page:
    from labfbo.report.build import build

    return Page(build(Campaign.from_records(records, where="edited"), path).html)


def test_dp_configured_before_any_release_says_nothing_was_spent(run: Run, tmp_path: Path) -> None:
    journal, _, _ = run("surface_dp")
    records, _ = read_records(journal, repair=False, torn="skip")
    first = next(i for i, r in enumerate(records) if r["op"] == "release")
    page = _report_of(records[:first], tmp_path / "early.html")  # the journal as it stood before the first release
    said = page.text("epsilon")
    assert said.startswith("Differential privacy is configured (δ = 1e-05, budget ε ≤ 2), but no noised release "
                           "has left this site yet"), said
    assert "no noised release has left yet" in page.text("privacy-summary")
    assert "∞" not in page.privacy and "None" not in page.privacy


def test_one_release_without_noise_makes_epsilon_infinite_and_is_named(run: Run, tmp_path: Path) -> None:
    journal, _, _ = run("surface_dp")
    records, _ = read_records(journal, repair=False, torn="skip")
    bare = {"v": 2, "op": "release", **Release.unprotected("surface_stats", round=2).model_dump()}
    page = _report_of(records + [bare], tmp_path / "mixed.html")
    eps, delta = page.epsilon_delta()
    assert eps == float("inf")
    assert delta == pytest.approx(DELTA)
    assert "ε is infinite because 1 release (surface_stats) carried no noise" in page.text("epsilon")


# -- what a person sees ------------------------------------------------------------------------
@pytest.mark.integration
def test_a_private_surface_report_shows_its_privacy_in_chromium(run: Run, tmp_path: Path) -> None:
    journal, page, res = run("surface_dp")
    rep = write_report(journal, tmp_path / "private.html")
    with chromium(1200, 2400) as browser:
        browser.get(rep.html.as_uri())
        errors = console_errors(browser)
        seen = browser.execute_script("""
            const el = id => document.getElementById(id);
            const shown = e => e !== null && e.offsetParent !== null && e.getClientRects().length > 0;
            const warns = Array.from(document.querySelectorAll('.warn')).filter(shown).map(e => e.innerText);
            const red = Array.from(document.querySelectorAll('#privacy *')).filter(
                e => shown(e) && getComputedStyle(e).borderLeftColor === 'rgb(214, 39, 40)').length;
            return {summary: el('privacy-summary').innerText, privacy: el('privacy').innerText,
                    epsilon: el('epsilon').innerText, raw: el('raw-data'), warns: warns, red: red,
                    kinds: el('privacy-kinds') ? el('privacy-kinds').querySelectorAll('tr').length : -1,
                    visible: shown(el('no-raw-data'))};""")
    assert errors == []
    assert seen["raw"] is None and seen["red"] == 0  # no red raw-data box anywhere in the privacy section
    assert not any("measurements themselves" in w for w in seen["warns"])
    assert seen["visible"] and "No measurement left this site" in seen["privacy"]
    eps = float(re.search(r"ε = ([0-9.e+-]+) at δ = 1e-05", seen["epsilon"]).group(1))
    assert eps == pytest.approx(res.epsilon[0], rel=1e-3) and eps <= 2.0 + 1e-6
    assert "ε = 2 at δ = 1e-05" in seen["summary"]
    assert "∞" not in seen["privacy"] and "None" not in seen["privacy"]
    assert seen["kinds"] == len(sent_kinds(journal)) + 1  # a header and a row per message kind that left
