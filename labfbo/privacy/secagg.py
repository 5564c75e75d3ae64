r"""Secure aggregation by pairwise additive masks (Bonawitz et al., CCS 2017, the masking layer).

Every site :math:`i` has an X25519 key pair; each pair of sites :math:`(i, j)` of a cohort
agrees on a shared secret without the coordinator learning it. For one release (a study,
round, step and cohort, the *context*) both derive from it, with HKDF-SHA256, a ChaCha20
key whose keystream is the mask :math:`m_{ij} \in \mathbb{Z}_{2^{64}}^P`. Site :math:`i`
sends

.. math:: y_i = \mathrm{enc}(x_i) + \sum_{j > i} m_{ij} - \sum_{j < i} m_{ji} \pmod{2^{64}},

so every mask appears once with each sign and :math:`\sum_i y_i = \sum_i \mathrm{enc}(x_i)`:
the coordinator learns the sum and nothing else about a single :math:`x_i` (each
:math:`y_i` alone is uniformly distributed, as long as one peer's mask is unknown to it).

``enc`` is fixed point with :data:`FRACTION_BITS` fractional bits in two's complement, so
the decoded sum equals the float sum to :math:`\le n\,2^{-33}` per coordinate. A value
that could overflow the ring in a sum of ``n_parties`` is refused.

Every upload also carries a *self mask* :math:`b_i` (Bonawitz et al.'s double masking),
whose seed the site reveals only when the coordinator asks, after every upload of that
release arrived. If a member drops out, the coordinator redoes the step with the others
under a new context; the first attempt's uploads stay hidden behind their self masks,
so even a late upload of the dropped site cannot be isolated by subtracting two sums.

**A sum only the members open** (:func:`group_key`, :func:`group_mask`, :func:`seal`,
:func:`unseal`). Instead of self masks, the cohort's *leader* (its first member) adds a group
mask :math:`R = \mathrm{ChaCha20}(K)` under a key :math:`K` fresh for the release, and seals
:math:`K` for every other member (ChaCha20-Poly1305 under a key the two alone derive): the
coordinator holds :math:`\sum_i y_i = \sum_i \mathrm{enc}(x_i) + R`, uniformly distributed, and
only the members can remove :math:`R`. Self masks are not needed then: every sum the
coordinator could form — of a complete release or of an abandoned attempt, whose context and so
whose :math:`K` differ — carries a group mask it does not know. The coordinator learns nothing
of the sum either.

**Many members** (:func:`peers`). In a cohort of more than :data:`MIN_DEGREE` + 1 members, each
member masks with :math:`k = \max(16, 2\lceil\log_2 n\rceil)` neighbours on a ring ordered by a
hash of the release's context — a connected graph, so the coordinator still learns only the
sum, and a member's cost grows as :math:`\log n` rather than :math:`n`. What changes is collusion:
the coordinator can isolate a member's upload if it also holds the pairwise secrets of all
:math:`k` of that member's neighbours in that release (with the complete graph: of all
:math:`n - 1` other members); the neighbours change with every release.

What is *not* here: the secret sharing of each site's mask seeds that lets Bonawitz et
al. finish a round *without* redoing it. The key material is 32 random bytes per site,
kept in its journal.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import os
from typing import Any, Iterable, Mapping

import numpy as np

from labfbo.core.exceptions import ConfigurationError, ProtocolError

FRACTION_BITS = 32
#: a cohort of more members than this + 1 masks over a sparse graph (:func:`peers`)
MIN_DEGREE = 16
_SCALE = float(2**FRACTION_BITS)
_LIMIT = 2.0**62  # |sum| must stay below 2^63; keep a factor 2 of headroom


def _crypto():
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError as exc:  # optional dependency (extra "privacy")
        raise ConfigurationError("secure aggregation needs cryptography: pip install 'labfbo[privacy]'") from exc
    return hashes, X25519PrivateKey, X25519PublicKey, Cipher, algorithms, HKDF


def _hkdf(material: bytes, info: bytes, length: int = 32) -> bytes:
    hashes, *_, HKDF = _crypto()
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(material)


def new_key_seed() -> bytes:
    """32 random bytes from the OS: a site's secure-aggregation key material (kept in its journal)."""
    return os.urandom(32)


