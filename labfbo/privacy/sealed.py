r"""Sealed messages: site-to-site payloads that the coordinator relays but cannot read.

Every site has the X25519 key pair of secure aggregation (:mod:`labfbo.privacy.secagg`); the
coordinator relays the public keys. For one payload from ``sender`` to ``recipient`` both
derive the same key from their Diffie–Hellman secret,

.. math:: k = \mathrm{HKDF\text{-}SHA256}\big(\mathrm{X25519}(s_{\text{sender}}, P_{\text{recipient}}),\
          \text{info} = \text{context} \,\|\, \text{sender} \,\|\, \text{recipient}\big),

and the payload travels as ChaCha20-Poly1305 ciphertext under :math:`k`: confidential to the
two sites and authenticated (a recipient refuses a payload altered in transit or sealed by
anyone else for that sender). The nonce is derived from the key and the payload (a
deterministic, misuse-resistant choice): re-sealing the same payload gives the same bytes on
every transport, and two different payloads never share a nonce under one key.

Trust: an honest-but-curious coordinator that relays the public keys faithfully (an active
one could substitute its own key and read what is sealed to it — the same assumption as
secure aggregation's). A recipient learns the payload; the coordinator learns its size,
which the caller keeps fixed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from labfbo.exceptions import ProtocolError
from labfbo.privacy import secagg

NONCE = 12
TAG = 16


def _key(me: str, key_seed: bytes, peer: str, peer_public: str, context: bytes, sending: bool) -> bytes:
    pair = (me, peer) if sending else (peer, me)  # (sender, recipient): a key per direction
    info = b"labfbo/sealed/" + context + b"/" + json.dumps(pair).encode()
    return secagg.shared_key(key_seed, peer_public, info)


def _aead(key: bytes):
    # called after _key, whose key agreement already refused a missing ``cryptography`` clearly
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(key)


def seal(payload: bytes, me: str, key_seed: bytes, recipient: str, recipient_public: str, context: bytes) -> str:
    """``payload`` for ``recipient`` only: base64 of nonce + ciphertext + tag."""
    key = _key(me, key_seed, recipient, recipient_public, context, sending=True)
    nonce = hmac.new(key, payload, hashlib.sha256).digest()[:NONCE]
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

    key = _key(me, key_seed, sender, sender_public, context, sending=False)
    try:
        return _aead(key).decrypt(raw[:NONCE], raw[NONCE:], context)
    except InvalidTag:
        raise ProtocolError(f"sealed payload from {sender!r} does not authenticate (altered, or sealed for "
                            "another site, round or key)") from None
