"""The sweep machinery: split-independent numbers, atomic resumable shards, job-array
slices, merge, worker processes, and batches sharded over (two forced) JAX devices."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.studies import sweep as S

HERE = Path(__file__).resolve().parent

# Failure injection for toy_kernel: raise when asked for the range starting here.
FAIL_AT = None


def toy_kernel(config, start, stop, seed):
    """Row i: a few normals from the per-sample stream, the index, and a block stream
    (blocks of 4 samples) -- everything a function of (config, seed, i) only."""
    if config.get("sleep"):
        time.sleep(config["sleep"])
    if FAIL_AT is not None and start == FAIL_AT:
        raise RuntimeError(f"injected failure at {start}")
    w = config["width"]
    rows = np.stack([S.rng(seed, 11, i).standard_normal(w) for i in range(start, stop)])
    block = np.empty(stop - start)
    for i in range(start, stop):
        block[i - start] = S.Substreams(seed, 12, i // 4)[i % 4].random()
    return {"x": rows, "index": np.arange(start, stop), "block": block, "flag": rows[:, 0] > 0}


def toy(size=50, shard_size=8, seed=3, **config):
    cfg = {"width": 3, **config}
    return S.Sweep(
        name="toy", kernel=toy_kernel, config=cfg, size=size, seed=seed, shard_size=shard_size
    )


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def stats(out_dir):
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(Path(out_dir).glob("shard-*.npz"))
    }


# ------------------------------------------------------------------- streams
def test_rng_streams_are_keyed_and_reproducible():
    a = S.rng(5, 1, 2).standard_normal(4)
    np.testing.assert_array_equal(a, S.rng(5, 1, 2).standard_normal(4))
    # the documented construction, rebuilt independently
    ref = np.random.Generator(np.random.PCG64(np.random.SeedSequence([5, 1, 2])))
    np.testing.assert_array_equal(a, ref.standard_normal(4))
    assert not np.array_equal(a, S.rng(5, 1, 3).standard_normal(4))
    assert not np.array_equal(a, S.rng(6, 1, 2).standard_normal(4))


def test_substreams_do_not_depend_on_lookup_order():
    st = S.Substreams(7, 1)
    forward = [st[j].standard_normal(3) for j in range(5)]
    st2 = S.Substreams(7, 1)
    backward = [st2[j].standard_normal(3) for j in reversed(range(5))][::-1]
    for f, b in zip(forward, backward):
        np.testing.assert_array_equal(f, b)
    # substream j is the base PCG64 stream advanced by j * 2**64
    bg = np.random.PCG64(np.random.SeedSequence([7, 1])).advance(3 << 64)
    np.testing.assert_array_equal(forward[3], np.random.Generator(bg).standard_normal(3))
    assert len({f.tobytes() for f in forward}) == 5


def test_sample_key_folds_large_indices():
    k1 = jax.random.key_data(S.sample_key(0, 5))
    assert np.array_equal(k1, jax.random.key_data(S.sample_key(0, 5)))
    assert not np.array_equal(k1, jax.random.key_data(S.sample_key(0, 5 + 2**32)))
    assert not np.array_equal(k1, jax.random.key_data(S.sample_key(1, 5)))


# ------------------------------------------------------------- shard slicing
def test_parse_shard_and_slices_partition_the_shards():
    assert S.parse_shard("2/5") == (2, 5)
    assert S.parse_shard(" 0 / 1 ") == (0, 1)
    assert S.parse_shard(None) is None
    for bad in ("5/5", "-1/3", "1/0", "a/b", "1", (3, 2)):
        with pytest.raises(ValueError, match="shard"):
            S.parse_shard(bad)
    for n_shards in (0, 1, 7, 10, 33):
        for n in (1, 2, 3, 8, 40):
            parts = [list(S.shard_slice(n_shards, (i, n))) for i in range(n)]
            flat = [k for p in parts for k in p]
            assert flat == list(range(n_shards))  # contiguous, disjoint, complete
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 1


# ------------------------------------------------------------------ in memory
def test_compute_does_not_depend_on_chunking():
    sw = toy(size=37)
    ref = S.compute(sw).arrays
    np.testing.assert_array_equal(ref["index"], np.arange(37))
    # independent reference for one row
    np.testing.assert_array_equal(ref["x"][20], S.rng(3, 11, 20).standard_normal(3))
    for chunk in (1, 5, 37, 100):
        same(ref, S.compute(sw, chunk=chunk).arrays)


def test_kernel_output_is_checked():
    def bad(config, start, stop, seed):
        return {"x": np.zeros(stop - start + 1)}

    sw = S.Sweep(name="bad", kernel=bad, config={}, size=4)
    with pytest.raises(ValueError, match="leading axis"):
        S.compute(sw)


def test_sweep_validates_its_arguments():
    with pytest.raises(ValueError, match="size"):
        toy(size=0)
    with pytest.raises(ValueError, match="seed"):
        toy(seed=-1)
    with pytest.raises(ValueError, match="shard_size"):
        toy(shard_size=0)
    with pytest.raises(ValueError, match="JSON"):
        S.Sweep(name="t", kernel=toy_kernel, config={"a": object()}, size=3)
    with pytest.raises(ValueError, match="workers"):
        S.compute(toy(), workers=0)


# ---------------------------------------------------------------------- on disk
def test_run_writes_shards_and_merge_equals_compute(tmp_path):
    sw = toy()
    rep = S.run(sw, tmp_path)
    assert rep.complete and rep.n_shards == 7 and rep.computed == list(range(7))
    names = sorted(p.name for p in tmp_path.glob("shard-*.npz"))
    assert names[0] == "shard-0000000000-0000000008.npz"
    assert names[-1] == "shard-0000000048-0000000050.npz"
    same(S.merge(tmp_path).arrays, S.compute(sw).arrays)
    # rerunning computes nothing and touches no file
    before = stats(tmp_path)
    rep2 = S.run(sw, tmp_path)
    assert rep2.computed == [] and rep2.skipped == list(range(7))
    assert stats(tmp_path) == before


def test_merged_sweep_as_an_xarray_dataset(tmp_path):
    import json

    sw = toy()
    S.run(sw, tmp_path)
    data = S.merge(tmp_path)
    ds = data.to_xarray()
    assert ds.sizes["sample"] == data.size == 50
    np.testing.assert_array_equal(ds["sample"].values, np.arange(50))
    for name, arr in data.arrays.items():
        assert ds[name].dims[0] == "sample" and ds[name].shape == arr.shape
        np.testing.assert_array_equal(ds[name].values, arr)
        # the global sample index selects the same row as the merged array
        np.testing.assert_array_equal(ds[name].sel(sample=37).values, arr[37])
    assert json.loads(ds.attrs["config"]) == data.manifest["config"]
    assert ds.attrs["seed"] == data.manifest["seed"] and ds.attrs["name"] == sw.name


def test_job_array_slices_then_merge(tmp_path):
    sw = toy(size=61, shard_size=6)
    for i in (2, 0):
        rep = S.run(sw, tmp_path, shard=f"{i}/3")
        assert not rep.complete
    with pytest.raises(ValueError, match="incomplete"):
        S.merge(tmp_path)
    rep = S.run(sw, tmp_path, shard="1/3")
    assert rep.complete
    same(S.merge(tmp_path).arrays, S.compute(sw).arrays)


def test_numbers_do_not_depend_on_shard_size(tmp_path):
    a = S.run(toy(size=30, shard_size=4), tmp_path / "a")
    b = S.run(toy(size=30, shard_size=30), tmp_path / "b")
    assert a.complete and b.complete
    same(S.merge(tmp_path / "a").arrays, S.merge(tmp_path / "b").arrays)


def test_directory_of_another_sweep_is_refused(tmp_path):
    S.run(toy(), tmp_path)
    with pytest.raises(ValueError, match="seed"):
        S.run(toy(seed=4), tmp_path)
    with pytest.raises(ValueError, match="config"):
        S.run(toy(width=4), tmp_path)
    with pytest.raises(ValueError, match="different sweep"):
        S.merge(tmp_path, expect=toy(size=51))
    with pytest.raises(ValueError, match="no manifest"):
        S.merge(tmp_path / "nothing")


def test_failure_after_some_shards_then_resume(tmp_path, monkeypatch):
    sw = toy(size=50, shard_size=8)
    monkeypatch.setattr(sys.modules[__name__], "FAIL_AT", 24)  # the 4th shard
    with pytest.raises(RuntimeError, match="injected"):
        S.run(sw, tmp_path)
    first = stats(tmp_path)
    assert sorted(first) == [f"shard-{s:010d}-{s + 8:010d}.npz" for s in (0, 8, 16)]
    assert not list(tmp_path.glob("*.tmp"))  # nothing half-written left behind
    monkeypatch.setattr(sys.modules[__name__], "FAIL_AT", None)
    rep = S.run(sw, tmp_path)
    assert rep.skipped == [0, 1, 2] and rep.computed == [3, 4, 5, 6]
    after = stats(tmp_path)
    assert all(after[name] == first[name] for name in first)  # not rewritten
    same(S.merge(tmp_path).arrays, S.compute(sw).arrays)


def test_sweep_killed_halfway_resumes_without_recomputing(tmp_path):
    out = tmp_path / "run"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from test_sweep import toy
        from attnflow.studies import sweep as S
        S.run(toy(size=80, shard_size=8, sleep=0.25), {str(out)!r})
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 60
        while len(list(out.glob("shard-*.npz"))) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "the subprocess wrote no shards"
            time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait()
    done = stats(out)
    assert 3 <= len(done) < 10
    # a crash while writing leaves at most a temporary file: simulate one
    (out / ".shard-0000000072-0000000080.npz.999.deadbeef.tmp").write_bytes(b"partial")
    sw = toy(size=80, shard_size=8, sleep=0.25)
    rep = S.run(sw, out)
    assert rep.complete
    assert len(rep.skipped) == len(done) and len(rep.computed) == 10 - len(done)
    after = stats(out)
    assert all(after[name] == done[name] for name in done)
    uninterrupted = S.compute(toy(size=80, shard_size=8, sleep=0.0), chunk=80).arrays
    same(S.merge(out).arrays, uninterrupted)


def compute_with_pool():
    S.compute(toy(size=16, shard_size=4, sleep=0.0), workers=2)


@pytest.mark.slow
def test_process_with_a_cached_pool_exits():
    """A process started by multiprocessing (as `attnflow figures --jobs` starts them)
    that used the cached worker pool must exit: multiprocessing joins its children
    before the atexit handlers could close the pool (this hung once)."""
    script = textwrap.dedent(f"""
        import multiprocessing, sys
        sys.path.insert(0, {str(HERE)!r})
        from test_sweep import compute_with_pool

        if __name__ == "__main__":
            p = multiprocessing.get_context("spawn").Process(target=compute_with_pool)
            p.start()
            p.join(timeout=90)
            print("exitcode", p.exitcode)
            if p.exitcode is None:
                p.kill()
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert "exitcode 0" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_corrupt_shard_from_another_sweep_is_detected(tmp_path):
    S.run(toy(size=16), tmp_path / "a")
    S.run(toy(size=16, seed=9), tmp_path / "b")
    name = "shard-0000000008-0000000016.npz"
    os.replace(tmp_path / "b" / name, tmp_path / "a" / name)
    with pytest.raises(ValueError, match="does not belong"):
        S.merge(tmp_path / "a")


