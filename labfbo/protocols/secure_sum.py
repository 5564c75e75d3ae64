"""Secure aggregation inside a protocol: its messages, the site's answers and the coordinator's bookkeeping.

Used by ``gradient`` (per-particle scores) and ``surface`` (ridge statistics). A secure sum the
coordinator unmasks takes two exchanges with the *cohort* (the members with known keys):

1. the protocol's request with ``cohort=...`` (``ParticlesRequest``, ``SurfaceRequest``) -> each
   member uploads ``MaskedScores`` (its vector plus its self mask and pairwise masks,
   :mod:`labfbo.privacy.secagg`);
2. once every member's upload arrived, ``UnmaskRequest`` -> each member reveals the seed of
   its self mask (``SelfMaskSeed``), and the coordinator removes the self masks from the sum.

A sum only the members open (``surface``'s default, ``sum_seen_by="members"``) takes **one**
exchange: the uploads carry no self mask; the leader (the cohort's first member) adds a group
mask and sends, with its upload, the group key sealed for every other site that receives the
sum (``MaskedScores.sealed``, :func:`upload_sealed`). The coordinator adds the uploads — the sum
behind the group mask, uniformly distributed — and forwards each site the key sealed for it
(:class:`SealedSum`); the site removes the mask (:func:`open_sum`). The coordinator learns
nothing of the sum.

If a member is missing at either exchange, the step is redone with those that answered,
under a new context (the cohort is part of it): fresh masks, and the abandoned attempt's
uploads stay hidden behind self masks that were never revealed. Public keys are asked of
the sites that have none (or sent a new one) along with the first request of a round.
"""

from __future__ import annotations

import base64
import hashlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, model_serializer

from labfbo.core.exceptions import ProtocolError
from labfbo.core.messages import Abstain, Array, Message, register
from labfbo.privacy import secagg

MIN_COHORT = 3  # with two sites, each can recover the other's vector from the sum


@register
class KeyRequest(Message):
    """Coordinator -> site (secure aggregation): send your X25519 public key."""

    kind: Literal["secagg_key_request"] = "secagg_key_request"


@register
class PublicKeyShare(Message):
    """Site -> coordinator (secure aggregation): the site's X25519 public key (base64, 32 bytes)."""

    kind: Literal["secagg_public_key"] = "secagg_public_key"
    public_key: str = Field(min_length=44, max_length=44)


@register
class MaskedScores(Message):
    """Site -> coordinator (secure aggregation): the site's encoded vector plus its self mask and
    pairwise masks, in Z_{2^64}; alone it is uniform noise. ``gradient``: ``enc([A_i.ravel(), 1/n_i, 1])``;
    ``surface``: ``enc([n_i upper(G_i), n_i h_i, n_i, 1])`` (under DP the averages, weight 1; under
    ``DP(unit="experiment")`` ``enc([upper(S_i), h_i, n_i, 1])``, the moment sum of centred ranks and a Gram
    holding only its constant row, the count and the features' sums, ``dp_unit`` stated).

    In the clear, configuration only: the DP clip and noise multiplier (and the l2 sensitivity
    the release states), and ``surface``'s schedule ``release_every`` (the coordinator may reuse
    the sum for ``k - 1`` rounds) — and, only if the lab opts in, ``surface``'s agreement. Fields
    left unset are left off the wire (``gradient``'s uploads are byte for byte as before)."""

    kind: Literal["masked_score"] = "masked_score"
    step: int
    masked: Array
    dp_clip: float | None = None
    dp_noise_multiplier: float | None = None
    dp_sensitivity: float | None = Field(None, gt=0, allow_inf_nan=False)
    dp_unit: Literal["experiment"] | None = Field(None, description="surface under DP(unit='experiment'): the "
                                                  "upload is a moment sum of centred ranks (left off otherwise)")
    release_every: int | None = Field(None, ge=1)
    sealed: dict[str, str] | None = Field(None, max_length=100_000, description="sum_seen_by='members', from the "
                                          "cohort's leader: the release's group key sealed for each other site "
                                          "that receives the sum (site -> ciphertext)")
    agreement: float | None = Field(None, allow_inf_nan=False, description="surface, when the lab opts in "
                                    "(share_agreement): its agreement with the partners' surface, in the clear")

    @model_serializer(mode="wrap")
    def _unset_left_off(self, handler: Any) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            for name in ("dp_sensitivity", "dp_unit", "release_every", "sealed", "agreement"):
                if getattr(self, name) is None:
                    out.pop(name, None)
        return out


