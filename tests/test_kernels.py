"""Attention kernels: numpy references, tiling, simulate in both frames, overflow bounds."""

import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.dynamics import kernels as K

STOCHASTIC = ("softmax", "qknorm", "ssmax", "adaptive")
# the kernels of this file; the others are tested in test_kernels_escape.py
CLASSIC = ("softmax", "qknorm", "ssmax", "sigmoid", "adaptive")


# ------------------------------------------------------- numpy references (independent)
def np_softmax(L):
    L = np.asarray(L, np.float64)
    E = np.exp(L - L.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def np_rms(u):
    return u / np.sqrt(np.mean(u * u, axis=-1, keepdims=True))


def np_kernel(name, q, k, beta, s=1.0):
    """The attention matrix of raw queries ``q`` and keys ``k`` under kernel ``name``."""
    n = k.shape[0]
    if name == "qknorm":
        q, k = np_rms(q), np_rms(k)
    L = beta * q @ k.T
    if name in ("softmax", "qknorm"):
        return np_softmax(L)
    if name == "ssmax":
        return np_softmax(s * np.log(n) * L)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-(L - np.log(n))))
    if name == "adaptive":
        p = np_softmax(L)
        H = -np.sum(p * np.log(p + 1e-9), axis=-1)
        inv = np.where(
            H > 0.5, np.maximum(np.polyval([-0.037, 0.481, -2.3, 4.917, -1.791], H), 1.0), 1.0
        )
        return np_softmax(L * inv[:, None])
    if name == "usa":
        return np.exp(L) / n
    raise ValueError(name)


def np_euler(name, x0, Q, Kk, V, beta, dt, layers, s=1.0):
    """Forward Euler in the original frame: x <- x + dt P(x) x V^T."""
    x = np.array(x0, np.float64)
    for _ in range(layers):
        P = np_kernel(name, x @ Q.T, x @ Kk.T, beta, s)
        x = x + dt * P @ x @ V.T
    return x


def np_rk4(name, x0, Q, Kk, V, beta, t1, steps, s=1.0):
    x = np.array(x0, np.float64)
    h = t1 / steps

    def f(y):
        return np_kernel(name, y @ Q.T, y @ Kk.T, beta, s) @ y @ V.T

    for _ in range(steps):
        a = f(x)
        b = f(x + h / 2 * a)
        c = f(x + h / 2 * b)
        d = f(x + h * c)
        x = x + h / 6 * (a + 2 * b + 2 * c + d)
    return x


def _params(name, s=1.7):
    return {"s": s} if name == "ssmax" else None


# --------------------------------------------------------------------------- tests
def test_registry_lists_the_kernels():
    assert K.KERNELS[:5] == CLASSIC
    assert [K.row_stochastic(k) for k in CLASSIC] == [True, True, True, False, True]
    assert K.KERNELS[5:] == (
        "usa",
        "linear",
        "linearnorm",
        "stickbreaking",
        "selective",
        "differential",
        "offbyone",
        "prenorm",
        "sink",
        "qknorm_sink",
        "sinkhorn",
        "sparsemax",
        "entmax",
        "softpick",
        "hardmax",
    )
    assert [K.row_stochastic(k) for k in K.KERNELS[5:]] == [
        False,
        False,
        True,
        False,
        True,
        False,
        False,
        True,
        False,
        False,
        True,
        True,
        True,
        False,
        True,
    ]
    assert af.KERNELS == K.KERNELS
    # every name is a final kernel class whose facts match the functional lookup
    for name in K.KERNELS:
        obj = K.get(name)
        assert isinstance(obj, K.AbstractKernel) and obj.name == name
        assert type(obj).row_stochastic is K.row_stochastic(name)
    assert math.isclose(K.ADAPTIVE_MAX_INVERSE_TEMPERATURE, 2.4213877, rel_tol=1e-6)


@pytest.mark.parametrize("name", CLASSIC)
def test_weights_match_numpy(name):
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(23, 3)), rng.normal(size=(31, 3))
    s = 1.7
    want = np_kernel(name, q, k, 0.9, s)
    qq, kk = K.prepare(name, jnp.asarray(q), jnp.asarray(k))
    got = K.weights(name, K.logits(qq, kk, 0.9), _params(name, s))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-15)
    if K.row_stochastic(name):
        np.testing.assert_allclose(np.asarray(got).sum(-1), 1.0, rtol=1e-13)


