r"""Secure aggregation for protocol ``surface``: the sites learn the cohort's sums, the coordinator nothing.

**Upload.** A member :math:`i` of the round's cohort :math:`S` (the sites with known keys)
uploads, masked (:mod:`labfbo.protocols.secure_sum`, :mod:`labfbo.privacy.secagg`),

.. math:: v_i = [\,w_i\,\mathrm{upper}(\bar G_i),\; w_i\,\bar h_i,\; n_i,\; 1\,], \qquad
          w_i = n_i \text{ (no DP)}, \quad w_i = 1 \text{ (DP)},

``p(p+1)/2 + m p + 2`` entries (:math:`m` moments, one per objective).

**Who opens the sum** (``sum_seen_by``). ``"members"`` (the default), one exchange: the uploads
carry pairwise masks and no self mask; the cohort's leader (its first member) adds the group mask
:math:`R` of a key it draws for the release and sends that key sealed for every other site with a
key (:func:`~labfbo.protocols.secure_sum.upload_sealed`); the coordinator holds :math:`V + R`
(uniform words) and sends each site the words, the members' keys and the key sealed for it
(:class:`~labfbo.protocols.surface.messages.SealedTotals`); the site removes :math:`R`
(:func:`open_totals`) and has :math:`V = \sum_{i\in S} v_i`. Nobody can check one
upload inside it, so the site bounds the sum (without DP every entry at most the summed count) and
refuses one outside. ``"coordinator"``: the members reveal their seeds to the coordinator, which
learns :math:`V` and nothing else and sends every site :math:`V` and the member list :math:`S`
(:class:`~labfbo.protocols.surface.protocol.SurfaceTotals` with ``members``). The same proposals either way.

**Leave-one-out at the site.** A member subtracts exactly what it uploaded (its fixed-point
encoding, so the difference is :math:`\sum_{j\ne i}` of the others' encoded vectors, exact in
float64): :math:`\sum_{j\ne i} n_j \bar G_j`, :math:`\sum_{j\ne i} n_j \bar h_j`, their count
and :math:`|S| - 1` — today's :func:`~labfbo.protocols.surface.aggregate.leave_one_out` to fixed-point
precision (:math:`2^{-32}` per entry and site). A site not in :math:`S` uses :math:`V` as it is.
The site keeps its upload in memory; after a restart it recomputes it from the data of the
round (the data it proposes from for that round is the data it answered from: the round's cut)
and the same site-private DP stream, so the recomputed vector is the uploaded one bit for bit.

**Distributed DP.** Under ``privacy=DP(...)`` (``unit="site"``) each member adds only its share
of the Gaussian noise to its averages, :math:`\mathcal N(0, \sigma^2\Delta^2/h)` per entry with
:math:`h = \max(|S| - t, 1)` honest members (``dp_colluders`` = :math:`t`,
:mod:`labfbo.privacy.distributed`), so the sum of the averages carries the noise of one
Gaussian mechanism of std :math:`\sigma\Delta` on each site's averages — the mechanism declared and
accounted as in local mode. The averages are summed with weight 1 (not :math:`n_i`): the noise on a
count-weighted sum would be :math:`\sum_j n_j Z_j`, too little for the site with the most
observations; the site then scales the others' summed averages by their mean count
:math:`\bar n_{-i} = \sum_{j\ne i} n_j / (|S|-1)`, the count-weighted sum exactly when the counts are
equal.

**One experiment protected** (``DP(unit="experiment")``). A member uploads
:math:`[\,\mathrm{upper}(S_i),\; h_i + \text{share},\; n_i,\; 1\,]`: the moment *sum* :math:`h_i = \Phi_i^\top z_i`
of its values' centred ranks (:func:`~labfbo.protocols.surface.model.ranked_moments`) and, in the Gram's place, a matrix
:math:`S_i` whose constant row holds its count and its features' sums :math:`s_i = \sum_k\tilde\phi(x_k)` plus
a share (:func:`~labfbo.protocols.surface.model.feature_sums`; for a reagent the count of each choice), every other
entry 0. One Gaussian mechanism covers :math:`(h_i, C s_i)`, whose sensitivity
:math:`\Delta_\Sigma = 2C\sqrt{(P-1)(4m+1)}` (:func:`~labfbo.protocols.surface.model.ranked_sum_sensitivity`) does not
depend on the count — so each member adds only its share :math:`\mathcal N(0, \sigma^2\Delta_\Sigma^2/h)`
(on :math:`s_i` divided by :math:`C`), and the sum's noise is that of one mechanism however many labs
contribute, while its signal grows with their experiments. No pair count is released: the site takes
the others' Gram to be that of the maximum-entropy design matching their feature sums
(:func:`~labfbo.protocols.surface.design_tilt.tilted_gram`; for reagents, choices drawn independently with the
released counts) and fits :math:`h_{-i}` against it by the coefficients' posterior mean at the stated
noise, each reagent choice only while the noise does not swamp its moment
(:func:`~labfbo.protocols.surface.model.guarded_noisy_weights`). The uploads state ``dp_unit``; the sums are
``ranked`` (:class:`~labfbo.protocols.surface.messages.SurfaceTotals`). In the clear (two sites,
``secure_aggregation="off"``) such a site sends noised averages instead
(:func:`~labfbo.protocols.surface.model.private_statistics`).

**Dropouts.** A member whose upload (or self-mask seed) does not arrive makes the exchange run
again with the members that answered, under new masks (:class:`~labfbo.protocols.secure_sum.SecureSum`);
if fewer than :data:`~labfbo.protocols.secure_sum.MIN_COHORT` (3) remain, the round ends without a new
sum — never with statistics in the clear: each site proposes from the sum the coordinator still holds
(``release_every``) or from its own GP.

**Fewer releases** (``release_every=k``). The schedules are aligned (uploads in rounds
:math:`t \equiv 0 \pmod k`), so the coordinator keeps the round-:math:`r` *sum*, its members and the
smallest :math:`k` they stated, and sends it again in rounds :math:`r < t < r + k` (post-processing); a
member subtracts its round-:math:`r` upload, kept in memory (a site restarted within the window
proposes from its own GP until the next release round, with a warning).

Who may see what: the coordinator, the cohort's sums and counts; a site, the others' sum (as in
the clear protocol). With two sites a sum minus one's own is the other's: ``"auto"`` runs such a
study unmasked, with a warning; ``"on"`` refuses it.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np

from labfbo.core.exceptions import ProtocolError
from labfbo.core.messages import Array, Message
from labfbo.privacy import secagg
from labfbo.protocols.base import Exchange, Finish, Step
from labfbo.protocols.secure_sum import (
    MIN_COHORT,
    MaskedScores,
    SealedSum,
    SecureSum,
    context_digest,
    open_sum,
    upload,
    upload_sealed,
)
from labfbo.protocols.surface.messages import SealedTotals, SurfaceRequest, SurfaceTotals
from labfbo.protocols.surface.model import packed_size

Mode = Literal["auto", "on", "off"]
Reader = Literal["members", "coordinator"]

SURFACE_CONTEXT = context_digest("labfbo/surface/ridge-statistics")
"""The mask context's digest for ``surface`` (``gradient`` puts its particles' there)."""

UNMASKED_2_SITES = ("surface: secure aggregation is off in this study of {n} sites (it needs >= 3: with two, "
                    "each could recover the other's statistics from the sum); this site's statistics leave "
                    "unmasked (secure_aggregation='auto'; 'on' refuses such a study)")

MECHANISM = ("distributed Gaussian on the secure sum of the ridge statistics' averages (G/n, h/n), values clipped "
             "to [-C, C] (labfbo.protocols.surface.model): each of the cohort's n members adds N(0, (sigma Delta)^2 / "
             "max(n - t, 1)), t = {t}, so the honest members' shares sum to the noise std sigma Delta stated here; "
             "the count n_i is summed exactly; trust: an honest-but-curious coordinator, at most {t} other site(s) "
             "collude with it, the others add their shares honestly with the same clip and noise multiplier")

RANKED_MECHANISM = (
    "distributed Gaussian on the secure sum of the moment sums h of the values' centred ranks in [-C, C] "
    "(labfbo.protocols.surface.model.ranked_moments) and C times the features' sums s (the Gram's constant row; "
    "one experiment replaced moves (h, C s) by at most 2 C sqrt((P - 1)(4 m + 1)), whatever the count): "
    "each of the cohort's n members adds N(0, (sigma Delta)^2 / max(n - t, 1)), t = {t}; no other Gram "
    "entry is released; trust: an honest-but-curious coordinator, at most {t} other site(s) collude "
    "with it, the others add their shares honestly"
)


def masked_study(mode: str, n_sites: int) -> bool:
    """Whether a study of ``n_sites`` runs ``surface`` over secure sums: ``"on"``, or ``"auto"`` from 3 sites."""
    return mode == "on" or (mode == "auto" and n_sites >= MIN_COHORT)


def contribution(gram: np.ndarray, moment: np.ndarray, count: int, averaged: bool) -> np.ndarray:
    """``[w upper(G), w h, n, 1]`` with ``w = n`` (count-weighted) or ``1`` (``averaged``, under DP)."""
    w = 1.0 if averaged else float(count)
    return np.concatenate([w * np.asarray(gram, dtype=np.float64).ravel(),
                           w * np.asarray(moment, dtype=np.float64).ravel(), [float(count), 1.0]])


def as_summed(vector: np.ndarray, parties: int) -> np.ndarray:
    """``vector`` as it enters the sum: its fixed-point encoding, decoded (exact in float64)."""
    return secagg.decode(secagg.encode(vector, max(parties, 1)))


def features_of(size: int, p: int | None) -> tuple[int, int] | None:
    """``(p, m)`` of a summed vector of ``size`` entries (``p`` known, or the smallest one that fits)."""
    for q in ([p] if p is not None else range(1, 4000)):
        rest = size - packed_size(q) - 2
        if rest > 0 and rest % q == 0:
            return q, rest // q
        if p is None and rest < q:
            break
    return None


def split(total: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(gram, moment, count, members)`` of a summed vector (``moment`` ``(p,)`` or ``(m, p)``)."""
    P = packed_size(p)
    moment = total[P:-2]
    m = moment.size // p
    return (total[:P].copy(), moment.copy() if m == 1 else moment.reshape(m, p).copy(),
            int(round(float(total[-2]))), int(round(float(total[-1]))))


