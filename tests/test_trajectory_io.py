"""Trajectory files: the layout of version 2 (nested metadata, each weight stored once),
and the files written by attnflow 0.1.0 (tests/data/trajectory_v0_1_0, written by
tests/data/make_v010_files.py with the code of 0.1.0) loading as they were written."""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
from attnflow.io import trajectory_file

DATA = Path(__file__).parent / "data" / "trajectory_v0_1_0"
EXPECTED = json.loads((DATA / "expected.json").read_text())["files"]


def _digest(a) -> dict:
    """The digest of make_v010_files.py: dtype, shape, sha256 of the C-order bytes."""
    a = np.asarray(a)
    return {
        "dtype": a.dtype.str,
        "shape": list(a.shape),
        "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
    }


def _json(v):
    return json.loads(json.dumps(v))


def test_the_0_1_0_files_are_all_there_and_small():
    names = sorted(p.stem for p in DATA.glob("*.npz"))
    assert names == sorted(EXPECTED) and len(names) == 13
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 200_000
    for name in names:  # they are of the old layout: flat, "format": 1
        with np.load(DATA / f"{name}.npz") as f:
            meta = json.loads(str(f["metadata"]))
        assert meta["format"] == 1 and "format_version" not in meta and "run" not in meta


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_0_1_0_file_loads_as_it_was_written(name):
    want = EXPECTED[name]
    run = want["run"]
    back = af.Trajectory.load(DATA / f"{name}.npz")
    # the arrays the file holds come back bit for bit
    for key in ("ts", "state", "reached", "t_stop", "x0"):
        assert _digest(getattr(back, key)) == run["arrays"][key], key
    np.testing.assert_array_equal(np.asarray(back.ts), run["values"]["ts"])
    np.testing.assert_array_equal(
        np.asarray(back.state)[..., -1, :, :], run["values"]["state_last"]
    )
    # the frames computed from the state: what 0.1.0 computed and stored beside it
    with np.load(DATA / f"{name}.npz") as f:
        stored = {k: f[k] for k in ("x", "z") if k in f.files}
    for key, arr in stored.items():
        assert _digest(arr) == run["arrays"][key], key  # the file is the one written
        np.testing.assert_allclose(np.asarray(getattr(back, key)), arr, rtol=1e-12, atol=0)
    assert back.has_z == ("z" in run["arrays"])
    # statuses, the run's settings and statistics
    assert [str(s) for s in back.statuses] == run["statuses"]
    assert str(back.status) == run["status"] and back.ok == (run["status"] == "ok")
    assert back.frame == run["frame"] and back.coords == run["coords"]
    assert back.batched == run["batched"] and back.t1 == run["t1"]
    assert back.solver == run["solver"]
    assert set(back.stats) == set(run["stats"])
    for key, stat in run["stats"].items():
        value = back.stats[key]
        assert _digest(value) == {k: stat[k] for k in ("dtype", "shape", "sha256")}, key
        assert isinstance(value, int) == (stat["python"] == "int"), key
    # the model: its family, weights bit for bit, kernel and mask
    model = back.model
    assert type(model).__name__ == run["type"]
    arrays = model.arrays()
    assert set(arrays) == set(run["model_arrays"])
    for key, d in run["model_arrays"].items():
        assert _digest(arrays[key]) == d, key
    assert _json(model.describe()) == run["describe"]
    head = model.attn if isinstance(model, af.Block) else model
    assert head.kernel.name == run["kernel"]["name"]
    assert (
        _json({k: np.asarray(v).tolist() for k, v in head.kernel.params().items()})
        == (run["kernel"]["params"])
    )
    assert (None if head.mask is None else _json(head.mask.describe())) == run["mask"]
    np.testing.assert_allclose(
        np.asarray(back.attention(-1)), run["attention_last_values"], rtol=1e-12, atol=0
    )
    # the metadata, nested: the run's keys, the model's description, the caller's keys
    flat = want["metadata"]
    meta = back.saved_metadata
    assert meta["format"] == "attnflow.trajectory" and meta["format_version"] == 1
    assert set(meta) == {"format", "format_version", "run", "model", "extra"}
    assert meta["run"] == {k: flat[k] for k in trajectory_file.RUN_KEYS if k in flat}
    assert back.wall_seconds is None  # not recorded by 0.1.0
    assert meta["model"] == run["describe"]
    assert meta["extra"] == want["extra"]
    assert meta["run"]["versions"]["attnflow"] == "0.1.0"


