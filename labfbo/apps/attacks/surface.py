r"""What the coordinator, a peer, and a coordinator under secure aggregation recover from ``surface``.

A ``surface`` lab :math:`i` sends in each round :math:`t` (:class:`~labfbo.protocols.surface.protocol.SurfaceStats`)
:math:`n_{i,t}`, :math:`\bar G_{i,t} = \Phi_{i,t}^\top\Phi_{i,t}/n_{i,t}` (upper triangle) and
:math:`\bar h_{i,t} = \Phi_{i,t}^\top z_{i,t}/n_{i,t}`, where the rows of :math:`\Phi_{i,t}` are the
features :math:`\phi(x)` (:class:`~labfbo.protocols.surface.model.SurfaceFeatures`: an intercept and the
one-hot main effects of every categorical choice, plus a quadratic in ordered parameters) of
its first :math:`n_{i,t}` experiments and :math:`z_{i,t} = (y_{1:n} - \bar y_{1:n})/s_{1:n}` its
results standardized *on that round's data*. Every attacker here reads a sequence of
**snapshots** (:class:`Snapshot`): per round a count :math:`N_t`, the sums
:math:`C_t = \sum n\bar G` and :math:`H_t = \sum n\bar h` over the labs it sees, and the DP
noise std of those sums:

* ``coordinator`` (:func:`coordinator_view`): one lab's own statistics, :math:`C_t = \Phi_t^\top\Phi_t`;
* ``peer`` (:func:`peer_view`): the leave-one-out totals a lab receives — every *other* lab summed;
* ``sum`` (:func:`sum_view`, :func:`secure_sum_view`): the cohort's sum per round, all a
  coordinator learns under secure aggregation when it unmasks the sum (``sum_seen_by="coordinator"``);
* ``sealed`` (:func:`sealed_view`): what the coordinator holds by default (``sum_seen_by="members"``),
  the sum of the round's masked uploads with every self mask still in it — read as a fixed-point sum
  and attacked as one with a noise std equal to its values' spread, given the true counts.

**Combinations** (categorical spaces, whose combinations :math:`c = 1..K` are enumerated with
:math:`M_c = \mathrm{upper}(\phi_c\phi_c^\top)`). Rows are only appended, so the view at round
:math:`t` is the first :math:`N_t` rows :math:`r_1, r_2, \dots` of one sequence and

.. math:: C_t = \sum_{k \le N_t} M_{r_k} + \varepsilon_t, \qquad
          C_t - C_{t-1} = \sum_{N_{t-1} < k \le N_t} M_{r_k} + \varepsilon_t - \varepsilon_{t-1}.

The intercept row of :math:`M_c` is :math:`\phi_c` itself and the rest its pairwise products:
the difference of two rounds holds the counts of every choice and every pair of choices among
the rows that round added. Without noise one new row is read off exactly (the :math:`c` with
:math:`M_c = C_t - C_{t-1}`); a block of several (the first release, the several labs of a
sum) is the integer program :math:`\sum_c x_c M_c = C_t - C_{t-1}`, :math:`\sum_c x_c =
N_t - N_{t-1}`, :math:`x \in \mathbb Z_{\ge 0}^K` (scipy's ``milp``; it returns *one*
multiset with those pair counts — unique in practice for a few rows). With DP noise of std
:math:`\tau_t` per entry the attack is the weighted least squares
:math:`\min_r \sum_t \lVert C_t - \sum_{k\le N_t} M_{r_k}\rVert^2/\tau_t^2` over every round
at once: a greedy start block by block, then coordinate descent (each row moved to its best
combination given the others, until no move helps).

**Results.** With :math:`\Phi` recovered, :math:`H_t = \Phi_t^\top z_t` is linear in the
results. One lab: :math:`z_t = (y_{1:N_t} - m_t)/s_t` for one raw :math:`y` and per-round
:math:`(m_t, s_t)`, so :math:`\Phi_t^\top y_{1:N_t} - s_t H_t - m_t\,\Phi_t^\top\mathbf 1 = 0`
for :math:`t < T` and :math:`\Phi_T^\top y = H_T` (fixing :math:`m_T = 0, s_T = 1`: :math:`y`
is then the last round's :math:`z`) — a linear system in :math:`(y, s, m)` solved by least
squares (minimum norm where the rows do not determine it; each round's equations divided by
:math:`N_t`). A sum of labs mixes labs' standardizations; its attack is the last round's
minimum-norm :math:`\zeta` with :math:`\Phi_T^\top\zeta = H_T`, one value per recovered row.

**Scores** (:func:`score`), for one lab against its true rows and its last standardized
results: the fraction of its experiments the guess contains (``recall``; a multiset overlap)
and the fraction of the guess that are its (``precision``), beside ``chance``: as many
combinations drawn at random (distinct, uniform over the space; 200 draws); the Pearson and
Spearman correlation and RMSE between recovered and true results over the matched rows
(same combination; none below 3), beside a random permutation of the recovered values (200 draws).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from labfbo.core.exceptions import ConfigurationError

MAX_COMBINATIONS = 50_000
CHANCE_DRAWS = 200
VIEWS = ("coordinator", "peer", "sum", "sealed")

__all__ = ["Snapshot", "Candidates", "candidates", "coordinator_view", "peer_view", "sum_view",
           "secure_sum_view", "sealed_view", "reconstruct_rows", "reconstruct_values", "attack", "score", "VIEWS"]


@dataclass(frozen=True)
class Snapshot:
    """One round of a view: the count of rows, the count-weighted sums :math:`C = \\sum n\\bar G`
    (packed upper triangle) and :math:`H = \\sum n\\bar h`, the DP noise std per entry of those
    sums (0: none) and how many labs they sum."""

    round: int
    count: int
    gram: np.ndarray
    moment: np.ndarray
    noise_sd: float = 0.0
    sites: int = 1


@dataclass(frozen=True)
class Candidates:
    """Every combination of a categorical space: unit-cube points ``X (K, d)``, features
    ``Phi (K, p)`` and the packed outer products ``M (K, p(p+1)/2)``."""

    X: np.ndarray
    Phi: np.ndarray
    M: np.ndarray

    def index(self, X: np.ndarray) -> list[int]:
        """The combination of each unit-cube row of ``X``."""
        d = np.abs(np.asarray(X, float)[:, None, :] - self.X[None]).max(-1)
        return [int(i) for i in d.argmin(1)]


def candidates(space: Any, fourier_features: int = 100, fourier_lengthscale: float = 0.2) -> Candidates:
    """Enumerate a categorical space's combinations with their ``surface`` features.

    Raises:
        ConfigurationError: a parameter is not categorical, or there are more than
            :data:`MAX_COMBINATIONS` combinations.
    """
    from labfbo.protocols.surface.model import SurfaceFeatures, upper
    from labfbo.space.search import Categorical

    if not all(isinstance(p, Categorical) for p in space.params):
        raise ConfigurationError("the surface attack enumerates combinations: every parameter must be categorical")
    sizes = [len(p.choices) for p in space.params]
    if int(np.prod(sizes)) > MAX_COMBINATIONS:
        raise ConfigurationError(f"the space has {int(np.prod(sizes))} combinations; the surface attack enumerates "
                                 f"at most {MAX_COMBINATIONS}")
    combos = [dict(zip(space.names, c)) for c in itertools.product(*(p.choices for p in space.params))]
    X = np.asarray(space.encode(combos), dtype=np.float64)
    Phi = SurfaceFeatures(space, fourier_features, fourier_lengthscale).of_unit(X)
    M = np.stack([upper(np.outer(f, f)) for f in Phi])
    return Candidates(X, Phi, M)


# ----------------------------------------------------------------------------- the three views
def _stats_noise(m: Any) -> float:
    """The DP noise std per entry of ``n * statistics`` a :class:`SurfaceStats` states (0: none)."""
    if m.dp_noise_multiplier is None or m.dp_sensitivity is None:
        return 0.0
    return float(m.count * m.dp_noise_multiplier * m.dp_sensitivity)


def _upload_weight(m: Any) -> float:
    """The weight a lab put on its statistics, read off the intercept's entry (1 under DP or when 0)."""
    w = float(m.gram.numpy()[0])
    return w if _stats_noise(m) == 0 and 0 < w < 1 else 1.0