@dataclass(frozen=True)
class HeldSum:
    """A cohort's sum the coordinator holds: from round ``round``, reused while ``round < t < round + every``.
    With ``sealed`` (``sum_seen_by="members"``) ``total`` is still behind the group mask (uint64 words) and
    ``sealed`` holds, per site that receives it, the group key sealed for it; ``keys``: the members' public keys."""

    round: int
    total: np.ndarray
    members: tuple[str, ...]
    every: int
    averaged: bool
    sealed: dict[str, dict[str, str]] | None = None
    keys: dict[str, str] | None = None
    ranked: bool = False  # under DP(unit="experiment"): moment sums of centred ranks and feature sums

    def stands(self, t: int) -> bool:
        return t == self.round or self.round < t < self.round + self.every

    def state(self) -> dict[str, Any]:
        out = {
            "round": self.round,
            "members": list(self.members),
            "every": self.every,
            "averaged": self.averaged,
            "total": Array.of(self.total, dtype="float64" if self.sealed is None else "uint64").model_dump(mode="json"),
        }
        out = {**out, "ranked": True} if self.ranked else out
        return out if self.sealed is None else {**out, "sealed": self.sealed, "keys": self.keys}

    @classmethod
    def restore(cls, state: dict[str, Any]) -> "HeldSum":
        return cls(round=int(state["round"]), total=Array.model_validate(state["total"]).numpy(),
                   members=tuple(state["members"]), every=int(state["every"]), averaged=bool(state["averaged"]),
                   sealed=state.get("sealed"), keys=state.get("keys"), ranked=bool(state.get("ranked", False)))

    def sealed_for(self, site: str) -> SealedTotals:
        """What member ``site`` receives of a sealed sum."""
        assert self.sealed is not None and self.keys is not None
        masked, members = self._shared
        return SealedTotals(masked=masked, members=members, leader_key=self.keys[members[0]], sealed=self.sealed[site],
                            summed_round=self.round, averages=self.averaged, ranked=self.ranked)

    @functools.cached_property
    def _shared(self) -> tuple[Array, list[str]]:
        """What every member receives alike: the words and the members' names (built once, not per member)."""
        assert self.keys is not None
        return Array.of(self.total, dtype="uint64"), sorted(self.keys)