def test_a_0_1_0_file_saved_again_is_version_2_and_the_same_run(tmp_path):
    old = af.Trajectory.load(DATA / "ssmax_causal.npz")
    new = af.Trajectory.load(old.save(tmp_path / "again.npz", **old.saved_metadata["extra"]))
    assert new.saved_metadata["format_version"] == 2
    for key in ("ts", "state", "reached", "t_stop", "x0", "x", "z"):
        assert _digest(getattr(new, key)) == _digest(getattr(old, key)), key
    assert new.saved_metadata["model"] == old.saved_metadata["model"]
    run_old, run_new = old.saved_metadata["run"], new.saved_metadata["run"]
    # the same run; its wall time was not recorded by 0.1.0 and stays unknown
    assert run_new.pop("wall_seconds") is None and "wall_seconds" not in run_old
    assert {k: v for k, v in run_new.items() if k != "versions"} == {
        k: v for k, v in run_old.items() if k != "versions"
    }


# ----------------------------------------------------------------- version 2
def _block_run():
    rng = np.random.default_rng(5)
    att = af.Attention(
        rng.normal(size=(2, 2)),
        rng.normal(size=(2, 2)),
        rng.normal(size=(2, 2)),
        kernel="ssmax",
        kernel_params={"s": 2.0},
        mask="causal",
    )
    ff = af.FeedForward(
        rng.normal(size=(3, 2)), rng.normal(size=3), rng.normal(size=(2, 3)), rng.normal(size=2)
    )
    x0 = rng.uniform(-1, 1, (4, 2))
    return af.simulate(af.Block(att, ff), x0, 0.5, frame="original", method="euler", dt=0.25)


def test_version_2_nests_the_metadata_and_stores_each_weight_once(tmp_path):
    traj = _block_run()
    path = traj.save(tmp_path / "b.npz", seed=3, frame="mine")
    with np.load(path) as f:
        record = json.loads(str(f["metadata"]))
        files = set(f.files)
        W1 = f["model.feedforward.W1"]
    assert record["format"] == "attnflow.trajectory" and record["format_version"] == 2
    assert set(record) == {"format", "format_version", "saved", "run", "model", "extra"}
    assert set(record["run"]) == set(trajectory_file.RUN_KEYS)
    # when and by which command line the file was written, and the run's wall time
    saved_at = datetime.datetime.fromisoformat(record["saved"]["at"])
    assert abs((datetime.datetime.now(datetime.UTC) - saved_at).total_seconds()) < 600
    assert record["saved"]["command"] == [str(a) for a in sys.argv]
    assert record["run"]["wall_seconds"] > 0
    assert record["run"]["frame"] == "original"  # the caller's "frame" is its own key
    assert record["extra"] == {"seed": 3, "frame": "mine"}
    # the weights: once, as arrays; the JSON refers to them
    model = record["model"]
    assert model["attention"]["Q"] == {
        "array": "model.attention.Q",
        "shape": [2, 2],
        "dtype": "float64",
    }
    assert model["feedforward"]["b1"] == {
        "array": "model.feedforward.b1",
        "shape": [3],
        "dtype": "float64",
    }
    assert model["attention"]["kernel_params"] == {"s": 2.0}  # scalars stay readable
    assert model["attention"]["beta"] == 1.0 and model["attention"]["mask"] == ["causal"]
    text = json.dumps(record)
    for value in np.asarray(traj.model.ffn.W1).ravel():
        assert repr(float(value)) not in text  # no weight is written in the JSON
    np.testing.assert_array_equal(W1, np.asarray(traj.model.ffn.W1))
    assert {"model.attention.Q", "model.feedforward.W2", "state", "ts"} <= files
    # loaded: the references resolved, the metadata that metadata() gave
    back = af.Trajectory.load(path)
    meta = back.saved_metadata
    assert meta["format_version"] == 2
    fresh = _json(traj.metadata(seed=3, frame="mine"))
    assert meta["model"] == fresh["model"] and meta["extra"] == fresh["extra"]
    assert {k: v for k, v in meta["run"].items() if k != "versions"} == {
        k: v for k, v in fresh["run"].items() if k != "versions"
    }
    assert meta["model"]["feedforward"]["W1"] == np.asarray(traj.model.ffn.W1).tolist()
    assert meta["saved"] == record["saved"] and back.wall_seconds == traj.wall_seconds
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))
    assert back.stats == {k: v for k, v in traj.stats.items()}


