"""The study's initial design: one scrambled Latin hypercube dealt to its sites.

The coordinator deals it at join (:func:`collaborative_design`); a site recomputes the
whole of it from the study's seed when its protocol needs the others' rows
(:func:`study_design`), and repairs its own rows to its local constraints
(:func:`design_rows`). A site on its own draws its own hypercube.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labfbo.seeding import rng
from labfbo.space import SearchSpace


def collaborative_design(space: SearchSpace, n_sites: int, n_init: int, seed: int) -> np.ndarray:
    """``(n_sites, n_init, d)``: one scrambled LHS of ``n_sites * n_init`` points, dealt to sites.

    Site ``i`` receives rows ``perm[i*n_init:(i+1)*n_init]`` of a seeded random
    permutation, so each site's cells are spread over the whole space.
    """
    if n_init <= 0:
        return np.zeros((n_sites, 0, space.dim))
    from scipy.stats import qmc  # deferred: scipy.stats takes a while to import

    gen = rng(seed, 0, 0, f"collaborative-lhs/{n_sites}/{n_init}")
    pts = qmc.LatinHypercube(space.dim, scramble=True, seed=gen).random(n_sites * n_init)
    pts = space.design(pts[gen.permutation(n_sites * n_init)], int(gen.integers(2**31)))
    return pts.reshape(n_sites, n_init, space.dim)


def study_design(space: SearchSpace, n_init: int, join_reply: Any) -> np.ndarray | None:
    """The whole collaborative design of the study a site joined, as the coordinator dealt it to
    sites with this site's ``n_init`` (``(n_sites, n_init, d)``; public: a function of the study's
    seed), or None when it cannot be known: no federation, no design, or a coordinator that does
    not say its seed or dealt this site other rows."""
    if join_reply is None or join_reply.study_seed is None or n_init <= 0:
        return None
    shared = SearchSpace.model_validate(space.model_dump(mode="json"))  # as the coordinator holds it: no local constraints
    full = collaborative_design(shared, join_reply.n_sites, n_init, join_reply.study_seed)
    mine = join_reply.design.numpy().reshape(-1, space.dim)
    if mine.shape != full[join_reply.site_index].shape or not np.allclose(mine, full[join_reply.site_index]):
        return None
    return full


def design_rows(space: SearchSpace, n_init: int, seed: int, join_reply: Any, repair_seed: int) -> np.ndarray:
    """The site's initial design in model coordinates: the coordinator's (repaired to the site's
    own constraints with ``repair_seed``) when it joined a federation, else a scrambled Latin
    hypercube of ``n_init`` points drawn from ``(seed, 0, 0, "design")``."""
    if join_reply is not None:
        rows = join_reply.design.numpy().reshape(-1, space.dim)
        return space.repair(rows, repair_seed) if space.local_constraints else rows
    if not n_init:
        return np.zeros((0, space.dim))
    from scipy.stats import qmc

    gen = rng(seed, 0, 0, "design")
    return space.design(qmc.LatinHypercube(space.dim, scramble=True, seed=gen).random(n_init),
                        int(gen.integers(2**31)))


