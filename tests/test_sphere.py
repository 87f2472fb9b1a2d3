"""The sphere frame (layer normalisation): the continuous dynamics against scipy, the
layer-norm placements against plain numpy, tokens on the sphere, the ``usa`` kernel,
save/load and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import attnflow as af


def _softmax(L):
    e = np.exp(L - L.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _weights(L, kernel):
    return _softmax(L) if kernel == "softmax" else np.exp(L) / L.shape[-1]


def _F(x, Q, K, V, beta, kernel="softmax"):
    """Plain numpy field sum_j P_ij V x_j."""
    L = beta * (x @ Q.T) @ (x @ K.T).T
    return _weights(L, kernel) @ x @ V.T


def _N(u):
    r = np.linalg.norm(u, axis=-1, keepdims=True)
    return np.where(r == 0, 0.0, u / np.where(r == 0, 1.0, r))


def _sphere_rhs(x, Q, K, V, beta, kernel):
    g = _F(x, Q, K, V, beta, kernel)
    return g - np.sum(x * g, axis=-1, keepdims=True) * x


def _weights_qkv(d, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))


@pytest.mark.parametrize("kernel", ["softmax", "usa"])
def test_sphere_ode_matches_scipy(kernel):
    """dx_i/dt = Proj_{x_i}(sum_j P_ij V x_j) for random Q, K, V against solve_ivp on the
    same equation (renormalised start), with a tight tolerance on both."""
    n, d, beta, t1 = 7, 4, 1.5, 3.0
    Q, K, V = _weights_qkv(d, 1)
    x0 = np.random.default_rng(2).normal(size=(n, d)) * 3.0  # not on the sphere
    model = af.Attention(Q, K, V, beta=beta, kernel=kernel)
    ts = np.linspace(0.0, t1, 7)
    traj = af.simulate(model, x0, t1, ts=ts, frame="sphere", rtol=1e-12, atol=1e-13)
    assert traj.ok and traj.frame == "sphere"
    y0 = _N(x0)

    def rhs(t, y):
        return _sphere_rhs(y.reshape(n, d), Q, K, V, beta, kernel).ravel()

    ref = solve_ivp(rhs, (0, t1), y0.ravel(), t_eval=ts, rtol=1e-12, atol=1e-13, method="DOP853")
    ref_x = ref.y.T.reshape(len(ts), n, d)
    np.testing.assert_allclose(np.asarray(traj.x), ref_x, atol=1e-9)
    np.testing.assert_allclose(np.asarray(traj.x[0]), y0, atol=1e-15)
    # z is the same array as x for the sphere frame
    assert np.array_equal(np.asarray(traj.z), np.asarray(traj.x))
    assert traj.status_of("z") == "ok" and traj.status_of("x") == "ok"


def test_tokens_stay_on_sphere_over_long_runs():
    """float64: |x_i| = 1 to 1e-12 at every save of a long run (the layer modes are
    checked over 3,000 layers in test_layernorm_maps_match_numpy); the continuous
    state's own norm drifts by no more than the tolerance (the field is tangent, so the
    ODE conserves it)."""
    n, d = 16, 3
    Q, K, V = _weights_qkv(d, 3)
    model = af.Attention(Q, K, V, beta=4.0)
    x0 = np.random.default_rng(4).normal(size=(2, n, d))
    ts = np.linspace(0, 300.0, 31)
    traj = af.simulate(model, x0, 300.0, ts=ts, frame="sphere")
    assert traj.ok
    assert np.abs(np.linalg.norm(traj.x, axis=-1) - 1).max() < 1e-12
    assert np.abs(np.linalg.norm(traj.state, axis=-1) - 1).max() < 1e-4


def _layers_numpy(x0, Q, K, V, beta, dt, k, ln):
    """The four layer-norm maps in plain numpy (no JAX), k layers."""
    y = _N(x0)
    for _ in range(k):
        if ln == "post":
            y = _N(y + dt * _F(y, Q, K, V, beta))
        elif ln == "pre":
            y = y + dt * _F(_N(y), Q, K, V, beta)
        elif ln == "peri":
            y = y + dt * _N(_F(_N(y), Q, K, V, beta))
        else:
            y = _N(y + 0.2 * dt * _N(_F(y, Q, K, V, beta)))
    return y


@pytest.mark.parametrize("ln", ["post", "pre", "peri", "ngpt"])
def test_layernorm_maps_match_numpy(ln):
    n, d, beta, dt = 9, 5, 2.0, 0.1
    Q, K, V = _weights_qkv(d, 5)
    V = V + np.eye(d)  # a growing residual stream for pre / peri
    x0 = np.random.default_rng(6).normal(size=(n, d))
    model = af.Attention(Q, K, V, beta=beta)
    ts = np.array([0.0, 2.0, 4.0, 300.0])  # the last: a long run, 3,000 layers
    tr = af.simulate(model, x0, 300.0, ts=ts, frame="sphere", method="euler", dt=dt, layernorm=ln)
    assert tr.ok and tr.solver["layernorm"] == ln
    assert np.abs(np.linalg.norm(tr.x, axis=-1) - 1).max() < 1e-12, ln
    assert np.all(np.isfinite(np.asarray(tr.x)))
    for j, kk in enumerate((0, 20, 40)):
        ref = _layers_numpy(x0, Q, K, V, beta, dt, kk, ln)
        np.testing.assert_allclose(np.asarray(tr.state[j]), ref, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(np.asarray(tr.x[j]), _N(ref), rtol=1e-11, atol=1e-12)
    if ln in ("pre", "peri"):  # the residual stream is free and grows off the sphere
        assert np.linalg.norm(np.asarray(tr.state[-1]), axis=-1).min() > 1.5


def test_default_layernorm_is_post_and_euler_ode_runs():
    Q, K, V = _weights_qkv(3, 7)
    model = af.Attention(Q, K, V)
    x0 = np.random.default_rng(8).normal(size=(5, 3))
    a = af.simulate(model, x0, 1.0, frame="sphere", method="euler", dt=0.1)
    b = af.simulate(model, x0, 1.0, frame="sphere", method="euler", dt=0.1, layernorm="post")
    assert a.solver["layernorm"] == "post"
    assert np.array_equal(np.asarray(a.x), np.asarray(b.x))
    # forward Euler on the sphere ODE: dy = |y| Proj(F(N(y))) per step, tokens N(y)
    c = af.simulate(model, x0, 1.0, frame="sphere", method="euler-ode", dt=0.1)
    y = _N(x0)
    for _ in range(10):
        u = _N(y)
        y = y + 0.1 * np.linalg.norm(y, axis=-1, keepdims=True) * _sphere_rhs(
            u, Q, K, V, 1.0, "softmax"
        )
    np.testing.assert_allclose(np.asarray(c.x[-1]), _N(y), atol=1e-13)


def test_sphere_errors():
    I3 = np.eye(3)
    model = af.Attention(I3, I3, I3)
    x0 = np.random.default_rng(0).normal(size=(4, 3))
    bad = x0.copy()
    bad[2] = 0.0
    with pytest.raises(ValueError, match="x0 has a zero or subnormal token"):
        af.simulate(model, bad, 1.0, frame="sphere")
    with pytest.raises(ValueError, match="x0 has a zero or subnormal token"):
        af.simulate(model, np.stack([x0, bad]), 1.0, frame="sphere", method="euler", dt=0.1)
    with pytest.raises(ValueError, match="layernorm"):
        af.simulate(model, x0, 1.0, frame="sphere", method="euler", dt=0.1, layernorm="middle")
    with pytest.raises(ValueError, match="needs frame='sphere' and method='euler'"):
        af.simulate(model, x0, 1.0, frame="original", method="euler", dt=0.1, layernorm="pre")
    with pytest.raises(ValueError, match="needs frame='sphere' and method='euler'"):
        af.simulate(model, x0, 1.0, frame="sphere", layernorm="pre")


def test_usa_kernel_weights_frames_and_overflow():
    rng = np.random.default_rng(9)
    L = rng.normal(size=(6, 6))
    np.testing.assert_allclose(
        np.asarray(af.kernels.weights("usa", jnp.asarray(L))), np.exp(L) / 6, rtol=1e-14
    )
    assert not af.kernels.row_stochastic("usa") and "usa" in af.KERNELS
    I2 = np.eye(2)
    with pytest.raises(ValueError, match="not row-stochastic"):
        af.simulate(af.Attention(I2, I2, I2, kernel="usa"), rng.normal(size=(4, 2)), 1.0)
    # Q = K = I on the sphere: logits <= beta; e^800 / n leaves float64, so the guard
    # stops the solve at once with "overflow" (never a NaN behind "ok")
    model = af.Attention(I2, I2, I2, beta=800.0, kernel="usa")
    tr = af.simulate(model, rng.normal(size=(4, 2)), 1.0, frame="sphere")
    assert tr.status == "overflow" and not tr.ok
    assert np.all(np.isfinite(np.asarray(tr.x)))
    # beta = 600: e^600 / n is finite, post-LN layers run (and normalise it away)
    big = af.Attention(I2, I2, I2, beta=600.0, kernel="usa")
    ok = af.simulate(big, rng.normal(size=(4, 2)), 0.3, frame="sphere", method="euler", dt=0.1)
    assert ok.ok and np.all(np.isfinite(np.asarray(ok.x)))


def test_any_model_runs_on_the_sphere():
    """A one-head MultiHeadAttention equals Attention on the sphere (the frame uses only
    the model's field)."""
    Q, K, V = _weights_qkv(3, 10)
    x0 = np.random.default_rng(11).normal(size=(6, 3))
    one = af.simulate(
        af.Attention(Q, K, V, beta=1.3), x0, 2.0, frame="sphere", rtol=1e-10, atol=1e-12
    )
    mha = af.MultiHeadAttention(Q[None], K[None], V[None], beta=1.3)
    two = af.simulate(mha, x0, 2.0, frame="sphere", rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(two.x), np.asarray(one.x), atol=1e-10)


@pytest.mark.parametrize("method", ["adaptive", "euler"])
def test_sphere_save_load_round_trip(tmp_path, method):
    Q, K, V = _weights_qkv(3, 12)
    model = af.Attention(Q, K, V, beta=2.0, kernel="usa")
    x0 = np.random.default_rng(13).normal(size=(2, 5, 3))
    kw = {"method": "euler", "dt": 0.1, "layernorm": "pre"} if method == "euler" else {}
    tr = af.simulate(model, x0, 1.0, ts=np.array([0.0, 0.5, 1.0]), frame="sphere", **kw)
    back = af.Trajectory.load(tr.save(tmp_path / "s.npz"))
    for name in ("ts", "x", "z", "state", "reached", "x0"):
        a, b = np.asarray(getattr(tr, name)), np.asarray(getattr(back, name))
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert back.frame == "sphere" and back.solver == tr.solver
    assert back.model.kernel.name == "usa"
    assert np.array_equal(np.asarray(tr.attention(-1)), np.asarray(back.attention(-1)))


@pytest.mark.slow
def test_cli_simulate_frame_sphere():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnflow",
            "simulate",
            "--V",
            "identity",
            "--n",
            "5",
            "--t1",
            "3",
            "--frame",
            "sphere",
            "--x64",
            "--seed",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["frame"] == "sphere" and res["status"] == "ok"
    x = np.asarray(res["x_final"])
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-12)
    assert np.array_equal(x, np.asarray(res["z_final"]))


