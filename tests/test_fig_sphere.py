"""The sphere figure scripts, quick: sidecars checked against independent numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import special

import attnflow as af


def _side(tmp_path, name):
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_fig_sphere_phase_quick(tmp_path):
    from attnflow.experiments import fig_sphere_phase as F

    F.make(tmp_path, quick=True)
    side = _side(tmp_path, F.NAME)
    assert (tmp_path / "fig_sphere_phase.png").exists()
    for r in side["runs"]:
        frac = np.asarray(r["fraction"])
        assert frac.shape == (len(r["betas"]), len(r["ts"]))
        assert np.all((frac >= 0) & (frac <= 1))
        # at t = 0: uniform points, P(<x_i, x_j> > 0.999) = P(angle < 0.0447) is small
        assert frac[:, 0].max() < 0.05
        if r["equiangular_boundary"] is not None:
            b = r["equiangular_boundary"]
            assert b[0] == pytest.approx(af.equiangular_time(32, r["betas"][0], 0.999))
    assert F.crossing(np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.6, 0.2])) == pytest.approx(1.25)


def test_fig_metastability_quick(tmp_path):
    from attnflow.experiments import fig_metastability as F

    F.make(tmp_path, quick=True)
    side = _side(tmp_path, F.NAME)
    for r in side["runs"]:
        assert r["status"] == "ok"
        c = np.asarray(r["clusters"])
        assert c[:, 0].max() <= 32 and c[:, -1].min() >= 1
        # the rescaled energy lies in [e^-beta, 1] and ends near 1/k for k clusters
        e = np.asarray(r["energy_2beta_over_ebeta"])
        assert np.all(e <= 1 + 1e-6) and np.all(e > 0)
    assert F.plateaus(np.arange(5.0), np.array([3, 3, 2, 2, 2])) == [
        {"clusters": 3, "t_start": 0.0, "t_end": 1.0},
        {"clusters": 2, "t_start": 2.0, "t_end": 4.0},
    ]


@pytest.mark.slow
def test_fig_sphere_regimes_quick(tmp_path):
    from attnflow.experiments import fig_sphere_regimes as F

    F.make(tmp_path, quick=True)
    side = _side(tmp_path, F.NAME)
    md = (tmp_path / "fig_sphere_regimes.md").read_text()
    for row in side["table"]:
        assert row["V"] in md
        assert row["predicted"] == str(
            af.predict_regime(
                np.eye(row["d"]), np.eye(row["d"]), af.matrices.named(row["V"], row["d"])
            ).label
        )
        for mode in ("sphere", "post", "pre", "peri"):
            assert 1 <= row[mode]["clusters_median"] <= 20 and row[mode]["status"] == "ok"
    # the redraw writes the markdown table again, after the PNG and PDF, from the saved data
    (tmp_path / "fig_sphere_regimes.md").unlink()
    F.make.redraw(tmp_path, quick=True)
    assert (tmp_path / "fig_sphere_regimes.md").read_text() == md
    again = _side(tmp_path, F.NAME)
    assert again["figures"] == side["figures"] and side["figures"][-1].endswith(".md")
    assert again["table"] == side["table"]


@pytest.mark.slow
def test_fig_hemisphere_quick(tmp_path):
    from attnflow.experiments import fig_hemisphere as F

    out = F.make(tmp_path, quick=True)
    side = _side(tmp_path, F.NAME)
    for r in side["runs"][:2]:
        for n, w in zip(r["n"], r["wendel_probability"], strict=True):
            assert w == pytest.approx(af.wendel_probability(n, r["d"]))
        # every start that lies in an open hemisphere ends in one cluster (the theorem)
        assert all(r["hemisphere_starts_all_end_in_one_cluster"])
    assert out["orthogonal_gap"] < 1e-8
    assert max(out["antipodal_moved"].values()) < 1e-10
    # the hemisphere tests themselves
    assert F.in_open_half_circle(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.1]]))
    assert not F.in_open_half_circle(np.array([[1.0, 0.0], [-0.5, 0.8], [-0.5, -0.8]]))
    assert F.in_open_hemisphere(np.eye(3))
    assert not F.in_open_hemisphere(np.vstack([np.eye(3), -np.ones((1, 3)) / np.sqrt(3)]))


def test_fig_modes_quick(tmp_path):
    from attnflow.experiments import fig_modes as F

    F.make(tmp_path, quick=True)
    side = _side(tmp_path, F.NAME)
    assert side["seeds"] == [0, 1, 2, 3] and side["windows_in_T"][0] == [1.0, 2.0]
    for r in side["runs"]:
        assert all(s == "ok" for s in r["status"])
        assert r["predicted_clusters"] == {2.0: 2, 5.0: 3, 10.0: 4}[r["beta"]]
        c = np.asarray(r["clusters"])
        assert c.shape == (4, 161) and c.min() >= 1
        assert len(r["windows"]) == len(F.WINDOWS)
        for w in r["windows"]:
            assert sum(w["distribution"].values()) == 4
            assert w["equal"] + w["below"] + w["above"] == 4
            lo, hi = w["fraction_equal_interval_95"]
            assert lo <= w["fraction_equal"] <= hi
    ten = side["runs"][-1]  # beta = 10 over [3T, 6T]: three of the four starts at k* = 4
    assert ten["windows"][3]["counts"] == [3, 4, 4, 4]
    pooled = side["pooled"][3]
    assert (pooled["equal"], pooled["starts"]) == (7, 12)
    t = np.array([0.0, 3.0, 4.0, 5.0, 7.0])
    assert F.plateau_count(t, np.array([9, 3, 2, 3, 1])) == 3
    assert F.plateau_count(t, np.array([9, 3, 2, 3, 1]), (0.0, 1.0)) == 9
    assert "| 10 | 4 |" in (tmp_path / "fig_modes.md").read_text()


@pytest.mark.slow  # 25 s; the solver, its rates and the W1 fit are in test_meanfield.py
def test_fig_meanfield_quick(tmp_path):
    from attnflow.experiments import fig_meanfield as F

    F.make(tmp_path, quick=True)
    side = _side(tmp_path, F.NAME)
    (rate,) = side["rates"]
    assert rate["status"] == "ok" and rate["max_relative_error"] < 1e-3
    # the measured rates against the closed form k^2 I_k(beta) / (beta I_0(beta))
    k = np.asarray(rate["k"], float)
    closed = k**2 * special.ive(k, 5.0) / (5.0 * special.ive(0, 5.0))
    np.testing.assert_allclose(rate["predicted"], closed, rtol=1e-12)
    (cl,) = side["clusters"]
    assert cl["predicted_clusters"] == 3 and cl["counted"] == [3, 3, 3, 3]
    assert cl["wins"] == 4 and cl["seeds"] == [10, 11, 12, 13]
    assert cl["fraction_wins_interval_95"][1] == 1.0
    conv = side["convergence"]
    # W1 against n: particles at the density's quantiles converge like 1/n
    assert abs(conv["slope_quantile"] + 1.0) < 0.15
    assert np.all(np.diff(conv["w1_quantile"]) < 0)
    assert "| 5 | 3 | 3, 3, 3, 3 | 4/4 |" in (tmp_path / "fig_meanfield.md").read_text()
