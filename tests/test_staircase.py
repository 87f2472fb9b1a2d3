"""The staircase of metastability (Geshkovski, Koubbi, Polyanskiy and Rigollet 2024): the
unit-speed angle steps against a plain-numpy transcription of the authors' update, and the
energy levels of the merges against sum m_c^2 / n^2."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnflow as af
from attnflow.studies.staircase import authors_start, staircase


def _usa(beta: float):
    return af.IsotropicAttention(2, beta=beta, kernel=af.kernels.USA(shift=beta))


def test_angle_steps_match_the_authors_update():
    beta, lr, steps = 1000.0, 1e-5, 3000
    theta = np.arctan2(*authors_start(beta)[:, ::-1].T)
    n = theta.size
    for _ in range(steps):  # theta <- theta + lr log(beta) g / |g|, g their USA gradient
        diff = theta[:, None] - theta[None, :]
        g = (-np.sin(diff) * np.exp(beta * (np.cos(diff) - 1))).sum(axis=1) / n**2
        theta = theta + lr * math.log(beta) * g / np.linalg.norm(g)
    run = staircase(
        _usa(beta),
        authors_start(beta),
        ds=lr,
        steps=steps,
        speed=math.log(beta),
        record_every=steps,
    )
    got = np.arctan2(run.x[-1, :, 1], run.x[-1, :, 0])
    np.testing.assert_allclose(got, theta, atol=1e-11)
    assert run.s[-1] == pytest.approx(lr * steps)


@pytest.mark.parametrize("beta", [1000.0, 4000.0])
def test_the_energy_climbs_the_levels_of_the_merges(beta):
    run = staircase(
        _usa(beta),
        authors_start(beta),
        ds=1e-5,
        steps=40_000,
        speed=math.log(beta),
        record_every=100,
        merge_below=5e-5,
        merge_angle=1e-3,
    )
    E = af.interaction_energy(run.x, beta, shifted=True)
    assert np.all(np.diff(E) > -1e-12)  # an ascent, to rounding
    change = np.nonzero(np.diff(run.distinct))[0] + 1
    assert run.distinct[0] == 5 and list(run.distinct[change]) == [4, 3, 2, 1]
    # after each merge the clusters' multiplicities m_c give the level sum m_c^2 / n^2
    for k in change:
        _, m = np.unique(
            np.round(np.arctan2(run.x[k, :, 1], run.x[k, :, 0]), 12), return_counts=True
        )
        assert E[k] == pytest.approx((m**2).sum() / 25, abs=2e-2), (k, m)
    # one cluster: every e^{beta (<x_i, x_j> - 1)} is 1 up to beta times the rounding of
    # a unit norm (the tokens are normalised by their largest entry, then by their norm)
    assert E[-1] == pytest.approx(1.0, abs=4 * beta * np.finfo(np.float64).eps)


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="V = I"):
        staircase(af.IsotropicAttention(3), np.eye(3), ds=1e-3, steps=10, record_every=10)
    with pytest.raises(ValueError, match="V = I"):
        model = af.Attention(np.eye(2), np.eye(2), -np.eye(2))
        staircase(model, authors_start(10.0), ds=1e-3, steps=10, record_every=10)
    with pytest.raises(ValueError, match="record_every"):
        staircase(_usa(10.0), authors_start(10.0), ds=1e-3, steps=15, record_every=10)
    with pytest.raises(ValueError, match="ds"):
        staircase(_usa(10.0), authors_start(10.0), ds=0.0, steps=10, record_every=10)


def test_fig_staircase_quick(tmp_path):
    import json

    from attnflow.experiments import fig_staircase as F

    assert F.make(tmp_path, quick=True)["figures"]
    side = json.loads((tmp_path / "fig_staircase.json").read_text())
    for run in side["runs"]:  # 5 -> 4 -> 3 -> 2 -> 1 tokens, each merge on its level
        assert [m["clusters"] for m in run["merges"]] == [4, 3, 2, 1]
        for m in run["merges"]:
            assert m["energy"] == pytest.approx(m["level"], abs=2e-2)
        assert run["largest_energy_decrease"] < 1e-12
    # larger beta, earlier merges in rescaled time
    assert side["runs"][1]["merges"][-1]["s"] < side["runs"][0]["merges"][-1]["s"]