@pytest.mark.parametrize("name", CLASSIC)
def test_attend_tiled_equals_dense_and_numpy(name):
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(157, 4)) for _ in range(3))
    want = np_kernel(name, q, k, 0.8) @ v
    args = (jnp.asarray(q), jnp.asarray(k), 0.8, jnp.asarray(v))
    dense = np.asarray(K.attend(name, *args, block=0))
    np.testing.assert_allclose(dense, want, rtol=1e-11, atol=1e-13)
    for block in (1, 16, 50, 156, 157, 400):  # padding, exact fit, one tile
        tiled = np.asarray(K.attend(name, *args, block=block))
        np.testing.assert_allclose(tiled, dense, rtol=1e-12, atol=1e-14)


def test_ssmax_parameter_reaches_attend_tiles():
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(40, 2)) for _ in range(3))
    for s in (0.3, 2.5):
        want = np_kernel("ssmax", q, k, 1.0, s) @ v
        for block in (0, 7):
            got = K.attend(
                "ssmax",
                jnp.asarray(q),
                jnp.asarray(k),
                1.0,
                jnp.asarray(v),
                block=block,
                params={"s": s},
            )
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_rms_normalize_is_scale_invariant_and_safe():
    u = np.array([[3.0, -4.0, 0.0], [0.0, 0.0, 0.0], [1e-200, 2e-200, 0.0], [1e200, -1e200, 3e200]])
    r = np.asarray(K.rms_normalize(jnp.asarray(u)))
    np.testing.assert_allclose(r[0], np_rms(u[:1])[0], rtol=1e-15)
    assert np.all(r[1] == 0)
    np.testing.assert_allclose(r[2], np_rms(np.array([[1.0, 2.0, 0.0]]))[0], rtol=1e-15)
    np.testing.assert_allclose(np.sum(r[[0, 2, 3]] ** 2, -1), 3.0, rtol=1e-14)
    assert np.all(np.isnan(np.asarray(K.rms_normalize(jnp.array([[np.inf, 1.0]])))))


@pytest.mark.parametrize("name", CLASSIC)
def test_simulate_euler_original_frame_matches_numpy(name):
    rng = np.random.default_rng(4)
    d, n = 2, 9
    Q = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    Kk = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    V = np.array([[0.5, 0.2], [-0.1, 0.3]])
    x0 = rng.uniform(-1.5, 1.5, (n, d))
    if name == "usa":  # e^L / n: tokens of size 1.5 blow up in finite time (t ~ 0.5)
        x0 = x0 / 3
    model = af.Attention(Q, Kk, V, beta=0.7, kernel=name, kernel_params=_params(name))
    traj = af.simulate(model, x0, 1.5, frame="original", method="euler", dt=0.1)
    assert traj.ok
    want = np_euler(name, x0, Q, Kk, V, 0.7, 0.1, 15, s=1.7)
    np.testing.assert_allclose(np.asarray(traj.x[-1]), want, rtol=1e-11, atol=1e-12)
    # the attention matrix of the trajectory is the kernel's
    P = np.asarray(traj.attention(-1))
    xl = np.asarray(traj.x[-1])
    np.testing.assert_allclose(
        P, np_kernel(name, xl @ Q.T, xl @ Kk.T, 0.7, 1.7), rtol=1e-11, atol=1e-14
    )


@pytest.mark.parametrize("name", CLASSIC)
def test_simulate_adaptive_original_frame_matches_numpy_rk4(name):
    rng = np.random.default_rng(5)
    d, n = 2, 7
    Q = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    V = np.array([[0.4, 0.1], [0.0, -0.2]])
    x0 = rng.uniform(-1, 1, (n, d))
    model = af.Attention(Q, np.eye(d), V, kernel=name, kernel_params=_params(name))
    traj = af.simulate(model, x0, 1.0, frame="original", rtol=1e-10, atol=1e-12)
    assert traj.ok
    want = np_rk4(name, x0, Q, np.eye(d), V, 1.0, 1.0, 400, s=1.7)
    np.testing.assert_allclose(np.asarray(traj.x[-1]), want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_rescaled_frame_agrees_with_original_frame(name):
    # discrete transformer: x^k = (I + dt V)^k z^k exactly, so the frames agree to rounding
    rng = np.random.default_rng(6)
    V = np.array([[0.6, 0.3], [-0.2, 0.4]])
    x0 = rng.uniform(-1, 1, (11, 2))
    model = af.Attention(np.eye(2), np.eye(2), V, kernel=name, kernel_params=_params(name))
    a = af.simulate(model, x0, 2.0, frame="original", method="euler", dt=0.1)
    b = af.simulate(model, x0, 2.0, frame="rescaled", method="euler", dt=0.1)
    np.testing.assert_allclose(np.asarray(b.x[-1]), np.asarray(a.x[-1]), rtol=1e-10, atol=1e-12)


def test_sigmoid_refuses_the_rescaled_frame():
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="sigmoid")
    x0 = np.random.default_rng(0).normal(size=(5, 2))
    with pytest.raises(ValueError, match=r"sigmoid.*frame='original'"):
        af.simulate(model, x0, 1.0)
    with pytest.raises(ValueError, match="sigmoid"):
        af.simulate(model, x0, 1.0, frame="rescaled", method="euler", dt=0.1)
    assert af.simulate(model, x0, 1.0, frame="original").ok


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(kernel="ssmax", kernel_params={"t": 1.0}), "t"),
        (dict(kernel="softmax", kernel_params={"s": 1.0}), "s"),
        (dict(kernel="ssmax", kernel_params={"s": 0.0}), "s"),
        (dict(kernel="ssmax", kernel_params={"s": float("nan")}), "s"),
        (dict(kernel="ssmax", kernel_params={"s": [1.0, 2.0]}), "s"),
        (dict(kernel="ssmax", kernel_params=2.0), "kernel_params"),
        (dict(kernel="flash"), "kernel"),
    ],
)
def test_bad_kernel_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        af.Attention(np.eye(2), np.eye(2), np.eye(2), **kwargs)


