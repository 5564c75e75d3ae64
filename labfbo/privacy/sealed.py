r"""Sealed messages: site-to-site payloads that the coordinator relays but cannot read.

Every site has the X25519 key pair of secure aggregation (:mod:`labfbo.privacy.secagg`); the
coordinator relays the public keys. For one payload from ``sender`` to ``recipient`` both
derive the same key from their Diffie–Hellman secret,

.. math:: k = \mathrm{HKDF\text{-}SHA256}\big(\mathrm{X25519}(s_{\text{sender}}, P_{\text{recipient}}),\
          \text{info} = \text{context} \,\|\, \text{sender} \,\|\, \text{recipient}\big),

split into an encryption key and a MAC key, and the payload travels as ChaCha20-Poly1305
ciphertext under the first: confidential to the two sites, and authenticated *against the
public keys the recipient was given* (it refuses a payload altered in transit, or sealed with
any other key than the one it holds for that sender). The nonce is an HMAC of the payload
under the second key (deterministic and misuse-resistant): re-sealing the same payload gives
the same bytes on every transport, and two different payloads never share a nonce under one key.

Trust: an honest-but-curious coordinator that relays the public keys faithfully (an active
one could substitute its own key, read what is sealed to it and seal payloads in a site's
name — the same assumption as secure aggregation's). A recipient learns the payload; the coordinator learns its size,
which the caller keeps fixed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from labfbo.core.exceptions import ProtocolError
from labfbo.privacy import secagg

NONCE = 12
TAG = 16


def _keys(me: str, key_seed: bytes, peer: str, peer_public: str, context: bytes, sending: bool) -> tuple[bytes, bytes]:
    """The encryption key and the nonce's MAC key of one direction, one context."""
    pair = (me, peer) if sending else (peer, me)  # (sender, recipient): keys per direction
    info = b"labfbo/sealed/" + context + b"/" + json.dumps(pair).encode()
    both = secagg.shared_key(key_seed, peer_public, info, length=64)
    return both[:32], both[32:]


def _aead(key: bytes):
    # called after _keys, whose key agreement already refused a missing ``cryptography`` clearly
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(key)


def seal(payload: bytes, me: str, key_seed: bytes, recipient: str, recipient_public: str, context: bytes) -> str:
    """``payload`` for ``recipient`` only: base64 of nonce + ciphertext + tag."""
    key, mac = _keys(me, key_seed, recipient, recipient_public, context, sending=True)
    nonce = hmac.new(mac, payload, hashlib.sha256).digest()[:NONCE]
    return base64.b64encode(nonce + _aead(key).encrypt(nonce, payload, context)).decode("ascii")


def unseal(token: str, me: str, key_seed: bytes, sender: str, sender_public: str, context: bytes) -> bytes:
    """The payload ``sender`` sealed for this site; :class:`ProtocolError` if it is not one."""
    try:
        raw = base64.b64decode(token, validate=True)
    except ValueError:
        raise ProtocolError(f"sealed payload from {sender!r} is not base64") from None
    if len(raw) < NONCE + TAG:
        raise ProtocolError(f"sealed payload from {sender!r} is too short")
    from cryptography.exceptions import InvalidTag

    key, _ = _keys(me, key_seed, sender, sender_public, context, sending=False)
    try:
        return _aead(key).decrypt(raw[:NONCE], raw[NONCE:], context)
    except InvalidTag:
        raise ProtocolError(f"sealed payload from {sender!r} does not authenticate (altered, or sealed for "
                            "another site, round or key)") from None
