"""Sweeps under faults: workers die with their parent (kill -9, SIGTERM), shards are
verified by content (truncated, corrupted, edited), and concurrent runs into one
directory share the work or are refused up front."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from attnflow import _parallel
from attnflow.studies import sweep as S

HERE = Path(__file__).resolve().parent


def log_kernel(config, start, stop, seed):
    """Appends ``start seed pid`` to ``config["log"]`` (one write, O_APPEND), sleeps
    ``config["sleep"]`` seconds (not when $SWEEP_FAULTS_FAST is set: a rerun of the same
    sweep in the test), and returns rows that depend on (seed, index) only."""
    if config.get("log"):
        fd = os.open(config["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{start} {seed} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
    if config.get("sleep") and not os.environ.get("SWEEP_FAULTS_FAST"):
        time.sleep(config["sleep"])
    x = np.stack([S.rng(seed, 21, i).standard_normal(3) for i in range(start, stop)])
    return {"x": x, "index": np.arange(start, stop), "flag": x[:, 0] > 0}


def logged(tmp_path, *, size=24, shard_size=2, seed=0, sleep=0.0):
    cfg = {"log": str(tmp_path / "kernel.log"), "sleep": sleep}
    return S.Sweep("faults", log_kernel, cfg, size=size, seed=seed, shard_size=shard_size)


def log_lines(tmp_path):
    p = tmp_path / "kernel.log"
    if not p.exists():
        return []
    return [tuple(int(v) for v in ln.split()) for ln in p.read_text().splitlines() if ln]


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def reference(tmp_path, **kw):
    """The uninterrupted result, computed in memory without the log."""
    sw = logged(tmp_path, **kw)
    cfg = {**sw.config, "log": ""}
    return S.compute(S.Sweep("faults", log_kernel, cfg, sw.size, sw.seed, sw.shard_size)).arrays


# ------------------------------------------------------------- processes
def alive(pid):
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid):
    """Processes whose parent is ``pid``, from the PPid lines of /proc/*/status."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for ln in (d / "status").read_text().splitlines():
                if ln.startswith("PPid:"):
                    if int(ln.split()[1]) == pid:
                        out.append(int(d.name))
                    break
        except OSError:
            continue
    return out


def _script(tmp_path, body, *, pdeathsig=True):
    return textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(HERE)!r})
        from pathlib import Path
        from attnflow import _parallel
        from attnflow.studies import sweep as S
        from test_sweep_faults import logged
        _parallel.USE_PDEATHSIG = {pdeathsig!r}
        tmp = Path({str(tmp_path)!r})

        if __name__ == "__main__":
    """) + textwrap.indent(textwrap.dedent(body), "    ")


def _start(tmp_path, body, name="run.py", **kw):
    script = tmp_path / name
    script.write_text(_script(tmp_path, body, **kw))
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(cond, proc, what, timeout=90.0):
    deadline = time.time() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stderr.read()[-3000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _all_gone(pids, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


# the watchdog (the fallback where PR_SET_PDEATHSIG is missing) in the slow suite
@pytest.mark.parametrize(
    "pdeathsig",
    [pytest.param(True, id="prctl"), pytest.param(False, id="watchdog", marks=pytest.mark.slow)],
)
def test_kill_9_of_a_pooled_sweep_leaves_no_worker(tmp_path, monkeypatch, pdeathsig):
    if pdeathsig and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    out = tmp_path / "run"
    proc = _start(
        tmp_path,
        f"S.run(logged(tmp, size=40, sleep=0.3), {str(out)!r}, workers=2)",
        pdeathsig=pdeathsig,
    )
    try:
        # both workers busy: two distinct pids in the kernel's log
        _wait_for(lambda: len({p for _, _, p in log_lines(tmp_path)}) >= 2, proc, "two workers ran")
        workers = {p for _, _, p in log_lines(tmp_path)}
        kids = set(children(proc.pid))
        assert workers <= kids and proc.pid not in workers
    finally:
        proc.kill()  # SIGKILL: no handler, no atexit, no finally
        proc.wait()
    left = _all_gone(kids)
    assert not left, f"processes of the killed run still alive: {left}"
    # its claims name a dead pid of this host: a rerun takes them over and completes
    assert list(out.glob("*.claim"))
    before = len(log_lines(tmp_path))
    monkeypatch.setenv("SWEEP_FAULTS_FAST", "1")
    rep = S.run(logged(tmp_path, size=40, sleep=0.3), out)
    assert rep.complete and not list(out.glob("*.claim"))
    assert len(rep.skipped) + len(rep.computed) == 20
    assert len(log_lines(tmp_path)) - before == len(rep.computed)
    same(S.merge(out).arrays, reference(tmp_path, size=40))


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_releases_the_claims(tmp_path, monkeypatch):
    out = tmp_path / "run"
    proc = _start(tmp_path, f"S.run(logged(tmp, size=40, sleep=0.3), {str(out)!r}, workers=2)")
    try:
        _wait_for(lambda: len({p for _, _, p in log_lines(tmp_path)}) >= 2, proc, "two workers ran")
        kids = set(children(proc.pid))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr.read()[-2000:]
    assert not _all_gone(kids, timeout=10.0)
    assert not list(out.glob("*.claim"))  # finally blocks ran
    monkeypatch.setenv("SWEEP_FAULTS_FAST", "1")
    rep = S.run(logged(tmp_path, size=40, sleep=0.3), out)
    assert rep.complete
    same(S.merge(out).arrays, reference(tmp_path, size=40))


def _worker_report(_):
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_info

    blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    return os.environ.get("OPENBLAS_NUM_THREADS"), os.environ.get(_parallel._PDEATHSIG_VAR), blas


def test_pool_workers_have_one_blas_thread_and_this_process_keeps_its_environment():
    before = dict(os.environ)
    with _parallel.process_pool(1) as pool:
        env, flag, blas = pool.submit(_worker_report, 0).result()
        assert _parallel.worker_pids(pool) and all(
            int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()
            for p in _parallel.worker_pids(pool)
        )
    assert env == "1" and blas and set(blas) == {1}
    assert flag == ("1" if _parallel.USE_PDEATHSIG else "0")
    assert dict(os.environ) == before


def test_shutdown_on_sigterm_leaves_a_callers_handler_alone():
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGTERM, mine)
    try:
        pool = _parallel.process_pool(1)
        with _parallel.shutdown_on_sigterm(pool):
            assert signal.getsignal(signal.SIGTERM) is mine
        pool.shutdown()
    finally:
        signal.signal(signal.SIGTERM, old)
    with _parallel.shutdown_on_sigterm(pool):
        assert signal.getsignal(signal.SIGTERM) is _parallel._on_sigterm
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# ---------------------------------------------------------------- verification
def _edit_keeping_metadata(path):
    """Rewrite a shard with one number of ``x`` changed and its metadata as it was."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["x"] = arrays["x"].copy()
    arrays["x"][0, 0] += 1.0
    np.savez(path, **arrays)


def _flip_bytes_of_x(path):
    """Corrupt the stored bytes of array ``x`` in place (size unchanged)."""
    with np.load(path) as f:
        raw = f["x"].tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(raw)
    assert at > 0
    data[at + 3] ^= 0xFF
    path.write_bytes(bytes(data))


def test_rerun_verifies_every_shard_and_recomputes_the_bad_ones(tmp_path):
    out = tmp_path / "run"
    sw = logged(tmp_path, size=20, shard_size=4)
    assert S.run(sw, out).complete
    shard = sorted(out.glob("shard-*.npz"))
    truncated, corrupted, edited = shard[1], shard[2], shard[4]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    _flip_bytes_of_x(corrupted)
    _edit_keeping_metadata(edited)
    bad = {truncated.name, corrupted.name, edited.name}

    # merge names every bad file
    with pytest.raises(ValueError, match="3 shard file") as err:
        S.merge(out)
    for name in bad:
        assert name in str(err.value)
    assert "SHA-256" in str(err.value) and "cannot be read" in str(err.value)

    # a rerun finds them, names them in one warning, recomputes exactly them
    before = len(log_lines(tmp_path))
    with pytest.warns(S.BadShardWarning) as rec:
        rep = S.run(sw, out)
    assert len(rec) == 1
    for name in bad:
        assert name in str(rec[0].message)
    assert sorted(b.split(":")[0] for b in rep.bad) == sorted(bad)
    assert rep.computed == [1, 2, 4] and rep.skipped == [0, 3]
    assert sorted(s for s, _, _ in log_lines(tmp_path)[before:]) == [4, 8, 16]
    same(S.merge(out).arrays, reference(tmp_path, size=20, shard_size=4))
    # and now nothing is bad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert S.run(sw, out).computed == []


def test_shard_hash_is_of_the_arrays(tmp_path):
    sw = logged(tmp_path, size=6, shard_size=6)
    S.run(sw, tmp_path / "run")
    path = next((tmp_path / "run").glob("shard-*.npz"))
    with np.load(path) as f:
        meta = json.loads(str(f["__meta__"]))
        arrays = {k: f[k] for k in f.files if k != "__meta__"}
    assert meta["sha256"] == S._arrays_sha256(arrays)
    # layout does not matter, dtype and values do
    fortran = {k: np.asfortranarray(v) for k, v in arrays.items()}
    assert S._arrays_sha256(fortran) == meta["sha256"]
    assert S._arrays_sha256({**arrays, "x": arrays["x"].astype(np.float32)}) != meta["sha256"]
    assert S._arrays_sha256({**arrays, "index": arrays["index"][::-1]}) != meta["sha256"]


def test_shard_of_another_sweep_is_recomputed_and_named(tmp_path):
    S.run(logged(tmp_path, size=8, shard_size=4), tmp_path / "a")
    S.run(logged(tmp_path, size=8, shard_size=4, seed=5), tmp_path / "b")
    name = "shard-0000000004-0000000008.npz"
    os.replace(tmp_path / "b" / name, tmp_path / "a" / name)
    with pytest.raises(ValueError, match=f"{name}.*does not belong"):
        S.merge(tmp_path / "a")
    with pytest.warns(S.BadShardWarning, match=name):
        rep = S.run(logged(tmp_path, size=8, shard_size=4), tmp_path / "a")
    assert rep.computed == [1]
    same(S.merge(tmp_path / "a").arrays, reference(tmp_path, size=8, shard_size=4))


# ---------------------------------------------------------------- concurrent runs
_TOGETHER = """
(tmp / "ready-{tag}").touch()
while not (tmp / "go").exists():  # start both runs at the same moment
    time.sleep(0.002)
rep = S.run(logged(tmp, size={size}, shard_size=1, seed={seed}, sleep={sleep}), tmp / "run",
            workers={workers})
print(json.dumps(rep.to_dict()))
"""


def _together(tmp_path, runs):
    procs = [
        _start(tmp_path, _TOGETHER.format(**r), name=f"run_{r['tag']}.py", pdeathsig=True)
        for r in runs
    ]
    try:
        for r, p in zip(runs, procs):
            _wait_for(lambda r=r: (tmp_path / f"ready-{r['tag']}").exists(), p, "ready")
        (tmp_path / "go").touch()
        res = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, res)]


@pytest.mark.slow
def test_two_identical_runs_split_the_work(tmp_path):
    size = 16
    res = _together(
        tmp_path,
        [
            {"tag": "a", "size": size, "seed": 0, "sleep": 0.15, "workers": 1},
            {"tag": "b", "size": size, "seed": 0, "sleep": 0.15, "workers": 2},
        ],
    )
    for code, _, err in res:
        assert code == 0, err[-3000:]
    reps = [json.loads(o.strip().splitlines()[-1]) for _, o, _ in res]
    a, b = (set(r["computed"]) for r in reps)
    # every shard computed exactly once, by one run or the other, and both did some
    assert not a & b and a | b == set(range(size)) and a and b
    starts = sorted(s for s, _, _ in log_lines(tmp_path))
    assert starts == list(range(size))
    assert all(r["complete"] for r in reps)
    assert set(reps[0]["others"]) | set(reps[0]["computed"]) == set(range(size))
    assert not list((tmp_path / "run").glob("*.claim"))
    same(S.merge(tmp_path / "run").arrays, reference(tmp_path, size=size, shard_size=1))


@pytest.mark.slow
def test_second_run_with_another_seed_is_refused_before_computing(tmp_path):
    res = _together(
        tmp_path,
        [
            {"tag": "a", "size": 6, "seed": 1, "sleep": 0.1, "workers": 1},
            {"tag": "b", "size": 6, "seed": 2, "sleep": 0.1, "workers": 1},
        ],
    )
    codes = sorted(code for code, _, _ in res)
    assert codes[0] == 0 and codes[1] != 0, res
    (_, _, lose_err) = next(r for r in res if r[0] != 0)
    assert "different sweep" in lose_err and "seed" in lose_err
    winner = S.read_manifest(tmp_path / "run")["seed"]
    # the refused run computed nothing; the winner's work is whole
    assert {seed for _, seed, _ in log_lines(tmp_path)} == {winner}
    assert sorted(s for s, _, _ in log_lines(tmp_path)) == list(range(6))
    same(
        S.merge(tmp_path / "run").arrays,
        reference(tmp_path, size=6, shard_size=1, seed=winner),
    )


def test_manifest_without_hard_links_is_still_exclusive(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise PermissionError("hard links not supported here")

    monkeypatch.setattr(os, "link", no_link)  # the store links through os.link
    out = tmp_path / "run"
    assert S.run(logged(tmp_path, size=4, shard_size=2), out).complete
    with pytest.raises(ValueError, match="different sweep"):
        S.run(logged(tmp_path, size=4, shard_size=2, seed=1), out)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def _claim(out, k, shard_size, **info):
    path = out / (S._shard_name(k * shard_size, (k + 1) * shard_size) + ".claim")
    path.write_text(json.dumps({"token": "t", "time": time.time(), **info}))
    return path


def test_claims_of_dead_or_silent_runs_are_taken_over_and_live_ones_respected(tmp_path):
    out = tmp_path / "run"
    sw = logged(tmp_path, size=8, shard_size=2)
    S._prepare_dir(sw, out)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    _claim(out, 0, 2, pid=int(dead.stdout), host=S._HOST)  # a dead process of this host
    silent = _claim(out, 1, 2, pid=1, host="elsewhere")  # another host, not refreshed
    old = time.time() - S.CLAIM_STALE_SECONDS - 5
    os.utime(silent, (old, old))
    _claim(out, 2, 2, pid=os.getppid(), host=S._HOST)  # a live process of this host
    _claim(out, 3, 2, pid=1, host="elsewhere")  # another host, fresh
    rep = S.run(sw, out, wait=False)
    assert rep.computed == [0, 1] and rep.busy == [2, 3] and not rep.complete
    assert sorted(p.name for p in out.glob("*.claim")) == [
        S._shard_name(4, 6) + ".claim",
        S._shard_name(6, 8) + ".claim",
    ]
    # the live claims are not ours to remove; once they go, the rest is computed
    for p in out.glob("*.claim"):
        p.unlink()
    rep = S.run(sw, out)
    assert rep.computed == [2, 3] and rep.complete
    same(S.merge(out).arrays, reference(tmp_path, size=8, shard_size=2))


def test_empty_or_unreadable_claims_are_taken_over_after_a_short_grace(tmp_path):
    """A run killed between creating its claim and writing it leaves an empty file: once
    older than the grace period it is stale (it used to block the shard for
    CLAIM_STALE_SECONDS), while a fresh one is respected (it may still be written)."""
    from attnflow.studies.sweep.claims import UNREADABLE_GRACE_SECONDS

    out = tmp_path / "run"
    sw = logged(tmp_path, size=6, shard_size=2)
    S._prepare_dir(sw, out)
    empty = out / (S._shard_name(0, 2) + ".claim")
    empty.write_text("")
    garbled = out / (S._shard_name(2, 4) + ".claim")
    garbled.write_text('{"pid": ')
    old = time.time() - UNREADABLE_GRACE_SECONDS - 1
    for p in (empty, garbled):
        os.utime(p, (old, old))
    fresh = out / (S._shard_name(4, 6) + ".claim")
    fresh.write_text("")
    rep = S.run(sw, out, wait=False)
    assert rep.computed == [0, 1] and rep.busy == [2] and not rep.complete
    fresh.unlink()
    rep = S.run(sw, out)
    assert rep.computed == [2] and rep.complete
    same(S.merge(out).arrays, reference(tmp_path, size=6, shard_size=2))


def test_a_run_waits_for_a_shard_another_run_is_computing(tmp_path):
    """wait=True: the shard claimed by a live run is not computed here; the run returns
    once the other run has written it."""
    out = tmp_path / "run"
    sw = logged(tmp_path, size=4, shard_size=2)
    S._prepare_dir(sw, out)
    claim = _claim(out, 1, 2, pid=os.getppid(), host=S._HOST)
    import threading

    def other_run_finishes():
        time.sleep(1.0)
        S._run_one(
            (
                log_kernel,
                dict(sw.config),
                2,
                4,
                0,
                "faults",
                str(out / S._shard_name(2, 4)),
                S.read_manifest(out)["digest"],
            )
        )
        claim.unlink()

    t = threading.Thread(target=other_run_finishes)
    t.start()
    rep = S.run(sw, out)
    t.join()
    assert rep.computed == [0] and rep.others == [1] and rep.complete
    same(S.merge(out).arrays, reference(tmp_path, size=4, shard_size=2))


def test_temporary_files_of_dead_processes_of_this_host_are_removed(tmp_path):
    # a run killed mid-write leaves `.<name>.<host>.<pid>.<random>.tmp`; the next run
    # deletes those of dead pids of this host and leaves live or foreign ones alone
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = S._HOST_TAG
    names = {
        "dead": f".shard-0000000000-0000000002.npz.{tag}.{dead.pid}.0a1b2c3d.tmp",
        "live": f".shard-0000000002-0000000004.npz.{tag}.{os.getpid()}.0a1b2c3d.tmp",
        "foreign": f".shard-0000000004-0000000006.npz.other_host.{dead.pid}.0a1b2c3d.tmp",
    }
    for name in names.values():
        (out / name).write_bytes(b"partial")
    rep = S.run(logged(tmp_path, size=8), out)
    assert rep.complete
    assert not (out / names["dead"]).exists()
    assert (out / names["live"]).exists() and (out / names["foreign"]).exists()
    same(S.merge(out).arrays, reference(tmp_path, size=8))


def test_an_edited_manifest_and_an_unhashed_shard_are_refused(tmp_path):
    """A manifest edited by hand (size, seed) used to merge relabelled; a shard whose hash
    was deleted was accepted with whatever arrays it held. Both are refused by name, and
    a rerun recomputes the unhashed shard (the result equals the uninterrupted one)."""
    out = tmp_path / "run"
    sw = logged(tmp_path)
    S.run(sw, out, progress=False)
    good = S.merge(out).arrays
    man = json.loads((out / "manifest.json").read_text())
    for field, value in (("size", 22), ("seed", 5)):
        (out / "manifest.json").write_text(json.dumps({**man, field: value}))
        with pytest.raises(ValueError, match=r"manifest\.json' was edited: its identity"):
            S.merge(out)
    (out / "manifest.json").write_text(json.dumps(man))
    shard = sorted(out.glob("shard-*.npz"))[0]
    with np.load(shard) as f:
        data = {k: f[k] for k in f.files}
    meta = json.loads(str(data["__meta__"]))
    del meta["sha256"]
    data["x"] = data["x"] + 1.0  # wrong data, and nothing to tell
    np.savez(shard, **{**data, "__meta__": np.asarray(json.dumps(meta))})
    with pytest.raises(ValueError, match="records no SHA-256"):
        S.merge(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        S.run(sw, out, progress=False)  # the bad shard is computed again
    same(S.merge(out).arrays, good)
