"""What left a site, from its journal's facts: the report's privacy statements.

Every statement the report makes about privacy is derived here from three journaled facts
and nothing else:

* the **traffic** records — which messages left the site (kind, round, size);
* the **release** records — what the protocol declared each data-derived message released:
  with DP noise (a Gaussian mechanism or a randomized response, at the site's delta) or
  without; a message kind with no release carries nothing computed from the site's data;
* the protocol's ``shares_raw_data`` — its data-derived messages sent without noise are the
  site's measurements themselves (``pooled``, ``centralized``).

Which releases secure aggregation hid from the coordinator is each release's own declaration
(``secure_aggregation``). A journal whose options left secure aggregation to ``"auto"`` (``surface``)
but whose data-derived releases went unmasked ran in a study too small for it (fewer than 3
sites): the page repeats the warning the site gave (:attr:`Disclosure.unmasked`).

The cumulative epsilon is the PLD accountant's over the private releases
(:func:`labfbo.privacy.report.cumulative_epsilon`), stated at their delta; it is given only
when DP noise was used. With no noised release there is no epsilon to state: the report
says "no differential privacy" instead of an infinite epsilon at no delta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from labfbo.core.records import LegacyRelease
from labfbo.core.release import Release
from labfbo.privacy.report import cumulative_epsilon, delta_of
from labfbo.report.campaign import Campaign

Carries = Literal["measurements", "noised", "unprotected", "nothing", "unknown"]

CARRIES_TEXT: dict[str, str] = {
    "measurements": "the site's measurements themselves (settings and results), without noise",
    "noised": "information computed from the site's data, with differential-privacy noise",
    "unprotected": "information computed from the site's data (not the measurements themselves), without "
                   "differential-privacy noise",
    "nothing": "nothing computed from the site's data (the protocol declares no release for it)",
    "unknown": "information computed from the site's data, without noise (this installation does not have the "
               "protocol: it may be the measurements themselves)",
}


@dataclass(frozen=True)
class KindFacts:
    """One kind of message that left the site: how many, their size, their releases, what they carried."""

    kind: str
    sent: int  # messages of this kind in the journaled traffic
    nbytes: int
    releases: int  # releases the protocol declared for messages of this kind
    private: int  # of which with DP noise
    mechanisms: tuple[str, ...]
    secure_aggregation: bool
    carries: Carries

    @property
    def text(self) -> str:
        return CARRIES_TEXT[self.carries]


@dataclass(frozen=True)
class Disclosure:
    """The privacy facts of one site's campaign."""

    protocol: str
    federated: bool
    shares_raw_data: bool | None
    traffic_journaled: bool  # the journal holds traffic records (older ones do not)
    kinds: list[KindFacts]
    epsilon: float | None  # cumulative epsilon of the releases; None: no release carried DP noise
    delta: float | None  # the delta it is stated at (the releases'; else the configured DP's)
    configured: dict[str, Any] | None  # the journal's DP(...) options, None without DP
    legacy: int  # version-1 release records (not accounted here)
    unmasked: str | None = None  # secure aggregation was "auto" but releases left unmasked: the warning to repeat

    # -- what the page says ----------------------------------------------------------------
    def of(self, carries: Carries) -> list[KindFacts]:
        return [k for k in self.kinds if k.carries == carries]

    @property
    def raw_left(self) -> bool:
        """The site's measurements themselves left it."""
        return bool(self.of("measurements"))

    @property
    def dp_used(self) -> bool:
        """At least one (current-format) release carried DP noise: there is an epsilon to state."""
        return self.epsilon is not None

    @property
    def unprotected(self) -> list[KindFacts]:
        """Kinds with data-derived releases sent without DP noise (measurements included)."""
        return [k for k in self.kinds if k.releases > k.private]

    @property
    def masked(self) -> list[KindFacts]:
        """Kinds whose releases secure aggregation hid from the coordinator (it saw only the cohort's sum)."""
        return [k for k in self.kinds if k.secure_aggregation]

    @property
    def sent(self) -> int:
        return sum(k.sent for k in self.kinds)

    @property
    def budget(self) -> float | None:
        return None if self.configured is None else self.configured.get("epsilon")

    def summary(self) -> str:
        """One sentence for the page's header."""
        if self.raw_left:
            left = "the site's measurements left it (a non-private reference protocol)"
        elif not self.kinds:
            left = "nothing left this site"
        elif self.shares_raw_data is None and self.of("unknown"):
            left = "data-derived information left this site (its protocol is unknown here)"
        else:
            left = "no measurement left this site"
        if self.dp_used:
            dp = f"differential privacy: ε = {fmt_number(self.epsilon)} at δ = {fmt_number(self.delta)}"
        elif self.legacy:
            dp = "the privacy accounting of its older release records is not made here (see its optimizer)"
        elif self.configured is not None:
            dp = "differential privacy is configured, but no noised release has left yet"
        else:
            dp = "no differential privacy was used"
        return f"{left}; {dp}."


