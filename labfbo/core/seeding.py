"""Every random draw in labfbo comes from ``SeedSequence([seed, site, round, purpose])``.

Strings are hashed stably (SHA-256), never with Python's salted ``hash()``, so the same
seed gives the same draws in every process and on every transport.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from typing import Iterator

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


_TORCH_RNG = threading.RLock()


@contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """Run a block with torch's global RNG seeded, restoring the caller's state after.

    torch's generator is process-global: the block holds a process-wide lock, so a site's
    transport thread (answering the coordinator) and its lab-script thread never
    interleave their draws — the same seed gives the same numbers on every transport.
    """
    import torch  # deferred: the space and its constraints import this module without torch

    with _TORCH_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed) % (2**63 - 1))
        yield
