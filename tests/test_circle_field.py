"""The exact O(n K) field on the circle (``attnflow.dynamics.fields.circle``) against the
dense field and a plain numpy evaluation, its gradients against the dense field's, and the
engine's choice of it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import ive

import attnflow as af
from attnflow.dynamics.fields import choose_field, circle_modes

RNG = np.random.default_rng(3)
ROT = np.array([[0.6, -0.8], [0.8, 0.6]])  # a rotation: Q^T K = a I + b J with b != 0


def _circle(n, rng=RNG):
    t = rng.uniform(0, 2 * np.pi, n)
    return np.stack([np.cos(t), np.sin(t)], axis=-1)


def _numpy_average(x, beta, A, kernel="softmax", causal=False, rows=None):
    """sum_j P_ij x_j in plain numpy, row by row (the reference)."""
    rows = range(len(x)) if rows is None else rows
    out = []
    for i in rows:
        L = beta * (x[i] @ A @ x.T)
        if causal:
            L = np.where(np.arange(len(x)) <= i, L, -np.inf)
        if kernel == "softmax":
            w = np.exp(L - L.max())
            w /= w.sum()
        else:
            w = np.exp(L) / len(x)
        out.append(w @ x)
    return np.array(out)


@pytest.mark.parametrize(
    "Q,K,kernel,mask",
    [
        (np.eye(2), np.eye(2), "softmax", None),
        (ROT, 1.3 * np.eye(2), "softmax", None),
        (np.eye(2), np.eye(2), "usa", None),
        (np.eye(2), 0.7 * ROT, "softmax", "causal"),
    ],
)
def test_field_equals_the_dense_field_and_numpy(Q, K, kernel, mask):
    V = RNG.normal(size=(2, 2))
    m = af.Attention(Q, K, V, beta=12.0, kernel=kernel, mask=mask)
    x = _circle(1500)
    fast, info = choose_field(m, len(x), prefer="circle")
    assert info["field"] == "circle" and info["error_bound"] < 1e-9
    got = np.asarray(fast.vector_field(jnp.asarray(x)))
    dense = np.asarray(m.vector_field(jnp.asarray(x)))
    np.testing.assert_allclose(got, dense, rtol=0, atol=1e-12 * np.abs(dense).max())
    rows = [0, 1, 777, 1499]
    ref = _numpy_average(x, 12.0, Q.T @ K, kernel, mask == "causal", rows) @ V.T
    np.testing.assert_allclose(got[rows], ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_modes_follow_beta_and_the_precision():
    for c in (0.5, 5.0, 20.0, 200.0):
        K = circle_modes(c)
        eps = np.finfo(np.float64).eps
        assert ive(K + 1, c) < eps * ive(0, c) <= ive(K, c) or K == 1
        assert K <= 9 * np.sqrt(c) + 6
    assert circle_modes(20.0, np.float32) < circle_modes(20.0)


def test_gradients_through_the_circle_field_equal_the_dense_ones():
    """Through a solve on the sphere (the tokens stay unit, so the field is read along
    the circle): the gradient in x0; through the field itself: beta and V (Q and K enter
    through the rotation-invariant part of Q^T K only)."""
    import equinox as eqx

    V = RNG.normal(size=(2, 2))
    m = af.Attention(np.eye(2), 0.9 * ROT, V, beta=6.0)
    x0 = jnp.asarray(_circle(1100))
    W = jnp.asarray(RNG.normal(size=(1100, 2)))

    def through_solve(x, field):
        sol = af.solve(m, x, 0.3, frame="sphere", solver=af.LayerSolver(0.1), field=field)
        return jnp.sum(W * sol.ys[-1])

    g_circle = jax.grad(lambda x: through_solve(x, "circle"))(x0)
    g_dense = jax.grad(lambda x: through_solve(x, "dense"))(x0)
    np.testing.assert_allclose(np.asarray(g_circle), np.asarray(g_dense), atol=1e-10)

    fast, _ = choose_field(m, 1100, prefer="circle")
    x = x0[:300]

    def loss(model):
        return jnp.sum(W[:300] * model.vector_field(x))

    g1 = eqx.filter_grad(lambda h: loss(type(fast)(h, fast.modes, False, True)))(m)
    g2 = eqx.filter_grad(loss)(m)
    for name in ("V", "beta"):
        np.testing.assert_allclose(
            np.asarray(getattr(g1, name)), np.asarray(getattr(g2, name)), rtol=1e-9, atol=1e-11
        )
    # a traced beta cannot fix the mode count: asked for, the circle field says why not
    with pytest.raises(ValueError, match="traced"):
        jax.grad(lambda b: loss(choose_field(eqx.tree_at(lambda h: h.beta, m, b), 300,
                                             prefer="circle")[0]))(6.0)  # fmt: skip


def test_the_engine_chooses_the_circle_field_and_records_it():
    x0 = _circle(1100)
    m = af.Attention(np.eye(2), np.eye(2), RNG.normal(size=(2, 2)), beta=8.0)
    kw = dict(frame="sphere", method="euler", dt=0.1, ts=[0.0, 0.5])
    auto = af.simulate(m, x0, 0.5, **kw)
    dense = af.simulate(m, x0, 0.5, field="dense", **kw)
    assert auto.solver["field"] == "circle" and dense.solver["field"] == "dense"
    assert auto.solver["modes"] == circle_modes(8.0)
    np.testing.assert_allclose(np.asarray(auto.x), np.asarray(dense.x), atol=1e-12)
    # fewer tokens, another dimension, float32, a head that is not rotation-invariant:
    # the model's own field
    assert af.simulate(m, x0[:100], 0.5, **kw).solver["field"] == "dense"
    skew = af.Attention(np.diag([1.0, 2.0]), np.eye(2), np.eye(2), beta=8.0)
    assert af.simulate(skew, x0, 0.5, **kw).solver["field"] == "dense"
    with pytest.raises(ValueError, match="commute with rotations"):
        af.simulate(skew, x0, 0.5, field="circle", **kw)
    m3 = af.Attention(np.eye(3), np.eye(3), np.eye(3))
    with pytest.raises(ValueError, match="d = 3"):
        af.simulate(m3, RNG.normal(size=(5, 3)), 0.5, field="circle", **kw)
    # solve takes it too
    sol = af.solve(m, jnp.asarray(x0), 0.5, frame="sphere", solver=af.LayerSolver(0.1))
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), np.asarray(auto.x[-1]), atol=1e-12)


@pytest.mark.parametrize("kernel", ["softmax", "usa"])
def test_isotropic_attention_takes_the_circle_field(kernel):
    """Q = K = V = I on the circle (the metastability studies' model) is served by the
    circle field, with the numbers of the dense field and of plain numpy."""
    x = _circle(1300)
    iso = af.IsotropicAttention(2, beta=9.0, kernel=kernel)
    fast, info = choose_field(iso, len(x))
    assert info["field"] == "circle" and info["modes"] == circle_modes(9.0)
    got = np.asarray(fast.vector_field(jnp.asarray(x)))
    dense = np.asarray(iso.vector_field(jnp.asarray(x)))
    np.testing.assert_allclose(got, dense, rtol=0, atol=1e-12 * np.abs(dense).max())
    rows = [0, 650, 1299]
    ref = _numpy_average(x, 9.0, np.eye(2), kernel, False, rows)
    np.testing.assert_allclose(got[rows], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    kw = dict(frame="sphere", method="euler", dt=0.1, ts=[0.0, 0.3])
    auto = af.simulate(iso, x, 0.3, **kw)
    assert auto.solver["field"] == "circle"
    dense_run = af.simulate(iso, x, 0.3, field="dense", **kw)
    np.testing.assert_allclose(np.asarray(auto.x), np.asarray(dense_run.x), atol=1e-12)
