"""``Trajectory.save`` / ``Trajectory.load`` round trip bit for bit, and ``to_xarray``."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import attnflow as af


def _same(a, b):
    """Bit-for-bit equality of two arrays (NaN where NaN, same dtype and shape)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True)


def _check_round_trip(traj, path, **extra):
    written = traj.save(path, seed=7, **extra)
    back = af.Trajectory.load(written)
    for name in ("ts", "z", "x", "state", "reached", "t_stop", "x0"):
        _same(getattr(traj, name), getattr(back, name))
    assert back.statuses == traj.statuses and back.status == traj.status
    assert back.ok == traj.ok and back.batched == traj.batched
    assert back.frame == traj.frame and back.coords == traj.coords
    assert back.solver == traj.solver and back.t1 == traj.t1
    assert set(back.stats) == set(traj.stats)
    for k, v in traj.stats.items():
        _same(v, back.stats[k])
    for name in ("Q", "K", "V", "beta"):
        _same(getattr(traj.model, name), getattr(back.model, name))
    assert back.model.kernel == traj.model.kernel
    assert back.model.propagator.method == traj.model.propagator.method
    for k, v in traj.model.kernel_params.items():
        _same(v, back.model.kernel_params[k])
    _same(traj.attention(-1), back.attention(-1))
    meta = back.saved_metadata
    assert meta["extra"]["seed"] == 7 and meta["run"]["versions"]["x64"] is True
    assert meta["run"]["coords"] == traj.coords and meta["format_version"] == 2
    # the metadata written equals the metadata of the run, extras included
    fresh = json.loads(json.dumps(traj.metadata(seed=7, **extra)))
    for key in ("frame", "solver", "t1", "status", "statuses", "n", "d", "batch", "dtype", "stats"):
        assert meta["run"][key] == fresh["run"][key], key
    assert meta["model"] == fresh["model"] and meta["extra"] == fresh["extra"]
    assert meta["model"]["V"] == np.asarray(traj.model.V).tolist()
    return back


@pytest.mark.parametrize("frame", ["rescaled", "original"])
def test_round_trip_adaptive_one_system(tmp_path, frame):
    V = np.array([[1.2, 0.3], [-0.4, 0.5]])
    model = af.Attention(np.eye(2), np.eye(2), V, beta=1.5)
    x0 = np.random.default_rng(0).uniform(-1, 1, (6, 2))
    traj = af.simulate(model, x0, 2.0, ts=np.linspace(0, 2, 5), frame=frame)
    assert traj.ok
    _check_round_trip(traj, tmp_path / "a" / "b" / "run.npz")  # parents created


def test_round_trip_euler_batch_with_failures(tmp_path):
    """A batch where some systems overflow: NaN-filled unreached saves, per-system
    statuses and steps, the discrete maps R^k, and ssmax's kernel parameter."""
    V = np.diag([3.0, -0.5])
    model = af.Attention(np.eye(2), np.eye(2), V, kernel="ssmax", kernel_params={"s": 0.7})
    rng = np.random.default_rng(1)
    x0 = rng.uniform(-1, 1, (3, 5, 2)) * np.array([1.0, 1e140, 1.0])[:, None, None]
    traj = af.simulate(model, x0, 40.0, ts=np.arange(0, 40.5, 4.0), method="euler", dt=0.5)
    assert not traj.ok and "overflow" in traj.status
    back = _check_round_trip(traj, tmp_path / "batch", command="test")  # .npz appended
    assert (tmp_path / "batch.npz").is_file()
    assert back.saved_metadata["extra"]["command"] == "test"


def test_round_trip_standard_coordinates_euler(tmp_path):
    """A defective V (a Jordan block) has no modal basis: the state is in standard
    coordinates and the file keeps the R^k maps."""
    V = np.array([[1.0, 1.0], [0.0, 1.0]])
    model = af.Attention(np.eye(2), np.eye(2), V)
    x0 = np.random.default_rng(2).uniform(-1, 1, (4, 2))
    traj = af.simulate(model, x0, 1.0, ts=[0.0, 0.5, 1.0], method="euler", dt=0.1)
    back = _check_round_trip(traj, tmp_path / "jordan.npz")
    assert back.coords == traj.coords


