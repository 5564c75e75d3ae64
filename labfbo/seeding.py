"""Every random draw in labfbo comes from ``SeedSequence([seed, site, round, purpose])``.

Strings are hashed stably (SHA-256), never with Python's salted ``hash()``, so the same
seed gives the same draws in every process and on every transport.
"""

from __future__ import annotations

import hashlib

import numpy as np


def stable_hash(text: str) -> int:
    """A 63-bit integer from ``text`` that is the same in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def seed_sequence(seed: int, site: int, round: int, purpose: str) -> np.random.SeedSequence:
    """The seed sequence of one (seed, site, round, purpose) stream."""
    for name, v in (("seed", seed), ("site", site), ("round", round)):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0 for seeding, got {v}")
    return np.random.SeedSequence([int(seed), int(site), int(round), stable_hash(purpose)])


def rng(seed: int, site: int, round: int, purpose: str) -> np.random.Generator:
    """A numpy generator for one stream."""
    return np.random.default_rng(seed_sequence(seed, site, round, purpose))


def int_seed(seed: int, site: int, round: int, purpose: str) -> int:
    """A 31-bit integer seed for one stream (for torch / BoTorch)."""
    return int(seed_sequence(seed, site, round, purpose).generate_state(1, np.uint32)[0] >> 1)


def campaign_id(site: str, secret: int) -> str:
    """A stable, public id of one site's campaign (its journal): 12 hex digits of a hash of its private secret."""
    return hashlib.sha256(f"labfbo-campaign/{site}/{int(secret)}".encode()).hexdigest()[:12]
