"""The kernels that escape (or alter) dispersion: linear, linearnorm, stickbreaking,
selective, differential, offbyone, prenorm, against plain-numpy references."""

import jax.numpy as jnp
import numpy as np
import pytest
from reference import euler_kernel, kernel_weights

import attnflow as af
from attnflow.analysis.dispersion import prenorm_logit_bound
from attnflow.dynamics import kernels as K
from attnflow.dynamics.frames import ModalRescaled

NEW = ("linear", "linearnorm", "stickbreaking", "selective", "differential", "offbyone", "prenorm")
ROW_SUM_ONE = {"linearnorm", "selective", "prenorm"}


def _model(name, d=4, seed=0, V=None, **kw):
    rng = np.random.default_rng(seed)
    Q = np.eye(d) + 0.5 * rng.normal(size=(d, d))
    Kk = np.eye(d) + 0.5 * rng.normal(size=(d, d))
    V = 0.3 * np.eye(d) if V is None else V
    return af.Attention(Q, Kk, V, beta=0.8, kernel=name, **kw), Q, Kk


def test_registry_entries_and_row_sums():
    assert set(NEW) <= set(K.KERNELS) and K.KERNELS[:5] == (
        "softmax",
        "qknorm",
        "ssmax",
        "sigmoid",
        "adaptive",
    )
    for name in NEW:
        assert K.row_stochastic(name) == (name in ROW_SUM_ONE)
        assert K.get(name).summary


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("mask", [None, "causal"])
def test_attention_matches_numpy(name, mask):
    if name == "differential" and mask is not None:
        with pytest.raises(ValueError, match="mask"):
            _model(name, mask=mask)
        return
    rng = np.random.default_rng(1)
    x = rng.normal(size=(13, 4))
    m, Q, Kk = _model(name, mask=mask)
    want = kernel_weights(name, x, Q, Kk, 0.8, mask=mask)
    got = np.asarray(m.attention(jnp.asarray(x)))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    sums = got.sum(-1)
    if name == "differential":
        np.testing.assert_allclose(sums, 0.8, rtol=1e-13)
    elif name in ROW_SUM_ONE:
        np.testing.assert_allclose(sums, 1.0, rtol=1e-13)
    elif name != "linear":
        assert np.all(sums < 1.0) and np.all(got >= 0)


@pytest.mark.parametrize("name", [n for n in NEW if n != "selective"])
def test_tiled_attend_is_exact(name):
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(157, 4)) for _ in range(3))
    args = (jnp.asarray(q), jnp.asarray(k), 0.7, jnp.asarray(v))
    dense = np.asarray(K.attend(name, *args, block=0))
    for block in (16, 50):  # padding and several tiles
        tiled = np.asarray(K.attend(name, *args, block=block))
        np.testing.assert_allclose(tiled, dense, rtol=1e-12, atol=1e-14)
    if name != "differential":
        tiled = np.asarray(K.attend(name, *args, block=16, mask=("causal",)))
        dense = np.asarray(K.attend(name, *args, block=0, mask=("causal",)))
        np.testing.assert_allclose(tiled, dense, rtol=1e-12, atol=1e-14)


def test_selective_refuses_tiles_and_partial_rows():
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(40, 2))) for _ in range(3))
    with pytest.raises(ValueError, match="block=0"):
        K.attend("selective", q, k, 1.0, v, block=8)
    with pytest.raises(ValueError, match="square"):
        K.weights("selective", K.logits(q[:5], k, 1.0))
    # dispersion of a few rows computes the full matrix and reads the rows
    m, Q, Kk = _model("selective", d=2, V=np.eye(2))
    x = rng.normal(size=(20, 2))
    rep = af.dispersion(m, x=x, rows=[4, 19], block=1)
    P = kernel_weights("selective", x, Q, Kk, 0.8)
    np.testing.assert_allclose(rep.max, P[[4, 19]].max(-1), rtol=1e-12)


@pytest.mark.parametrize("name", NEW)
def test_simulate_original_frame_matches_numpy_euler(name):
    rng = np.random.default_rng(4)
    V = np.diag([0.3, 0.2, -0.1, 0.1]) + np.diag([0.1, 0.0, 0.0], 1)
    if name == "linear":  # P grows like |x|^2: dx/dt ~ |x|^3 blows up in finite time
        V = 0.05 * V
    m, Q, Kk = _model(name, V=V, seed=5)
    x0 = rng.uniform(-1, 1, (9, 4))
    traj = af.simulate(m, x0, 0.5, frame="original", method="euler", dt=0.05)
    assert traj.ok
    want = euler_kernel(name, x0, Q, Kk, V, 0.05, 10, 0.8)
    np.testing.assert_allclose(np.asarray(traj.x[-1]), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ROW_SUM_ONE))
