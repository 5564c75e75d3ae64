r"""Sealed votes (``vote`` with ``sealed=True``, the default): the coordinator relays votes it cannot read.

A site's vote names one of its own dealt experiments, so whoever reads it learns which of them
the site's model ranks best (under ``DP(epsilon=2)``: the truth 65 % of the time among 5).
Sealed, the vote is encrypted separately for every other site (:mod:`labfbo.privacy.sealed`:
X25519 key agreement, ChaCha20-Poly1305), and the coordinator only relays:

1. a ``KeyRequest`` to the sites whose public key it does not hold
   (:class:`~labfbo.protocols.secure_sum.PublicKeyShare` answers, as for secure aggregation),
   alone in round 0 and beside the vote requests after that (:class:`SealedRelay`);
2. ``VoteRequest(cohort={site: public key})`` -> :class:`SealedVote`: one fixed-size token
   per other member, each the packed vote (:data:`PAYLOAD`) with the voter's roster index,
   authenticated;
3. to each site a :class:`SealedTally`: the tokens sealed for it (the voter's public key
   and the round it sealed in ride along, so held votes of earlier rounds open too).

Each recipient opens its tokens and counts the votes itself
(:func:`labfbo.protocols.vote.protocol.count_votes`), leaving out, with a warning, a vote over another
codebook or one that names a row not dealt to its voter — the site that sealed it, whose roster
index the recipient knows from its own request (``VoteRequest.roster``), whatever index the
payload claims. The coordinator learns who voted in
which round and nothing of what: every token has the same length whatever the vote (trust: it
relays the public keys faithfully; a recipient opens a vote only under the key its own request
listed for the voter). The peers learn each vote and who cast it, as they do unsealed with the
design (with ``codebook=B`` unsealed tallies hide the voters from the peers; sealed they do not),
and the randomized response bounds what one vote tells them.

A site that joins (or rekeys) after a vote was sealed gets it when the voter is next asked,
within the vote's ``release_every`` window: the voter seals the *same* randomized response
again (``resealed_from``, no new release) — only a vote that left, never one the operator
declined or the budget withheld — also after a restart, from the row its journaled release
states (``Release.reported``).
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from typing import Annotated, Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from labfbo.core.exceptions import ProtocolError
from labfbo.core.messages import Message, register
from labfbo.privacy import sealed
from labfbo.protocols.base import Exchange, Finish, Step
from labfbo.protocols.held import HeldReleases
from labfbo.protocols.secure_sum import KeyRequest, learn_keys

PAYLOAD = struct.Struct("<HHHHdI")  # index, codebook, choices (0: None), voter's roster index, sigma (nan: None), k
TOKEN_CHARS = 4 * math.ceil((sealed.NONCE + PAYLOAD.size + sealed.TAG) / 3)
Token = Annotated[str, Field(min_length=TOKEN_CHARS, max_length=TOKEN_CHARS)]
PublicKey = Annotated[str, Field(min_length=44, max_length=44)]


@register
class SealedVote(Message):
    """Site -> coordinator: the site's vote sealed for each other member (recipient -> token).
    The DP setting and the schedule are the site's configuration, not its data, and stay in the clear."""

    kind: Literal["sealed_vote"] = "sealed_vote"
    public_key: PublicKey = Field(description="the voter's X25519 public key, which opens its tokens")
    sealed: dict[str, Token] = Field(min_length=1)
    dp_noise_multiplier: float | None = Field(None, gt=0)
    release_every: int | None = Field(None, ge=1)
    resealed_from: int | None = Field(None, ge=0, description="the round of the vote this repeats, sealed again "
                                      "for a cohort with a newcomer (no new release)")


class SealedEnvelope(BaseModel):
    """One voter's token for the recipient, with what opening it needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sender: str
    public_key: PublicKey
    round: int = Field(ge=0, description="the round the vote was sealed in (a held vote: an earlier one)")
    token: Token


@register
class SealedTally(Message):
    """Coordinator -> site: the other sites' votes sealed for this site."""

    kind: Literal["sealed_tally"] = "sealed_tally"
    votes: list[SealedEnvelope] = Field(min_length=1, max_length=4096)


def context(study: str, round: int) -> bytes:
    return json.dumps(["vote", study, int(round)]).encode()


def pack(fields: Mapping[str, Any], voter_index: int) -> bytes:
    """An :class:`~labfbo.protocols.vote.protocol.OptimumVote`'s fields and the voter's roster index,
    in :data:`PAYLOAD`."""
    sigma = fields.get("dp_noise_multiplier")
    return PAYLOAD.pack(fields["index"], fields["codebook"], fields.get("choices") or 0, voter_index,
                        math.nan if sigma is None else sigma, fields.get("release_every") or 0)


