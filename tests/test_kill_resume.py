"""Kill -9 at a random moment, then resume: the result is bit for bit that of a run never
interrupted, and no finished work is done again.

Property-based over the moment of the kill (hypothesis draws it): a retrieval training
(checkpoints every few steps; a kill may land mid-step, mid-checkpoint or between the
two) and a sharded sweep (a kill may land mid-shard or mid-write). The default suite
draws a few moments; ``-m slow`` draws many more. The processes are real (``SIGKILL``: no
handler, no ``finally``), so each example costs a process start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attnflow.studies import retrieval as R
from attnflow.studies import sweep as S

HERE = Path(__file__).resolve().parent
FIELDS = dict(width=8, depth=1, max_steps=60, eval_every=10, val_sets=32, batch=16)
CFG = R.RetrievalConfig(**FIELDS, checkpoint_every=5)
FEW = settings(
    max_examples=2,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MANY = settings(
    max_examples=12,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _leaves(directory: Path) -> list[np.ndarray]:
    like = R.RetrievalModel(CFG, jax.random.key(0))
    model = eqx.tree_deserialise_leaves(directory / "model.eqx", like)
    return [np.asarray(a) for a in jax.tree.leaves(model)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "whole"
    with jax.numpy_dtype_promotion("standard"):
        rec = R.train(CFG, out, progress=False)
    return rec, _leaves(out)


def _kill_training_at(directory: Path, fraction: float) -> int:
    """Start the training in a process, SIGKILL it ``fraction`` of the way through its
    training steps (judged by the checkpoint's step), return the step last checkpointed."""
    script = textwrap.dedent(f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        from pathlib import Path
        from attnflow.studies import retrieval as R
        cfg = R.RetrievalConfig(**{FIELDS!r}, checkpoint_every=5)
        R.train(cfg, Path({str(directory)!r}), progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    ckpt = directory / "checkpoint.bin"
    deadline = time.time() + 120
    try:
        # wait until training runs (its first checkpoint), then for the chosen moment
        while not ckpt.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.time() < deadline, "the training never started"
            time.sleep(0.01)
        time.sleep(fraction * 1.5)  # the 55 remaining steps take about 1-2 s here
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return proc.returncode


def _check_training_resume(tmp_path: Path, fraction: float, uninterrupted) -> None:
    whole, leaves = uninterrupted
    part = Path(tempfile.mkdtemp(dir=tmp_path)) / "killed"
    code = _kill_training_at(part, fraction)
    with jax.numpy_dtype_promotion("standard"):
        rest = R.train(CFG, part, progress=False)
    assert rest["finished"] and rest["step"] == whole["step"]
    # killed before the end: it resumed from a checkpoint; killed after: the saved run
    assert rest["resumed"] or code != -signal.SIGKILL or (part / "model.eqx").exists()
    assert rest["history"] == whole["history"]
    for a, b in zip(leaves, _leaves(part), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not list(part.glob("*.tmp")) and not list(part.glob(".*.tmp"))


# slow: 30 s; the default suite kills a sweep at a random moment and resumes trainings bit for
# bit in test_longcontext and test_retrieval
@pytest.mark.slow
@settings(FEW, max_examples=1)  # a process start and a compile each: one by default
@given(fraction=st.floats(min_value=0.0, max_value=1.0))
def test_training_killed_at_a_random_moment_resumes_bit_for_bit(tmp_path, fraction, uninterrupted):
    _check_training_resume(tmp_path, fraction, uninterrupted)


@pytest.mark.slow
@MANY
@given(fraction=st.floats(min_value=0.0, max_value=1.0))
def test_training_killed_at_many_moments_resumes_bit_for_bit(tmp_path, fraction, uninterrupted):
    _check_training_resume(tmp_path, fraction, uninterrupted)


# ------------------------------------------------------------------- sweeps
SIZE, SHARD = 12, 2


def _sweep_script(tmp_path: Path) -> str:
    return textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from pathlib import Path
        from attnflow.studies import sweep as S
        from test_sweep_faults import logged
        tmp = Path({str(tmp_path)!r})
        S.run(logged(tmp, size={SIZE}, shard_size={SHARD}, sleep=0.05), tmp / "run")
    """)


def _check_sweep_resume(tmp_path: Path, fraction: float) -> None:
    """The kernel of ``test_sweep_faults`` logs each shard as it starts and sleeps 0.05 s
    (not in the rerun: $SWEEP_FAULTS_FAST, which leaves the sweep's identity alone)."""
    from test_sweep_faults import log_lines, logged, reference

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_FAULTS_FAST"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _sweep_script(tmp_path)], stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.time() + 60
    try:
        while not (out / "manifest.json").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.time() < deadline, "the sweep never started"
            time.sleep(0.005)
        time.sleep(fraction * 0.05 * SIZE / SHARD)  # the six shards take about 0.3 s
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done_before = {p.name for p in out.glob("shard-*.npz")}
    before = len(log_lines(tmp_path))
    os.environ["SWEEP_FAULTS_FAST"] = "1"
    try:
        rep = S.run(logged(tmp_path, size=SIZE, shard_size=SHARD, sleep=0.05), out)
    finally:
        del os.environ["SWEEP_FAULTS_FAST"]
    assert rep.complete
    # no shard whose file was written before the kill is computed again
    assert len(rep.computed) == SIZE // SHARD - len(done_before)
    assert len(log_lines(tmp_path)) - before == len(rep.computed)
    whole = reference(tmp_path, size=SIZE, shard_size=SHARD, sleep=0.05)
    merged = S.merge(out)
    assert sorted(merged.arrays) == sorted(whole)
    for k, v in whole.items():
        assert merged.arrays[k].dtype == v.dtype
        np.testing.assert_array_equal(merged.arrays[k], v, err_msg=k)
    assert json.loads((out / "manifest.json").read_text())["size"] == SIZE


@FEW
@given(fraction=st.floats(min_value=0.0, max_value=1.2))
def test_sweep_killed_at_a_random_moment_resumes_bit_for_bit(tmp_path_factory, fraction):
    _check_sweep_resume(tmp_path_factory.mktemp("sweep"), fraction)


@pytest.mark.slow
@MANY
@given(fraction=st.floats(min_value=0.0, max_value=1.2))
def test_sweep_killed_at_many_moments_resumes_bit_for_bit(tmp_path_factory, fraction):
    _check_sweep_resume(tmp_path_factory.mktemp("sweep"), fraction)