def test_metadata_is_nested_with_the_description_and_extras():
    traj = _block_run()
    meta = traj.metadata(seed=1, note="n")
    assert set(meta) == {"run", "model", "extra"}
    assert meta["extra"] == {"seed": 1, "note": "n"}
    assert meta["model"] == traj.model.describe()
    run = meta["run"]
    assert run["solver"] == {"method": "euler", "dt": 0.25, "layers": 2}
    assert run["n"] == 4 and run["d"] == 2 and run["batch"] is None
    assert run["dtype"] == "float64" and run["versions"]["x64"] is True
    assert run["statuses"] == ["ok"] and run["t_stop"] == [0.5] and run["t1"] == 0.5


def test_a_newer_version_is_refused_with_what_to_do(tmp_path):
    path = _block_run().save(tmp_path / "b.npz")
    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    record = json.loads(str(data.pop("metadata")))
    for version, match in [
        (3, "format version 3, newer than this attnflow reads .* upgrade attnflow"),
        ("2", "not a trajectory file"),
    ]:
        np.savez(
            tmp_path / "new.npz", metadata=json.dumps({**record, "format_version": version}), **data
        )
        with pytest.raises(ValueError, match=match):
            af.Trajectory.load(tmp_path / "new.npz")
    np.savez(tmp_path / "other.npz", metadata=json.dumps({**record, "format": "x"}), **data)
    with pytest.raises(ValueError, match=r"not a trajectory file .*\(format 'x'"):
        af.Trajectory.load(tmp_path / "other.npz")


def _before_the_hash(arrays: dict) -> dict:
    """The arrays of a file as attnflow wrote it before trajectory files carried a hash:
    no ``sha256`` array and no ``saved`` record (which came later, always with a hash)."""
    import json

    meta = json.loads(str(arrays["metadata"]))
    meta.pop("saved", None)
    out = {k: v for k, v in arrays.items() if k != "sha256"}
    out["metadata"] = np.asarray(json.dumps(meta))
    return out


def test_a_missing_weight_array_is_named(tmp_path):
    path = _block_run().save(tmp_path / "b.npz")
    with np.load(path) as f:
        # as a file written before the hash (which would name the change first)
        data = _before_the_hash({k: f[k] for k in f.files if k != "model.attention.V"})
    np.savez(tmp_path / "cut.npz", **data)
    with pytest.raises(ValueError, match="'model.attention.V', which it does not hold"):
        af.Trajectory.load(tmp_path / "cut.npz")


def test_extra_keys_that_are_not_json_are_refused_by_name(tmp_path):
    traj = _block_run()
    with pytest.raises(ValueError, match=r"\['x'\] cannot be written as JSON"):
        traj.save(tmp_path / "b.npz", seed=1, x=np.zeros(2))
    assert not (tmp_path / "b.npz").exists()


def test_saved_runs_follow_the_umask(tmp_path):
    """A run is written under a private temporary name and renamed: it must end with the
    mode of any new file (0666 minus the umask), so colleagues on a shared directory can
    read it."""
    import os
    import stat

    tr = af.simulate(af.Attention(np.eye(2), np.eye(2), 0.5 * np.eye(2)), np.eye(2), 0.1)
    old = os.umask(0o022)
    try:
        for mask in (0o022, 0o077, 0o002):
            os.umask(mask)
            p = tr.save(tmp_path / f"r{mask:o}.npz")
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o666 & ~mask
    finally:
        os.umask(old)


