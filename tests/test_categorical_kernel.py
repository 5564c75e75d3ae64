"""The local GP's kernel on categorical columns (``HammingKernel``) and repeated proposals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from botorch.models.kernels.categorical import CategoricalKernel
from gpytorch.priors import LogNormalPrior

import labfbo
from labfbo.datasets import load_reactions
from labfbo.models.gp import DTYPE, MISMATCH, HammingKernel, SurrogateOptions, fit_local_gp

CATS = labfbo.SearchSpace([labfbo.Categorical("base", ["a", "b", "c"]), labfbo.Categorical("ligand", list("wxyz"))])


def _kernel(rbf: bool, ls: list[float]) -> HammingKernel:
    k = HammingKernel(3, [2], rbf=rbf).to(DTYPE)
    k.lengthscale = torch.tensor(ls, dtype=DTYPE)
    return k


@pytest.mark.parametrize("rbf", [True, False])
def test_two_different_choices_are_a_sixth_apart_squared_over_their_lengthscale(rbf: bool) -> None:
    k = _kernel(rbf, [0.5, 2.0, 0.8])
    x1 = torch.tensor([[0.1, 0.7, 0.0]], dtype=DTYPE)
    x2 = torch.tensor([[0.4, 0.2, 1.0], [0.4, 0.2, 0.0]], dtype=DTYPE)
    cont = (0.3 / 0.5) ** 2 + (0.5 / 2.0) ** 2
    assert MISMATCH == pytest.approx(1 / 6)
    r2 = torch.tensor([cont + (1 / 6) / 0.8 ** 2, cont], dtype=DTYPE)
    if rbf:
        want = torch.exp(-0.5 * r2)
    else:
        r = math.sqrt(5) * r2.sqrt()
        want = (1 + r + r ** 2 / 3) * torch.exp(-r)
    with torch.no_grad():
        got = k(x1, x2).to_dense()
        diag = k(x2, x2, diag=True)
    torch.testing.assert_close(got, want.reshape(1, 2))
    torch.testing.assert_close(diag, torch.ones(2, dtype=DTYPE))


def test_the_categorical_lengthscales_have_the_dimension_scaled_prior() -> None:
    k = HammingKernel(3, [0, 1, 2])
    prior = k.lengthscale_prior
    assert isinstance(prior, LogNormalPrior)
    assert float(prior.loc) == pytest.approx(math.sqrt(2) + 0.5 * math.log(3))
    assert float(prior.scale) == pytest.approx(math.sqrt(3))
    assert float(k.raw_lengthscale_constraint.lower_bound) == pytest.approx(2.5e-2)


def test_the_default_kernel_of_a_categorical_space_is_hamming_and_the_former_one_stays_reachable() -> None:
    X = CATS.encode([{"base": b, "ligand": lig} for b, lig in [("a", "w"), ("b", "x"), ("c", "y"), ("a", "z")]])
    y = np.array([1.0, 2.0, 0.5, 3.0])
    assert isinstance(fit_local_gp(X, y, space=CATS).covar_module, HammingKernel)
    old = fit_local_gp(X, y, space=CATS, options=SurrogateOptions(categorical_kernel="botorch"))
    assert isinstance(old.covar_module, CategoricalKernel)
    cont = labfbo.SearchSpace([labfbo.Real("t", 0.0, 1.0), labfbo.Real("u", 0.0, 1.0)])
    assert not isinstance(fit_local_gp(np.random.default_rng(0).random((4, 2)), y, space=cont).covar_module,
                          HammingKernel)


def test_the_fitted_lengthscales_stay_finite_on_few_reaction_yields() -> None:
    """Without a prior BoTorch's CategoricalKernel ran its lengthscales to ~0 or ~1e4 on this lab."""
    data = load_reactions()
    lab = data.labs.index("1-iodo-4-methoxybenzene")
    combos = data.combos()
    Y = data.yields(lab)
    pick = np.random.default_rng(0).choice(np.flatnonzero(~np.isnan(Y)), 8, replace=False)
    X = data.space.encode([dict(zip(data.space.names, combos[k])) for k in pick])
    ls = fit_local_gp(X, Y[pick], space=data.space).covar_module.lengthscale.detach().numpy()
    assert np.all(ls > 0.1) and np.all(ls < 20.0), ls


def test_a_categorical_space_is_never_proposed_a_combination_it_has_run_until_all_are_run(fast) -> None:
    opt = labfbo.Optimizer(CATS, n_init=3, seed=0, **fast)
    seen = []
    for t in range(12):
        trial = opt.ask()
        seen.append((trial.params["base"], trial.params["ligand"]))
        opt.tell(trial, float(t % 5))
    assert len(set(seen)) == 12
    trial = opt.ask()  # every combination has run: the whole grid is scored again
    assert (trial.params["base"], trial.params["ligand"]) in seen


