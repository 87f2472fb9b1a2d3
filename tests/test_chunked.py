"""The tiled attention path (never the n x n matrix) against the dense path."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

import attnflow as af


def test_attend_tiles_equal_dense_and_numpy():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(301, 3)) for _ in range(3))
    dense = np.asarray(
        af.kernels.attend("softmax", jnp.asarray(q), jnp.asarray(k), 0.8, jnp.asarray(v), block=0)
    )
    want = ref.softmax_rows(0.8 * q @ k.T) @ v
    np.testing.assert_allclose(dense, want, rtol=1e-12, atol=1e-14)
    for block in (1, 16, 100, 300, 301, 1000):  # padding, exact fit, one tile
        tiled = np.asarray(
            af.kernels.attend(
                "softmax", jnp.asarray(q), jnp.asarray(k), 0.8, jnp.asarray(v), block=block
            )
        )
        np.testing.assert_allclose(tiled, dense, rtol=1e-12, atol=1e-14)


def test_auto_block_switches_on_size():
    assert af.kernels.auto_block(2048) == 0
    assert af.kernels.auto_block(4096) == 1024
    assert af.kernels.auto_block(65536) == 64
    assert af.kernels.auto_block(10**7) == 16


# the original frame's tiling is the same attend (kept in the slow suite)
@pytest.mark.parametrize("frame", ["rescaled", pytest.param("original", marks=pytest.mark.slow)])
def test_simulate_tiled_equals_dense(frame):
    rng = np.random.default_rng(1)
    V = np.array([[0.6, 0.3], [-0.2, 0.4]])
    Q = np.eye(2) + 0.2 * rng.normal(size=(2, 2))
    x0 = rng.uniform(-2, 2, (45, 2))
    ts = [0.0, 1.0, 2.0]
    dense = af.simulate(af.Attention(Q, np.eye(2), V, block=0), x0, 2.0, ts=ts, frame=frame)
    tiled = af.simulate(af.Attention(Q, np.eye(2), V, block=8), x0, 2.0, ts=ts, frame=frame)
    np.testing.assert_allclose(np.asarray(tiled.z), np.asarray(dense.z), rtol=1e-12, atol=1e-12)
    eul_d = af.simulate(
        af.Attention(Q, np.eye(2), V, block=0), x0, 2.0, method="euler", dt=0.1, frame=frame
    )
    eul_t = af.simulate(
        af.Attention(Q, np.eye(2), V, block=7), x0, 2.0, method="euler", dt=0.1, frame=frame
    )
    np.testing.assert_allclose(np.asarray(eul_t.z), np.asarray(eul_d.z), rtol=1e-12, atol=1e-12)


def test_bad_block():
    with pytest.raises(ValueError, match="block"):
        af.Attention(np.eye(2), np.eye(2), np.eye(2), block=-1)
