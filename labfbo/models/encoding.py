r"""From the unit cube (one column per parameter) to what a model's kernel sees.

:class:`FeatureMap` replaces each categorical column by

* its choice's **descriptors**, min-max scaled to [0, 1] over the choices, when the
  parameter has them (a solvent by its polarity and boiling point): similar choices
  are then close, and the model can transfer what it learned about one to another;
* a **one-hot** vector of length :math:`k` (``one_hot=True``, for models whose kernel
  is a plain stationary kernel on features, e.g. PACOH's meta-learned feature map), or
* the choice's code unchanged, for a kernel that treats the column as categorical
  (the local GP's ``HammingKernel``: equal or not, never "how far");

every other column is copied. The code of choice :math:`j` of :math:`k` is
:math:`j/(k-1)`; the map is piecewise constant in a categorical column
(the optimizers treat those columns as discrete anyway), with the same shares of [0, 1]
per choice as :func:`~labfbo.space.params.choice_index`.
"""

from __future__ import annotations

import numpy as np
import torch
from botorch.models.transforms.input import InputTransform
from torch import Tensor

from labfbo.space.params import choice_index
from labfbo.space.search import Categorical, SearchSpace

DTYPE = torch.float64


class FeatureMap:
    """Unit-cube points ``(..., d)`` -> model features ``(..., n_out)`` (torch, float64)."""

    def __init__(self, space: SearchSpace, one_hot: bool = False) -> None:
        self.d = space.dim
        self.tables: dict[int, Tensor] = {}
        self.cat_out: list[int] = []     # output columns a categorical kernel must treat as labels
        self.slices: list[tuple[int, int]] = []
        width = 0
        for j, p in enumerate(space.params):
            if isinstance(p, Categorical) and p.descriptors is not None:
                self.tables[j] = torch.as_tensor(p.scaled_descriptors(), dtype=DTYPE)
            elif isinstance(p, Categorical) and one_hot:
                self.tables[j] = torch.eye(len(p.choices), dtype=DTYPE)
            elif isinstance(p, Categorical):
                self.cat_out.append(width)
            w = self.tables[j].shape[1] if j in self.tables else 1
            self.slices.append((width, width + w))
            width += w
        self.n_out = width

    @property
    def identity(self) -> bool:
        return not self.tables

    def __call__(self, X: Tensor) -> Tensor:
        if self.identity:
            return X
        parts = []
        for j in range(self.d):
            table = self.tables.get(j)
            if table is None:
                parts.append(X[..., j:j + 1])
            else:
                k = table.shape[0]
                idx = choice_index(X[..., j].detach(), k)
                parts.append(table.to(X)[idx])
        return torch.cat(parts, dim=-1)

    def numpy(self, X: np.ndarray) -> np.ndarray:
        return self(torch.as_tensor(np.asarray(X, dtype=np.float64), dtype=DTYPE)).numpy()


class FeatureTransform(InputTransform):
    """A :class:`FeatureMap` as a BoTorch input transform (applied in training and prediction)."""

    def __init__(self, fmap: FeatureMap) -> None:
        super().__init__()
        self.fmap = fmap
        self.transform_on_train = True
        self.transform_on_eval = True
        self.transform_on_fantasize = True

    def transform(self, X: Tensor) -> Tensor:
        return self.fmap(X)

    def equals(self, other: InputTransform) -> bool:
        return isinstance(other, FeatureTransform) and other.fmap is self.fmap
