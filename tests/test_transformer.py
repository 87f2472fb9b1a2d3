"""Multi-head attention, feed-forward layers, blocks, masks, layers without the skip
connection and forward Euler on the frame's ODE, each against plain numpy written here
(tests/reference.py holds the softmax and the matrix exponential)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from reference import expm, softmax_rows

import attnflow as af
from attnflow.dynamics import kernels

RNG = np.random.default_rng(15)
H, P_, D, N = 3, 2, 3, 7
QS = RNG.normal(size=(H, P_, D)) / 2
KS = RNG.normal(size=(H, P_, D)) / 2
VS = RNG.normal(size=(H, D, D)) / 2
X0 = RNG.normal(size=(N, D))


# ------------------------------------------------------------------ numpy oracles
def np_keep(n, mask):
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if mask is None:
        return np.ones((n, n), bool)
    if mask == "causal":
        return j <= i
    return np.abs(i - j) <= mask[1]


def np_P(x, Q, K, beta=1.0, mask=None):
    L = beta * (x @ Q.T) @ (x @ K.T).T
    L = np.where(np_keep(len(x), mask), L, -np.inf)
    return softmax_rows(L)


def np_mha(x, Qs, Ks, Vs, beta=1.0, mask=None):
    return sum(np_P(x, Q, K, beta, mask) @ x @ V.T for Q, K, V in zip(Qs, Ks, Vs))


def np_act(name, u):
    if name == "relu":
        return np.maximum(u, 0.0)
    if name == "tanh":
        return np.tanh(u)
    erf = np.vectorize(math.erf)
    return 0.5 * u * (1.0 + erf(u / math.sqrt(2.0)))


def np_ff(x, W1, b1, W2, b2, act):
    return np_act(act, x @ W1.T + b1) @ W2.T + b2


FF_W1 = RNG.normal(size=(5, D))
FF_B1 = RNG.normal(size=5)
FF_W2 = RNG.normal(size=(D, 5)) / 3
FF_B2 = RNG.normal(size=D) / 3


# ------------------------------------------------------------------------ fields
def test_multi_head_field_and_attention_against_numpy():
    m = af.MultiHeadAttention(QS, KS, VS, beta=0.7)
    np.testing.assert_allclose(
        np.asarray(m.vector_field(jnp.asarray(X0))), np_mha(X0, QS, KS, VS, 0.7), rtol=1e-12
    )
    A = np.asarray(m.attention(jnp.asarray(X0)))
    assert A.shape == (H, N, N)
    for h in range(H):
        np.testing.assert_allclose(A[h], np_P(X0, QS[h], KS[h], 0.7), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(m.W), VS.sum(0), rtol=1e-15)


@pytest.mark.parametrize("act", ["relu", "gelu", "tanh"])
def test_feedforward_field_against_numpy(act):
    f = af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2, activation=act)
    got = np.asarray(f.vector_field(jnp.asarray(X0)))
    np.testing.assert_allclose(got, np_ff(X0, FF_W1, FF_B1, FF_W2, FF_B2, act), rtol=1e-12)


def test_block_field_is_the_sum_and_a_layer_is_attention_then_feedforward():
    m = af.MultiHeadAttention(QS, KS, VS)
    f = af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2, activation="tanh")
    b = af.Block(m, f)
    x = jnp.asarray(X0)
    ffn = lambda y: np_ff(y, FF_W1, FF_B1, FF_W2, FF_B2, "tanh")  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(b.vector_field(x)), np_mha(X0, QS, KS, VS) + ffn(X0), rtol=1e-12
    )
    dt = 0.1
    traj = af.simulate(b, X0, 0.3, ts=[0.0, 0.1, 0.3], frame="original", method="euler", dt=dt)
    y = X0.copy()
    for _ in range(3):
        y = y + dt * np_mha(y, QS, KS, VS)  # attention sub-step
        y = y + dt * ffn(y)  # then feed-forward on its result
    np.testing.assert_allclose(np.asarray(traj.x[-1]), y, rtol=1e-12)
    # the other order differs at O(dt^2): the test can tell the two apart
    w = X0.copy()
    for _ in range(3):
        w = w + dt * ffn(w)
        w = w + dt * np_mha(w, QS, KS, VS)
    assert np.abs(w - y).max() > 1e-6


# ------------------------------------------------------------------------- masks
@pytest.mark.parametrize("mask", ["causal", ("window", 1), ("window", 0)])
def test_masked_attention_dense_and_tiled_against_numpy(mask):
    Q, K, V = QS[0].T @ QS[0], KS[0].T @ KS[0], VS[0]
    n = 37
    x = RNG.normal(size=(n, D))
    want_P = np_P(x, Q, K, 1.3, mask)
    assert np.all(want_P[~np_keep(n, mask)] == 0)
    want = want_P @ x @ V.T
    for block in (0, 8):  # dense, then tiles of 8 rows (the last one padded)
        a = af.Attention(Q, K, V, beta=1.3, mask=mask, block=block)
        np.testing.assert_allclose(np.asarray(a.vector_field(jnp.asarray(x))), want, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(a.attention(jnp.asarray(x))), want_P, rtol=1e-12)
        m = af.MultiHeadAttention(QS, KS, VS, mask=mask, block=block)
        np.testing.assert_allclose(
            np.asarray(m.vector_field(jnp.asarray(x))),
            np_mha(x, QS, KS, VS, 1.0, mask),
            rtol=1e-12,
        )


def test_masked_tiled_attend_matches_dense_for_every_kernel():
    n = 29
    q, k = RNG.normal(size=(n, 2)), RNG.normal(size=(n, 2))
    vals = RNG.normal(size=(n, 3))
    tileable = [k for k in kernels.KERNELS if kernels.get(k).rowwise and k != "differential"]
    for i, name in enumerate(tileable):
        for mask in ((("causal",), ("window", 3))[i % 2],):
            dense = kernels.attend(name, q, k, 0.9, vals, block=0, mask=mask)
            tiled = kernels.attend(name, q, k, 0.9, vals, block=5, mask=mask)
            np.testing.assert_allclose(np.asarray(tiled), np.asarray(dense), rtol=1e-12, atol=1e-15)
            assert np.all(np.isfinite(np.asarray(dense)))


def test_unmasked_attention_is_bit_identical_to_mask_none_default():
    a = af.Attention(QS[0].T @ KS[0], np.eye(D), VS[0])
    b = af.Attention(QS[0].T @ KS[0], np.eye(D), VS[0], mask=None)
    t1 = af.simulate(a, X0, 1.0, method="euler", dt=0.1)
    t2 = af.simulate(b, X0, 1.0, method="euler", dt=0.1)
    np.testing.assert_array_equal(np.asarray(t1.z), np.asarray(t2.z))
    assert "mask" not in a.describe()


def test_causal_first_token_moves_alone():
    """Under a causal mask token 0 sees only itself: x_0 <- (I + dt V) x_0 per layer."""
    V = VS[1]
    a = af.Attention(np.eye(D), np.eye(D), V, mask="causal")
    traj = af.simulate(a, X0, 1.5, frame="original", method="euler", dt=0.1)
    want = np.linalg.matrix_power(np.eye(D) + 0.1 * V, 15) @ X0[0]
    np.testing.assert_allclose(np.asarray(traj.x[-1, 0]), want, rtol=1e-12)
    # with a window of 0 every token is alone
    b = af.Attention(np.eye(D), np.eye(D), V, mask=("window", 0))
    tb = af.simulate(b, X0, 1.5, frame="original", method="euler", dt=0.1)
    want = X0 @ np.linalg.matrix_power(np.eye(D) + 0.1 * V, 15).T
    np.testing.assert_allclose(np.asarray(tb.x[-1]), want, rtol=1e-12)


# ----------------------------------------------------------- h = 1 equals Attention
@pytest.mark.parametrize("frame", ["original", "rescaled"])
@pytest.mark.parametrize(
    "method", [pytest.param("adaptive", marks=pytest.mark.slow), "euler", "euler-ode"]
)
def test_one_head_equals_attention_in_both_frames(frame, method):
    Q, K, V = QS[0].T @ QS[0] + np.eye(D), KS[0].T @ KS[0] + np.eye(D), VS[0]
    a = af.Attention(Q, K, V)
    m = af.MultiHeadAttention(Q[None], K[None], V[None])
    kw = {"dt": 0.1} if method != "adaptive" else {"rtol": 1e-11, "atol": 1e-13}
    ta = af.simulate(a, X0, 2.0, ts=[0.0, 1.0, 2.0], frame=frame, method=method, **kw)
    tm = af.simulate(m, X0, 2.0, ts=[0.0, 1.0, 2.0], frame=frame, method=method, **kw)
    assert ta.ok and tm.ok
    for arr_a, arr_m in ((ta.x, tm.x), (ta.z, tm.z)):
        np.testing.assert_allclose(np.asarray(arr_m), np.asarray(arr_a), rtol=1e-8, atol=1e-9)


# ------------------------------------------------------------------- rescaled W
@pytest.mark.slow
def test_multi_head_rescaled_frame_is_e_minus_tW_of_the_original():
    W = np.diag([0.3, -0.2, 0.1])
    m = af.MultiHeadAttention(QS, KS, VS, W=W)
    to = af.simulate(m, X0, 1.0, ts=[0.0, 0.5, 1.0], frame="original", rtol=1e-11, atol=1e-13)
    tr = af.simulate(m, X0, 1.0, ts=[0.0, 0.5, 1.0], frame="rescaled", rtol=1e-11, atol=1e-13)
    for j, t in enumerate([0.0, 0.5, 1.0]):
        z = np.asarray(to.x[j]) @ expm(-t * W).T
        np.testing.assert_allclose(np.asarray(tr.z[j]), z, rtol=1e-8, atol=1e-9)
        np.testing.assert_allclose(np.asarray(to.z[j]), z, rtol=1e-8, atol=1e-9)


def test_rescaled_layers_with_a_given_W_are_R_minus_k_of_the_original():
    W = np.diag([0.3, -0.2, 0.1])
    m = af.MultiHeadAttention(QS, KS, VS, W=W)
    to = af.simulate(m, X0, 0.5, frame="original", method="euler", dt=0.1)
    tr = af.simulate(m, X0, 0.5, frame="rescaled", method="euler", dt=0.1)
    Rk = np.linalg.matrix_power(np.eye(D) + 0.1 * W, 5)
    z = np.asarray(to.x[-1]) @ np.linalg.inv(Rk).T
    np.testing.assert_allclose(np.asarray(tr.z[-1]), z, rtol=1e-10, atol=1e-12)


def test_block_rescaled_layers_equal_the_original_layers_rescaled():
    m = af.MultiHeadAttention(QS, KS, VS)
    b = af.Block(m, af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2, activation="gelu"))
    dt, k = 0.1, 10
    to = af.simulate(b, X0, dt * k, frame="original", method="euler", dt=dt)
    tr = af.simulate(b, X0, dt * k, frame="rescaled", method="euler", dt=dt)
    R = np.eye(D) + dt * VS.sum(0)
    z = np.asarray(to.x[-1]) @ np.linalg.inv(np.linalg.matrix_power(R, k)).T
    np.testing.assert_allclose(np.asarray(tr.z[-1]), z, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(tr.x[-1]), np.asarray(to.x[-1]), rtol=1e-10)


# ------------------------------------------------------ layers without the skip
def test_residual_false_layers_against_numpy():
    Q, K, V = QS[0].T @ QS[0], KS[0].T @ KS[0], VS[0]
    a = af.Attention(Q, K, V)
    traj = af.simulate(a, X0, 0.4, ts=[0.0, 0.2, 0.4], frame="original", method="euler", dt=0.1,
                       residual=False)  # fmt: skip
    x = X0.copy()
    xs = [x]
    for _ in range(4):
        x = np_P(x, Q, K) @ x @ V.T
        xs.append(x)
    np.testing.assert_allclose(np.asarray(traj.x), np.stack(xs)[[0, 2, 4]], rtol=1e-12)
    assert traj.solver["residual"] is False and not traj.has_z
    with pytest.raises(ValueError, match="skip connection"):
        _ = traj.z
    # multi-head and block: x <- sum_h P^h x V_h^T, then the feed-forward without skip
    b = af.Block(af.MultiHeadAttention(QS, KS, VS), af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2))
    tb = af.simulate(b, X0, 0.2, frame="original", method="euler", dt=0.1, residual=False)
    y = X0.copy()
    for _ in range(2):
        y = np_ff(np_mha(y, QS, KS, VS), FF_W1, FF_B1, FF_W2, FF_B2, "relu")
    np.testing.assert_allclose(np.asarray(tb.x[-1]), y, rtol=1e-12)


# ------------------------------------------------------------ forward Euler on the ODE
def test_euler_ode_rescaled_frame_against_numpy_loop():
    Q, K, V = QS[0].T @ QS[0], KS[0].T @ KS[0], VS[0]
    a = af.Attention(Q, K, V)
    dt, k = 0.1, 12
    traj = af.simulate(a, X0, dt * k, frame="rescaled", method="euler-ode", dt=dt)
    z = X0.copy()
    for step in range(k):
        x = z @ expm(step * dt * V).T
        P = np_P(x, Q, K)
        z = z + dt * (P @ z - z) @ V.T  # z_i += dt sum_j P_ij V (z_j - z_i)
    np.testing.assert_allclose(np.asarray(traj.z[-1]), z, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        np.asarray(traj.x[-1]), z @ expm(dt * k * V).T, rtol=1e-10, atol=1e-12
    )
    # it is not the discrete transformer
    layers = af.simulate(a, X0, dt * k, frame="rescaled", method="euler", dt=dt)
    assert np.abs(np.asarray(layers.z[-1]) - z).max() > 1e-6


def test_euler_ode_original_frame_is_euler_for_one_head_and_unsplit_for_a_block():
    a = af.Attention(QS[0].T @ QS[0], KS[0].T @ KS[0], VS[0])
    e = af.simulate(a, X0, 1.0, frame="original", method="euler", dt=0.1)
    o = af.simulate(a, X0, 1.0, frame="original", method="euler-ode", dt=0.1)
    np.testing.assert_allclose(np.asarray(o.x), np.asarray(e.x), rtol=1e-13)
    f = af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2, activation="tanh")
    m = af.MultiHeadAttention(QS, KS, VS)
    tb = af.simulate(af.Block(m, f), X0, 0.3, frame="original", method="euler-ode", dt=0.1)
    y = X0.copy()
    for _ in range(3):
        y = y + 0.1 * (np_mha(y, QS, KS, VS) + np_ff(y, FF_W1, FF_B1, FF_W2, FF_B2, "tanh"))
    np.testing.assert_allclose(np.asarray(tb.x[-1]), y, rtol=1e-12)


def test_euler_ode_multi_head_rescaled_against_numpy_loop():
    m = af.MultiHeadAttention(QS, KS, VS)
    W = VS.sum(0)
    dt, k = 0.1, 8
    traj = af.simulate(m, X0, dt * k, frame="rescaled", method="euler-ode", dt=dt)
    z = X0.copy()
    for step in range(k):
        E = expm(step * dt * W)
        x = z @ E.T
        z = z + dt * (np.linalg.solve(E, np_mha(x, QS, KS, VS).T).T - z @ W.T)
    np.testing.assert_allclose(np.asarray(traj.z[-1]), z, rtol=1e-10, atol=1e-12)


# -------------------------------------------------------------- save and load
@pytest.mark.parametrize(
    "make",
    [
        lambda: af.MultiHeadAttention(QS, KS, VS, mask=("window", 2), beta=0.5),
        lambda: af.MultiHeadAttention(QS, KS, VS, W=np.eye(D)),
        lambda: af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2, activation="gelu"),
        lambda: af.Block(
            af.Attention(QS[0].T @ KS[0], np.eye(D), VS[0], mask="causal"),
            af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2),
        ),
        lambda: af.Block(af.MultiHeadAttention(QS, KS, VS)),
    ],
)
def test_save_load_round_trip(tmp_path, make):
    model = make()
    frame = "original" if model.propagator is None else "rescaled"
    traj = af.simulate(model, X0, 0.5, frame=frame, method="euler", dt=0.1)
    back = af.Trajectory.load(traj.save(tmp_path / "run.npz"))
    assert type(back.model) is type(model)
    assert back.model.describe() == model.describe()
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))
    x = jnp.asarray(X0)
    np.testing.assert_array_equal(
        np.asarray(back.model.vector_field(x)), np.asarray(model.vector_field(x))
    )


def test_trajectory_attention_is_per_head():
    m = af.MultiHeadAttention(QS, KS, VS)
    traj = af.simulate(m, X0, 0.5, frame="original", method="euler", dt=0.1)
    A = np.asarray(traj.attention(-1))
    assert A.shape == (H, N, N)
    x = np.asarray(traj.x[-1])
    for h in range(H):
        np.testing.assert_allclose(A[h], np_P(x, QS[h], KS[h]), rtol=1e-12)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "mask, match",
    [
        ("diagonal", "mask must be None"),
        (("window", -1), "w >= 0"),
        (("window", 1.5), "w >= 0"),
        (3, "mask must be None"),
    ],  # fmt: skip
)
def test_bad_masks_are_refused(mask, match):
    with pytest.raises(ValueError, match=match):
        af.Attention(np.eye(2), np.eye(2), np.eye(2), mask=mask)
    with pytest.raises(ValueError, match=match):
        af.MultiHeadAttention(QS, KS, VS, mask=mask)


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="Q and K must both be"):
        af.MultiHeadAttention(QS[:2], KS, VS)
    with pytest.raises(ValueError, match="W must be"):
        af.MultiHeadAttention(QS, KS, VS, W=np.eye(2))
    with pytest.raises(ValueError, match="beta"):
        af.MultiHeadAttention(QS, KS, VS, beta=-1.0)
    with pytest.raises(ValueError, match="activation"):
        af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2, activation="swish")
    with pytest.raises(ValueError, match="feed-forward shapes"):
        af.FeedForward(FF_W1, FF_B1, FF_W2.T, FF_B2)
    with pytest.raises(ValueError, match="attention must be"):
        af.Block(af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2))
    with pytest.raises(ValueError, match="d = 3"):
        af.Block(
            af.Attention(np.eye(2), np.eye(2), np.eye(2)),
            af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2),
        )
    f = af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2)
    with pytest.raises(ValueError, match="rescaled frame"):
        af.simulate(f, X0, 1.0)
    with pytest.raises(ValueError, match="no attention matrix"):
        f.attention(jnp.asarray(X0))
    a = af.Attention(np.eye(D), np.eye(D), VS[0])
    with pytest.raises(ValueError, match="residual=False"):
        af.simulate(a, X0, 1.0, frame="rescaled", method="euler", dt=0.1, residual=False)
    with pytest.raises(ValueError, match="residual=False"):
        af.simulate(a, X0, 1.0, frame="original", residual=False)
    with pytest.raises(ValueError, match="residual must be"):
        af.simulate(a, X0, 1.0, residual="no")
    with pytest.raises(ValueError, match="dt is required for method='euler-ode'"):
        af.simulate(a, X0, 1.0, method="euler-ode")


# ------------------------------------------------------------------ analyses
def test_predict_regime_reports_per_head_and_summed_spectra():
    m = af.MultiHeadAttention(QS, KS, VS)
    r = af.predict_regime(m)
    assert r.label == "unclassified" and r.theorem is None
    assert f"{H} heads" in r.reason
    for h in range(H):
        w = np.linalg.eigvals(VS[h])
        lead = w[np.argmax(np.abs(w))]
        assert f"head {h}: [{lead.real:.4g}" in r.reason
    ws = np.linalg.eigvals(VS.sum(0))
    np.testing.assert_allclose(np.sort_complex(r.eigenvalues), np.sort_complex(ws), rtol=1e-10)
    f = af.FeedForward(FF_W1, FF_B1, FF_W2, FF_B2)
    assert "feed-forward term" in af.predict_regime(af.Block(m, f)).reason
    assert af.predict_regime(f).label == "unclassified"
    # one head and no feed-forward term: that head's theorem
    one = af.MultiHeadAttention(np.eye(D)[None], np.eye(D)[None], np.eye(D)[None])
    assert af.predict_regime(one).label == af.predict_regime(af.Attention(*[np.eye(D)] * 3)).label
    assert af.predict_regime(one).label == "polytope"


def test_track_rank_and_dispersion_per_head_against_numpy():
    m = af.MultiHeadAttention(QS, KS, VS)
    traj = af.simulate(m, X0, 1.0, ts=[0.0, 0.5, 1.0], frame="original", method="euler", dt=0.1)
    xs = np.asarray(traj.x)
    with pytest.raises(ValueError, match="pass head="):
        af.track_rank(traj)
    for h in (0, 2):
        rt = af.track_rank(traj, head=h)
        want = np.stack([np_P(x, QS[h], KS[h]).argmax(1) for x in xs])
        np.testing.assert_array_equal(rt.attends_to, want)
        rep = af.dispersion(traj, k=-1, head=h)
        np.testing.assert_allclose(rep.max, np_P(xs[-1], QS[h], KS[h]).max(1), rtol=1e-12)


def test_dispersion_and_rank_of_a_masked_model_see_the_mask():
    Q, K = QS[0].T @ QS[0], KS[0].T @ KS[0]
    a = af.Attention(Q, K, VS[0], mask=("window", 1))
    traj = af.simulate(a, X0, 0.5, frame="original", method="euler", dt=0.1)
    x = np.asarray(traj.x[-1])
    P = np_P(x, Q, K, 1.0, ("window", 1))
    for block in (None, 3):
        rep = af.dispersion(traj, k=-1, block=block)
        np.testing.assert_allclose(rep.max, P.max(1), rtol=1e-12)
        L = (x @ Q.T) @ (x @ K.T).T
        keep = np_keep(N, ("window", 1))
        spread = np.where(keep, L, -np.inf).max(1) - np.where(keep, L, np.inf).min(1)
        np.testing.assert_allclose(rep.delta, spread, rtol=1e-12)
    np.testing.assert_array_equal(af.track_rank(traj).attends_to[-1], P.argmax(1))


def test_observe_limit_uses_the_rescaling_matrix():
    m = af.MultiHeadAttention(QS, KS, VS)
    traj = af.simulate(m, X0, 1.0, ts=[0.0, 0.5, 1.0], frame="rescaled", method="euler", dt=0.1)
    obs = af.observe_limit(traj)
    assert obs.details["structure"] == af.spectral_structure(VS.sum(0)).kind