def test_x0_kept_when_t0_not_saved(tmp_path):
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x0 = np.random.default_rng(3).uniform(-1, 1, (5, 2))
    traj = af.simulate(model, x0, 1.0, ts=[0.5, 1.0])
    np.testing.assert_array_equal(np.asarray(traj.x0), x0)
    back = af.Trajectory.load(traj.save(tmp_path / "r.npz"))
    np.testing.assert_array_equal(np.asarray(back.x0), x0)
    # the run can be reproduced from the file alone
    again = af.simulate(
        back.model,
        back.x0,
        back.t1,
        ts=np.asarray(back.ts),
        frame=back.frame,
        rtol=back.solver["rtol"],
        atol=back.solver["atol"],
    )
    _same(again.z, traj.z)


def test_save_refuses_a_directory_and_writes_atomically(tmp_path):
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    traj = af.simulate(model, np.eye(2), 0.5)
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        traj.save(tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
    traj.save(tmp_path / "out" / "r.npz")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["r.npz"]  # no temp left


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        af.Trajectory.load(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read"):
        af.Trajectory.load(bad)
    other = tmp_path / "other.npz"
    np.savez(other, a=np.zeros(3))
    with pytest.raises(ValueError, match="not written by Trajectory.save"):
        af.Trajectory.load(other)


def test_load_float64_without_x64_raises(tmp_path):
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    path = af.simulate(model, np.eye(2), 0.5).save(tmp_path / "r.npz")
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ValueError, match="x64"):
            af.Trajectory.load(path)
    finally:
        jax.config.update("jax_enable_x64", True)


@pytest.mark.slow
def test_to_xarray(tmp_path):
    xr = pytest.importorskip("xarray")
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x0 = np.random.default_rng(4).uniform(-1, 1, (3, 4, 2))
    traj = af.simulate(model, x0, 1.0, ts=[0.0, 0.5, 1.0])
    ds = traj.to_xarray()
    assert isinstance(ds, xr.Dataset)
    assert ds["z"].dims == ("system", "time", "token", "coord")
    assert ds["z"].shape == (3, 3, 4, 2)
    np.testing.assert_array_equal(ds["x"].values, np.asarray(traj.x))
    np.testing.assert_array_equal(ds["time"].values, np.asarray(traj.ts))
    np.testing.assert_array_equal(ds["token"].values, np.arange(4))
    np.testing.assert_array_equal(ds["coord"].values, np.arange(2))
    np.testing.assert_array_equal(ds["system"].values, np.arange(3))
    assert ds.sel(token=2, coord=1)["x"].shape == (3, 3)
    assert ds.attrs["frame"] == "rescaled" and json.loads(ds.attrs["statuses"]) == ["ok"] * 3
    assert ds.attrs["t1"] == 1.0 and json.loads(ds.attrs["solver"])["rtol"] == 1e-6
    assert json.loads(ds.attrs["model"]) == json.loads(json.dumps(model.describe()))
    assert json.loads(ds.attrs["extra"]) == {}
    ds.to_netcdf(tmp_path / "traj.nc")  # every attribute is a string or a number
    one = af.simulate(model, x0[0], 1.0).to_xarray()
    assert one["z"].dims == ("time", "token", "coord")


def test_extra_metadata_never_replaces_the_runs_own_keys(tmp_path):
    """save(p, frame=...) used to overwrite the run's frame: the reload then converted
    with the wrong frame. The caller's keys are kept apart, in metadata["extra"]."""
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    traj = af.simulate(m, np.random.default_rng(0).normal(size=(4, 2)), 0.5)
    mine = {"frame": "x", "kernel": "x", "t1": "x", "family": "x", "note": "kept", "seed": 3}
    back = af.Trajectory.load(traj.save(tmp_path / "r.npz", **mine))
    assert back.saved_metadata["extra"] == mine
    assert back.frame == "rescaled" and back.t1 == 0.5 and back.model.kernel.name == "softmax"
    assert back.saved_metadata["run"]["frame"] == "rescaled"
    assert back.saved_metadata["model"]["family"] == "Attention"
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))