def _moment(a: np.ndarray) -> np.ndarray:
    if a.ndim != 1:
        raise ConfigurationError("the surface attack reads one moment per message (one objective)")
    return a


def coordinator_view(sent: Sequence[Any]) -> list[Snapshot]:
    """What the coordinator holds of one lab: its :class:`SurfaceStats`, by round (from
    ``opt.sent_messages()`` or the coordinator's log). A lab that weighs its upload
    (``weigh_upload``) multiplies both averages by its weight; the intercept's entry
    :math:`\bar G_{11}` *is* that weight, so the attack divides it out (statistics without DP)."""
    out = [Snapshot(int(m.round), int(m.count), m.count * m.gram.numpy() / w, m.count * _moment(m.moment.numpy()) / w,
                    _stats_noise(m)) for m in sent if getattr(m, "kind", None) == "surface_stats"
           for w in [_upload_weight(m)]]
    if not out:
        raise ConfigurationError("no surface statistics to attack: the audit needs a lab of the `surface` protocol "
                                 "that has released its statistics")
    return out


def peer_view(received: Sequence[Any]) -> list[Snapshot]:
    """What a peer holds: the leave-one-out totals it received (every other lab summed), by round."""
    return [Snapshot(int(m.round), int(m.count), m.gram.numpy(), _moment(m.moment.numpy()),
                     float(m.noise_sd or 0.0), int(m.sites))
            for m in received if getattr(m, "kind", None) == "surface_totals" and m.sites > 0]


