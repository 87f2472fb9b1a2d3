"""Sweeps on any concurrent.futures executor: a thread pool, the embedded process pool,
an engine that pickles its calls, and (slow) a Dask LocalCluster with worker processes
give the numbers of the in-memory computation bit for bit; the claims, hashes and
resume work unchanged; BLAS limits of concurrent tasks are shared and restored."""

import functools
import json
import os
import pickle
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_sweep import stats, toy
from test_sweep_faults import _start, _wait_for, log_lines, logged, reference, same

from attnflow import _parallel
from attnflow.studies import sweep as S


def rows_by_hand(seed, size, width=3):
    """toy_kernel's "x" rebuilt from the documented streams, without attnflow."""
    return np.stack(
        [
            np.random.Generator(
                np.random.PCG64(np.random.SeedSequence([seed, 11, i]))
            ).standard_normal(width)
            for i in range(size)
        ]
    )


def shard_hashes(out_dir):
    """The SHA-256 each shard file records, by name."""
    out = {}
    for p in sorted(Path(out_dir).glob("shard-*.npz")):
        with np.load(p) as f:
            out[p.name] = json.loads(str(f["__meta__"]))["sha256"]
    return out


def blas_counts():
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


class Locked:
    """A kernel that holds a lock, so that it cannot be pickled."""

    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, config, start, stop, seed):
        return {"i": np.arange(start, stop)}