# -------------------------------------------------------------- worker pool
def test_worker_processes_give_the_same_numbers(tmp_path):
    sw = toy(size=40, shard_size=5)
    rep = S.run(sw, tmp_path, workers=2)
    assert rep.complete and rep.computed == list(range(8))
    same(S.merge(tmp_path).arrays, S.compute(sw).arrays)
    same(S.compute(sw, workers=2).arrays, S.compute(sw).arrays)


# ------------------------------------------------------------------ devices
def _heavy_row(a):
    # a few nonlinear steps per row (no cross-row mixing)
    def body(c, _):
        return jnp.tanh(c @ a) + 0.1 * c, None

    return jax.lax.scan(body, jnp.ones(a.shape[0]), None, length=20)[0]


_heavy = jax.vmap(_heavy_row)


def test_map_devices_sharded_equals_unsharded_to_rounding():
    assert len(jax.devices()) == 2  # tests/conftest.py forces two host devices
    A = np.random.default_rng(0).standard_normal((7, 5, 5)) / 2  # odd: padded to 8
    two = S.map_devices(_heavy, A)
    one = S.map_devices(_heavy, A, devices=jax.devices()[:1])
    assert two.shape == (7, 5) and two.dtype == np.float64
    # blocks of 4 rows and one block of 7 are vectorised differently by XLA (jax 0.12
    # rounds them apart by an ulp): equal to rounding, not bit for bit
    np.testing.assert_allclose(two, one, rtol=1e-14, atol=1e-15)
    # independent reference: the same recurrence in numpy
    ref = []
    for a in A:
        c = np.ones(5)
        for _ in range(20):
            c = np.tanh(c @ a) + 0.1 * c
        ref.append(c)
    np.testing.assert_allclose(two, np.array(ref), rtol=1e-12, atol=1e-14)