def sum_view(sent_by_lab: Sequence[Sequence[Any]]) -> list[Snapshot]:
    """The cohort's sum per round — what a coordinator learns under secure aggregation (the
    masks cancel in the sum of the uploads); rounds where a lab sent nothing are left out."""
    views = [{s.round: s for s in coordinator_view(sent)} for sent in sent_by_lab]
    rounds = sorted(set.intersection(*(set(v) for v in views)))
    out = []
    for r in rounds:
        snaps = [v[r] for v in views]
        out.append(Snapshot(r, sum(s.count for s in snaps), sum(s.gram for s in snaps),
                            sum(s.moment for s in snaps), float(np.sqrt(sum(s.noise_sd ** 2 for s in snaps))),
                            len(snaps)))
    return out


def secure_sum_view(sums: Sequence[tuple[int, np.ndarray]], p: int, noise_sd: float = 0.0) -> list[Snapshot]:
    r"""The coordinator's view under secure aggregation (:mod:`labfbo.protocols.surface.secure`): per
    round the unmasked sum :math:`V = \sum_i [w_i\,\mathrm{upper}(\bar G_i), w_i \bar h_i, n_i, 1]`,
    :math:`w_i = n_i` without DP, :math:`w_i = 1` under DP (``noise_sd`` :math:`= \sigma\Delta`: the
    one Gaussian mechanism the sum of the averages carries, distributed DP), whose averaged sums the
    attacker scales by the mean count :math:`\sum n_i/|S|` (exact when the counts are equal)."""
    K = p * (p + 1) // 2
    out = []
    for r, V in sums:
        V = np.asarray(V, dtype=np.float64)
        count, sites = int(round(V[-2])), int(round(V[-1]))
        scale = count / max(sites, 1) if noise_sd > 0 else 1.0
        out.append(Snapshot(int(r), count, scale * V[:K], scale * V[K:K + p], scale * noise_sd, sites))
    return out


