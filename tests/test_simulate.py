"""simulate() against the numpy reference, theorem invariants, batches and failures."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

import attnflow as af

RNG = np.random.default_rng(20231)

V_CASES = {
    "identity": np.eye(2),
    "symmetric": np.array([[0.8, 0.3], [0.3, -0.4]]),
    "non-normal": np.array([[1.0, 2.0], [0.0, 0.5]]),
    "complex": np.array([[0.3, -1.0], [1.0, 0.3]]),
    "jordan": np.array([[0.7, 1.0], [0.0, 0.7]]),
    "paper-3d-re-neg": af.matrices.PAPER["paper-3d-re-neg"],
}


def _weights(V, seed):
    d = V.shape[0]
    rng = np.random.default_rng(seed)
    Q = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    K = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    return Q, K


# every V in the rescaled frame; in the original frame (whose field does not depend on
# V's spectral structure) three of them in the default suite, all six with -m slow
ORIGINAL_SLOW = ("identity", "symmetric", "paper-3d-re-neg")


@pytest.mark.parametrize(
    "name, frame",
    [(n, "rescaled") for n in V_CASES]
    + [
        pytest.param(n, "original", marks=[pytest.mark.slow] if n in ORIGINAL_SLOW else [])
        for n in V_CASES
    ],
)
def test_matches_numpy_reference(name, frame):
    V = V_CASES[name]
    d = V.shape[0]
    Q, K = _weights(V, 1)
    x0 = np.random.default_rng(2).uniform(-1.5, 1.5, (6, d))
    ts = np.array([0.0, 0.5, 1.25, 2.0])
    model = af.Attention(Q, K, V, beta=0.7)
    traj = af.simulate(model, x0, 2.0, ts=ts, frame=frame, rtol=1e-10, atol=1e-12)
    assert traj.ok, traj.status
    if frame == "rescaled":
        want = ref.rk4(ref.field_rescaled, x0, ts, 2e-3, Q, K, V, 0.7)
        got = np.asarray(traj.z)
    else:
        want = ref.rk4(ref.field_original, x0, ts, 2e-3, Q, K, V, 0.7)
        got = np.asarray(traj.x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * max(1, np.abs(want).max()))
    # The other frame is the exact change of variables x = e^{tV} z.
    for k, t in enumerate(ts):
        E = ref.expm(t * V)
        np.testing.assert_allclose(
            np.asarray(traj.x[k]), np.asarray(traj.z[k]) @ E.T, rtol=1e-10, atol=1e-10
        )


def test_both_frames_agree():
    V = V_CASES["non-normal"]
    Q, K = _weights(V, 3)
    x0 = RNG.uniform(-1, 1, (8, 2))
    ts = np.linspace(0, 3, 7)
    m = af.Attention(Q, K, V)
    a = af.simulate(m, x0, 3.0, ts=ts, frame="rescaled", rtol=1e-10, atol=1e-12)
    b = af.simulate(m, x0, 3.0, ts=ts, frame="original", rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(a.x), np.asarray(b.x), rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(np.asarray(a.z), np.asarray(b.z), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("name", ["symmetric", "non-normal", "complex"])
def test_euler_matches_numpy_and_discrete_rescaling_is_exact(name):
    V = V_CASES[name]
    Q, K = _weights(V, 4)
    x0 = RNG.uniform(-2, 2, (7, 2))
    dt, layers = 0.1, 30
    m = af.Attention(Q, K, V)
    ts = np.arange(layers + 1) * dt
    orig = af.simulate(m, x0, layers * dt, ts=ts, method="euler", dt=dt, frame="original")
    resc = af.simulate(m, x0, layers * dt, ts=ts, method="euler", dt=dt, frame="rescaled")
    want = ref.euler_original(x0, Q, K, V, dt, layers)
    np.testing.assert_allclose(np.asarray(orig.x), want, rtol=1e-12, atol=1e-12)
    # z^k = (I + dt V)^{-k} x^k, with x^k from the independent numpy transformer.
    R = np.eye(2) + dt * V
    for k in range(layers + 1):
        zk = np.linalg.solve(np.linalg.matrix_power(R, k), want[k].T).T
        scale = max(1.0, np.abs(zk).max())
        np.testing.assert_allclose(np.asarray(resc.z[k]), zk, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(
            np.asarray(resc.x[k]), want[k], rtol=0, atol=1e-12 * max(1, np.abs(want[k]).max())
        )


def test_hull_never_grows_for_identity():
    """V = Q = K = I: max_i <w, z_i> never increases, for any direction w."""
    x0 = RNG.uniform(-5, 5, (20, 2))
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    ts = np.linspace(0, 6, 121)
    traj = af.simulate(m, x0, 6.0, ts=ts, rtol=1e-9, atol=1e-11)
    assert traj.ok
    z = np.asarray(traj.z)
    angles = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    W = np.stack([np.cos(angles), np.sin(angles)])
    support = (z @ W).max(axis=1)  # (m, directions)
    assert np.all(np.diff(support, axis=0) <= 1e-8)
    # ... and it genuinely shrinks somewhere (the test could fail).
    assert np.any(support[-1] < support[0] - 1e-2)


# the frames are the same dynamics (test_both_frames_agree): one in the default suite
@pytest.mark.parametrize("frame", ["rescaled", pytest.param("original", marks=pytest.mark.slow)])
def test_order_preserved_in_one_dimension(frame):
    x0 = np.sort(RNG.uniform(-3, 3, (15, 1)), axis=0)
    m = af.Attention([[1.3]], [[0.8]], [[1.0]])
    ts = np.linspace(0, 8, 81)
    traj = af.simulate(m, x0, 8.0, ts=ts, frame=frame)
    assert traj.ok
    z = np.asarray(traj.z)[..., 0]
    assert np.all(np.diff(z, axis=1) > 0)


def test_negative_identity_collapses_to_origin():
    x0 = RNG.uniform(-2, 2, (10, 2))
    I = np.eye(2)
    m = af.Attention(I, I, -I)
    ts = np.array([0.0, 5.0, 20.0, 80.0])
    traj = af.simulate(m, x0, 80.0, ts=ts, frame="original")
    assert traj.ok
    radius = np.abs(np.asarray(traj.x)).max(axis=(1, 2))
    assert np.all(np.diff(radius) < 0)
    assert radius[-1] < 0.2 * radius[0]
    # The mean decays like e^{-t} exactly: sum_i dx_i = -sum_i (sum_j P_ij x_j) is not
    # e^{-t} in general, but the centroid of a converged cluster is, so the spread
    # (slow, ~t^{-1/2}) dominates: check it is the spread that remains.
    x = np.asarray(traj.x[-1])
    assert np.linalg.norm(x.mean(axis=0)) < 1e-3


def test_batch_equals_one_by_one():
    V = V_CASES["complex"]
    Q, K = _weights(V, 5)
    x0 = RNG.uniform(-2, 2, (3, 9, 2))
    x0[2] *= 3.0  # a stiffer system: it must choose its own steps
    m = af.Attention(Q, K, V)
    ts = np.linspace(0, 4, 5)
    batch = af.simulate(m, x0, 4.0, ts=ts)
    assert batch.z.shape == (3, 5, 9, 2)
    steps = []
    for b in range(3):
        one = af.simulate(m, x0[b], 4.0, ts=ts)
        # same steps, same arithmetic up to the blocking of batched matmuls
        np.testing.assert_allclose(
            np.asarray(batch.z[b]), np.asarray(one.z), rtol=1e-10, atol=1e-10
        )
        assert int(batch.stats["num_steps"][b]) == int(one.stats["num_steps"])
        steps.append(int(one.stats["num_steps"]))
    assert len(set(steps)) > 1  # each system adapted its own steps


def test_euler_batch_equals_one_by_one():
    V = V_CASES["non-normal"]
    Q, K = _weights(V, 6)
    x0 = RNG.uniform(-2, 2, (4, 5, 2))
    m = af.Attention(Q, K, V)
    batch = af.simulate(m, x0, 2.0, method="euler", dt=0.05)
    for b in range(4):
        one = af.simulate(m, x0[b], 2.0, method="euler", dt=0.05)
        np.testing.assert_allclose(
            np.asarray(batch.z[b]), np.asarray(one.z), rtol=1e-11, atol=1e-12
        )


def test_attention_matrix_matches_reference():
    V = V_CASES["symmetric"]
    Q, K = _weights(V, 7)
    x0 = RNG.uniform(-1, 1, (6, 2))
    m = af.Attention(Q, K, V, beta=2.0)
    traj = af.simulate(m, x0, 1.0, ts=[0.0, 0.5, 1.0])
    for k in range(3):
        P = np.asarray(traj.attention(k))
        np.testing.assert_allclose(
            P, ref.attention(np.asarray(traj.x[k]), Q, K, 2.0), rtol=1e-12, atol=1e-14
        )
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-13)
    batch = af.simulate(m, np.stack([x0, -x0]), 1.0)
    assert batch.attention(-1).shape == (2, 6, 6)


def test_float32_runs_and_agrees_with_float64():
    V = V_CASES["non-normal"]
    Q, K = _weights(V, 8)
    x0 = RNG.uniform(-1, 1, (6, 2))
    m64 = af.Attention(Q, K, V)
    m32 = af.Attention(*(np.asarray(a, np.float32) for a in (Q, K, V)))
    assert m32.dtype == jnp.float32
    a = af.simulate(m64, x0, 2.0, rtol=1e-10, atol=1e-12)
    b = af.simulate(m32, x0, 2.0, rtol=1e-5, atol=1e-7)
    assert b.z.dtype == jnp.float32 and b.ok
    np.testing.assert_allclose(np.asarray(b.z), np.asarray(a.z), rtol=0, atol=1e-4)


def test_overflow_gives_status_not_nan():
    I = np.eye(2, dtype=np.float32)
    m = af.Attention(I, I, I)
    x0 = RNG.uniform(-5, 5, (12, 2))
    ts = np.linspace(0, 100, 11)
    for method, kw in [("adaptive", {}), ("euler", {"dt": 0.1})]:
        traj = af.simulate(m, x0, 100.0, ts=ts, method=method, **kw)
        assert traj.status == "overflow" and not traj.ok
        # e^{2t} |x|^2 reaches the float32 limit (~e^88) near t = 40
        assert 35 < float(traj.t_stop[0]) < 46
        assert np.all(np.isfinite(np.asarray(traj.z)))
        assert np.all(np.isfinite(np.asarray(traj.x)))
        assert float(traj.ts[-1]) == pytest.approx(float(traj.t_stop[0]))
        assert np.all(np.asarray(traj.ts[:-1]) <= 40)  # the saves before the stop are kept
        with pytest.raises(af.SimulationError, match="x64"):
            traj.raise_for_status()
    # In a batch: per-system status, unreached saves NaN and flagged.
    ts = np.linspace(0, 50, 11)  # the small system overflows only near t = 59
    batch = af.simulate(m, np.stack([x0, 1e-8 * x0]), 50.0, ts=ts)
    assert batch.statuses == ("overflow", "ok")
    assert batch.status == "overflow (1 of 2)"
    assert not batch.reached[0, -1] and batch.reached[1].all()
    assert np.all(np.isnan(np.asarray(batch.z[0, -1])))
    assert np.all(np.isfinite(np.asarray(batch.z[1])))


def test_max_steps_status_keeps_partial_result():
    m = af.Attention(np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"])
    x0 = RNG.uniform(-5, 5, (10, 2))
    traj = af.simulate(m, x0, 50.0, ts=np.linspace(0, 50, 6), max_steps=50)
    assert traj.status == "max_steps"
    assert 0 < float(traj.t_stop[0]) < 50
    assert np.all(np.isfinite(np.asarray(traj.z)))
    with pytest.raises(af.SimulationError, match="max_steps"):
        traj.raise_for_status()


def test_progress_bar(capfd):
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x0 = RNG.uniform(-1, 1, (4, 2))
    af.simulate(m, x0, 1.0, method="euler", dt=0.01, progress=True)
    err = capfd.readouterr().err
    assert "100/100" in err


def test_save_writes_metadata(tmp_path):
    import json

    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    traj = af.simulate(m, RNG.uniform(-1, 1, (4, 2)), 1.0)
    traj.save(tmp_path / "r.npz", seed=3)
    with np.load(tmp_path / "r.npz") as f:
        meta = json.loads(str(f["metadata"]))
        assert f["z"].shape == (2, 4, 2)
    assert meta["extra"]["seed"] == 3 and meta["run"]["versions"]["x64"] is True
    assert meta["run"]["solver"]["rtol"] == 1e-6 and meta["run"]["status"] == "ok"


BAD_SIMULATE = [
    (dict(x0=np.zeros((3,))), "x0"),
    (dict(x0=np.zeros((3, 5))), "x0"),
    (dict(x0=np.full((3, 2), np.nan)), "x0"),
    (dict(x0=np.zeros((3, 2), complex)), "x0"),
    (dict(t1=-1.0), "t1"),
    (dict(t1=float("nan")), "t1"),
    (dict(ts=[0.5, 0.1]), "ts"),
    (dict(ts=[0.0, 2.0]), "ts"),
    (dict(frame="lab"), "frame"),
    (dict(method="rk45"), "method"),
    (dict(method="euler"), "dt"),
    (dict(method="euler", dt=0.3), "t1"),
    (dict(method="euler", dt=0.25, ts=[0.1]), "ts"),
]


@pytest.mark.parametrize("kwargs,word", BAD_SIMULATE)
def test_bad_simulate_input_names_the_argument(kwargs, word):
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    args = dict(x0=np.zeros((3, 2)), t1=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=word):
        af.simulate(m, args.pop("x0"), args.pop("t1"), **args)


def test_singular_discrete_rescaling_is_refused():
    m = af.Attention(np.eye(2), np.eye(2), -10 * np.eye(2))
    with pytest.raises(ValueError, match="singular"):
        af.simulate(m, np.ones((2, 2)), 1.0, method="euler", dt=0.1)
    # the original frame is fine
    assert af.simulate(m, np.ones((2, 2)), 1.0, method="euler", dt=0.1, frame="original").ok


def test_rescaled_frame_keeps_precision_with_mixed_spectrum():
    """The paper's 128x128 set-up in small: a symmetric V with eigenvalues of both signs.

    In the rescaled frame the coordinates along negative eigenvalues diverge; in the
    standard basis their rounding would swamp the leading mode within ~100 layers. The
    modal coordinates keep x = R^k z accurate to rounding against the numpy transformer.
    """
    d = n = 24
    V = af.matrices.paper_128(seed=1, d=d, density=0.3)
    w = np.linalg.eigvalsh(V)
    assert w.min() < -1 and w.max() > 2
    x0 = np.random.default_rng(0).uniform(-0.5, 0.5, (n, d))
    dt, layers = 0.1, 150
    m = af.Attention(np.eye(d), np.eye(d), V)
    traj = af.simulate(m, x0, layers * dt, ts=[0.0, 5.0, 10.0, 15.0], method="euler", dt=dt)
    assert traj.ok and traj.coords == "modal"
    want = ref.euler_original(x0, np.eye(d), np.eye(d), V, dt, layers)
    for k, layer in enumerate([0, 50, 100, 150]):
        err = np.abs(np.asarray(traj.x[k]) - want[layer]).max() / np.abs(want[layer]).max()
        assert err < 1e-11, (layer, err)
