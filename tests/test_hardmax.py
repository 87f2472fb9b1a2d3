"""The hardmax limit (Alcalde, Geshkovski and Ruiz-Balet 2025, "Attention's forward pass
and Frank-Wolfe") in the particle system, with V = I. Positive semidefinite Q^T K = I:
each token of the rescaled frame moves in a straight line to the token of its largest
logit, ``z_i(t) = z_j + e^{-t} (z_i(0) - z_j)``, the tokens that are their own argmax
stay put, and softmax runs approach the hardmax run like ``e^{-beta m} / beta`` (``m``
the smallest decision margin). Negative semidefinite Q^T K = -I: a centrally symmetric
set contracts linearly to the origin, ``z(t) = e^{-2t} z(0)``; Frank-Wolfe steps
(``euler-ode``) obey the exact descent identity. ``attnflow.analysis.hardmax_cells``
against plain numpy: cells, ties, masks, gaps, objective, margins, hull vertices
(``scipy.spatial.ConvexHull``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial import ConvexHull

import attnflow as af
from attnflow.analysis import frank_wolfe_gap, hardmax_cells

I2 = np.eye(2)
Z0 = np.random.default_rng(2).normal(size=(8, 2))
TS = np.linspace(0.0, 3.0, 7)


def test_tokens_move_straight_to_their_vertex():
    tr = af.simulate(
        af.Attention(I2, I2, I2, kernel="hardmax"), Z0, 3.0, ts=TS, rtol=1e-11, atol=1e-12
    )
    assert tr.status == "ok"
    z = np.asarray(tr.z)
    target = np.argmax(Z0 @ Z0.T, axis=1)
    fixed = target == np.arange(8)
    assert 0 < fixed.sum() < 8  # some vertices, some interior tokens
    for k, t in enumerate(TS):
        ref = Z0[target] + np.exp(-t) * (Z0 - Z0[target])
        # the closed form is valid while every token keeps its argmax along the path
        assert np.array_equal(np.argmax(ref @ ref.T, axis=1), target)
        np.testing.assert_allclose(z[k], ref, atol=1e-10)
        np.testing.assert_allclose(z[k][fixed], Z0[fixed], atol=1e-12)


def test_softmax_runs_approach_the_hardmax_run_as_beta_grows():
    ts = TS[:3]
    hard = np.asarray(
        af.simulate(
            af.Attention(I2, I2, I2, kernel="hardmax"), Z0, 1.0, ts=ts, rtol=1e-11, atol=1e-12
        ).z
    )
    errs = []
    for beta in (8.0, 16.0, 32.0):
        soft = af.simulate(
            af.Attention(I2, I2, I2, beta=beta), Z0, 1.0, ts=ts, rtol=1e-11, atol=1e-12
        )
        errs.append(np.abs(np.asarray(soft.z) - hard).max())
    # measured 1.2e-2, 4.4e-4, 5.6e-6: each doubling of beta gains more than the last
    assert errs[0] > 10 * errs[1] > 100 * errs[2] and errs[2] < 1e-4


def test_the_distance_to_the_hardmax_run_is_exp_minus_beta_margin_over_beta():
    """err(beta) ~ C e^{-beta m} / beta, m the smallest top-versus-runner-up gap of the
    initial logits per unit beta (on this path the gaps of x = e^t z only grow, so the
    first instants dominate; the 1 / beta is the Laplace width of that instant)."""
    m = np.diff(np.sort(Z0 @ Z0.T, axis=1)[:, -2:], axis=1).min()  # 0.2297
    cells = hardmax_cells(af.Attention(I2, I2, I2, kernel="hardmax"), Z0)
    np.testing.assert_allclose(cells.margin.min(), m, rtol=1e-14)
    ts = TS[:3]
    hard = np.asarray(
        af.simulate(
            af.Attention(I2, I2, I2, kernel="hardmax"), Z0, 1.0, ts=ts, rtol=1e-11, atol=1e-12
        ).z
    )
    betas = np.array([24.0, 32.0, 48.0])
    errs = np.array(
        [
            np.abs(
                np.asarray(
                    af.simulate(
                        af.Attention(I2, I2, I2, beta=b), Z0, 1.0, ts=ts, rtol=1e-11, atol=1e-12
                    ).z
                )
                - hard
            ).max()
            for b in betas
        ]
    )
    # measured 4.66e-5, 5.57e-6, 9.44e-8; rates of ln(beta err): 0.2296, 0.2295 (m =
    # 0.22973); of ln(err) alone 0.2655, 0.2549, drifting: the 1 / beta is there
    rates = -np.diff(np.log(betas * errs)) / np.diff(betas)
    np.testing.assert_allclose(rates, m, rtol=5e-3)
    bare = -np.diff(np.log(errs)) / np.diff(betas)
    assert np.all(bare > 1.1 * m) and bare[0] > bare[1]


def test_frank_wolfe_gap_and_objective_along_a_hardmax_run():
    """With v the vertex of token i and w = z_i(0) - v: g_i(t) = e^{-t} <v, v - z_i(0)>
    - e^{-2t} |w|^2 and f(z_i(t)) = -|v + e^{-t} w|^2 / 2, so the objective falls by
    sum_i a_i (1 - e^{-T}) - b_i (1 - e^{-2T}) / 2 = int_0^T sum_i g_i. The gap is not
    monotone: it rises while e^{-t} > a_i / (2 b_i), then falls like e^{-t}."""
    ts = np.linspace(0.0, 3.0, 13)
    model = af.Attention(I2, I2, I2, kernel="hardmax")
    z = np.asarray(af.simulate(model, Z0, 3.0, ts=ts, rtol=1e-11, atol=1e-12).z)
    cells = hardmax_cells(model, z)
    v = Z0[np.argmax(Z0 @ Z0.T, axis=1)]
    w = Z0 - v
    a, b = np.sum(v * (v - Z0), axis=1), np.sum(w * w, axis=1)
    e = np.exp(-ts)[:, None]
    np.testing.assert_allclose(cells.gap, e * a - e**2 * b, atol=1e-10)
    np.testing.assert_allclose(
        cells.objective, -0.5 * np.sum((v + e[..., None] * w) ** 2, -1), atol=1e-10
    )
    drop = cells.objective.sum(-1)[0] - cells.objective.sum(-1)
    np.testing.assert_allclose(drop, np.sum(a * (1 - e) - b * (1 - e**2) / 2, axis=1), atol=1e-10)
    assert np.all(np.diff(cells.objective.sum(-1)) < 0)
    moving = a > 0
    t_star = np.log(2 * b[moving] / a[moving]).max()  # 0.574
    G = cells.total_gap
    assert G[1] > G[0]  # measured 3.91 -> 5.97 -> 6.42 at t = 0.5
    assert np.all(np.diff(G[ts >= t_star]) < 0)
    np.testing.assert_allclose(np.exp(ts[-1]) * cells.gap[-1], a, rtol=0.1)  # e^{-t} tail


def test_negative_semidefinite_contracts_linearly_to_the_origin():
    """Q^T K = -I, V = I, a centrally symmetric set of equal norms: every token's
    smallest <x_i, x_j> is its antipode, so z_i' = -z_i - z_i: z(t) = e^{-2t} z(0) in the
    rescaled frame, x(t) = e^{-t} x(0) in the original one, and each Frank-Wolfe step of
    size gamma multiplies by 1 - 2 gamma."""
    th = np.array([0.3, 1.1, 2.0, 2.6])
    half = 1.5 * np.c_[np.cos(th), np.sin(th)]
    x0 = np.r_[half, -half]
    model = af.Attention(I2, -I2, I2, kernel="hardmax")
    cells = hardmax_cells(model, x0)
    np.testing.assert_array_equal(cells.leader, np.argmin(x0 @ x0.T, axis=1))
    np.testing.assert_array_equal(cells.leader, (np.arange(8) + 4) % 8)  # the antipodes
    np.testing.assert_allclose(cells.gap, 2 * 1.5**2, rtol=1e-14)  # |x|^2 + |x|^2
    e = np.exp(-TS)[:, None, None]
    tr = af.simulate(model, x0, 3.0, ts=TS, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.asarray(tr.z), e**2 * x0, atol=1e-11)
    tr = af.simulate(model, x0, 3.0, ts=TS, frame="original", rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.asarray(tr.x), e * x0, atol=1e-11)
    k = np.arange(21)[:, None, None]
    fw = af.simulate(model, x0, 2.0, method="euler-ode", dt=0.1, ts=np.linspace(0, 2, 21))
    np.testing.assert_allclose(np.asarray(fw.z), 0.8**k * x0, atol=1e-15)


def test_negative_semidefinite_frank_wolfe_steps_descend_to_one_cluster():
    """Random tokens (the origin inside their hull), Q^T K = -I: f(z) = |z|^2 / 2 and
    one step z <- z + gamma (s - z) changes f by exactly -gamma g + gamma^2 |s - z|^2 / 2
    (s the mean of the winners); with gamma = 0.05 the total objective falls from 5.7 to
    2.7e-4 by t = 6 and every token ends in one cell."""
    gamma, t1 = 0.05, 6.0
    x0 = np.random.default_rng(0).normal(size=(7, 2))
    assert ConvexHull(np.r_[x0, [[0.0, 0.0]]]).vertices.max() < 7  # 0 is inside
    model = af.Attention(I2, -I2, I2, kernel="hardmax")
    steps = round(t1 / gamma)
    z = np.asarray(
        af.simulate(model, x0, t1, method="euler-ode", dt=gamma, ts=np.linspace(0, t1, steps + 1)).z
    )
    cells = hardmax_cells(model, z)
    G = np.einsum("mid,mjd->mij", z, z)
    np.testing.assert_allclose(cells.objective, 0.5 * np.einsum("mii->mi", G), atol=1e-14)
    np.testing.assert_allclose(cells.gap, np.einsum("mii->mi", G) - G.min(axis=-1), atol=1e-14)
    win = G == G.min(axis=-1, keepdims=True)
    s = np.einsum("mij,mjd->mid", win / win.sum(-1, keepdims=True), z)
    f = 0.5 * np.sum(z * z, -1)
    g = np.sum(z * (z - s), -1)
    step = f[:-1] - gamma * g[:-1] + 0.5 * gamma**2 * np.sum((s - z)[:-1] ** 2, -1)
    np.testing.assert_allclose(f[1:], step, atol=1e-14)  # measured 4.4e-16
    F = cells.objective.sum(-1)
    assert np.all(np.diff(F) < 0) and F[0] > 5 and F[-1] < 1e-3
    assert len(set(cells.leader[-1])) == 1 and np.ptp(z[-1], axis=0).max() < 1e-2


def test_cells_against_numpy_ties_masks_and_heads():
    rng = np.random.default_rng(5)
    Q, K = rng.normal(size=(2, 3, 3))
    x = rng.normal(size=(9, 3))
    beta = 1.7
    L = beta * (x @ Q.T) @ (x @ K.T).T
    cells = hardmax_cells(af.Attention(Q, K, np.eye(3), beta=beta), x)  # softmax: same cells
    np.testing.assert_array_equal(cells.leader, np.argmax(L, axis=1))
    np.testing.assert_array_equal(cells.count, 1)
    top2 = np.sort(L, axis=1)[:, -2:]
    np.testing.assert_allclose(cells.margin, (top2[:, 1] - top2[:, 0]) / beta, rtol=1e-12)
    np.testing.assert_allclose(cells.gap, (L.max(1) - np.diag(L)) / beta, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cells.objective, -0.5 * np.einsum("id,de,ie->i", x, Q.T @ K, x))
    assert cells.beta == beta
    # ties: the midpoint of an edge sees three equal logits and is stationary, not exposed
    tie = hardmax_cells(
        af.Attention(I2, I2, I2, kernel="hardmax"), np.array([[1.0, 0], [0, 1], [0.5, 0.5]])
    )
    assert tie.count.tolist() == [1, 1, 3] and tie.tied.tolist() == [False, False, True]
    assert tie.stationary.tolist() == [True, True, True]
    assert tie.exposed.tolist() == [True, True, False]
    assert tie.margin[2] == np.inf and tie.members(0).tolist() == [0, 2]
    # a causal mask: the winners are the keys the model's own hardmax weighs
    causal = af.Attention(Q, K, np.eye(3), kernel="hardmax", mask="causal")
    masked = hardmax_cells(causal, x)
    P = np.asarray(causal.attention(jnp.asarray(x)))
    np.testing.assert_array_equal(masked.winners, P > 0)
    Lc = np.where(np.tri(9, dtype=bool), L, -np.inf)
    np.testing.assert_array_equal(masked.leader, np.argmax(Lc, axis=1))
    assert np.all(masked.leader <= np.arange(9))
    # one head of several
    heads = af.MultiHeadAttention(np.stack([K, Q]), np.stack([Q, K]), np.stack([np.eye(3)] * 2))
    np.testing.assert_array_equal(hardmax_cells(heads, x, head=1).winners, cells.winners)
    np.testing.assert_allclose(frank_wolfe_gap(heads, x, head=1), cells.gap, rtol=1e-12)
    with pytest.raises(ValueError, match="head"):
        hardmax_cells(heads, x)
    with pytest.raises(ValueError, match="no bilinear form"):
        hardmax_cells(af.Attention(Q, K, np.eye(3), kernel="qknorm"), x)
    with pytest.raises(ValueError, match="x must be tokens"):
        hardmax_cells(causal, x[:, :2])
    with pytest.raises(ValueError, match="atol"):
        hardmax_cells(causal, x, atol=-1.0)


def test_stationary_tokens_are_hull_vertices():
    """On an ellipsoid <x, B x> = 1 (Q^T K = B positive definite) every hull vertex is
    its own strict argmax (Cauchy-Schwarz in the B inner product) and no interior token
    is: the stationary tokens are exactly scipy's hull vertices. Off the ellipsoid a
    stationary token with a strict argmax is still a vertex, but a vertex need not be
    stationary: token 5 of Z0 is a vertex that attends token 2."""
    rng = np.random.default_rng(7)
    B = np.diag([1.0, 4.0])
    th = rng.uniform(0, 2 * np.pi, 9)
    on = np.c_[np.cos(th), np.sin(th) / 2]  # <x, B x> = 1
    inside = rng.uniform(0.1, 0.8, size=(6, 1)) * on[rng.integers(0, 9, 6)]
    inside += 0.05 * rng.normal(size=(6, 2))
    x = np.r_[on, inside]
    hull = np.zeros(len(x), bool)
    hull[ConvexHull(x).vertices] = True
    assert hull[:9].all() and not hull[9:].any()
    cells = hardmax_cells(af.Attention(I2, B, I2, kernel="hardmax"), x)
    np.testing.assert_array_equal(cells.stationary, hull)
    np.testing.assert_array_equal(cells.exposed, hull)
    model = af.Attention(I2, I2, I2, kernel="hardmax")
    for seed in range(4):
        y = np.random.default_rng(seed).normal(size=(12, 2))
        exposed = hardmax_cells(model, y).exposed
        assert exposed.any() and set(np.flatnonzero(exposed)) <= set(ConvexHull(y).vertices)
    z0 = hardmax_cells(model, Z0)
    assert 5 in ConvexHull(Z0).vertices and not z0.stationary[5] and z0.leader[5] == 2