def sealed_view(sent_by_lab: Sequence[Sequence[Any]], p: int, counts: dict[int, int]) -> list[Snapshot]:
    """What the coordinator holds under sealed sums: per round every lab uploaded in, the sum of the
    masked uploads (``masked_score``) in Z_{2^64}, decoded as if it were the sum; ``counts`` (round ->
    the cohort's observations) is given to the attacker, which cannot read it there."""
    from labfbo.privacy import secagg

    ups = [{int(m.round): m.masked.numpy() for m in sent if getattr(m, "kind", None) == "masked_score"}
           for sent in sent_by_lab]
    K = p * (p + 1) // 2
    out = []
    for r in sorted(set.intersection(*(set(u) for u in ups)) & set(counts)):
        V = secagg.decode(secagg.aggregate([u[r] for u in ups], []))
        out.append(Snapshot(r, int(counts[r]), V[:K], V[K:K + p], float(np.std(V)), len(ups)))
    return out


def _chain(snaps: Sequence[Snapshot]) -> list[Snapshot]:
    """The rounds in order, keeping only those whose count does not fall (a lab missing from a
    sum would break the 'rows are appended' model)."""
    out: list[Snapshot] = []
    for s in sorted(snaps, key=lambda s: s.round):
        if not out or s.count >= out[-1].count:
            out.append(s)
    return out


# ----------------------------------------------------------------------------- combinations
def _solve_block(D: np.ndarray, k: int, cand: Candidates, exact: bool) -> list[int]:
    """``k`` combinations whose outer products sum to ``D``: exactly (an integer program) or greedily."""
    if k <= 0:
        return []
    M = cand.M
    if k == 1 or not exact:
        rows: list[int] = []
        R = D.copy()
        for _ in range(k):
            c = int((((R[None] - M) ** 2).sum(1)).argmin())
            rows.append(c)
            R = R - M[c]
        return rows
    from scipy.optimize import Bounds, LinearConstraint, milp

    target = np.round(D)
    A = np.vstack([M.T, np.ones((1, len(M)))])
    b = np.concatenate([target, [k]])
    res = milp(np.zeros(len(M)), constraints=LinearConstraint(A, b, b), integrality=np.ones(len(M)),
               bounds=Bounds(0, k), options={"time_limit": 30.0})
    if res.x is None:  # nothing consistent (should not happen without noise): fall back to greedy
        return _solve_block(D, k, cand, exact=False)
    x = np.round(res.x).astype(int)
    return [c for c in range(len(M)) for _ in range(x[c])]


def reconstruct_rows(snaps: Sequence[Snapshot], cand: Candidates, sweeps: int = 20) -> list[int]:
    """The combinations of the view's rows, in order of appearance (see the module's math)."""
    chain = _chain(snaps)
    exact = all(s.noise_sd == 0 for s in chain)
    rows: list[int] = []
    prev = np.zeros(cand.M.shape[1])
    for s in chain:
        rows += _solve_block(s.gram - prev, s.count - len(rows), cand, exact)
        prev = s.gram if exact else cand.M[rows].sum(0)  # noisy: the next block against the fit so far
    if exact or not rows:
        return rows
    w = np.array([1.0 / max(s.noise_sd, 1e-12) ** 2 for s in chain])
    counts = np.array([s.count for s in chain])
    M = cand.M
    sqn = (M ** 2).sum(1)
    for _ in range(sweeps):  # coordinate descent on the weighted least squares over every round
        moved = False
        for k in range(len(rows)):
            fit = np.cumsum(M[rows], 0)  # fit[j] = sum of the first j+1 rows
            ts = np.nonzero(counts > k)[0]
            V = np.stack([chain[t].gram - fit[counts[t] - 1] + M[rows[k]] for t in ts])
            obj = -2.0 * M @ (w[ts] @ V) + w[ts].sum() * sqn
            best = int(obj.argmin())
            if obj[best] < obj[rows[k]] - 1e-9:
                rows[k], moved = best, True
        if not moved:
            break
    return rows