def test_kernel_parameter_is_a_leaf_no_recompile():
    traces = []

    @eqx.filter_jit
    def attn(m, x):
        traces.append(1)
        return m.attention(x)

    x = jnp.asarray(np.random.default_rng(7).normal(size=(6, 2)))
    outs = [
        attn(
            af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="ssmax", kernel_params={"s": s}), x
        )
        for s in (0.5, 1.0, 3.0)
    ]
    assert len(traces) == 1
    assert not np.allclose(np.asarray(outs[0]), np.asarray(outs[2]))
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="ssmax")
    assert float(m.kernel_params["s"]) == 1.0 and m.kernel_params["s"].dtype == m.dtype


@pytest.mark.parametrize("name", CLASSIC)
def test_log_logit_bound_bounds_what_the_kernel_exponentiates(name):
    rng = np.random.default_rng(8)
    for scale in (0.1, 1.0, 30.0):
        q, k = scale * rng.normal(size=(50, 3)), scale * rng.normal(size=(64, 3))
        qq, kk = K.prepare(name, jnp.asarray(q), jnp.asarray(k))
        L = np.asarray(K.logits(qq, kk, 1.3))
        n = k.shape[0]
        if name == "ssmax":
            eff = 2.0 * math.log(n) * L
        elif name == "sigmoid":
            eff = L - math.log(n)
        elif name == "adaptive":
            eff = L * np.asarray(K.adaptive_inverse_temperature(jnp.asarray(L)))[:, None]
        elif name == "usa":  # the bound is of log of the largest weight, max L - log n
            eff = np.exp(np.minimum(L.max() - math.log(n), 700.0))
        else:
            eff = L
        bound = float(
            K.log_logit_bound(
                jnp.asarray(q),
                jnp.asarray(k),
                1.3,
                kernel=name,
                params={"s": 2.0} if name == "ssmax" else None,
            )
        )
        assert np.log(np.max(np.abs(eff))) <= bound + 1e-12


def test_qknorm_bound_is_beta_p_whatever_the_tokens():
    q = 1e150 * np.random.default_rng(9).normal(size=(8, 5))
    b = float(K.log_logit_bound(jnp.asarray(q), jnp.asarray(q), 0.5, kernel="qknorm"))
    assert math.isclose(b, math.log(0.5 * 5), rel_tol=1e-12)
    b_soft = float(K.log_logit_bound(jnp.asarray(q), jnp.asarray(q), 0.5))
    assert b_soft > 600


def test_qknorm_never_overflows_where_softmax_does():
    # float32, V = 2 I, rescaled frame: softmax logits grow like e^{4t} and pass e^84 near
    # t = 21; qknorm logits stay within beta p.
    f32 = np.float32
    Q = np.eye(2, dtype=f32)
    V = 2 * np.eye(2, dtype=f32)
    x0 = np.random.default_rng(10).uniform(-1, 1, (6, 2)).astype(f32)
    soft = af.simulate(af.Attention(Q, Q, V), x0, 30.0, method="euler", dt=0.25)
    assert soft.status == "overflow"
    qk = af.simulate(af.Attention(Q, Q, V, kernel="qknorm"), x0, 30.0, method="euler", dt=0.25)
    assert qk.ok and np.all(np.isfinite(np.asarray(qk.z)))


