r"""Reagents described by their structure: SMILES -> a few numeric descriptors per choice.

:meth:`labfbo.Categorical.from_smiles` (or ``Categorical(name, {choice: smiles})``) calls
:func:`smiles_descriptors`, which

1. computes a standard descriptor set with RDKit (the optional extra ``labfbo[chem]``) for
   every choice that has a structure (:data:`ENCODINGS`):

   * ``"rdkit"`` — a fixed list of RDKit 2D descriptors (:data:`RDKIT_DESCRIPTORS`: molecular
     weight, logP, TPSA, H-bond donors/acceptors, rotatable bonds, sp3 fraction, rings,
     connectivity and shape indices, Gasteiger partial charges, E-state indices);
   * ``"morgan"`` — the bits of a Morgan fingerprint (radius 2, 2048 bits);

2. reduces them to at most ``n_components`` columns: drops non-finite and constant columns,
   z-scores the rest, drops a column whose :math:`|\mathrm{corr}|` with an earlier kept column
   exceeds 0.95, then projects on the first principal components (scikit-learn ``PCA`` with
   ``svd_solver="full"``; each component's sign fixed so that its largest-magnitude score is
   positive; components with no variance dropped); values rounded to 6 decimals;

3. a choice **without structure** (SMILES ``None`` or ``""``: "no additive") gets the column
   means — 0 on every component, the centre of the reagents — plus an indicator column (1 for
   it, 0 for the others) that only exists when some choice lacks a structure: models treat it as
   an average reagent that may still behave differently.

The result is plain numbers: they are stored on the parameter (``descriptors``) and so in the
space's JSON, its fingerprint and every journal, which replays without RDKit and gives the same
proposals whatever RDKit version computed them. Results are cached in-process per
(SMILES, encoding, ``n_components``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from labfbo.core.exceptions import ConfigurationError, SearchSpaceError

#: the RDKit 2D descriptors of the ``"rdkit"`` encoding (names in ``rdkit.Chem.Descriptors``), in order
RDKIT_DESCRIPTORS = (
    "MolWt", "MolLogP", "MolMR", "TPSA", "LabuteASA",                                 # size, polarity
    "NumHDonors", "NumHAcceptors", "NumRotatableBonds", "NumHeteroatoms", "HeavyAtomCount",
    "NumValenceElectrons", "FractionCSP3", "RingCount", "NumAromaticRings", "NumAliphaticRings",
    "BertzCT", "BalabanJ", "Chi1v", "Chi2v", "Chi3v", "Kappa2", "Kappa3",               # topology, shape
    "MaxPartialCharge", "MinPartialCharge", "MaxEStateIndex", "MinEStateIndex",        # electronics
)
MORGAN_RADIUS, MORGAN_BITS = 2, 2048
#: the encodings :func:`smiles_descriptors` knows, with a short description each
ENCODINGS = {"rdkit": f"{len(RDKIT_DESCRIPTORS)} RDKit 2D descriptors (MolWt, MolLogP, TPSA, ...)",
             "morgan": f"Morgan fingerprint bits (radius {MORGAN_RADIUS}, {MORGAN_BITS} bits)"}
DEFAULT_COMPONENTS = 5
#: two descriptor columns correlated beyond this (in absolute value) count as one
MAX_CORRELATION = 0.95
DECIMALS = 6
INSTALL_HINT = "pip install 'labfbo[chem]'"


def has_structure(smiles: str | None) -> bool:
    """True unless ``smiles`` is ``None`` or blank (a choice such as "no additive")."""
    return smiles is not None and str(smiles).strip() != ""


def _rdkit(name: str) -> Any:
    """``rdkit.Chem``, or a :class:`ConfigurationError` saying how to install it."""
    try:
        from rdkit import Chem
    except ImportError:
        raise ConfigurationError(f"Categorical {name!r}: descriptors from SMILES need RDKit, which is not "
                                 f"installed: {INSTALL_HINT}") from None
    return Chem


def check_encoding(encoding: str, name: str | None = None) -> str:
    if encoding not in ENCODINGS:
        raise SearchSpaceError(
            ("" if name is None else f"Categorical {name!r}: ")
            + f"unknown SMILES encoding {encoding!r}; valid encodings: "
            + "; ".join(f"{k!r} ({v})" for k, v in ENCODINGS.items())
        )
    return encoding


def _featurizer(encoding: str) -> Callable[[Any], np.ndarray]:
    if encoding == "rdkit":
        from rdkit.Chem import Descriptors

        fns = [getattr(Descriptors, n) for n in RDKIT_DESCRIPTORS]
        return lambda mol: np.array([float(f(mol)) for f in fns], dtype=np.float64)
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=MORGAN_RADIUS, fpSize=MORGAN_BITS)
    return lambda mol: np.asarray(gen.GetFingerprintAsNumPy(mol), dtype=np.float64)


def raw_descriptors(name: str, choices: Sequence[Any], smiles: Sequence[str], encoding: str) -> np.ndarray:
    """``(n, m)`` unreduced descriptors of molecules ``smiles`` (one per choice in ``choices``)."""
    Chem = _rdkit(name)
    from rdkit import RDLogger

    featurize = _featurizer(check_encoding(encoding, name))
    rows = []
    RDLogger.DisableLog("rdApp.*")  # a bad SMILES is reported below, not on stderr
    try:
        for c, s in zip(choices, smiles):
            mol = Chem.MolFromSmiles(str(s))
            if mol is None:
                raise SearchSpaceError(f"Categorical {name!r}: choice {c!r} has a SMILES RDKit cannot parse: {s!r}")
            # in canonical atom order: "CCO" and "OCC" give the same numbers, to the last bit
            rows.append(featurize(Chem.MolFromSmiles(Chem.MolToSmiles(mol))))
    finally:
        RDLogger.EnableLog("rdApp.*")
    return np.stack(rows)


def reduce(X: np.ndarray, n_components: int) -> np.ndarray:
    """Constant and near-duplicate columns dropped, z-scored, projected on at most
    ``n_components`` principal components (deterministic signs); ``(n, <= n_components)``."""
    from sklearn.decomposition import PCA

    X = X[:, np.isfinite(X).all(0)]
    sd = X.std(0)
    keep = sd > 1e-12 * np.maximum(1.0, np.abs(X).max(0, initial=0.0))
    Z = (X[:, keep] - X[:, keep].mean(0)) / sd[keep]
    if Z.shape[1] == 0:
        return np.zeros((len(X), 0))
    C = np.corrcoef(Z, rowvar=False).reshape(Z.shape[1], Z.shape[1])
    kept: list[int] = []
    for j in range(Z.shape[1]):
        if all(abs(C[j, i]) <= MAX_CORRELATION for i in kept):
            kept.append(j)
    Z = Z[:, kept]
    k = min(n_components, Z.shape[1], len(Z))
    pca = PCA(n_components=k, svd_solver="full")
    S = pca.fit_transform(Z)
    var = S.var(0)
    S = S[:, var > 1e-10 * max(float(var.sum()), 1e-300)]
    flip = np.sign(S[np.argmax(np.abs(S), axis=0), np.arange(S.shape[1])])
    return S * np.where(flip == 0, 1.0, flip)


@lru_cache(maxsize=256)
def _cached(name: str, choices: tuple, smiles: tuple, encoding: str, n_components: int) -> tuple:
    present = [i for i, s in enumerate(smiles) if has_structure(s)]
    if not present:
        raise SearchSpaceError(f"Categorical {name!r}: no choice has a SMILES, so there is nothing to describe; "
                               "drop encoding= (or give the choices descriptors=)")
    none = [choices[i] for i in range(len(choices)) if i not in present]
    if len(none) > 1:
        raise SearchSpaceError(f"Categorical {name!r}: choices {none} all lack a structure, so no model could tell "
                               "them apart; keep one of them (or give descriptors= by hand)")
    X = raw_descriptors(name, [choices[i] for i in present], [str(smiles[i]).strip() for i in present], encoding)
    seen: dict[bytes, Any] = {}
    for i, row in zip(present, X):
        other = seen.setdefault(np.round(row, 9).tobytes(), choices[i])
        if other != choices[i]:
            raise SearchSpaceError(f"Categorical {name!r}: choices {other!r} and {choices[i]!r} have the same "
                                   f"{encoding!r} descriptors (the same molecule, or stereoisomers?), so no model "
                                   "could tell them apart; try another encoding or give descriptors= by hand")
    S = reduce(X, n_components)
    out = np.zeros((len(choices), S.shape[1] + (1 if none else 0)))
    out[present, :S.shape[1]] = S                   # the choice without structure: 0 = the column means
    if none:
        out[[i for i in range(len(choices)) if i not in present], -1] = 1.0
    if out.shape[1] == 0 or len({r.tobytes() for r in np.round(out, DECIMALS)}) < len(out):
        raise SearchSpaceError(f"Categorical {name!r}: the {encoding!r} descriptors of the choices do not tell them "
                               "all apart; try another encoding or more components")
    return tuple(tuple(float(v) + 0.0 for v in r) for r in np.round(out, DECIMALS))


def smiles_descriptors(name: str, choices: Sequence[Any], smiles: Sequence[str | None], encoding: str = "rdkit",
                       n_components: int = DEFAULT_COMPONENTS) -> tuple[tuple[float, ...], ...]:
    """One row of at most ``n_components`` (+1, see the module docstring) descriptors per choice."""
    check_encoding(encoding, name)
    if isinstance(n_components, bool) or not isinstance(n_components, int) or n_components < 1:
        raise SearchSpaceError(f"Categorical {name!r}: n_components must be an integer >= 1, got {n_components!r}")
    if len(smiles) != len(choices):
        raise SearchSpaceError(f"Categorical {name!r}: {len(smiles)} SMILES for {len(choices)} choices")
    bad = [(c, s) for c, s in zip(choices, smiles) if s is not None and not isinstance(s, str)]
    if bad:
        raise SearchSpaceError(f"Categorical {name!r}: a SMILES must be a string or None; got {bad[0][1]!r} "
                               f"for {bad[0][0]!r}")
    return _cached(name, tuple(choices), tuple(smiles), encoding, n_components)
