"""Statuses describe every array a user can read; a frame that leaves the float range is
+-inf there and says so, never NaN behind "ok"."""

from __future__ import annotations

import json
import warnings

import jax
import numpy as np
import pytest

import attnflow as af


def test_status_enum_is_the_string_vocabulary():
    assert af.Status.OK == "ok" and af.Status.MAX_STEPS == "max_steps"
    assert json.dumps({"s": af.Status.OVERFLOW}) == '{"s": "overflow"}'
    assert [s.code for s in af.Status] == list(range(5))
    from attnflow.dynamics.trajectory import STATUS_CODES

    assert STATUS_CODES == ("ok", "overflow", "max_steps", "nonfinite", "failed")


def _float32_run(V, frame, t1, kernel="softmax", ts=None):
    jax.config.update("jax_enable_x64", False)
    try:
        x0 = np.random.default_rng(0).uniform(-1, 1, (5, 2)).astype(np.float32)
        model = af.Attention(
            *(np.eye(2, dtype=np.float32),) * 2, V.astype(np.float32), kernel=kernel
        )
        ts = np.linspace(0, t1, 7) if ts is None else np.asarray(ts)
        traj = af.simulate(model, x0, t1, ts=ts, frame=frame)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            z, x = np.asarray(traj.z), np.asarray(traj.x)
        return traj, z, x, caught
    finally:
        jax.config.update("jax_enable_x64", True)


def test_float32_original_frame_z_overflows_to_signed_inf_not_nan():
    """V = -8 I, original frame, float32: x -> 0 and z = e^{8t} x passes 3.4e38 after
    t ~ 11. Before: traj.z was NaN with status "ok"."""
    traj, z, x, caught = _float32_run(-8 * np.eye(2), "original", 60.0)
    assert traj.status == "ok" and traj.ok  # the solve itself succeeded
    assert not np.isnan(z).any() and not np.isnan(x).any()
    assert traj.status_of("z") == af.Status.OVERFLOW and traj.status_of("x") == "ok"
    assert any("traj.z leaves the float32 range" in str(w.message) for w in caught)
    # where finite, z = e^{8t} x exactly as a float64 reference says; beyond, the sign
    ts = np.asarray(traj.ts, np.float64)
    ref = np.exp(8 * ts)[:, None, None] * x.astype(np.float64)
    finite = np.isfinite(z)
    assert (~finite).any()
    np.testing.assert_allclose(z[finite], ref[finite], rtol=1e-5)
    big = ~finite
    assert np.all(np.sign(z[big]) == np.sign(ref[big]))
    assert np.all(np.abs(ref[big]) > np.finfo(np.float32).max)


def test_complex_modes_beyond_the_range_keep_their_signs():
    """A decaying complex pair -1 +- 2i, original frame, float32: z = e^{-tV} x passes
    3.4e38 at t ~ 89 while x is still representable; there z is +-inf with the signs of
    the rotation e^{-tV} = e^t [[cos 2t, -sin 2t], [sin 2t, cos 2t]]."""
    a, b = -1.0, 2.0
    V = np.array([[a, b], [-b, a]])
    traj, z, x, _ = _float32_run(V, "original", 96.0, ts=[0.0, 40.0, 80.0, 92.0, 96.0])
    assert traj.ok
    assert not np.isnan(z).any() and np.isinf(z).any()
    assert traj.status_of("z") == af.Status.OVERFLOW
    for j, t in enumerate(np.asarray(traj.ts, np.float64)):
        M = np.exp(-t * a) * np.array(
            [[np.cos(b * t), -np.sin(b * t)], [np.sin(b * t), np.cos(b * t)]]
        )
        want = x[j].astype(np.float64) @ M.T
        fin = np.isfinite(z[j])
        np.testing.assert_allclose(z[j][fin], want[fin], rtol=2e-3, atol=1e-30)
        big = ~fin
        assert np.all(np.abs(want[big]) > 1e38)
        assert np.all(np.sign(z[j][big]) == np.sign(want[big]))


def test_status_of_names_the_array():
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    traj = af.simulate(model, np.eye(2), 0.5)
    assert traj.status_of("state") == "ok"
    with pytest.raises(ValueError, match="name must be one of"):
        traj.status_of("y")


@pytest.mark.parametrize(
    "Q, V, kernel",
    [
        (np.zeros((2, 2)), np.eye(2), "softmax"),  # uniform attention: logits stay 0
        (np.eye(2), np.eye(2), "qknorm"),  # normalised queries and keys: logits bounded
        (np.zeros((2, 2)), np.array([[1.0, 1.0], [0.0, 1.0]]), "softmax"),  # a Jordan V
    ],
)
def test_rescaled_tokens_leaving_the_range_stop_as_overflow(Q, V, kernel):
    """When the logits stay bounded, the tokens x = e^{tV} z leave the float64 range
    first (|e^{tV}| passes 1.8e308 near t = 709 for lambda = 1): the solve stops there
    as "overflow" (before, its field was 0 * inf and it used up max_steps)."""
    x0 = np.random.default_rng(0).uniform(-1, 1, (5, 2))
    model = af.Attention(Q, Q, V, kernel=kernel)
    traj = af.simulate(model, x0, 800.0, ts=np.linspace(0.0, 800.0, 9))
    assert traj.status == af.Status.OVERFLOW
    t_stop = float(np.asarray(traj.t_stop).reshape(-1)[0])
    # stopped within the guard's margin (e^4) of where the first token's size leaves it
    assert 690.0 < t_stop < np.log(np.finfo(np.float64).max)
    assert np.all(np.isfinite(np.asarray(traj.z)[:-1]))  # the saves before t_stop are kept