def leave_out(total: SurfaceTotals, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """``(gram, moment, count, sites)`` of the others: a cohort's sum less this member's upload
    ``mine`` as it entered the sum (:func:`as_summed`); None if it does not fit the sum's shape."""
    gram, moment = total.gram.numpy(), total.moment.numpy()
    if mine.size != gram.size + moment.size + 2:
        return None
    return (gram - mine[:gram.size], moment - mine[gram.size:-2].reshape(moment.shape),
            total.count - int(np.rint(mine[-2])), total.sites - 1)


def masked_upload(vector: np.ndarray, me: str, key_seed: bytes, request: SurfaceRequest, round: int,
                  reader: Reader) -> tuple[Array, dict[str, str] | None]:
    """A member's masked upload for ``request``'s cohort and, from the leader of a sum only the sites
    open (``reader="members"``), its group key sealed for the others (None otherwise)."""
    assert request.cohort is not None
    if reader == "members":
        return upload_sealed(vector, me, key_seed, request.cohort, request.recipients, request.study, round, 0,
                             SURFACE_CONTEXT)
    return upload(vector, me, key_seed, request.cohort, request.study, round, 0, SURFACE_CONTEXT), None


def open_totals(msg: SealedTotals, me: str, key_seed: bytes, p: int) -> SurfaceTotals:
    """The cohort's sum of a :class:`SealedTotals` (what the coordinator held masked), as
    :class:`SurfaceTotals` with its members: the group mask removed with the key this site drew (the
    leader) or the leader sealed for it. A sum no cohort's data can produce is refused — the coordinator
    cannot check it, so each member bounds it: without DP every entry of :math:`\\sum_j n_j \bar G_j`
    and :math:`\\sum_j n_j \bar h_j` is at most the summed count in magnitude (features in
    :math:`[-1, 1]`, standardized values). :class:`ProtocolError` names what is wrong."""
    total = open_sum(msg.masked.numpy(), msg.sealed, me, key_seed, msg.members, msg.leader_key, msg.study,
                     msg.summed_round, 0, SURFACE_CONTEXT)
    shape = features_of(total.size, p)
    if shape is None:
        raise ProtocolError(f"surface: a sealed sum of {total.size} entries does not fit {p} features")
    gram, moment, count, members = split(total, p)
    bound = (1.0 + 1e-6) * max(count, 0) + 1e-6
    bounded = [np.abs(moment).max(), np.abs(gram).max()]
    if msg.ranked:  # the noised moments and feature sums have no bound; the rest of the Gram's place is 0
        bounded = [abs(gram[0]), np.abs(gram[p:]).max(initial=0.0)]
    if not msg.averages and (count < 0 or max(bounded) > bound):
        raise ProtocolError(f"surface: the cohort's sum of round {msg.summed_round} is outside what {count} "
                            "observations can produce (a member sent statistics its data cannot give)")
    return SurfaceTotals(sites=members, count=count, gram=Array.of(gram), moment=Array.of(moment),
                         members=sorted(msg.members), summed_round=msg.summed_round, averages=msg.averages,
                         ranked=msg.ranked)


def opened(msg: SealedTotals, me: str, key_seed: bytes, p: int) -> SurfaceTotals | None:
    """:func:`open_totals`, or None with a warning (the site then proposes from its own GP)."""
    try:
        return open_totals(msg, me, key_seed, p)
    except ProtocolError as exc:
        warnings.warn(f"{exc}; proposing from this site's own GP this round", stacklevel=4)
        return None


class SecureRounds:
    """The coordinator's side of ``surface`` over secure sums (a mixin of its aggregator, which has
    ``sites``, ``options`` and ``_features()``, the study's number of features)."""

    sites: list[str]
    options: Any

    def _features(self) -> int | None:
        """The study's number of features (None before it is known): the aggregator defines it."""
        raise NotImplementedError("the aggregator that mixes in SecureRounds defines _features()")

    def start_secure(self, mode: str, reader: Reader = "coordinator") -> None:
        self.masked = masked_study(mode, len(self.sites))
        self.sealed = reader == "members"
        self.secure = SecureSum(self.sites)
        self.held_sum: HeldSum | None = None
        self._stated: tuple[Any, ...] = ()
        self._every = 1

    @property
    def redone(self) -> int:
        """Exchanges asked again because a member dropped out."""
        return self.secure.redone

    def retire(self, site: str) -> None:
        self.secure.retired.add(site)

    def secure_state(self) -> dict[str, Any]:
        """Keys, retired members and the held sum (nothing in the clear protocol: its snapshots read as before)."""
        if not self.masked:
            return {}
        return {"secure": {"keys": self.secure.keys, "retired": sorted(self.secure.retired),
                           "held_sum": None if self.held_sum is None else self.held_sum.state()}}

    def secure_restore(self, state: Mapping[str, Any]) -> None:
        secure = state.get("secure") or {}
        self.secure.keys, self.secure.retired = dict(secure.get("keys", {})), set(secure.get("retired", ()))
        self.held_sum = HeldSum.restore(secure["held_sum"]) if secure.get("held_sum") else None


    def _ask(self, t: int) -> Step:
        exchange = self.secure.first(lambda cohort: SurfaceRequest(
            cohort=cohort, recipients=(self.secure.outsiders() or None) if self.sealed else None))
        return self._finish(t, None) if exchange is None else Exchange(exchange)

    def _on_secure(self, t: int, responses: Mapping[str, Message]) -> Step:
        if self.secure.phase == "start":  # no exchange of this round is open
            return self._finish(t, None)
        if self.secure.phase == "upload":
            uploads = [responses[s] for s in self.secure.cohort if isinstance(responses.get(s), MaskedScores)]
            if not uploads:  # nobody had anything to add (not a release round, no data): the held sum
                return self._finish(t, None)
            stated = {(m.dp_noise_multiplier, m.dp_clip, m.dp_unit) for m in uploads}  # type: ignore[union-attr]
            if len(stated) > 1:  # a share relies on the others': never unmask unequal ones
                warnings.warn(
                    f"surface: the cohort of round {t} stated different DP noise or units {sorted(map(str, stated))};"
                    " one member's smaller share would weaken the others' guarantee, so this round ends "
                    "without unmasking the sum",
                    stacklevel=2,
                )
                return self._finish(t, None)
            self._stated = next(iter(stated))
            self._every = min(m.release_every or 1 for m in uploads)  # type: ignore[union-attr]
        out = self.secure.on_responses(0, SURFACE_CONTEXT, None, responses, to_members=self.sealed)
        if isinstance(out, str):
            return self._ask(t) if out == "redo" else self._finish(t, None)
        if isinstance(out, dict):
            return Exchange(out)
        sealed = out if isinstance(out, SealedSum) else None
        self.held_sum = HeldSum(round=t, total=out.masked if sealed else out, members=tuple(self.secure.cohort),
                                every=self._every, averaged=self._stated[0] is not None and self._stated[2] is None,
                                sealed=sealed.sealed if sealed else None,
                                keys=self.secure.cohort_keys() if sealed else None, ranked=self._stated[2] is not None)
        return self._finish(t, self.held_sum)

    def _finish(self, t: int, fresh: HeldSum | None) -> Finish:
        """Every site gets the round's new sum, or the one held while it stands; else nothing."""
        self.secure.reset()
        held = fresh or self.held_sum
        if held is None or not held.stands(t):
            if held is not None and t >= held.round + held.every:
                self.held_sum = None
            return Finish({})
        if held.sealed is not None:  # only the members can open it
            return Finish({s: held.sealed_for(s) for s in held.sealed if s in self.sites})
        shape = features_of(held.total.size, self._features())
        if shape is None:
            return Finish({})
        gram, moment, count, members = split(held.total, shape[0])
        reply = SurfaceTotals(sites=members, count=count, gram=Array.of(gram), moment=Array.of(moment),
                              members=list(held.members), summed_round=held.round, averages=held.averaged,
                              ranked=held.ranked)
        return Finish({s: reply for s in self.sites})


