"""A second ``attnflow figures`` run reuses the saved results of scripts whose inputs
are unchanged, and runs again what changed or lost a file."""

from __future__ import annotations

import json
from pathlib import Path

from attnflow.experiments.runner import run_figures

SCRIPT = """
from pathlib import Path

def make(out_dir, quick=False):
    counter = Path(out_dir) / "runs.txt"
    counter.write_text(counter.read_text() + "x" if counter.exists() else "x")
    fig = Path(out_dir) / "fig_tiny.txt"
    fig.write_text("{label}")
    return {{"figures": [fig]}}
"""


def _runs(out: Path) -> int:
    return len((out / "runs.txt").read_text())


def test_unchanged_inputs_are_reused_and_changes_rerun(tmp_path):
    exp, out = tmp_path / "exp", tmp_path / "out"
    exp.mkdir()
    script = exp / "fig_tiny.py"
    script.write_text(SCRIPT.format(label="a"))
    kw = dict(experiments=exp, quick=True, progress=False, jobs=1)

    first = run_figures(out, **kw)
    assert _runs(out) == 1 and not first["figures"]["fig_tiny"].get("reused")
    second = run_figures(out, **kw)
    assert _runs(out) == 1 and second["figures"]["fig_tiny"]["reused"]
    index = json.loads((out / "index_quick.json").read_text())
    assert index["figures"]["fig_tiny"]["inputs"] == first["figures"]["fig_tiny"]["inputs"]

    run_figures(out, reuse=False, **kw)  # --force
    assert _runs(out) == 2
    script.write_text(SCRIPT.format(label="b"))  # the script changed
    run_figures(out, **kw)
    assert _runs(out) == 3 and (out / "fig_tiny.txt").read_text() == "b"
    (out / "fig_tiny.txt").unlink()  # a file it made is gone
    run_figures(out, **kw)
    assert _runs(out) == 4
    run_figures(out, quick=False, experiments=exp, progress=False, jobs=1)  # other inputs
    assert _runs(out) == 5