@register
class UnmaskRequest(Message):
    """Coordinator -> site: every upload of this release arrived; reveal your self mask's seed.

    ``particles_sha256`` is the digest of what the vectors were computed on, part of every
    mask's context: ``gradient``'s particles (:func:`digest`), ``surface``'s round context
    (:func:`context_digest`). The name is ``gradient``'s wire format."""

    kind: Literal["secagg_unmask_request"] = "secagg_unmask_request"
    step: int
    cohort: dict[str, str]
    particles_sha256: str


@register
class SelfMaskSeed(Message):
    """Site -> coordinator: the 32-byte seed of the site's self mask for one release (base64)."""

    kind: Literal["secagg_self_mask"] = "secagg_self_mask"
    step: int
    seed: str = Field(min_length=44, max_length=44)


@dataclass(frozen=True)
class SealedSum:
    """The coordinator's sum behind the group mask (uniform in Z_{2^64}) and, per site that receives it,
    the group key sealed for it (leader -> ciphertext; empty for the leader)."""

    masked: np.ndarray
    sealed: dict[str, dict[str, str]]


def digest(particles: Array) -> str:
    """The SHA-256 of the particles as sent (their base64 payload): part of every mask's context."""
    return hashlib.sha256(particles.data.encode("ascii")).hexdigest()


def context_digest(*parts: object) -> str:
    """The SHA-256 of a protocol's own context (what its members' vectors are computed on), for
    the mask context where ``gradient`` puts its particles' digest."""
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


# -- site side -------------------------------------------------------------------------------------
def check_cohort(cohort: Mapping[str, str] | None, me: str, key_seed: bytes) -> Message | None:
    """Why this site must not upload into ``cohort`` (an answer to send instead), or None."""
    cohort = cohort or {}
    mine = secagg.public_key(key_seed)
    if me in cohort and cohort[me] != mine:  # the coordinator holds an old key of ours: send the current one
        return PublicKeyShare(public_key=mine)
    if me not in cohort or len(cohort) < MIN_COHORT:
        return Abstain(reason=f"secure aggregation needs a cohort of >= {MIN_COHORT} sites including "
                              f"{me!r}, got {sorted(cohort)}")
    return None


def upload(values: np.ndarray, me: str, key_seed: bytes, cohort: Mapping[str, str], study: str, round: int,
           step: int, context_sha256: str) -> Array:
    """``values`` encoded and masked for this release (``context_sha256``: :func:`digest` or :func:`context_digest`)."""
    info = secagg.context(study, round, step, list(cohort), context_sha256.encode())
    return Array.of(secagg.mask(secagg.encode(values, len(cohort)), me, key_seed, cohort, info), dtype="uint64")


def upload_sealed(values: np.ndarray, me: str, key_seed: bytes, cohort: Mapping[str, str],
                  recipients: Mapping[str, str] | None, study: str, round: int, step: int,
                  context_sha256: str) -> tuple[Array, dict[str, str] | None]:
    """``values`` encoded and masked for a sum only the members open: pairwise masks, no self mask;
    the leader (``min(cohort)``) adds the group mask and returns its group key sealed for every other
    member and every site of ``recipients`` (the others return None)."""
    info = secagg.context(study, round, step, list(cohort), context_sha256.encode())
    encoded, sealed = secagg.encode(values, len(cohort)), None
    if me == min(cohort):
        key = secagg.group_key(key_seed, info)
        with np.errstate(over="ignore"):
            encoded = encoded + secagg.group_mask(key, encoded.size)
        to = {**(recipients or {}), **cohort}
        sealed = {peer: secagg.seal(key, key_seed, public, info, me, peer) for peer, public in sorted(to.items())
                  if peer != me}
    return Array.of(secagg.mask(encoded, me, key_seed, cohort, info, self_mask=False), dtype="uint64"), sealed