# ----------------------------------------------------------------------------- results
def reconstruct_values(snaps: Sequence[Snapshot], rows: Sequence[int], cand: Candidates,
                       single: bool = True) -> np.ndarray:
    """The standardized results of the rows at the last round (see the module's math): from
    every round for one lab (``single``), from the last round for a sum of labs."""
    chain = [s for s in _chain(snaps) if s.count <= len(rows)]
    if not chain:
        return np.zeros(len(rows))
    T, n = chain[-1], chain[-1].count
    Phi = cand.Phi[list(rows[:n])]
    if not single or len(chain) == 1:
        return np.linalg.lstsq(Phi.T, T.moment, rcond=None)[0]
    early = chain[:-1]
    p, e = Phi.shape[1], len(early)
    A = np.zeros(((e + 1) * p, n + 2 * e))
    b = np.zeros((e + 1) * p)
    for j, s in enumerate(early):
        Pt = Phi[: s.count]
        blk = slice(j * p, (j + 1) * p)
        A[blk, : s.count] = Pt.T / s.count
        A[blk, n + j] = -s.moment / s.count
        A[blk, n + e + j] = -Pt.sum(0) / s.count
    A[e * p:, :n] = Phi.T / n
    b[e * p:] = T.moment / n
    return np.linalg.lstsq(A, b, rcond=None)[0][:n]


def attack(snaps: Sequence[Snapshot], cand: Candidates, single: bool = True) -> tuple[list[int], np.ndarray]:
    """Rows (combination indices) and their standardized results at the view's last round."""
    rows = reconstruct_rows(snaps, cand)
    return rows, reconstruct_values(snaps, rows, cand, single)


# ----------------------------------------------------------------------------- scores
def _matched(guess: Sequence[int], values: np.ndarray, true: Sequence[int]) -> tuple[list[int], list[int]]:
    """Pairs (true row, guessed row) of the same combination, occurrences paired in order."""
    slots: dict[int, list[int]] = {}
    for j, c in enumerate(guess):
        slots.setdefault(c, []).append(j)
    ti, gi = [], []
    for i, c in enumerate(true):
        if slots.get(c):
            ti.append(i)
            gi.append(slots[c].pop(0))
    return ti, gi


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import rankdata

    return _corr(rankdata(a), rankdata(b))


def score(guess: Sequence[int], values: np.ndarray, true: Sequence[int], z_true: np.ndarray, n_combinations: int,
          seed: int = 0) -> dict[str, float]:
    """Recall and precision of the guessed combinations and the results' agreement, each beside chance."""
    gen = np.random.default_rng(seed)
    overlap = sum((Counter(guess) & Counter(true)).values())
    k = min(len(guess), n_combinations)
    draws = [sum((Counter(gen.choice(n_combinations, k, replace=False).tolist()) & Counter(true)).values())
             for _ in range(CHANCE_DRAWS)]
    ti, gi = _matched(guess, values, true)
    zt, zg = np.asarray(z_true, float)[ti], np.asarray(values, float)[gi]
    perms = [gen.permutation(zg) for _ in range(CHANCE_DRAWS)] if len(zg) >= 3 else []
    nan = float("nan")
    return {"n": float(len(true)), "guessed": float(len(guess)), "matched": float(len(ti)),
            "recall": overlap / max(len(true), 1), "recall_chance": float(np.mean(draws)) / max(len(true), 1),
            "precision": overlap / max(len(guess), 1), "precision_chance": float(np.mean(draws)) / max(k, 1),
            "pearson": _corr(zt, zg), "spearman": _spearman(zt, zg),
            "rmse": float(np.sqrt(np.mean((zt - zg) ** 2))) if len(zt) >= 3 else nan,
            "pearson_chance": float(np.nanmean([_corr(zt, q) for q in perms])) if perms else nan,
            "spearman_chance": float(np.nanmean([_spearman(zt, q) for q in perms])) if perms else nan,
            "rmse_chance": float(np.mean([np.sqrt(np.mean((zt - q) ** 2)) for q in perms])) if perms else nan}
