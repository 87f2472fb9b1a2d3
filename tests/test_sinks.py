"""The long-context escape kernels: a learned sink (an extra softmax column with no value)
and QK norm with learnable per-channel gains, against float64 numpy references; the two
bugs kernel libraries keep hitting (the sink in the numerator, a pivot without the sink);
the logit cap from the gains, attained; gradients and saved forms."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy.special import logsumexp

import attnflow as af
from attnflow import kernels as K

RNG = np.random.default_rng(21)


def sink_numpy(L, b):
    """Softmax over the columns of L plus one column of logit b, that column dropped."""
    full = np.concatenate([L, np.full(L.shape[:-1] + (1,), b)], axis=-1)
    return np.exp(full - logsumexp(full, axis=-1, keepdims=True))[..., :-1]


def test_sink_against_numpy_and_its_share():
    L = RNG.normal(size=(5, 8)) * 3
    L[1, 2] = -np.inf
    for b in (-3.0, 0.0, 2.5):
        P = np.asarray(K.get("sink", b=b).weights(L))
        np.testing.assert_allclose(P, sink_numpy(L, b), rtol=1e-13)
        share = np.asarray(K.sink_share(L, b))
        np.testing.assert_allclose(share, 1 - P.sum(axis=1), rtol=1e-10)
        np.testing.assert_allclose(share, 1 / (1 + np.exp(logsumexp(L, axis=1) - b)), rtol=1e-12)
    np.testing.assert_array_equal(
        np.asarray(K.get("sink", b=0.0).weights(L)), np.asarray(K.get("offbyone").weights(L))
    )


def test_sink_in_the_denominator_only_and_in_the_pivot():
    # the sink weighs nothing in P @ V: a value attached to it would change nothing
    x = RNG.normal(size=(6, 2))
    A = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel=K.Sink(b=1.0))
    P = np.asarray(A.attention(x))
    np.testing.assert_allclose(np.asarray(A.vector_field(x)), P @ x, rtol=1e-13)
    assert np.all(P.sum(axis=1) < 1)
    # a pivot without the sink overflows for a large sink logit; with it, exact
    big_b = np.asarray(K.sink_softmax(np.array([[0.0, 1.0]]), 800.0))
    assert np.all(np.isfinite(big_b)) and np.all(big_b < 1e-300)
    big_L = np.asarray(K.sink_softmax(np.array([[800.0, 799.0]]), 0.0))
    np.testing.assert_allclose(big_L, sink_numpy(np.array([[800.0, 799.0]]), 0.0), rtol=1e-13)
    close = np.asarray(K.sink_softmax(np.array([[700.0, 10.0]]), 700.0))
    np.testing.assert_allclose(close[0, 0], 0.5, rtol=1e-13)


def test_sink_logit_gradient_against_finite_differences():
    L = RNG.normal(size=(4, 6))

    def loss(b):
        return float(np.sum(np.asarray(K.sink_softmax(L, b)) ** 2))

    g = jax.grad(lambda k: (k.weights(L) ** 2).sum())(K.Sink(b=0.7)).b
    eps = 1e-6
    assert float(g) == pytest.approx((loss(0.7 + eps) - loss(0.7 - eps)) / (2 * eps), rel=1e-7)


def rms(u):
    return u / np.sqrt(np.mean(u * u, axis=-1, keepdims=True))


def test_qknorm_gains_against_numpy_and_the_cap():
    d, p, beta = 4, 4, 0.5
    Q, Kk = RNG.normal(size=(2, p, d))
    wq, wk = RNG.uniform(0.2, 3.0, p), RNG.uniform(0.2, 3.0, p)
    x = RNG.normal(size=(9, d))
    A = af.Attention(Q, Kk, 0.3 * np.eye(d), beta=beta, kernel=K.QKNorm(wq=wq, wk=wk))
    L = beta * (rms(x @ Q.T) * wq) @ (rms(x @ Kk.T) * wk).T
    P = np.exp(L - logsumexp(L, axis=1, keepdims=True))
    np.testing.assert_allclose(np.asarray(A.attention(x)), P, rtol=1e-12)
    B = K.qknorm_logit_bound(A.kernel, beta, p)
    assert B == pytest.approx(beta * p * wq.max() * wk.max())
    many = RNG.normal(size=(2000, d))
    assert np.abs(np.asarray(A.logits(many))).max() <= B * (1 + 1e-12)
    # attained: the gains' largest entries on one channel, a query and key along it
    w = np.array([0.5, 2.0, 1.0, 0.7])
    e = np.zeros((1, p))
    e[0, 1] = 1.0
    top = np.asarray(K.QKNorm(wq=w, wk=w).prepare(e, e)[0])
    cap = K.qknorm_logit_bound(K.QKNorm(w, w), beta, p)
    assert beta * float((top @ top.T)[0, 0]) == pytest.approx(cap)
    # unit gains are the fixed-gain kernel: the same attention as before
    np.testing.assert_array_equal(
        np.asarray(
            af.Attention(Q, Kk, np.eye(d), kernel=K.QKNorm(np.ones(p), np.ones(p))).attention(x)
        ),
        np.asarray(af.Attention(Q, Kk, np.eye(d), kernel="qknorm").attention(x)),
    )


def test_qknorm_sink_and_the_dispersion_report():
    d = p = 4
    Q, Kk = RNG.normal(size=(2, p, d))
    x = RNG.normal(size=(64, d))
    kern = K.QKNormSink(wq=np.full(p, 1.5), wk=np.ones(p), b=2.0)
    A = af.Attention(Q, Kk, 0.2 * np.eye(d), beta=0.5, kernel=kern)
    L = 0.5 * (rms(x @ Q.T) * 1.5) @ rms(x @ Kk.T).T
    np.testing.assert_allclose(np.asarray(A.attention(x)), sink_numpy(L, 2.0), rtol=1e-12)
    rep = af.dispersion(A, x=x, rows=slice(0, 8))
    assert np.all(rep.delta <= 2 * K.qknorm_logit_bound(kern, 0.5, p) + 1e-12)
    np.testing.assert_allclose(1 - rep.row_sum, np.asarray(K.sink_share(L[:8], 2.0)), rtol=1e-10)
    with pytest.raises(ValueError, match="frame='original'|rows"):
        af.simulate(A, x[:6], 0.1)


def test_gains_check_their_shape_and_save(tmp_path):
    with pytest.raises(ValueError, match=r"kernel_params\['wq'\].*1-d array"):
        K.QKNorm(wq=[[1.0, 2.0]])
    A = af.Attention(np.eye(3), np.eye(3), np.eye(3), kernel=K.QKNorm(wq=[1.0, 2.0]))
    with pytest.raises(ValueError, match="gains have 2 channels; the head has p = 3"):
        A.attention(np.ones((4, 3)))
    B = af.Attention(
        np.eye(2), np.eye(2), 0.2 * np.eye(2), kernel=K.QKNormSink([1.0, 2.0], [0.5, 1.0], 1.5)
    )
    tr = af.simulate(B, RNG.normal(size=(5, 2)), 0.3, frame="original")
    tr.save(tmp_path / "s.npz")
    back = af.Trajectory.load(tmp_path / "s.npz").model.kernel
    assert back.describe() == B.kernel.describe()
    np.testing.assert_array_equal(np.asarray(back.wq), [1.0, 2.0])


def test_fig_escapes_kernels_meet_their_closed_forms(tmp_path):
    """The figure's every point is a kernel's weight; each curve equals its closed form,
    and the halving sizes are 1 + e^g (needles) and e^b (sinks)."""
    import json
    import math

    from attnflow.experiments import fig_escapes

    res = fig_escapes.make(tmp_path, quick=True)
    assert res["max_relative_difference"] < 1e-13
    runs = {r["name"]: r for r in json.loads((tmp_path / "fig_escapes.json").read_text())["runs"]}
    assert runs["softmax, g = 6"]["halves_at_n"] == pytest.approx(1 + math.exp(6), rel=1e-3)
    assert runs["softmax, g = 8"]["halves_at_n"] == pytest.approx(1 + math.exp(8), rel=1e-3)
    assert runs["learned sink, b = 8"]["halves_at_n"] == pytest.approx(math.exp(8))
    sink = runs["learned sink, b = 4"]
    np.testing.assert_allclose(sink["one_minus_row_sum"], sink["sink_share"], rtol=1e-9)


def test_learned_scales_train_through_the_solve():
    """ssmax's scale, a sink logit and QK-norm gains are ordinary leaves: the gradient of
    a loss of the tokens after the particle system's solve, through ``attnflow.solve``,
    equals central finite differences of the same loss (original frame, Euler layers)."""
    import equinox as eqx

    x0 = RNG.normal(size=(5, 3))
    solver = af.LayerSolver(0.1)

    def tokens(kernel):
        m = af.Attention(np.eye(3), np.eye(3), 0.5 * np.eye(3), kernel=kernel)
        return af.solve(m, x0, 1.0, frame="original", solver=solver).ys[-1]

    def loss(kernel):
        return (tokens(kernel) ** 2).sum()

    cases = [
        (K.SSMax(s=0.8), lambda k, v: K.SSMax(s=v), "s", 0.8),
        (K.Sink(b=0.3), lambda k, v: K.Sink(b=v), "b", 0.3),
    ]
    for kernel, rebuild, leaf, value in cases:
        grad = eqx.filter_grad(loss)(kernel)
        h = 1e-6
        fd = (float(loss(rebuild(kernel, value + h))) - float(loss(rebuild(kernel, value - h)))) / (
            2 * h
        )
        assert float(getattr(grad, leaf)) == pytest.approx(fd, rel=1e-6, abs=1e-10), kernel.name
        assert abs(fd) > 1e-6  # the scale moves the tokens
    wq = np.array([0.9, 1.3, 0.7])
    grad = eqx.filter_grad(loss)(K.QKNorm(wq=wq, wk=np.ones(3))).wq
    for c in range(3):
        up, down = wq.copy(), wq.copy()
        up[c] += 1e-6
        down[c] -= 1e-6
        fd = (
            float(loss(K.QKNorm(wq=up, wk=np.ones(3))))
            - float(loss(K.QKNorm(wq=down, wk=np.ones(3))))
        ) / 2e-6
        assert float(grad[c]) == pytest.approx(fd, rel=1e-5, abs=1e-9)
