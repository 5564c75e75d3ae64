r"""The local GP surrogate of one site (BoTorch, float64).

Continuous spaces: ``SingleTaskGP`` with ``Normalize`` (unit-cube bounds) and
``Standardize``; spaces with categoricals: ``MixedSingleTaskGP`` (BoTorch's categorical
kernel on those columns). Hyper-parameters are MAP estimates from ``fit_gpytorch_mll``
under BoTorch's default priors. When per-observation standard errors are known for every
observation they enter as fixed noise :math:`\sigma_j^2 = \mathrm{sem}_j^2`; otherwise the
noise level is learned.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import MixedSingleTaskGP, SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from gpytorch.mlls import ExactMarginalLogLikelihood

DTYPE = torch.float64


_TORCH_RNG = threading.RLock()


@contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """Run a block with torch's global RNG seeded, restoring the caller's state after.

    torch's generator is process-global: the block holds a process-wide lock, so a site's
    transport thread (answering the coordinator) and its lab-script thread never
    interleave their draws — the same seed gives the same numbers on every transport.
    """
    with _TORCH_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed) % (2**63 - 1))
        yield


def as_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=DTYPE)


def fit_local_gp(X: np.ndarray, y: np.ndarray, yvar: np.ndarray | None = None,
                 cat_dims: list[int] | None = None, seed: int = 0) -> Model:
    """Fit the site's GP on unit-cube inputs ``X (n, d)`` and targets ``y (n,)``.

    ``y`` is in the maximization orientation (labfbo flips minimization objectives).
    """
    train_X = as_tensor(X)
    train_Y = as_tensor(y).reshape(-1, 1)
    train_Yvar = None if yvar is None else as_tensor(yvar).reshape(-1, 1).clamp_min(1e-10)
    d = train_X.shape[-1]
    cat_dims = list(cat_dims or [])
    if cat_dims:
        model: Model = MixedSingleTaskGP(train_X, train_Y, cat_dims=cat_dims, train_Yvar=train_Yvar,
                                         outcome_transform=Standardize(m=1))
    else:
        bounds = torch.stack([torch.zeros(d, dtype=DTYPE), torch.ones(d, dtype=DTYPE)])
        model = SingleTaskGP(train_X, train_Y, train_Yvar,
                             input_transform=Normalize(d=d, bounds=bounds),
                             outcome_transform=Standardize(m=1))
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with seeded_torch(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optimizer chatter; failures raise below
        fit_gpytorch_mll(mll)
    model.eval()
    return model


def predict(model: Model, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation of the latent function at ``X (m, d)``."""
    with torch.no_grad():
        post = model.posterior(as_tensor(X))
        mean = post.mean.reshape(-1).numpy().copy()
        std = post.variance.clamp_min(0.0).sqrt().reshape(-1).numpy().copy()
    return mean, std