def private_key(key_seed: bytes):
    """The site's X25519 key, derived from its 32-byte key seed (so a resumed site has the same one)."""
    _, X25519PrivateKey, *_ = _crypto()
    return X25519PrivateKey.from_private_bytes(_hkdf(key_seed, b"labfbo/secagg/x25519"))


def public_key(key_seed: bytes) -> str:
    """The site's public key, base64 (what it sends the coordinator)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = private_key(key_seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def _peer(public: str):
    _, _, X25519PublicKey, *_ = _crypto()
    try:
        return X25519PublicKey.from_public_bytes(base64.b64decode(public, validate=True))
    except Exception as exc:  # noqa: BLE001 — any malformed key is a protocol error
        raise ProtocolError(f"secure aggregation: malformed public key ({exc})") from None


def shared_key(key_seed: bytes, peer_public: str, info: bytes, length: int = 32) -> bytes:
    """``length`` bytes that this site and the owner of ``peer_public`` (and no one else) derive alike
    for ``info``: HKDF-SHA256 of their X25519 secret."""
    return _hkdf(private_key(key_seed).exchange(_peer(peer_public)), info, length)


def valid_public_key(public: str) -> bool:
    try:
        _peer(public)
        return True
    except ProtocolError:
        return False


def context(study: str, round: int, step: int, cohort: list[str], particles: bytes) -> bytes:
    """What makes one release's masks unique: study, round, step, the exact cohort and the
    particles the scores were computed on (a re-run of a step on other particles gets other masks)."""
    fields = [study, int(round), int(step), sorted(cohort), hashlib.sha256(particles).hexdigest()]
    return b"labfbo/secagg/" + json.dumps(fields, separators=(",", ":")).encode()


def encode(x: np.ndarray, n_parties: int) -> np.ndarray:
    """Fixed-point two's complement in Z_{2^64}; refuses values whose sum could overflow."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ProtocolError("secure aggregation: values must be finite")
    biggest = float(np.max(np.abs(x))) if x.size else 0.0
    if biggest * _SCALE * max(n_parties, 1) >= _LIMIT:
        raise ProtocolError(
            f"secure aggregation: |value| {biggest:.3g} is too large for a sum of {n_parties} "
            f"in fixed point with {FRACTION_BITS} fractional bits (max {_LIMIT / _SCALE / max(n_parties, 1):.3g})"
        )
    return np.round(x * _SCALE).astype(np.int64).view(np.uint64)


def decode(total: np.ndarray) -> np.ndarray:
    """The float value of a fixed-point sum."""
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) / _SCALE


def _stream(key: bytes, size: int) -> np.ndarray:
    *_, Cipher, algorithms, _ = _crypto()
    data = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor().update(b"\x00" * (8 * size))
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


def self_mask_seed(key_seed: bytes, info: bytes) -> bytes:
    """The seed of a site's own mask for one release; revealed only once every upload of that release arrived."""
    return _hkdf(key_seed, b"self/" + info)


def mask_degree(n: int) -> int:
    r"""How many peers a member of an ``n``-member cohort masks with: every other one up to
    :data:`MIN_DEGREE` + 1 members, then :math:`\max(16, 2\lceil\log_2 n\rceil)` (even)."""
    return n - 1 if n - 1 <= MIN_DEGREE else max(MIN_DEGREE, 2 * math.ceil(math.log2(n)))


