"""Property-based hostile inputs to the public API: every call either raises a
``ValueError`` whose message names the offending argument, or returns finite numbers (or
a status that says why not); never NaN behind "ok", never an XLA error."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnflow as af

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

MODEL = af.Attention(np.eye(2), np.eye(2), np.array([[1.0, 0.2], [0.0, 0.5]]))
X0 = np.random.default_rng(0).uniform(-1, 1, (4, 2))

bad_scalars = st.one_of(
    st.sampled_from(
        [
            0.0,
            -1.0,
            -1e-300,
            math.nan,
            math.inf,
            -math.inf,
            "1e-6",
            None,
            [1e-9, 1e-9],
            (),
            True,
            1 + 2j,
            np.array([1.0, 2.0]),
        ]
    ),
    st.floats(max_value=0.0),
)


def _names(exc: Exception, name: str) -> bool:
    return name in str(exc)


@SETTINGS
@given(name=st.sampled_from(["t1", "dt"]), value=bad_scalars)
def test_bad_times_are_refused_by_name(name, value):
    kwargs = {"t1": 1.0, "method": "euler", "dt": 0.1}
    kwargs[name] = value
    t1 = kwargs.pop("t1")
    if name == "dt" and value is None:
        match = "dt is required"
    else:
        match = name
    with pytest.raises(ValueError, match=match):
        af.simulate(MODEL, X0, t1, **kwargs)


@SETTINGS
@given(name=st.sampled_from(["rtol", "atol"]), value=bad_scalars)
def test_bad_tolerances_are_refused_by_name(name, value):
    kwargs = {"rtol": 1e-6, "atol": 1e-9, name: value}
    if isinstance(value, float) and value == 0.0:
        # one zero tolerance is legitimate (pure absolute or pure relative control)
        af.simulate(MODEL, X0, 0.5, **kwargs).raise_for_status()
        return
    with pytest.raises(ValueError) as info:
        af.simulate(MODEL, X0, 0.5, **kwargs)
    assert _names(info.value, name) or "rtol and atol" in str(info.value)


@SETTINGS
@given(
    value=st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=2**31),
        st.sampled_from([None, 10.7, "100", True, math.nan]),
    )
)
def test_bad_max_steps_is_refused_by_name(value):
    with pytest.raises(ValueError, match="max_steps"):
        af.simulate(MODEL, X0, 0.5, max_steps=value)


@SETTINGS
@given(
    x0=st.one_of(
        st.sampled_from(
            [
                [],
                [[]],
                [1.0, 2.0],
                "tokens",
                [[1, 2], [3]],
                np.zeros((2, 3)),
                np.full((3, 2), np.nan),
                np.array([[1 + 1j, 0], [0, 1]]),
                np.zeros((1, 2, 3, 2)),
                np.array([["a", "b"]]),
            ]
        ),
    )
)
def test_bad_tokens_are_refused_by_name(x0):
    with pytest.raises(ValueError, match="x0"):
        af.simulate(MODEL, x0, 0.5)


@SETTINGS
@given(
    entries=st.lists(
        st.sampled_from([1e300, -1e300, math.nan, math.inf, 0.0, 1.0]), min_size=4, max_size=4
    )
)
def test_weights_are_finite_in_the_working_precision(entries):
    V = np.array(entries, dtype=np.float64).reshape(2, 2)
    if not np.all(np.isfinite(V)):
        with pytest.raises(ValueError, match="V"):
            af.Attention(np.eye(2), np.eye(2), V)
        return
    m = af.Attention(np.eye(2), np.eye(2), V)  # float64 here: every finite entry fits
    assert np.all(np.isfinite(np.asarray(m.V)))


@SETTINGS
@given(
    k=st.one_of(
        st.integers(min_value=-10, max_value=10), st.sampled_from([1.5, "0", None, np.int64(1)])
    )
)
def test_saved_indices_are_checked_not_clamped(k):
    traj = af.simulate(MODEL, X0, 0.5, ts=[0.0, 0.25, 0.5])
    valid = isinstance(k, (int, np.integer)) and not isinstance(k, bool) and -3 <= k < 3
    if valid:
        P = np.asarray(traj.attention(k))
        assert np.all(np.isfinite(P)) and np.allclose(P.sum(-1), 1.0)
        return
    with pytest.raises(ValueError, match="k"):
        traj.attention(k)


@SETTINGS
@given(system=st.integers(min_value=-6, max_value=6))
def test_system_index_of_a_batch_is_checked(system):
    batch = np.stack([X0, -X0])
    traj = af.simulate(MODEL, batch, 0.5)
    if -2 <= system < 2:
        got = np.asarray(traj.project(np.eye(2), system=system))
        np.testing.assert_allclose(got, np.asarray(traj.z[system]), rtol=1e-12, atol=1e-12)
    else:
        with pytest.raises(ValueError, match="system"):
            traj.project(np.eye(2), system=system)


@SETTINGS
@given(
    scale=st.floats(min_value=1e-3, max_value=1e3),
    t1=st.floats(0.1, 5.0),
    frame=st.sampled_from(["rescaled", "original"]),
)
def test_valid_runs_are_finite_or_say_why(scale, t1, frame):
    traj = af.simulate(MODEL, scale * X0, t1, frame=frame)
    for name in ("x", "z"):
        a = np.asarray(getattr(traj, name))
        assert not np.isnan(a).any()
        if traj.status_of(name) == "ok":
            assert np.all(np.isfinite(a))


def test_weights_beyond_float32_are_refused_after_the_cast():
    """Finite in float64, infinite in float32: checked after the cast, not before."""
    import jax

    jax.config.update("jax_enable_x64", False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the once-per-process cast note
            with pytest.raises(ValueError, match="V has entries beyond the float32 range"):
                af.Attention(np.eye(2), np.eye(2), 1e300 * np.eye(2))
    finally:
        jax.config.update("jax_enable_x64", True)


def test_flags_and_indices_that_are_not_what_they_look_like():
    """progress='yes' was taken for True and unstack(st, 1.7) for model 1."""
    I2 = np.eye(2)
    m = af.Attention(I2, I2, I2)
    with pytest.raises(ValueError, match="progress must be True or False; got 'yes'"):
        af.simulate(m, I2, 0.1, progress="yes")
    with pytest.raises(ValueError, match="residual must be True or False"):
        af.simulate(m, I2, 0.1, method="euler", dt=0.1, residual=1)
    st = af.stack([m, af.Attention(I2, I2, 2 * I2)])
    with pytest.raises(ValueError, match="i must be an integer"):
        af.unstack(st, 1.7)
    with pytest.raises(IndexError, match="i = 2 is out of range for 2 stacked models"):
        af.unstack(st, 2)
    np.testing.assert_array_equal(np.asarray(af.unstack(st, -1).V), 2 * I2)