def reveal(request: UnmaskRequest, me: str, key_seed: bytes, study: str, round: int,
           members_only: bool = False) -> Message:
    """The self mask's seed of the release ``request`` names (only for a cohort this site is in). A site
    whose sums only the members open (``members_only``) never reveals one to the coordinator."""
    if me not in request.cohort:
        return Abstain(reason=f"{me!r} is not in that cohort")
    if members_only:
        return Abstain(reason="this site's sums are opened by the members only, never by the coordinator")
    info = secagg.context(study, round, request.step, list(request.cohort), request.particles_sha256.encode())
    return SelfMaskSeed(step=request.step, seed=base64.b64encode(secagg.self_mask_seed(key_seed, info)).decode())


def open_sum(masked: np.ndarray, sealed: Mapping[str, str], me: str, key_seed: bytes, members: Sequence[str],
             leader_key: str, study: str, round: int, step: int, context_sha256: str) -> np.ndarray:
    """The decoded sum of a release behind a group mask (:func:`upload_sealed`) of ``members``:
    ``masked`` less the mask of the group key, which this site drew (the leader) or the leader (whose
    public key is ``leader_key``) sealed for it (``sealed``: leader -> ciphertext). Raises
    :class:`ProtocolError` if the key is missing or does not open, or the sum does not check out."""
    if not members:
        raise ProtocolError("secure aggregation: a sum of no members")
    info = secagg.context(study, round, step, list(members), context_sha256.encode())
    leader = min(members)
    if me == leader:
        key = secagg.group_key(key_seed, info)
    elif leader not in sealed:
        raise ProtocolError(f"secure aggregation: no group key sealed by {leader!r} for {me!r}")
    else:
        key = secagg.unseal(sealed[leader], key_seed, leader_key, info, leader, me)
    with np.errstate(over="ignore"):
        total = secagg.decode(np.asarray(masked, dtype=np.uint64).reshape(-1) - secagg.group_mask(key, np.size(masked)))
    if abs(total[-1] - len(members)) > 1e-6:  # every member counts 1: anything else is a corrupt sum
        raise ProtocolError("secure aggregation: the sum does not check out (a stale key or a wrong upload)")
    return total


# -- coordinator side --------------------------------------------------------------------------------
def learn_keys(keys: dict[str, str], sites: list[str], responses: Mapping[str, Message], who: str) -> None:
    """Keep in ``keys`` every valid public key a member of ``sites`` sent (an invalid one: a warning)."""
    for site, r in responses.items():
        if isinstance(r, PublicKeyShare) and site in sites:
            if secagg.valid_public_key(r.public_key):
                keys[site] = r.public_key
            else:
                warnings.warn(f"{who}: {site!r} sent an invalid public key", stacklevel=4)