class Roundtrip(Executor):
    """Runs each call in a thread after a pickle round trip of the call and of its
    result, as an engine that sends work to other processes does; records the calls."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(2)
        self.sent = []

    def submit(self, fn, /, *args, **kwargs):
        blob = pickle.dumps((fn, args, kwargs))
        self.sent.append(args)

        def call():
            f, a, k = pickle.loads(blob)
            return pickle.loads(pickle.dumps(f(*a, **k)))

        return self.pool.submit(call)

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.pool.shutdown(wait, cancel_futures=cancel_futures)


# ------------------------------------------------------------------ same numbers
def test_thread_pool_and_default_pool_give_the_numbers_of_compute(tmp_path):
    sw = toy(size=40, shard_size=5)
    ref = S.compute(sw).arrays
    np.testing.assert_array_equal(ref["x"], rows_by_hand(3, 40))
    before = blas_counts()
    with ThreadPoolExecutor(3) as ex:
        rep = S.run(sw, tmp_path / "threads", executor=ex, workers=3)
        assert rep.complete and rep.computed == list(range(8))
        same(S.merge(tmp_path / "threads").arrays, ref)
        same(S.compute(sw, executor=ex, workers=3).arrays, ref)
        same(S.compute(sw, executor=ex, workers=None, chunk=3).arrays, ref)
        assert ex.submit(int, "7").result() == 7  # used as it is, not shut down
    assert blas_counts() == before  # the tasks' BLAS limits were all undone
    rep = S.run(sw, tmp_path / "pool", workers=2)  # executor=None: the embedded pool
    assert rep.complete and rep.computed == list(range(8))
    same(S.merge(tmp_path / "pool").arrays, ref)
    same(S.compute(sw, workers=2).arrays, ref)
    # the shard files themselves hold the same arrays, whoever wrote them
    assert shard_hashes(tmp_path / "threads") == shard_hashes(tmp_path / "pool")


def test_an_engine_that_pickles_gets_no_paths_and_this_process_writes(tmp_path):
    sw = logged(tmp_path, size=12, shard_size=3)
    ex = Roundtrip()
    try:
        rep = S.run(sw, tmp_path / "run", executor=ex, workers=2)
    finally:
        ex.shutdown()
    assert rep.complete and rep.computed == [0, 1, 2, 3]
    # every call carried the kernel and a range, never a file to write
    tasks = [args[0] for args in ex.sent]
    assert sorted(t[2] for t in tasks) == [0, 3, 6, 9]
    assert all(t[6] is None and t[7] is None for t in tasks)
    assert {pid for _, _, pid in log_lines(tmp_path)} == {os.getpid()}
    same(S.merge(tmp_path / "run").arrays, reference(tmp_path, size=12, shard_size=3))
    assert not list((tmp_path / "run").glob("*.claim"))


# ------------------------------------------------------------------ bad input
def test_a_kernel_that_cannot_travel_is_named(tmp_path):
    def local_kernel(config, start, stop, seed):
        return {"i": np.arange(start, stop)}

    sw = S.Sweep("local", local_kernel, {}, size=8, seed=0, shard_size=2)
    with pytest.raises(ValueError, match=r"local_kernel could not travel.*module-level"):
        S.run(sw, tmp_path / "a", executor=Roundtrip())
    assert not list((tmp_path / "a").glob("*.claim"))
    # a callable object or a partial is named by its class or function
    locked = S.Sweep("locked", Locked(), {}, size=4, seed=0, shard_size=2)
    with pytest.raises(ValueError, match=r"kernel test_sweep_executors\.Locked instance could"):
        S.compute(locked, executor=Roundtrip(), workers=2)
    held = S.Sweep("held", functools.partial(Locked.__call__, Locked()), {}, 4, 0, 2)
    with pytest.raises(ValueError, match=r"kernel partial\(test_sweep_executors\.Locked\.__call__"):
        S.compute(held, executor=Roundtrip(), workers=2)
    # the embedded pool checks before it starts a worker
    with pytest.raises(ValueError, match="local_kernel could not travel"):
        S.compute(sw, workers=2)
    # in this process, nothing is pickled: a thread pool runs it
    with ThreadPoolExecutor(2) as ex:
        got = S.compute(sw, executor=ex, workers=2)
    np.testing.assert_array_equal(got["i"], np.arange(8))


def test_executor_must_be_an_executor(tmp_path):
    sw = toy(size=8)
    for bad in (object(), 4, "threads"):
        with pytest.raises(ValueError, match="executor must be a concurrent.futures.Executor"):
            S.run(sw, tmp_path, executor=bad)
        with pytest.raises(ValueError, match="executor must be"):
            S.compute(sw, executor=bad)
    assert not list(tmp_path.glob("shard-*"))


# ------------------------------------------------------------------ faults
def test_kill_9_of_a_threaded_run_then_resume_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    out = tmp_path / "run"
    body = f"""
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as ex:
            S.run(logged(tmp, size=40, sleep=0.3), {str(out)!r}, executor=ex, workers=2)
    """
    proc = _start(tmp_path, body)
    try:
        _wait_for(lambda: len(list(out.glob("shard-*.npz"))) >= 3, proc, "three shards")
    finally:
        proc.kill()  # SIGKILL: no handler, no atexit, no finally
        proc.wait()
    done = stats(out)
    started = {s for s, _, _ in log_lines(tmp_path)}
    on_disk = {int(name.split("-")[1]) for name in done}
    assert 3 <= len(done) < 20 and on_disk <= started
    assert len(started - on_disk) <= 2  # lost: at most the shards in flight
    before = len(log_lines(tmp_path))
    monkeypatch.setenv("SWEEP_FAULTS_FAST", "1")
    with ThreadPoolExecutor(2) as ex:
        rep = S.run(logged(tmp_path, size=40, sleep=0.3), out, executor=ex, workers=2)
    assert rep.complete and not list(out.glob("*.claim")) and not list(out.glob("*.tmp"))
    assert len(rep.skipped) == len(done) and len(rep.computed) == 20 - len(done)
    assert stats(out).items() >= done.items()  # nothing written before was rewritten
    again = [s for s, _, _ in log_lines(tmp_path)[before:]]
    assert sorted(again) == sorted(2 * k for k in rep.computed)  # each missing shard once
    same(S.merge(out).arrays, reference(tmp_path, size=40))


def test_two_runs_with_thread_pools_split_the_work(tmp_path):
    sw = logged(tmp_path, size=16, shard_size=1, sleep=0.1)
    barrier = threading.Barrier(2)
    reps, errors = {}, []

    def go(tag):
        try:
            with ThreadPoolExecutor(2) as ex:
                barrier.wait()
                reps[tag] = S.run(sw, tmp_path / "run", executor=ex, workers=2)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    a, b = (set(reps[t].computed) for t in "ab")
    assert not a & b and a | b == set(range(16)) and a and b
    assert sorted(s for s, _, _ in log_lines(tmp_path)) == list(range(16))  # once each
    assert all(reps[t].complete for t in "ab")
    assert not list((tmp_path / "run").glob("*.claim"))
    same(S.merge(tmp_path / "run").arrays, reference(tmp_path, size=16, shard_size=1))


# ------------------------------------------------------------------ BLAS limits
def test_blas_limits_of_overlapping_blocks_are_shared_and_restored():
    """Blocks left in another order than entered (as tasks of a thread pool leave
    them) keep one BLAS thread until the last one leaves, then restore the setting."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        base = blas_counts()
        if not base or set(base) == {1}:
            pytest.skip("no BLAS that can run two threads")
        a, b = _parallel.blas_threads(1), _parallel.blas_threads(1)
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert set(blas_counts()) == {1}  # b is still inside
        b.__exit__(None, None, None)
        assert blas_counts() == base
        # another count over it, the outer block leaving first: the inner limit stays
        # until its block leaves, then both are undone, innermost first
        a, b = _parallel.blas_threads(1), _parallel.blas_threads(2)
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert blas_counts() == base
        b.__exit__(None, None, None)
        assert blas_counts() == base
        with _parallel.blas_threads(1):
            assert set(blas_counts()) == {1}
    assert not _parallel._BLAS_LIMITS


# ------------------------------------------------------------------ Dask
@pytest.mark.slow
def test_dask_local_cluster_with_processes_gives_the_same_numbers(tmp_path):
    distributed = pytest.importorskip("distributed")
    sw = logged(tmp_path, size=24, shard_size=4)
    ref = reference(tmp_path, size=24, shard_size=4)
    with (
        distributed.LocalCluster(
            processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        ex = client.get_executor()
        rep = S.run(sw, tmp_path / "dask", executor=ex, workers=2)
        assert rep.complete and rep.computed == list(range(6))
        same(S.merge(tmp_path / "dask").arrays, ref)
        log = log_lines(tmp_path)
        same(S.compute(sw, executor=ex, workers=2, chunk=5).arrays, ref)
        worker_pids = set(client.run(os.getpid).values())
    # the kernels ran in the cluster's worker processes, each shard once
    assert sorted(s for s, _, _ in log) == list(range(0, 24, 4))
    assert {pid for _, _, pid in log_lines(tmp_path)} <= worker_pids
    assert os.getpid() not in worker_pids
    # and the files equal those the embedded pool writes
    S.run(sw, tmp_path / "pool", workers=2)
    assert shard_hashes(tmp_path / "dask") == shard_hashes(tmp_path / "pool")
