"""The original-frame tokens of a rescaled run in V's modal coordinates, against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from reference import euler_original, expm, field_original, rk4


@pytest.mark.parametrize("method", ["euler", "adaptive"])
def test_rescaled_modal_run_gives_tokens_of_the_right_shape_and_value(method):
    """traj.x of a single (unbatched) system run in the modal rescaled frame is
    (m, n, d) and equals the original-frame tokens computed in numpy (a regression: the
    per-save modal factors were once broadcast into extra leading axes)."""
    import attnflow as af

    V = np.array([[0.64709742, 0.81911926], [0.61210449, 0.63263484]])
    Q, K = np.eye(2), np.eye(2)
    x0 = np.random.default_rng(0).uniform(-1, 1, (5, 2))
    ts = np.arange(11) * 0.1
    kw = {"dt": 0.1} if method == "euler" else {"rtol": 1e-10, "atol": 1e-12}
    traj = af.simulate(af.Attention(Q, K, V), x0, 1.0, ts=ts, method=method, **kw)
    assert traj.coords == "modal"
    x = np.asarray(traj.x)
    assert x.shape == (11, 5, 2) and np.asarray(traj.z).shape == (11, 5, 2)
    if method == "euler":
        ref = euler_original(x0, Q, K, V, 0.1, 10)
        np.testing.assert_allclose(x, ref, rtol=1e-12, atol=1e-12)
    else:
        ref = rk4(field_original, x0, ts, 1e-3, Q, K, V)
        np.testing.assert_allclose(x, ref, rtol=1e-8, atol=1e-9)
        z_ref = np.einsum("mnd,med->mne", ref, np.stack([expm(-t * V) for t in ts]))
        np.testing.assert_allclose(np.asarray(traj.z), z_ref, rtol=1e-8, atol=1e-9)


def test_singular_layer_map_has_no_rescaled_frame():
    """With I + dt V singular the layers run in the original frame, but z = R^{-k} x does
    not exist: traj.z raises naming it (it returned inf), traj.x is the run."""
    import attnflow as af

    V = np.array([[-10.0, 0.0], [0.0, 1.0]])  # dt = 0.1: R = diag(0, 1.1)
    model = af.Attention(np.eye(2), np.eye(2), V)
    x0 = np.random.default_rng(2).normal(size=(4, 2))
    traj = af.simulate(model, x0, 0.5, method="euler", dt=0.1, frame="original")
    assert not traj.has_z
    with pytest.raises(ValueError, match=r"I \+ dt V is singular for dt = 0.1"):
        _ = traj.z
    ref = euler_original(x0, np.eye(2), np.eye(2), V, 0.1, 5)
    np.testing.assert_allclose(np.asarray(traj.x[-1]), ref[-1], rtol=1e-12, atol=1e-14)
    # a regular step keeps its rescaled frame
    ok = af.simulate(model, x0, 0.5, method="euler", dt=0.05, frame="original")
    assert ok.has_z and np.all(np.isfinite(np.asarray(ok.z)))