class SecureSum:
    """The coordinator's state of secure sums over ``sites``: their keys, this round's cohort, the phase."""

    def __init__(self, sites: list[str]) -> None:
        self.sites = sites
        self.keys: dict[str, str] = {}
        self.cohort: list[str] = []
        self.phase: Literal["start", "keys", "upload", "unmask"] = "start"
        self.uploads: dict[str, np.ndarray] = {}
        self.keys_asked = False  # keys are asked at most once per round
        self.redone = 0  # steps asked again because a member dropped out
        self.retired: set[str] = set()  # members that spent their privacy budget: never in a cohort again

    def reset(self) -> None:
        self.cohort, self.phase, self.uploads, self.keys_asked = [], "start", {}, False

    def learn_keys(self, responses: Mapping[str, Message]) -> None:
        learn_keys(self.keys, self.sites, responses, "secure aggregation")

    def first(self, make: Callable[[dict[str, str]], Message]) -> dict[str, Message] | None:
        """The exchange of a step: ``make(cohort keys)`` to the cohort, and key requests to the
        sites without a key once per round. None: fewer than :data:`MIN_COHORT` members, so no
        secure sum this round."""
        missing = [] if self.keys_asked else [s for s in self.sites if s not in self.keys]
        self.keys_asked = True
        self.cohort = self.cohort or [s for s in self.sites if s in self.keys and s not in self.retired]
        if len(self.cohort) < MIN_COHORT:
            if missing:  # a keys-only exchange, then the cohort is formed again
                self.phase = "keys"
                return {s: KeyRequest() for s in missing}
            return None
        self.phase = "upload"
        request = make(self.cohort_keys())
        return {**{s: KeyRequest() for s in missing}, **{s: request for s in self.cohort}}

    def cohort_keys(self) -> dict[str, str]:
        return {s: self.keys[s] for s in self.cohort}

    def outsiders(self) -> dict[str, str]:
        """The sites with a key outside this round's cohort (and not retired): they receive its sum too."""
        return {
            s: k for s, k in self.keys.items() if s in self.sites and s not in self.cohort and s not in self.retired
        }

    def on_responses(self, step: int, particles_sha256: str, size: int | None,
                     responses: Mapping[str, Message], to_members: bool = False
                     ) -> dict[str, Message] | np.ndarray | SealedSum | str:
        """The next exchange, the decoded sum (``size`` floats; ``to_members``: the sum behind the
        group mask and the leader's sealed keys, :class:`SealedSum`), ``"redo"`` (ask the step again of the smaller
        cohort) or
        ``"stop"`` (no secure sum possible this round).

        ``size=None``: the uploads' size is not known in advance (``surface``: one moment per
        objective); the most frequent size among the cohort's uploads (the first in roster order
        on a tie) is the sum's, and a member whose upload has another is treated as dropped out,
        with a warning."""
        self.learn_keys(responses)
        if self.phase == "keys":
            self.phase, self.cohort = "upload", []
            return "redo"
        want = MaskedScores if self.phase == "upload" else SelfMaskSeed
        if self.phase == "upload" and size is None:
            sizes = [responses[s].masked.n_scalars for s in self.cohort  # type: ignore[union-attr]
                     if isinstance(responses.get(s), MaskedScores)]
            common = max(sizes, key=sizes.count) if sizes else 0
            odd = [s for s in self.cohort if isinstance(responses.get(s), MaskedScores)
                   and responses[s].masked.n_scalars != common]  # type: ignore[union-attr]
            if odd:
                warnings.warn(f"secure aggregation: leaving out the uploads of {odd} (not of the cohort's size "
                              f"{common}: another basis or number of objectives)", stacklevel=3)
                responses = {s: r for s, r in responses.items() if s not in odd}
            size = common
        answered = [s for s in self.cohort if isinstance(responses.get(s), want)]
        leader = min(self.cohort) if self.cohort else ""
        if to_members and leader in answered:  # the leader's key must reach every member
            if not set(self.cohort) - {leader} <= set(responses[leader].sealed or {}):  # type: ignore[union-attr]
                answered.remove(leader)
        if len(answered) < len(self.cohort):  # a dropout: its masks would not cancel
            self.cohort, self.redone, self.phase, self.uploads = answered, self.redone + 1, "upload", {}
            return "redo" if len(answered) >= MIN_COHORT else "stop"
        if self.phase == "upload":
            self.uploads = {s: responses[s].masked.numpy().reshape(-1) for s in answered}  # type: ignore[union-attr]
            if size is not None and any(u.size != size for u in self.uploads.values()):
                raise ProtocolError(f"masked uploads must have {size} entries")
            if to_members:  # one exchange: the sum stays behind the leader's group mask
                keys = responses[leader].sealed or {}  # type: ignore[union-attr]
                masked = secagg.aggregate([self.uploads[s] for s in answered], [])
                self.uploads = {}
                return SealedSum(masked=masked, sealed={leader: {}, **{r: {leader: k} for r, k in keys.items()
                                                                       if r in self.sites and r != leader}})
            self.phase = "unmask"
            req = UnmaskRequest(step=step, cohort=self.cohort_keys(), particles_sha256=particles_sha256)
            return {s: req for s in self.cohort}
        seeds = [base64.b64decode(responses[s].seed) for s in answered]  # type: ignore[union-attr]
        total = secagg.decode(secagg.aggregate([self.uploads[s] for s in answered], seeds))
        self.phase, self.uploads = "upload", {}
        if abs(total[-1] - len(answered)) > 1e-6:  # every member counts 1: anything else is a corrupt sum
            warnings.warn("secure aggregation: the sum does not check out (a stale or wrong key?); "
                          "keys will be asked again", stacklevel=3)
            for s in answered:
                self.keys.pop(s, None)
            return "stop"
        return total
