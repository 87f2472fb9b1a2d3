"""One system's tokens over the devices of two processes (``jax.distributed``, CPU
collectives over gloo): ``simulate(..., devices=jax.devices(), shard="tokens")`` run in
two processes on this machine gives, in each process, the result of one process alone to
rounding: residual layers with the dense field (n = 300) and with the tiled field
(n = 2053: padded query tiles, rows split unevenly over the devices); the adaptive solve
(its own compiled loop on each process, lock-step through the collectives) in the slow
checks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

CHILD = r"""
import json, sys
import numpy as np
import jax

port, pid, out, case = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if pid >= 0:  # before any computation: the processes meet at the coordinator
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid
    )
jax.config.update("jax_enable_x64", True)
import attnflow as af

rng = np.random.default_rng(0)
d = 4
I = np.eye(d)
V = 0.5 * I + 0.1 * rng.standard_normal((d, d))
kw = {"devices": jax.devices(), "shard": "tokens"} if pid >= 0 else {}
x_dense, x_tiled = rng.standard_normal((300, d)), rng.standard_normal((2053, d))
layers = {"method": "euler", "dt": 0.25}
if case == "adaptive":
    dense = af.simulate(af.Attention(I, I, V, beta=0.5), x_dense, 1.0, **kw)
    runs = {"dense": dense}
else:
    dense = af.simulate(af.Attention(I, I, V, beta=0.5), x_dense, 1.0, **layers, **kw)
    tiled = af.simulate(af.Attention(I, I, V, beta=0.25), x_tiled, 0.5, **layers, **kw)
    runs = {"dense": dense, "tiled": tiled}
np.savez(out, **{k: np.asarray(r.x) for k, r in runs.items()})
print(json.dumps({
    "process": jax.process_index(),
    "processes": jax.process_count(),
    "devices": len(jax.devices()),
    "local_devices": len(jax.local_devices()),
    "status": sorted({r.status for r in runs.values()}),
}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, pid: int, out, case: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(port), str(pid), str(out), case],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


def _finish(p: subprocess.Popen, timeout: float) -> dict:
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        raise AssertionError(f"process timed out:\n{stderr[-3000:]}") from None
    assert p.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def _two_processes_like_one(tmp_path, case: str) -> None:
    port = _free_port()
    outs = [tmp_path / f"p{i}.npz" for i in (0, 1)]
    procs = [_start(port, i, outs[i], case) for i in (0, 1)]
    try:
        said = [_finish(p, 240) for p in procs]
    finally:
        for p in procs:  # a process left waiting for its peer
            if p.poll() is None:
                p.kill()
                p.communicate()
    alone = _finish(_start(0, -1, tmp_path / "one.npz", case), 240)
    assert [s["process"] for s in said] == [0, 1]
    for s in said:
        assert s["processes"] == 2
        assert s["devices"] == 2 * s["local_devices"]  # every process's devices
        assert s["status"] == ["ok"]
    assert alone["processes"] == 1
    ref = np.load(tmp_path / "one.npz")
    for out in outs:
        got = np.load(out)
        assert sorted(got.files) == sorted(ref.files)
        for run in ref.files:
            scale = np.abs(ref[run]).max()
            assert np.abs(got[run] - ref[run]).max() <= 1e-12 * scale, run


def test_two_processes_shard_one_systems_tokens_like_one_process(tmp_path):
    _two_processes_like_one(tmp_path, "layers")


@pytest.mark.slow
def test_two_processes_adaptive_solve_like_one_process(tmp_path):
    _two_processes_like_one(tmp_path, "adaptive")
