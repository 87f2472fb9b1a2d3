"""The top-level research scripts (``experiments/``) run with ``--quick`` and give the
numbers they claim."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1] / "experiments"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", ROOT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fit_value_matrix_lowers_the_loss():
    # optax's bias correction mixes an int32 count with floats: the standard promotion
    # rules (the suite's strict mode is for attnflow's own arithmetic)
    with jax.numpy_dtype_promotion("standard"):
        out = _load("fit_value_matrix").main(["--quick"])
    assert out["loss_end"] < 0.2 * out["loss_start"], out


# slow: the conformance suite runs SinkhornAttention through every analysis
@pytest.mark.slow
def test_sinkhorn_head_gets_every_analysis():
    out = _load("sinkhorn_head").main(["--quick"])
    assert out["leaders"] and out["label"]


def test_ginibre_curve_matches_the_closed_form_at_d2():
    rows = _load("ginibre_curve").main(["--quick"])
    d2 = rows[0]
    assert d2["d"] == 2
    # the exact fraction at d = 2 is 1 / (2 sqrt 2); 20,000 samples: within the interval
    lo, hi = d2["interval"]
    assert lo <= 1 / (2 * math.sqrt(2)) <= hi
    assert np.all(np.diff([r["fraction"] for r in rows]) < 0.1)


def test_plateau_counts_quick_resumes(tmp_path):
    mod = _load("plateau_counts")
    rows = mod.main(["--quick", "--out", str(tmp_path)])
    assert [(r["n"], r["beta"]) for r in rows] == [(300, 3.0), (300, 10.0)]
    # beta = 3: k* = 2, and two clusters is what 300 tokens form (Bruno et al. 2025)
    assert rows[0]["predicted_clusters"] == 2 and rows[0]["plateau_counts"] == [2, 2]
    assert all(s == "ok" for r in rows for s in r["statuses"])
    again = mod.main(["--quick", "--out", str(tmp_path)])  # nothing left to run
    assert again == rows
