"""The transformer figure scripts, quick, against numpy written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from reference import softmax_rows


def test_fig_rank_collapse_quick(tmp_path):
    from attnflow.experiments import fig_rank_collapse as F

    out = F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_rank_collapse.json").read_text())
    assert {Path(p).name for p in out["figures"]} >= {"fig_rank_collapse.png"}
    runs = {r["name"]: r for r in side["runs"]}
    # pure attention on the s = 1 tokens, layer by layer in numpy: x <- P x V^T
    V = np.asarray(F.V_PAPER)
    x = np.random.default_rng(F.SEED).uniform(-1, 1, (F.N, 2))
    r = []
    for _ in range(F.PURE_LAYERS + 1):
        res = x - x.mean(0)
        r.append(np.linalg.norm(res) / np.linalg.norm(x))
        x = softmax_rows(x @ x.T) @ x @ V.T
    got = np.asarray(runs["one head, s=1"]["pure_relative_residual"])
    big = np.asarray(r) > 1e-10  # below that both are rounding
    np.testing.assert_allclose(got[big], np.asarray(r)[big], rtol=1e-6, atol=1e-15)
    k = runs["one head, s=1"]["pure_layers_to_collapse"]
    assert k is not None and got[k] < 1e-12 <= got[k - 1]
    # without the skip the collapse is doubly exponential (log(1/r) grows by > 2 a layer);
    # with it the residual stays of order one
    assert runs["one head, s=1"]["pure_log_growth_factor"] > 2
    assert runs["one head, s=1"]["residual_relative_residual_min"] > 0.5
    assert runs["one head, s=5"]["pure_layers_to_collapse"] is None