def test_isotropic_attention_equals_attention_of_identities(tmp_path):
    x0 = np.random.default_rng(14).normal(size=(2, 6, 4))
    I4 = np.eye(4)
    a = af.simulate(
        af.Attention(I4, I4, I4, beta=3.0), x0, 1.0, frame="sphere", method="euler", dt=0.1
    )
    iso = af.IsotropicAttention(4, beta=3.0)
    b = af.simulate(iso, x0, 1.0, frame="sphere", method="euler", dt=0.1)
    # equal to rounding (XLA fuses the two programs differently)
    np.testing.assert_allclose(np.asarray(b.x), np.asarray(a.x), rtol=0, atol=1e-14)
    back = af.Trajectory.load(b.save(tmp_path / "iso.npz"))
    assert type(back.model) is af.IsotropicAttention and np.array_equal(
        np.asarray(back.x), np.asarray(b.x)
    )
    with pytest.raises(ValueError, match="d must be"):
        af.IsotropicAttention(0)


@pytest.mark.parametrize("scale", [1e-310, 3e-320])
def test_subnormal_tokens_are_refused_not_flushed(scale):
    """XLA flushes subnormal numbers to zero: a token whose every entry is subnormal would
    become a zero token on the sphere, status ok. Refused by name, in every mode; a tiny
    but normal scale is fine and gives the tokens of the unit-scale start."""
    I3 = np.eye(3)
    model = af.Attention(I3, I3, I3)
    x0 = np.random.default_rng(1).normal(size=(4, 3))
    bad = x0.copy()
    bad[1] *= scale
    for kw in ({}, {"method": "euler", "dt": 0.1}):
        with pytest.raises(ValueError, match=r"zero or subnormal token \(row \(1,\)"):
            af.simulate(model, bad, 0.5, frame="sphere", **kw)
    ok = x0.copy()
    ok[1] *= 1e-300  # normal in float64
    a = af.simulate(model, ok, 0.5, frame="sphere")
    b = af.simulate(model, x0, 0.5, frame="sphere")
    np.testing.assert_allclose(np.asarray(a.x), np.asarray(b.x), atol=1e-12)
