"""``fig_large_n``: the histogram peak count against known clusters, and the quick study
end to end (slow), resumed from its sweep without recomputing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attnflow.experiments import fig_large_n as L


def test_peak_count_counts_clusters_not_ripples():
    rng = np.random.default_rng(0)
    centres = np.array([0.3, 2.2, 4.4])
    clustered = (centres[rng.integers(0, 3, 30_000)] + 0.05 * rng.normal(size=30_000)) % (
        2 * math.pi
    )
    assert L.peak_count(clustered, 512) == 3
    # a cluster across the cut at angle 0 is one peak, not two
    assert L.peak_count((0.03 * rng.normal(size=20_000)) % (2 * math.pi), 512) == 1
    # uniform angles: sampling ripples only
    assert L.peak_count(rng.uniform(0, 2 * math.pi, 50_000), 256) == 0


@pytest.mark.slow
def test_fig_large_n_quick_runs_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFLOW_SWEEP_DIR", str(tmp_path / "sweeps"))
    L.make(tmp_path / "a", quick=True)
    side = json.loads((tmp_path / "a" / "fig_large_n.json").read_text())
    assert side["all_ok"] and side["seeds"] == [0, 1]
    by_n = {r["n"]: r for r in side["runs"]}
    assert not by_n[400]["circle_field"] and by_n[2000]["circle_field"]
    fits = side["meanfield"]["fits"]
    assert all(-0.9 < f["slope_iid"] < -0.2 for f in fits.values())
    # the second run reads every run back from the sweep: the same numbers
    shards = sorted((tmp_path / "sweeps").rglob("shard-*.npz"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    L.make(tmp_path / "b", quick=True)
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    again = json.loads((tmp_path / "b" / "fig_large_n.json").read_text())
    assert again["runs"] == side["runs"] and again["meanfield"] == side["meanfield"]