def test_map_devices_checks_batches():
    with pytest.raises(ValueError, match="leading batch"):
        S.map_devices(_heavy, np.zeros((3, 2, 2)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="leading batch"):
        S.map_devices(_heavy, np.zeros((0, 2, 2)))


def _openblas_getters():
    """OpenBLAS's own thread-count getters (symbol names differ by build), found
    through threadpoolctl's list of loaded libraries, as (path, getter)."""
    import ctypes

    from threadpoolctl import threadpool_info

    out = []
    for info in threadpool_info():
        if info["internal_api"] != "openblas":
            continue
        lib = ctypes.CDLL(info["filepath"])
        for sym in (
            "openblas_get_num_threads",
            "openblas_get_num_threads64_",
            f"{info['prefix']}_get_num_threads",
            f"{info['prefix']}_get_num_threads64_",
            "scipy_openblas_get_num_threads64_",
        ):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                out.append((info["filepath"], fn))
                break
    return out


def test_blas_threads_limits_every_blas_and_restores():
    import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS too)
    from threadpoolctl import threadpool_info

    getters = _openblas_getters()
    if not getters:
        pytest.skip("no OpenBLAS with a thread-count getter loaded")
    before = {path: fn() for path, fn in getters}
    with S.blas_threads(1):
        # every BLAS, as the library itself reports it
        assert {path: fn() for path, fn in getters} == {p: 1 for p in before}
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
    assert {path: fn() for path, fn in getters} == before
    with S.blas_threads(None):
        assert {path: fn() for path, fn in getters} == before
    with pytest.raises(ValueError, match="blas threads"):
        with S.blas_threads(0):
            pass


def test_blas_threads_gives_the_numbers_of_the_old_openblas_setting():
    """threadpoolctl replaced a ctypes call of OpenBLAS's thread-local setter: the
    eigenvalues (LAPACK geev, the Ginibre study's cost) are the same bit for bit."""
    import ctypes

    from threadpoolctl import threadpool_info

    setters = []
    for info in threadpool_info():
        fn = getattr(ctypes.CDLL(info["filepath"]), "openblas_set_num_threads_local", None)
        if fn is not None:
            fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
            setters.append(fn)
    if not setters:
        pytest.skip("no OpenBLAS >= 0.3.27 loaded")
    A = np.random.default_rng(7).standard_normal((40, 64, 64))
    prev = [fn(1) for fn in setters]
    try:
        old = np.linalg.eigvals(A)
    finally:
        for fn, p in zip(setters, prev):
            fn(p)
    with S.blas_threads(1):
        new = np.linalg.eigvals(A)
    np.testing.assert_array_equal(new, old)
    # and they are eigenvalues: det(A - lambda I) ~ 0 through a product of the others
    np.testing.assert_allclose(np.sort_complex(new[0]).sum(), np.trace(A[0]), rtol=1e-10)