def _flat_fit(prior: str) -> np.ndarray:
    """Lengthscales fitted on 12 points of a 3-D continuous space where the response is a plane in x1
    (flat along x2 and x3)."""
    X = np.random.default_rng(0).random((12, 3))
    y = X[:, 0].copy()
    opts = SurrogateOptions(lengthscale_prior=prior)
    return fit_local_gp(X, y, options=opts).covar_module.lengthscale.detach().numpy().ravel()


def test_on_flat_data_the_default_prior_keeps_the_continuous_lengthscales_bounded() -> None:
    """A log-normal lets them run to hundreds (the model then believes it knows the response everywhere
    and the search stalls); the default (Optuna's two-sided prior) and the capped log-normal keep them
    near the cube's width."""
    assert SurrogateOptions().lengthscale_prior == "optuna"
    default, capped, former = _flat_fit("optuna"), _flat_fit("capped"), _flat_fit("dim_scaled")
    assert default.max() < 10.0 and capped.max() < 10.0, (default, capped)
    assert former.max() > 3 * max(capped.max(), default.max()), (former, capped, default)


def test_on_flat_yields_the_default_keeps_the_categorical_lengthscales_bounded() -> None:
    data = load_reactions()
    combos = data.combos()
    pick = np.random.default_rng(0).choice(len(combos), 10, replace=False)
    X = data.space.encode([dict(zip(data.space.names, combos[k])) for k in pick])
    y = np.zeros(10)
    y[3] = 0.5  # one trace among zeros: nothing to learn yet
    ls = {p: fit_local_gp(X, y, space=data.space, options=SurrogateOptions(lengthscale_prior=p))
          .covar_module.lengthscale.detach().numpy().ravel() for p in ("optuna", "dim_scaled")}
    assert ls["optuna"].max() < 10.0 and ls["dim_scaled"].max() > 3 * ls["optuna"].max(), ls


def test_the_cap_leaves_a_categorical_column_as_it_was() -> None:
    from labfbo.models.kernels import lengthscale_prior

    capped, plain = lengthscale_prior(3, [1, 2], "capped"), lengthscale_prior(3, [1, 2], "dim_scaled")
    ls = torch.tensor([[0.05, 0.5, 50.0]], dtype=DTYPE)
    diff = capped.log_prob(ls) - plain.log_prob(ls)
    torch.testing.assert_close(diff, torch.tensor([[-0.1 * 0.05 ** 2, 0.0, 0.0]], dtype=DTYPE))
    assert isinstance(fit_local_gp(*_cats_xy(), space=CATS).covar_module, HammingKernel)


def _cats_xy() -> tuple[np.ndarray, np.ndarray]:
    X = CATS.encode([{"base": b, "ligand": lig} for b, lig in [("a", "w"), ("b", "x"), ("c", "y"), ("a", "z")]])
    return X, np.array([1.0, 2.0, 0.5, 3.0])


def test_optunas_prior_has_its_mode_at_the_unit() -> None:
    from labfbo.models.kernels import MISMATCH, lengthscale_prior

    prior = lengthscale_prior(2, [1], "optuna")
    torch.testing.assert_close(prior.mode, torch.tensor([1.0, math.sqrt(MISMATCH)], dtype=DTYPE))
    near = prior.log_prob(torch.tensor([[1.0, math.sqrt(MISMATCH)]], dtype=DTYPE))
    far = prior.log_prob(torch.tensor([[10.0, 10.0]], dtype=DTYPE))
    assert torch.all(near > far)


def test_descriptors_auto_keeps_the_fit_with_the_higher_leave_one_out_density() -> None:
    pytest.importorskip("rdkit")
    from labfbo.datasets import load_family
    from labfbo.models.gp import DESCRIPTOR_MIN_POINTS, loo_log_density

    data = load_family("deoxyfluorination", encoding="rdkit")
    combos = data.combos()
    Y = data.yields(3)
    pick = np.random.default_rng(1).choice(len(combos), 9, replace=False)
    X = data.space.encode([dict(zip(data.space.names, combos[k])) for k in pick])
    fits = {d: fit_local_gp(X, Y[pick], space=data.space, options=SurrogateOptions(descriptors=d))
            for d in ("use", "ignore", "auto")}
    lpd = {d: loo_log_density(m) for d, m in fits.items()}
    assert lpd["use"] != lpd["ignore"]
    assert lpd["auto"] == pytest.approx(max(lpd["use"], lpd["ignore"]))
    few = fit_local_gp(X[: DESCRIPTOR_MIN_POINTS - 1], Y[pick][: DESCRIPTOR_MIN_POINTS - 1], space=data.space,
                       options=SurrogateOptions(descriptors="auto"))
    assert not hasattr(few.input_transform, "features")  # labels until there are enough points to compare
    assert hasattr(fits["use"].input_transform, "features")