def test_rescaled_frame_agrees_with_original(name):
    rng = np.random.default_rng(6)
    V = np.array([[0.6, 0.3], [-0.2, 0.4]])
    m = af.Attention(np.eye(2), np.array([[1.0, 0.3], [0.0, 1.0]]), V, kernel=name)
    x0 = rng.uniform(-1, 1, (11, 2))
    a = af.simulate(m, x0, 2.0, frame="original", method="euler", dt=0.1)
    b = af.simulate(m, x0, 2.0, frame="rescaled", method="euler", dt=0.1)
    # x^k = (I + dt V)^k z^k: compare the states (z) of both runs
    R = np.linalg.matrix_power(np.eye(2) + 0.1 * V, 20)
    np.testing.assert_allclose(
        np.asarray(a.x[-1]), np.asarray(b.z[-1]) @ R.T, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("name", sorted(set(NEW) - ROW_SUM_ONE))
def test_rows_not_summing_to_one_refuse_the_rescaled_frame(name):
    m, _, _ = _model(name)
    with pytest.raises(ValueError, match="frame='original'"):
        af.simulate(m, np.ones((3, 4)), 1.0, frame="rescaled", method="euler", dt=0.1)


def test_prenorm_refuses_modal_coordinates_and_is_scale_invariant():
    m, Q, Kk = _model("prenorm", V=np.diag([0.5, 0.2, 0.1, -0.1]))
    with pytest.raises(ValueError, match="standard"):
        ModalRescaled(m)
    x = np.random.default_rng(7).normal(size=(10, 4))
    s = np.array([1e-3, 1.0, 1e3, 7.0, 0.2, 5.0, 1.0, 1.0, 2.0, 9.0])[:, None]
    np.testing.assert_allclose(
        np.asarray(m.attention(jnp.asarray(x))), np.asarray(m.attention(jnp.asarray(s * x))), 1e-12
    )


def test_prenorm_logits_within_beta_d_norm_qtk():
    rng = np.random.default_rng(8)
    d = 5
    Q, Kk = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    m = af.Attention(Q, Kk, np.eye(d), beta=0.6, kernel="prenorm")
    bound = 0.6 * d * np.linalg.norm(Q.T @ Kk, 2)
    assert np.isclose(prenorm_logit_bound(Q, Kk, beta=0.6), bound, rtol=1e-12)
    for scale in (1e-3, 1.0, 1e4):
        L = np.asarray(m.logits(jnp.asarray(scale * rng.normal(size=(300, d)))))
        assert np.max(np.abs(L)) <= bound * (1 + 1e-12)
    # attained: x = the top right singular vector of Q^T K (as a query) and its image
    U, S, Wt = np.linalg.svd(Q.T @ Kk)
    x = np.stack([U[:, 0], Wt[0]])
    L = np.asarray(m.logits(jnp.asarray(x)))
    assert np.isclose(abs(L[0, 1]), bound, rtol=1e-10)


@pytest.mark.parametrize("name", NEW)
def test_log_logit_bound_bounds_the_kernel_inputs(name):
    rng = np.random.default_rng(9)
    for scale in (0.1, 1.0, 30.0):
        m, _, _ = _model(name)
        x = jnp.asarray(scale * rng.normal(size=(40, 4)))
        q, k = m.queries_keys(x)
        L = np.asarray(m.logits(x))
        assert np.log(np.max(np.abs(L))) <= float(m.log_bound(q, k)) + 1e-12


def test_differential_lambda_is_a_leaf_and_head_must_split():
    m, _, _ = _model("differential", kernel_params={"lam": 0.5})
    assert float(m.kernel_params["lam"]) == 0.5
    np.testing.assert_allclose(np.asarray(m.attention(jnp.ones((6, 4)))).sum(-1), 0.5)
    with pytest.raises(ValueError, match="even"):
        af.Attention(np.eye(3), np.eye(3), np.eye(3), kernel="differential").attention(
            jnp.ones((4, 3))
        )


def test_stickbreaking_survives_huge_logits_in_log_space():
    # one key far above: weight ~1 on it, and every later key (sigmoid ~ 0) breaks nothing
    L = jnp.asarray([[-800.0, 900.0, -700.0, -750.0]])
    P = np.asarray(K.weights("stickbreaking", L))
    assert np.all(np.isfinite(P))
    np.testing.assert_allclose(P, [[0.0, 1.0, 0.0, 0.0]], atol=1e-300)
    P = np.asarray(K.weights("offbyone", jnp.asarray([[800.0, 0.0, -1e3]])))
    np.testing.assert_allclose(P, [[1.0, 0.0, 0.0]], atol=1e-300)
