"""Work neither lost nor repeated: the figures runner records each script as it
finishes, stops on SIGTERM, survives a worker's death, and refuses a second run into
its folder; result files are written whole or not at all, and the temporaries of killed
writes are removed by the next write. Siblings of the fourth reliability pass's
reproducers (``--only`` and kills left ``index.json`` incomplete, SIGTERM was ignored in
5 of 9 tries, one dead worker aborted the run, a failed ``LongContextResult.save``
destroyed the result it replaced)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnflow.experiments import runner
from attnflow.experiments.runner import FolderBusy, run_figures
from attnflow.io import files

SCRIPT = """
import os, time
from pathlib import Path

def make(out_dir, quick=False):
    name = Path(__file__).stem
    (Path(out_dir) / f"{{name}}.start").write_text(str(time.time()))
    {body}
    p = Path(out_dir) / f"{{name}}.txt"
    p.write_text(name)
    return {{"figures": [p]}}
"""


def folder(tmp_path: Path, bodies: dict[str, str]) -> Path:
    exp = tmp_path / "exp"
    exp.mkdir()
    for name, body in bodies.items():
        (exp / f"fig_{name}.py").write_text(SCRIPT.format(body=body))
    return exp


def index_of(out: Path) -> dict:
    return json.loads((out / "index_quick.json").read_text())


# --------------------------------------------------------------------- the index
def test_only_keeps_the_other_scripts_entries_and_they_are_reused(tmp_path):
    exp = folder(tmp_path, {n: "pass" for n in "abc"})
    out = tmp_path / "out"

    def run(**kw):
        return run_figures(out, experiments=exp, quick=True, progress=False, jobs=1, **kw)

    run()
    run(only=["b"], reuse=False)
    assert sorted(index_of(out)["figures"]) == ["fig_a", "fig_b", "fig_c"]
    again = run()  # nothing recomputed
    assert all(r.get("reused") for r in again["figures"].values())


def test_the_index_is_written_as_each_script_finishes(tmp_path):
    """A script reads the index while it runs: the scripts before it are there."""
    probe = (
        "import json; p = Path(out_dir) / 'index_quick.json'; "
        "seen = sorted(json.loads(p.read_text())['figures']) if p.exists() else []; "
        "(Path(out_dir) / 'seen.json').write_text(json.dumps(seen))"
    )
    exp = folder(tmp_path, {"a": "pass", "b": "pass", "c": probe})
    out = tmp_path / "out"
    run_figures(out, experiments=exp, quick=True, progress=False, jobs=1)
    assert json.loads((out / "seen.json").read_text()) == ["fig_a", "fig_b"]


# --------------------------------------------------------------------- workers
def test_a_dead_worker_costs_its_script_alone(tmp_path):
    """fig_b kills its own worker (as the OOM killer would): it is recorded as failed,
    every other script finishes, and the run returns."""
    exp = folder(
        tmp_path,
        {"a": "time.sleep(0.5)", "b": "os.kill(os.getpid(), 9)", "c": "pass"},
    )
    out = tmp_path / "out"
    index = run_figures(out, experiments=exp, quick=True, progress=False, jobs=2)
    assert sorted(index["figures"]) == ["fig_a", "fig_c"]
    assert list(index["failed"]) == ["fig_b"] and "died" in index["failed"]["fig_b"]
    assert sorted(index_of(out)["figures"]) == ["fig_a", "fig_c"]
    assert sorted(index_of(out)["failed"]) == ["fig_b"]


def test_sigterm_stops_the_run_and_nothing_starts_afterwards(tmp_path):
    """SIGTERM while the first two scripts run: exit 143, the scripts queued behind them
    never start, the lock is gone, and the index holds what finished."""
    exp = folder(tmp_path, {n: "time.sleep(30 if name != 'fig_a' else 0)" for n in "abcdef"})
    out = tmp_path / "out"
    code = (
        "from attnflow.experiments.runner import run_figures\n"
        f"run_figures({str(out)!r}, experiments={str(exp)!r}, quick=True, progress=False,"
        " jobs=2)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(list(out.glob("*.start"))) < 3:
        time.sleep(0.1)  # fig_a done, fig_b and fig_c running
    started = sorted(p.stem for p in out.glob("*.start"))
    assert started == ["fig_a", "fig_b", "fig_c"], started
    t_kill = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode in (143, -15), proc.stderr.read() if proc.stderr else ""
    assert time.time() - t_kill < 10  # not after the 30 s scripts
    time.sleep(1.0)  # a queued script would have started by now
    assert sorted(p.stem for p in out.glob("*.start")) == started
    assert not (out / runner.LOCK).exists()
    assert sorted(index_of(out)["figures"]) == ["fig_a"]


# ------------------------------------------------------------------------ the lock
def test_a_second_run_into_the_folder_is_refused_and_a_dead_runs_lock_taken_over(tmp_path):
    exp = folder(tmp_path, {"a": "pass"})
    out = tmp_path / "out"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / runner.LOCK).write_text(f"{live.pid} {os.uname().nodename}\n")
        with pytest.raises(FolderBusy, match=rf"pid {live.pid}.*another --out"):
            run_figures(out, experiments=exp, quick=True, progress=False, jobs=1)
        assert not (out / "fig_a.start").exists()
    finally:
        live.kill()
        live.wait()
    # the same lock, its process gone: taken over, and released at the end
    index = run_figures(out, experiments=exp, quick=True, progress=False, jobs=1)
    assert list(index["figures"]) == ["fig_a"] and not (out / runner.LOCK).exists()


def test_cli_names_the_folder_of_a_busy_run(tmp_path):
    exp = folder(tmp_path, {"a": "pass"})
    out = tmp_path / "out"
    out.mkdir()
    (out / runner.LOCK).write_text(f"{os.getpid()} {os.uname().nodename}\n")  # this test
    p = subprocess.run(
        [sys.executable, "-m", "attnflow", "--no-cache", "figures"]
        + ["--experiments", str(exp), "--out", str(out), "--quick", "--jobs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1 and str(out) in p.stderr and f"pid {os.getpid()}" in p.stderr


# --------------------------------------------------------------- atomic writes
def test_a_failed_long_context_save_leaves_the_previous_result(tmp_path, monkeypatch):
    """Disk full in the middle of the write: the previous result is read back whole."""
    from attnflow.studies.longcontext import LongContextResult

    path = tmp_path / "result.json"
    old = LongContextResult({"models": [1], "tiers": {}, "settings": {"v": 1}})
    old.save(path)
    before = path.read_bytes()

    def full(f_write):
        def write(data):
            f_write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

        return write

    real = files.write_atomic

    def failing(p, writer, tmp):
        return real(p, lambda f: writer(type("F", (), {"write": staticmethod(full(f.write))})), tmp)

    monkeypatch.setattr(files, "write_atomic", failing)
    new = LongContextResult({"models": [2, 3], "tiers": {}, "settings": {"v": 2}})
    with pytest.raises(OSError, match="No space"):
        new.save(path)
    assert path.read_bytes() == before
    assert LongContextResult.load(path).data == old.data
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left


def test_a_kill_while_writing_train_json_keeps_the_checkpoint(tmp_path, monkeypatch):
    """finish() dies in the middle of writing train.json: no partial train.json, and the
    checkpoint the rerun resumes from is still there."""
    import equinox as eqx
    import jax.numpy as jnp

    from attnflow.networks import _checkpoint, _training

    d = tmp_path / "run"
    d.mkdir()
    model = {"w": jnp.arange(3.0)}
    _checkpoint.save(d / _training.CHECKPOINT, (model, model, model), {"step": 7})

    real = files.write_atomic

    def killed(p, writer, tmp):
        if p.name == "train.json":

            def half(f):
                f.write(b'{"step": ')
                raise KeyboardInterrupt  # the kill, mid-write

            return real(p, half, tmp)
        return real(p, writer, tmp)

    monkeypatch.setattr(files, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        _training.finish(d, model, {"step": 7})
    assert not (d / "train.json").exists()
    assert (d / _training.CHECKPOINT).exists()
    found = _checkpoint.load(d / _training.CHECKPOINT, (model, model, model))
    assert found is not None and found[1]["step"] == 7
    assert eqx.tree_equal(found[0][0], model)


@settings(max_examples=40, deadline=None)
@given(
    pids=st.lists(st.sampled_from(["dead", "live", "mine"]), max_size=5),
    other=st.booleans(),
)
def test_stale_temporaries_are_removed_by_the_next_write(pids, other):
    """For any mix of temporaries left beside a file: the next write of that file removes
    those of processes that no longer run, keeps those of live processes and those of
    other files."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    live = {"dead": dead, "live": str(os.getppid()), "mine": str(os.getpid())}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        target = d / "result.json"
        left = []
        for i, who in enumerate(pids):
            t = d / f".result.json.{live[who]}.{i:08x}.tmp"
            t.write_text("partial")
            left.append((t, who))
        neighbour = d / f".other.json.{dead}.0000.tmp"
        if other:
            neighbour.write_text("partial")
        files.write_text(target, "{}\n")
        assert target.read_text() == "{}\n"
        for t, who in left:
            assert t.exists() == (who != "dead"), (t.name, who)
        assert neighbour.exists() == other


def test_checkpoint_temporaries_of_killed_saves_are_removed(tmp_path):
    import jax.numpy as jnp

    from attnflow.networks import _checkpoint

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    ckpt = tmp_path / "checkpoint.eqx"
    stale = tmp_path / f".checkpoint.eqx.{dead}.tmp"
    stale.write_bytes(b"half a checkpoint")
    _checkpoint.save(ckpt, {"w": jnp.zeros(2)}, {"step": 1})
    assert ckpt.exists() and not stale.exists()