def unpack(payload: bytes) -> tuple[dict[str, Any], int]:
    """The vote's fields and the voter's roster index."""
    if len(payload) != PAYLOAD.size:
        raise ProtocolError(f"a sealed vote holds {PAYLOAD.size} bytes, got {len(payload)}")
    index, size, choices, voter, sigma, every = PAYLOAD.unpack(payload)
    return {"index": index, "codebook": size, "choices": choices or None,
            "dp_noise_multiplier": None if math.isnan(sigma) else sigma, "release_every": every or None}, voter


def seal_vote(fields: Mapping[str, Any], voter_index: int, me: str, key_seed: bytes, cohort: Mapping[str, str],
              study: str, round: int) -> SealedVote:
    """The vote sealed for every member of ``cohort`` but this site."""
    payload, ctx = pack(fields, voter_index), context(study, round)
    tokens = {peer: sealed.seal(payload, me, key_seed, peer, key, ctx) for peer, key in cohort.items() if peer != me}
    return SealedVote(public_key=cohort[me], sealed=tokens, dp_noise_multiplier=fields.get("dp_noise_multiplier"),
                      release_every=fields.get("release_every"))


def open_votes(tally: SealedTally, me: str, key_seed: bytes) -> dict[str, tuple[dict[str, Any], int]]:
    """``sender -> (vote fields, voter index)`` of the tokens that open; the others are left out, with a warning."""
    out: dict[str, tuple[dict[str, Any], int]] = {}
    for env in tally.votes:
        try:
            out[env.sender] = unpack(sealed.unseal(env.token, me, key_seed, env.sender, env.public_key,
                                                   context(tally.study, env.round)))
        except ProtocolError as exc:
            warnings.warn(f"vote: {exc}; that vote is left out", stacklevel=2)
    return out


def relay(votes: Mapping[str, SealedVote], sites: list[str]) -> dict[str, SealedTally]:
    """Each site's tally: the tokens sealed for it by the other voters (roster order)."""
    out = {}
    for s in sites:
        envs = [SealedEnvelope(sender=o, public_key=v.public_key, round=v.round, token=v.sealed[s])
                for o, v in votes.items() if o != s and s in v.sealed]
        if envs:
            out[s] = SealedTally(votes=envs)
    return out


class SealedRelay:
    """The coordinator's side of sealed votes: the members' public keys and one round's exchanges.

    A round is one exchange: the vote request (with the cohort's keys) to every member with a
    key, and a key request to the others, who vote from the next round. Keys alone are asked
    first only while fewer than two sites could seal for each other (round 0). A member that
    answers with a new key instead of its vote is asked again, once, in the same round.
    """

    def __init__(self, sites: list[str], held: HeldReleases[SealedVote],
                 request: Callable[[dict[str, str]], Message]) -> None:
        self.sites, self.held, self.request = sites, held, request
        self.keys: dict[str, str] = {}  # as the members sent them
        self.asking_keys, self.reasked = False, False
        self.fresh: dict[str, SealedVote] = {}  # this round's sealed votes so far

    def _vote_requests(self, only: Any = None) -> dict[str, Message]:
        request = self.request({s: self.keys[s] for s in self.sites if s in self.keys})
        return {s: request for s in self.sites if s in self.keys and (only is None or s in only)}

    def open_round(self) -> Step:
        self.fresh, self.reasked = {}, False
        missing: dict[str, Message] = {s: KeyRequest() for s in self.sites if s not in self.keys}
        self.asking_keys = len(self.keys) < 2
        if self.asking_keys:
            return Exchange(missing) if missing else Finish({})
        return Exchange({**missing, **self._vote_requests()})

    def on_responses(self, t: int, responses: Mapping[str, Message]) -> Step:
        """The next exchange, or the round's relay: each site gets the tokens sealed for it, fresh or
        held from an earlier round of the voter's schedule."""
        before = dict(self.keys)
        learn_keys(self.keys, self.sites, responses, "vote")
        if self.asking_keys:
            self.asking_keys = False
            return Exchange(self._vote_requests()) if len(self.keys) >= 2 else Finish({})
        self.fresh.update({s: m for s, m in responses.items() if isinstance(m, SealedVote)})
        rekeyed = [s for s in responses if s in before and self.keys.get(s) != before[s]]
        if rekeyed and not self.reasked:
            self.reasked = True
            return Exchange(self._vote_requests(only=rekeyed))
        fresh, self.fresh = self.fresh, {}
        votes = self.held.merge(t, fresh)
        for s, m in fresh.items():  # a vote sealed again for a newcomer keeps its first release's window
            if m.resealed_from is not None and s in self.held.held:
                self.held.held[s] = (m.resealed_from, m)
        return Finish(relay(votes, self.sites))

    def state(self) -> dict[str, Any]:
        return {"keys": dict(self.keys)} if self.keys else {}  # absent without keys: a snapshot reads as before

    def restore(self, state: Mapping[str, Any]) -> None:
        self.keys = dict(state.get("keys", {}))
