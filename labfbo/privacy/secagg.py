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

What is *not* here: the secret sharing of each site's mask seed that lets Bonawitz et al.
finish a round without a site that dropped out. Our coordinator instead redoes the step
with the sites that answered (fresh masks, since the cohort is part of the context).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Mapping

import numpy as np

from labfbo.exceptions import ConfigurationError, ProtocolError

FRACTION_BITS = 32
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


def private_key(secret: int, site: str):
    """The site's X25519 key, derived from its private secret (so a resumed site has the same one)."""
    _, X25519PrivateKey, *_ = _crypto()
    seed = _hkdf(int(secret).to_bytes(8, "little", signed=False), b"labfbo/secagg/key/" + site.encode())
    return X25519PrivateKey.from_private_bytes(seed)


def public_key(secret: int, site: str) -> str:
    """The site's public key, base64 (what it sends the coordinator)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = private_key(secret, site).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def context(study: str, round: int, step: int, cohort: list[str]) -> bytes:
    """What makes one release's masks unique: study, round, step and the exact cohort."""
    digest = hashlib.sha256("\x00".join(sorted(cohort)).encode()).hexdigest()
    return f"labfbo/secagg/{study}/{round}/{step}/{digest}".encode()


def encode(x: np.ndarray, n_parties: int) -> np.ndarray:
    """Fixed-point two's complement in Z_{2^64}; refuses values whose sum could overflow."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ProtocolError("secure aggregation: values must be finite")
    biggest = float(np.max(np.abs(x))) if x.size else 0.0
    if biggest * _SCALE * max(n_parties, 1) >= _LIMIT:
        raise ProtocolError(f"secure aggregation: |value| {biggest:.3g} is too large for a sum of {n_parties} "
                            f"in fixed point with {FRACTION_BITS} fractional bits (max {_LIMIT / _SCALE / max(n_parties, 1):.3g})")
    return np.round(x * _SCALE).astype(np.int64).view(np.uint64)


def decode(total: np.ndarray) -> np.ndarray:
    """The float value of a fixed-point sum."""
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) / _SCALE


def _pair_mask(me: str, secret: int, peer_public: str, info: bytes, size: int) -> np.ndarray:
    _, _, X25519PublicKey, Cipher, algorithms, _ = _crypto()
    try:
        peer = X25519PublicKey.from_public_bytes(base64.b64decode(peer_public, validate=True))
    except Exception as exc:  # noqa: BLE001 — any malformed key is a protocol error
        raise ProtocolError(f"secure aggregation: malformed public key ({exc})") from None
    shared = private_key(secret, me).exchange(peer)
    key = _hkdf(shared, info)
    stream = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor().update(b"\x00" * (8 * size))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def mask(encoded: np.ndarray, me: str, secret: int, cohort: Mapping[str, str], info: bytes) -> np.ndarray:
    """``encoded`` plus this site's signed pairwise masks with every other member of ``cohort``.

    ``cohort`` maps each member (``me`` included) to its base64 public key.
    """
    if me not in cohort:
        raise ProtocolError(f"secure aggregation: {me!r} is not in the cohort")
    out = np.asarray(encoded, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        for peer in sorted(cohort):
            if peer == me:
                continue
            pair = info + b"/" + "\x00".join(sorted((me, peer))).encode()
            m = _pair_mask(me, secret, cohort[peer], pair, out.size).reshape(out.shape)
            out = out + m if me < peer else out - m
    return out


def aggregate(masked: list[np.ndarray]) -> np.ndarray:
    """The sum of the sites' masked vectors in Z_{2^64} (the masks cancel)."""
    total = np.zeros_like(np.asarray(masked[0], dtype=np.uint64))
    with np.errstate(over="ignore"):
        for y in masked:
            total = total + np.asarray(y, dtype=np.uint64)
    return total