def peers(me: str, members: Iterable[str], info: bytes) -> list[str]:
    r"""The members ``me`` shares pairwise masks with in the release ``info``.

    A cohort of at most :data:`MIN_DEGREE` + 1 members: every other member (the complete graph). A
    larger one: ``me``'s :func:`mask_degree` nearest members on a ring ordered by a hash of the
    release's context and each name (a Harary graph on a fresh random ring: connected, symmetric,
    so every mask still appears once with each sign), as Bell et al. (CCS 2020) do with a sparse
    random graph. A member's cost is then :math:`O(\log n)` key agreements instead of :math:`n - 1`.
    """
    ordered = tuple(sorted(members))
    n = len(ordered)
    k = mask_degree(n)
    if k >= n - 1:
        return [p for p in ordered if p != me]
    ring, where = _ring(info, ordered)
    i = where[me]
    return sorted({ring[(i + j) % n] for j in range(-(k // 2), k // 2 + 1) if j != 0})


@functools.lru_cache(maxsize=16)
def _ring(info: bytes, members: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, int]]:
    """The release's ring of ``members`` and each one's place on it (the same for every member of the
    release: kept, for a process that runs many sites)."""
    ring = tuple(sorted(members, key=lambda s: hashlib.sha256(info + b"/ring/" + s.encode()).digest()))
    return ring, {s: i for i, s in enumerate(ring)}


def mask(encoded: np.ndarray, me: str, key_seed: bytes, cohort: Mapping[str, str], info: bytes,
         self_mask: bool = True) -> np.ndarray:
    """``encoded`` plus this site's self mask (unless ``self_mask=False``: a sum behind a group mask)
    and its signed pairwise masks with its :func:`peers`.

    ``cohort`` maps each member (``me`` included) to its base64 public key.
    """
    if me not in cohort:
        raise ProtocolError(f"secure aggregation: {me!r} is not in the cohort")
    mine = private_key(key_seed)
    out = np.asarray(encoded, dtype=np.uint64).reshape(-1).copy()
    with np.errstate(over="ignore"):
        if self_mask:
            out = out + _stream(self_mask_seed(key_seed, info), out.size)
        for peer in peers(me, cohort, info):
            pair = info + b"/pair/" + json.dumps(sorted((me, peer))).encode()
            m = _stream(_hkdf(mine.exchange(_peer(cohort[peer])), pair), out.size)
            out = out + m if me < peer else out - m
    return out.reshape(np.shape(encoded))


def group_key(key_seed: bytes, info: bytes) -> bytes:
    """The 32-byte group key the cohort's leader draws for one release (from its key seed and the
    release's context: a resumed leader draws the same one; another attempt, another one)."""
    return _hkdf(key_seed, b"group/" + info)


def group_mask(key: bytes, size: int) -> np.ndarray:
    """The group mask of ``key``: ``size`` words of its ChaCha20 keystream."""
    return _stream(_hkdf(key, b"labfbo/secagg/group-mask"), size)


def _aead(key_seed: bytes, peer_public: str, info: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(shared_key(key_seed, peer_public, b"seal/" + info))


def seal(secret: bytes, key_seed: bytes, peer_public: str, info: bytes, sender: str, recipient: str) -> str:
    """``secret`` (a group key) sealed for the owner of ``peer_public`` (base64): ChaCha20-Poly1305 under a
    key only the two derive for this release (``info``); the key is used once, so the nonce is fixed. The
    sender and the recipient are authenticated with it."""
    _crypto()
    aad = json.dumps([sender, recipient]).encode()
    return base64.b64encode(_aead(key_seed, peer_public, info).encrypt(b"\x00" * 12, secret, aad)).decode("ascii")


def unseal(sealed: str, key_seed: bytes, sender_public: str, info: bytes, sender: str, recipient: str) -> bytes:
    """The secret ``sender`` sealed for this site (:func:`seal`); :class:`ProtocolError` if it does not open."""
    from cryptography.exceptions import InvalidTag

    _crypto()
    aad = json.dumps([sender, recipient]).encode()
    try:
        return _aead(key_seed, sender_public, info).decrypt(b"\x00" * 12, base64.b64decode(sealed, validate=True), aad)
    except (InvalidTag, ValueError) as exc:
        raise ProtocolError(f"secure aggregation: the key {sender!r} sealed for {recipient!r} does not open "
                            f"({type(exc).__name__}: tampered, or another release's)") from None


def aggregate(masked: list[np.ndarray], self_seeds: list[bytes]) -> np.ndarray:
    """The sum of the sites' masked vectors in Z_{2^64}, less their revealed self masks (the pairwise
    masks cancel in the sum)."""
    total = np.zeros(np.asarray(masked[0]).size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for y in masked:
            total = total + np.asarray(y, dtype=np.uint64).reshape(-1)
        for seed in self_seeds:
            total = total - _stream(seed, total.size)
    return total
