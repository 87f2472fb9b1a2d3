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
    moved = np.abs(traj.x[-1, 1:] - traj.x[0, 1:]).max()
    if kernel == "hardmax":  # on the sphere every token's own logit is its largest
        assert moved < 1e-15
    elif kernel == "sinkhorn":
        # a lower-triangular doubly stochastic matrix is the identity: Sinkhorn iterated
        # towards its tolerance under the causal mask leaves every token nearly in place
        assert moved < 0.01
    else:
        assert moved > 0.1  # the others do move


def test_value_identity_gives_one_cluster_at_the_first_token_for_any_qk():
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(8, 3))
    Q, K = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    model = af.Attention(Q, K, np.eye(3), mask="causal")
    traj = af.simulate(model, x0, 100.0, ts=[0.0, 100.0], frame="sphere", rtol=1e-10, atol=1e-12)
    traj.raise_for_status()
    gap = 1.0 - traj.x[-1] @ traj.x[-1, 0]
    assert gap.max() < 1e-12 and (1.0 - traj.x[0] @ traj.x[0, 0]).max() > 1.0


def test_renyi_centres_are_separated_maximal_and_pack_at_renyis_constant():
    from attnflow.analysis import renyi_centres

    rng = np.random.default_rng(3)
    x = rng.normal(size=(3000, 3))
    c = renyi_centres(x, beta=64.0)  # delta = 0.5
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    D = np.linalg.norm(u[c][:, None] - u[c][None], axis=-1)
    assert c[0] == 0 and np.all(np.diff(c) > 0)
    assert D[~np.eye(len(c), dtype=bool)].min() > 0.5  # separated
    for i in range(len(u)):  # maximal: every token is within delta of a centre up to it
        earlier = c[c <= i]
        assert np.linalg.norm(u[earlier] - u[i], axis=1).min() <= 0.5 or i in c
    # on the circle the centres are random sequential adsorption of arcs of angle theta:
    # their number tends to Renyi's parking constant 0.7476 times 2 pi / theta
    delta = 0.05
    theta = 2 * np.arcsin(delta / 2)
    counts = []
    for seed in range(4):
        a = np.random.default_rng(seed).uniform(0, 2 * np.pi, 40_000)
        counts.append(len(renyi_centres(np.stack([np.cos(a), np.sin(a)], 1), delta=delta)))
    assert np.mean(counts) == pytest.approx(0.7476 * 2 * np.pi / theta, rel=0.03)
    with pytest.raises(ValueError, match="exactly one of beta"):
        renyi_centres(x, beta=1.0, delta=0.1)


def test_the_plateau_count_of_a_causal_run_is_the_number_of_renyi_centres():
    """The set-up of Karagodin, Polyanskiy and Rigollet's Figure 2 (n = 200 uniform tokens
    on the circle, beta = 64, Q = K = V = I, causal SA): the count of clusters most
    frequent over t in [10, 100] (``fig_renyi.plateau_count``, threshold 0.999) is the
    number of Renyi centres of the start (delta = 4 beta^{-1/2} = 0.5) within one, for
    each of four seeds, and not the Renyi count at half or twice that delta."""
    from attnflow.analysis import renyi_centres
    from attnflow.experiments import fig_renyi as R

    beta, n, seeds = 64.0, 200, 4
    x0 = np.random.default_rng(7).normal(size=(seeds, n, 2))
    x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
    ts = np.concatenate([[0.0], np.geomspace(1.0, R.T1, R.SAVES - 1)])
    renyi = np.array([len(renyi_centres(x, beta=beta)) for x in x0])
    assert np.all((renyi >= 7) & (renyi <= 12)), renyi  # ~ 0.75 * 2 pi / 0.5
    model = af.IsotropicAttention(2, beta=beta, mask="causal")
    traj = af.simulate(model, x0, R.T1, ts=ts, frame="sphere", rtol=R.RTOL, atol=R.ATOL)
    traj.raise_for_status()
    counts = np.asarray(af.count_clusters(traj, threshold=R.THRESHOLD))
    plateau = np.array([R.plateau_count(ts, c) for c in counts])
    assert np.all(np.abs(plateau - renyi) <= 1), (plateau, renyi)
    finer = np.array([len(renyi_centres(x, delta=0.25)) for x in x0])
    coarser = np.array([len(renyi_centres(x, delta=1.0)) for x in x0])
    assert np.all(finer - plateau >= 4) and np.all(plateau - coarser >= 2), (finer, coarser)
