"""USA with a shift, ``e^{L - shift} / n``: the weights against numpy, the same paths on
the sphere at another speed, finite at beta in the thousands; the shifted energy."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnflow as af


def test_shifted_weights_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3))
    model = af.Attention(
        np.eye(3), np.eye(3), np.eye(3), beta=2.0, kernel=af.kernels.USA(shift=1.5)
    )
    L = 2.0 * x @ x.T
    np.testing.assert_allclose(np.asarray(model.attention(x)), np.exp(L - 1.5) / 6, rtol=1e-13)
    # through the kernel name and kernel_params as well (saved forms carry it)
    named = af.Attention(
        np.eye(3), np.eye(3), np.eye(3), beta=2.0, kernel="usa", kernel_params={"shift": 1.5}
    )
    np.testing.assert_allclose(
        np.asarray(named.attention(x)), np.asarray(model.attention(x)), rtol=0
    )
    with pytest.raises(ValueError, match="shift"):
        af.kernels.USA(shift=float("inf"))


def test_a_shift_is_a_change_of_speed_on_the_sphere():
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(8, 3))
    beta, c, T = 3.0, 2.0, 1.5
    shifted = af.IsotropicAttention(3, beta=beta, kernel=af.kernels.USA(shift=c))
    plain = af.IsotropicAttention(3, beta=beta, kernel="usa")
    a = af.simulate(shifted, x0, T, frame="sphere", rtol=1e-11, atol=1e-13)
    b = af.simulate(plain, x0, T * math.exp(-c), frame="sphere", rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(np.asarray(a.x[-1]), np.asarray(b.x[-1]), atol=1e-9)


def test_large_beta_runs_with_the_shift_and_stops_without():
    beta = 2000.0
    ang = np.array([0.0, 0.02, 0.05, 0.3])
    x0 = np.stack([np.cos(ang), np.sin(ang)], -1)
    ok = af.simulate(
        af.IsotropicAttention(2, beta=beta, kernel=af.kernels.USA(shift=beta)),
        x0,
        0.5,
        frame="sphere",
        method="euler",
        dt=1e-3,
    )
    assert ok.status == "ok" and np.all(np.isfinite(ok.x))
    stopped = af.simulate(
        af.IsotropicAttention(2, beta=beta, kernel="usa"),
        x0,
        0.5,
        frame="sphere",
        method="euler",
        dt=1e-3,
    )
    assert stopped.status == "overflow"


def test_shifted_energy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 7, 2))
    beta = 4.0
    E = af.interaction_energy(x, beta)
    np.testing.assert_allclose(
        af.interaction_energy(x, beta, shifted=True), 2 * beta * math.exp(-beta) * E, rtol=1e-13
    )
    # clusters of m_c tokens far apart at large beta: sum m_c^2 / n^2, finite at beta = 4000
    ang = np.repeat([0.0, 1.0, 2.5], [3, 1, 2])
    u = np.stack([np.cos(ang), np.sin(ang)], -1)[None]
    assert af.interaction_energy(u, 4000.0, shifted=True)[0] == pytest.approx(14 / 36, abs=1e-15)
    with pytest.raises(ValueError, match="shifted"):
        af.interaction_energy(x, beta, shifted="yes")