# ------------------------------------------------- NaN rows, softmax with its parts
def test_rms_normalize_non_finite_rows_give_nan_zero_rows_zero():
    """A regression: a NaN row used to come out as zeros (its max is NaN, which failed
    the `> 0` test), a plausible finite row."""
    u = jnp.array([[np.nan, 1.0, 2.0], [0.0, 0.0, 0.0], [-np.inf, 1.0, 0.0], [1.0, 2.0, 2.0]])
    r = np.asarray(K.rms_normalize(u))
    assert np.all(np.isnan(r[0])) and np.all(np.isnan(r[2]))
    assert np.all(r[1] == 0.0)
    np.testing.assert_allclose(r[3], np_rms(np.array([[1.0, 2.0, 2.0]]))[0], rtol=1e-15)


def test_qknorm_attention_of_nan_tokens_is_nan_not_uniform():
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="qknorm")
    x = np.random.default_rng(0).uniform(-1, 1, (5, 2))
    x[3] = np.nan
    P = np.asarray(m.attention(jnp.asarray(x)))
    assert np.all(np.isnan(P[3]))  # the NaN query's row
    assert np.all(np.isnan(P[:, 3]))  # and the NaN key in every row
    assert not np.any(np.isfinite(P.sum(-1)))


def _np_logsumexp(L):
    m = L.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(L - m).sum(axis=-1, keepdims=True)))[..., 0]


def test_softmax_parts_is_softmax_with_its_max_and_normaliser():
    L = jnp.asarray(np.random.default_rng(1).normal(size=(3, 7, 9)) * 4)
    parts = K.softmax_parts(L)
    np.testing.assert_array_equal(np.asarray(parts.P), np.asarray(K.softmax(L)))
    jit_parts = eqx.filter_jit(K.softmax_parts)(L)
    np.testing.assert_array_equal(np.asarray(jit_parts.P), np.asarray(eqx.filter_jit(K.softmax)(L)))
    Ln = np.asarray(L)
    np.testing.assert_array_equal(np.asarray(parts.max), Ln.max(-1))
    np.testing.assert_allclose(
        np.asarray(parts.log_norm), _np_logsumexp(Ln) - Ln.max(-1), rtol=1e-14, atol=4e-15
    )
    np.testing.assert_allclose(np.asarray(parts.P), np_softmax(Ln), rtol=1e-13)


def test_log_mass_against_numpy_logsumexp():
    rng = np.random.default_rng(2)
    L = rng.normal(size=(40, 12)) * 30  # masses down to ~1e-300
    keep = rng.random((40, 12)) < 0.4
    keep[0] = False  # nothing kept: -inf
    keep[1] = True  # everything: log 1 = 0
    got = np.asarray(K.log_mass(jnp.asarray(L), jnp.asarray(keep), K.softmax_parts(jnp.asarray(L))))
    ref = np.array(
        [_np_logsumexp(L[i][keep[i]][None])[0] if keep[i].any() else -np.inf for i in range(40)]
    ) - _np_logsumexp(L)
    assert got[0] == -np.inf and abs(got[1]) < 1e-15
    np.testing.assert_allclose(got[2:], ref[2:], rtol=1e-13, atol=1e-14)
    # where the mass is representable it is the sum of the weights softmax gives
    P = np.asarray(K.softmax(jnp.asarray(L)))
    mass = np.where(keep, P, 0.0).sum(-1)
    ok = mass > 1e-300
    np.testing.assert_allclose(np.exp(got[ok]), mass[ok], rtol=1e-12)


def test_log_mass_uses_the_band_of_softmax_on_huge_logits():
    """Logits of 1e20 carry ~1e4 of rounding: entries within 8 eps |max| of a max are
    ties, weight e^0 in softmax and in the log-masses alike (never NaN)."""
    big = 1e20
    L = jnp.array([[big, big - 1e3, big - 1e6, 0.0]])
    parts = K.softmax_parts(L)
    np.testing.assert_array_equal(np.asarray(parts.P)[0, :2], [0.5, 0.5])
    assert np.asarray(parts.P)[0, 2] == 0.0
    off_top = np.asarray(K.log_mass(L, jnp.array([[False, True, True, True]]), parts))
    np.testing.assert_allclose(off_top, [math.log(0.5)], rtol=1e-15)  # the tie's half
    rest = np.asarray(K.log_mass(L, jnp.array([[False, False, True, True]]), parts))
    gap = float(np.float64(big - 1e6) - np.float64(big))  # -999424: 1e20 has ulp 16384
    np.testing.assert_allclose(rest, [gap - math.log(2.0)], rtol=1e-15)
