"""Causal attention on the sphere (Karagodin, Polyanskiy and Rigollet 2024): with a
causal mask the first token attends only to itself and, with V = I, never moves, for
every kernel that takes a mask; and V = I gives one cluster, the first token, for any
Q^T K."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow import kernels

MASKABLE = [name for name, cls in kernels.KERNEL_CLASSES.items() if cls.takes_mask]


def test_every_kernel_but_the_maskless_ones_takes_a_causal_mask():
    refused = sorted(set(kernels.KERNEL_CLASSES) - set(MASKABLE))
    assert refused == ["differential"]
    with pytest.raises(ValueError, match="differential"):
        af.IsotropicAttention(3, kernel="differential", mask="causal")


@pytest.mark.parametrize("kernel", MASKABLE)
def test_the_first_token_never_moves(kernel):
    x0 = np.random.default_rng(0).normal(size=(6, 3))
    model = af.IsotropicAttention(3, beta=2.0, kernel=kernel, mask="causal")
    # layer-norm layers x <- N(x + dt F(x)): the first token's update is along itself
    traj = af.simulate(model, x0, 3.0, ts=[0.0, 1.0, 3.0], frame="sphere", method="euler", dt=0.1)
    traj.raise_for_status()
    first = x0[0] / np.linalg.norm(x0[0])
    np.testing.assert_allclose(traj.x[:, 0], np.broadcast_to(first, (3, 3)), atol=4e-16)
    assert np.abs(traj.x[-1, 1:] - traj.x[0, 1:]).max() > 0.1  # the others do move


def test_value_identity_gives_one_cluster_at_the_first_token_for_any_qk():
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(8, 3))
    Q, K = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    model = af.Attention(Q, K, np.eye(3), mask="causal")
    traj = af.simulate(model, x0, 100.0, ts=[0.0, 100.0], frame="sphere", rtol=1e-10, atol=1e-12)
    traj.raise_for_status()
    gap = 1.0 - traj.x[-1] @ traj.x[-1, 0]
    assert gap.max() < 1e-12 and (1.0 - traj.x[0] @ traj.x[0, 0]).max() > 1.0
