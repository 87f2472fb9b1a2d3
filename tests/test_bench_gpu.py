"""``benchmarks/bench_gpu.py --small`` runs on the CPU: it names the device and reports
pairs per second for the dense field, the circle field and the phase diagram's step.
Slow: 27 s of wall time at a load of 5 (7.5 s of CPU: JAX's start and three compilations),
over the default suite's 20 s bar."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


@pytest.mark.slow
def test_bench_gpu_small_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SCRIPT.parent,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("device: cpu")
    r = json.loads(out.read_text())
    for case in ("dense_field", "circle_step", "phase_step"):
        assert r[case]["pairs_per_second"] > 0, case
    assert r["circle_step"]["max_abs_vs_dense_rows"] < 1e-10