def fmt_number(v: float | None) -> str:
    """A privacy parameter as the page shows it (4 significant digits; ∞ for infinity)."""
    if v is None:
        return "n/a"
    if math.isinf(v):
        return "∞"
    return f"{v:.4g}"


def disclosure(campaign: Campaign) -> Disclosure:
    """The privacy facts of ``campaign``, from its journal."""
    st = campaign.state
    releases = [r for r in st.releases if isinstance(r, Release)]
    legacy = [r for r in st.releases if isinstance(r, LegacyRelease)]
    order: list[str] = []
    sent: dict[str, list[int]] = {}
    for m in st.traffic:
        if m.direction == "sent":
            if m.kind not in sent:
                order.append(m.kind)
            sent.setdefault(m.kind, []).append(m.nbytes)
    declared: dict[str, list[tuple[bool, str, bool]]] = {}  # kind -> (private, mechanism, secure aggregation)
    for r in releases:
        declared.setdefault(r.message, []).append((r.private, r.mechanism, r.secure_aggregation))
    for r in legacy:
        declared.setdefault(r.kind, []).append((r.dp, "an older record: see the optimizer's accounting",
                                                r.secure_aggregation))
    order += [k for k in declared if k not in sent]  # released but not (yet) in the traffic records
    kinds = []
    for kind in order:
        rel = declared.get(kind, [])
        private = sum(p for p, _, _ in rel)
        kinds.append(KindFacts(kind=kind, sent=len(sent.get(kind, [])), nbytes=sum(sent.get(kind, [])),
                               releases=len(rel), private=private,
                               mechanisms=tuple(dict.fromkeys(m for _, m, _ in rel)),
                               secure_aggregation=any(s for _, _, s in rel),
                               carries=_carries(len(rel), private, campaign.shares_raw_data)))
    options = (campaign.header.options or {}).get("privacy")
    configured = options if isinstance(options, dict) else None
    noised = any(r.private for r in releases)
    delta = delta_of(releases)
    if delta is None and configured is not None:
        delta = configured.get("delta")
    return Disclosure(protocol=campaign.header.protocol, federated=campaign.federated,
                      shares_raw_data=campaign.shares_raw_data, traffic_journaled=bool(st.traffic), kinds=kinds,
                      epsilon=cumulative_epsilon(releases) if noised else None, delta=delta, configured=configured,
                      legacy=len(legacy), unmasked=_unmasked(campaign, kinds))


def _unmasked(campaign: Campaign, kinds: list[KindFacts]) -> str | None:
    """The warning a site gave when ``secure_aggregation="auto"`` ran its study in the clear (fewer
    than 3 sites), from the journal: the option, the study's size and the unmasked releases."""
    if (campaign.header.options or {}).get("secure_aggregation") != "auto":
        return None
    bare = [k.kind for k in kinds if k.releases and not k.secure_aggregation]
    if not bare:
        return None
    reply = campaign.state.join_reply
    size = f"this study had {reply.n_sites} site{'s' if reply.n_sites != 1 else ''}" if reply is not None \
        else "this study was too small"
    return (f"Secure aggregation was left to 'auto', and {size}: it needs at least 3 (with two, each could recover "
            f"the other's contribution from the sum). So {', '.join(bare)} left this site unmasked: the coordinator "
            "saw them as they were. With 3 or more sites they leave masked; secure_aggregation='on' refuses a "
            "smaller study.")


def _carries(releases: int, private: int, shares_raw: bool | None) -> Carries:
    if releases == 0:
        return "nothing"
    if private == releases:
        return "noised"
    if shares_raw is None:
        return "unknown"
    return "measurements" if shares_raw else "unprotected"
