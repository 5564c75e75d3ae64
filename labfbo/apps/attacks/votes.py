"""What the coordinator — and a peer — learn of a site's optimum from its votes (``labfbo privacy audit --protocol
vote``).

A ``vote`` site sends one codebook index per release (:mod:`labfbo.protocols.vote.protocol`) and
nothing about its queries, so there is nothing to reconstruct but the optimum. Two attackers
read the votes of site ``i``, each from what it holds:

* ``coordinator``: the messages site ``i`` sent it. An unsealed vote is an index it reads;
  a sealed one (``sealed=True``, the default, :mod:`labfbo.protocols.vote.sealed`) is a
  token it has no key for, so it holds no vote, and its best guess is any point it
  considers as likely as the others — with the design codebook, the rows dealt to site ``i``.
* ``peer``: another site, which opens the token sealed for it (or reads the plain vote).

An attacker holding a vote guesses the voted codebook point; one holding none, a uniformly
drawn point of the site's choices (scored by its expected distance). Against the site's
final best query (the setting the campaign optimized), per site and view:

* ``guess``: the distance from that guess to it;
* ``chance``: a random guess's — the mean distance of a uniform point of the cube
  (``chance_uniform``) and of a uniformly drawn codebook point (``chance_codebook``);
* ``others``: the guess the attacker makes *without* this site's votes — the codebook
  point most of the other sites voted for, in the votes it can read (ties: the first) — the
  floor that related sites give any attacker, whatever this site does;
* ``hit``: whether the guess is the codebook point nearest the final best (chance ``1/B``).

With ``codebook="design"`` the codebook is the study's collaborative design and site ``i``
names one of the ``n_init`` rows dealt to it, which the coordinator knows: ``chance_codebook``
and ``hit`` are then over those rows (chance ``1/n_init``).

Under ``DP(epsilon=e)`` one vote reports the true index with probability
:math:`e^{e}/(e^{e} + k - 1)` (65 % at :math:`e = 2`, :math:`k = 5`), which bounds a
reader's ``hit`` (:mod:`labfbo.privacy.randomized_response`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from labfbo.apps.attacks.gradient import campaign

COLUMNS = ("guess", "chance_uniform", "chance_codebook", "others", "hit", "hit_chance")
VIEWS = ("coordinator", "peer")


def _peer_reads(sites: Sequence[Any], i: int, message: Any) -> int | None:
    """The index a peer of site ``i`` reads in ``message``: the next site's, opening its token if sealed."""
    from labfbo.protocols.vote.sealed import open_votes, relay

    if message.kind == "optimum_vote":
        return int(message.index)
    sender = sites[i].context.site
    for j in [*range(i + 1, len(sites)), *range(i)]:
        peer = sites[j].context.site
        tally = relay({sender: message}, [sender, peer]).get(peer)  # what the coordinator hands that peer
        opened = open_votes(tally.model_copy(update={"study": message.study}), peer,
                            sites[j].context.key_seed) if tally is not None else {}
        if sender in opened:
            return int(opened[sender][0]["index"])
    return None


def last_votes(sites: Sequence[Any], view: str) -> dict[int, int | None]:
    """Each voting site's last vote as ``view`` (``"coordinator"`` or ``"peer"``) reads it (None: it cannot)."""
    out: dict[int, int | None] = {}
    for i, o in enumerate(sites):
        sent = [m for m in o.sent_messages() if m.kind in ("optimum_vote", "sealed_vote")]
        if sent:
            m = sent[-1]
            out[i] = _peer_reads(sites, i, m) if view == "peer" else int(m.index) if m.kind == "optimum_vote" else None
    return out


def site_rows(sites: Sequence[Any], view: str = "coordinator") -> list[dict[str, float]]:
    """One row of metrics per voting site of a finished ``vote`` campaign, as ``view`` sees it."""
    from labfbo.protocols.vote.protocol import choice_set

    rows = []
    last = last_votes(sites, view)
    read = {i: v for i, v in last.items() if v is not None}
    for i, o in enumerate(sites):
        if i not in last:
            continue
        points, mine = choice_set(o.space, o.options.codebook, o.context)  # what site i could name
        if points is None:
            continue
        best = o.space.encode([o.best.params])[0]
        dist = np.linalg.norm(points - best, axis=1)
        nearest = int(mine[np.argmin(dist[mine])])
        candidates = [read[i]] if i in read else list(mine)  # no vote read: a uniform guess among the choices
        others = Counter(v for j, v in read.items() if j != i)
        other_guess = max(others, key=lambda v: (others[v], -v)) if others else None
        uniform = np.random.default_rng(0).random((4096, best.shape[0]))
        rows.append({"guess": float(dist[candidates].mean()),
                     "chance_uniform": float(np.linalg.norm(uniform - best, axis=1).mean()),
                     "chance_codebook": float(dist[mine].mean()),
                     "others": float(dist[other_guess]) if other_guess is not None else float("nan"),
                     "hit": float(np.mean([c == nearest for c in candidates])), "hit_chance": 1.0 / len(mine)})
    return rows


def audit_votes(problem: str, epsilons: Sequence[float | None], seeds: Sequence[int], n_sites: int = 5,
                n_init: int = 5, budget: int = 10, **vote_options: Any
                ) -> dict[tuple[float | None, str], list[dict[str, float]]]:
    """Per budget (None: no DP) and view (:data:`VIEWS`), the rows of every site of every seed's campaign."""
    import warnings

    from labfbo.core.dp import DP

    out: dict[float | None, list[dict[str, float]]] = {}
    for eps in epsilons:
        options: dict[str, Any] = dict(vote_options) if eps is None else {**vote_options,
                                                                          "privacy": DP(epsilon=eps)}
        for seed in seeds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sites = campaign(problem, n_sites, seed, budget, n_init, protocol="vote", **options)
            for view in VIEWS:
                out.setdefault((eps, view), []).extend(site_rows(sites, view))
    return out


def table(results: dict[tuple[float | None, str], list[dict[str, float]]]) -> str:
    lines = [
        "| ε | attacker | site-runs | guess to the site's final best | chance (uniform point) "
        "| chance (codebook point) | others' votes only | guess is the final best's cell | chance |",
        "|---|---|---:|" + "---:|" * 6,
    ]
    for (eps, view), rows in results.items():
        if not rows:
            continue
        a = {c: np.array([r[c] for r in rows]) for c in COLUMNS}
        others = f"{np.nanmean(a['others']):.3f}" if np.isfinite(a["others"]).any() else "— (reads no vote)"
        lines.append(f"| {'no DP' if eps is None else f'{eps:g}'} | {view} | {len(rows)} | "
                     f"{a['guess'].mean():.3f} ± {a['guess'].std():.3f} | {a['chance_uniform'].mean():.3f} | "
                     f"{a['chance_codebook'].mean():.3f} | {others} | {a['hit'].mean():.2f} | "
                     f"{a['hit_chance'].mean():.3f} |")
    return "\n".join(lines)
