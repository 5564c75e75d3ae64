"""The study's initial design: one scrambled Latin hypercube dealt to its sites.

The coordinator deals it at join (:func:`collaborative_design`, over the study's shared
space); a site recomputes the whole of it from the study's seed when its protocol needs the
others' rows (:func:`study_design`), and fits its own rows to what it can run
(:func:`design_rows`): a lab with its own stock (``allowed``) takes its cells of the same
hypercube snapped to that stock, and any lab repairs them to its nonlinear constraints. A
site on its own draws its own hypercube.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labfbo.core.seeding import rng
from labfbo.space.search import SearchSpace


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
    shared = space.shared()  # as the coordinator holds it: no stock, no local constraints
    full = collaborative_design(shared, join_reply.n_sites, n_init, join_reply.study_seed)
    mine = join_reply.design.numpy().reshape(-1, space.dim)
    if mine.shape != full[join_reply.site_index].shape or not np.allclose(mine, full[join_reply.site_index]):
        return None
    return full


def stocked_rows(space: SearchSpace, rows: np.ndarray, join_reply: Any, seed: int) -> np.ndarray:
    """A lab's dealt design cells fitted to its own stock: its rows of the study's hypercube laid
    out again over the space with the lab's ``allowed`` table (the same points, snapped to what it
    stocks, repeats replaced — with every lab's stock alike, exactly the cells the coordinator
    dealt before stock was site-local); without the study's seed, the dealt rows snapped."""
    if join_reply.study_seed is None or not len(rows):
        return space.design(rows, seed)
    stock = SearchSpace.model_validate(space.model_dump(mode="json"))  # the stock, no nonlinear constraints
    return collaborative_design(stock, join_reply.n_sites, len(rows), join_reply.study_seed)[join_reply.site_index]


def design_rows(space: SearchSpace, n_init: int, seed: int, join_reply: Any, repair_seed: int) -> np.ndarray:
    """The site's initial design in model coordinates: the coordinator's (repaired to the site's
    own constraints with ``repair_seed``) when it joined a federation, else a scrambled Latin
    hypercube of ``n_init`` points drawn from ``(seed, 0, 0, "design")``."""
    if join_reply is not None:
        rows = join_reply.design.numpy().reshape(-1, space.dim)
        if space.allowed is not None:
            rows = stocked_rows(space, rows, join_reply, repair_seed)
        return space.repair(rows, repair_seed) if space.local_constraints else rows
    if not n_init:
        return np.zeros((0, space.dim))
    from scipy.stats import qmc

    gen = rng(seed, 0, 0, "design")
    return space.design(qmc.LatinHypercube(space.dim, scramble=True, seed=gen).random(n_init),
                        int(gen.integers(2**31)))