def _rewrite(src, dst, **change):
    """Copy the .npz at src to dst with some arrays replaced (the hash kept as it was)."""
    with np.load(src, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    data.update(change)
    np.savez(dst, **data)


def test_a_file_checks_its_hash_and_its_consistency(tmp_path):
    """Saved runs carry a SHA-256 of their metadata and arrays: an altered state is named,
    not loaded; a file without the hash (written before it existed) still loads, but
    non-finite states under 'ok' statuses are refused; malformed metadata is one error
    naming the file."""
    import json

    tr = af.simulate(af.Attention(np.eye(2), np.eye(2), 0.5 * np.eye(2)), np.eye(2) + 0.1, 0.5)
    p = tr.save(tmp_path / "a.npz")
    with np.load(p) as f:
        state = f["state"]
    bad = state.copy()
    bad[0, -1, 0, 0] += 1e-9
    _rewrite(p, tmp_path / "b.npz", state=bad)
    with pytest.raises(ValueError, match=r"b\.npz' does not match the hash"):
        af.Trajectory.load(tmp_path / "b.npz")
    # no hash: an older file; a NaN where the status says ok is refused anyway
    with np.load(p) as f:
        old = _before_the_hash({k: f[k] for k in f.files})
    np.savez(tmp_path / "c.npz", **old)
    np.testing.assert_array_equal(
        np.asarray(af.Trajectory.load(tmp_path / "c.npz").x), np.asarray(tr.x)
    )
    nan = state.copy()
    nan[0, -1] = np.nan
    np.savez(tmp_path / "d.npz", **{**old, "state": nan})
    with pytest.raises(
        ValueError, match=r"d\.npz' holds non-finite states at saves its statuses call 'ok'"
    ):
        af.Trajectory.load(tmp_path / "d.npz")
    np.savez(tmp_path / "e.npz", **{**old, "metadata": np.asarray("{not json")})
    with pytest.raises(ValueError, match=r"e\.npz' has metadata that is not JSON"):
        af.Trajectory.load(tmp_path / "e.npz")
    record = json.loads(str(old["metadata"]))
    del record["run"]["solver"]
    np.savez(tmp_path / "f.npz", **{**old, "metadata": np.asarray(json.dumps(record))})
    with pytest.raises(ValueError, match=r"f\.npz' is a malformed trajectory file: KeyError"):
        af.Trajectory.load(tmp_path / "f.npz")


# --------------------------------------------- declared sizes, before allocation
def _small_run_file(tmp_path) -> tuple[Path, dict]:
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x0 = np.random.default_rng(0).normal(size=(4, 2))
    traj = af.simulate(model, x0, 1.0, ts=np.linspace(0, 1, 11))
    path = traj.save(tmp_path / "run.npz")
    with np.load(path) as f:
        return path, {k: f[k] for k in f.files}


def test_an_array_larger_than_its_run_is_refused_before_it_is_read(tmp_path):
    """A 240 kB file declaring a 240 MB state (zeros compress 1000:1) was refused only
    after about 290 MB had been allocated; its .npy headers are checked against the
    metadata's run first, so the refusal costs kilobytes."""
    import tracemalloc

    path, arrays = _small_run_file(tmp_path)
    arrays["state"] = np.zeros((1, 11, 4, 681_818))  # 240 MB declared
    bad = tmp_path / "bad.npz"
    np.savez_compressed(bad, **arrays)
    assert bad.stat().st_size < 300_000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"array 'state' declares shape \(1, 11, 4, 681818\)"):
            af.Trajectory.load(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 2**20, peak
    af.Trajectory.load(path)  # the original loads


@pytest.mark.parametrize(
    "key, shape",
    [("x", (11, 4, 3)), ("z", (12, 4, 2)), ("reached", (11, 2)), ("t_stop", (2,)), ("x0", (5, 2))],
)
def test_every_array_is_bounded_by_the_run_it_records(tmp_path, key, shape):
    path, arrays = _small_run_file(tmp_path)
    arrays[key] = np.zeros(shape, arrays[key].dtype)
    bad = tmp_path / "bad.npz"
    np.savez_compressed(bad, **arrays)
    with pytest.raises(ValueError, match=rf"array '{key}' declares shape"):
        af.Trajectory.load(bad)
