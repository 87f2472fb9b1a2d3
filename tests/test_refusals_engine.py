"""Inputs the engine cannot honour are refused by name (the fourth pass's leftovers):
each a sibling of its reproducer."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af

M = af.Attention(np.eye(2), np.eye(2), np.eye(2))
X0 = np.random.default_rng(0).normal(size=(4, 2))


@pytest.mark.parametrize("t1", [10**400, -(10**400), 10**309])
def test_times_beyond_the_float_range_are_named(t1):
    with pytest.raises(ValueError, match=r"t1 must be a finite number .* beyond the float"):
        af.simulate(M, X0, t1)


@pytest.mark.parametrize("dt", [1e-300, 1e-12])
def test_more_layers_than_the_loop_counts_is_named(dt):
    with pytest.raises(ValueError, match="more than the loop can count"):
        af.simulate(M, X0, 1.0, method="euler", dt=dt)
    with pytest.raises(ValueError, match="more than the loop can count"):
        af.solve(M, X0, 1.0, solver=af.LayerSolver(dt))


@pytest.mark.parametrize("dtype", ["banana", np.int32, complex, "U3"])
def test_isotropic_dtype_is_named(dtype):
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
        af.IsotropicAttention(2, dtype=dtype)


def test_stacking_names_what_differs_and_blocks_refuse_stacks():
    usa = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="usa")
    with pytest.raises(ValueError, match="kernel \\('softmax' against 'usa'\\)"):
        af.stack([M, usa])
    stacked = af.stack([M, M])
    with pytest.raises(ValueError, match="attention is stacked"):
        af.Block(stacked)


@pytest.mark.parametrize("alpha", ["2", b"2", True])
def test_entmax_takes_numbers_only(alpha):
    with pytest.raises(ValueError, match="alpha"):
        af.kernels.get("entmax", alpha=alpha)


def test_solve_density_refuses_non_finite_save_times():
    field = af.CircleMeanField(beta=2.0)
    with pytest.raises(ValueError, match="finite times"):
        af.solve_density(field, lambda th: 1 + 0.1 * np.cos(th), 1.0, ts=[0.0, np.nan, 1.0])
