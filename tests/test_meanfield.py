"""The mean-field continuity equation on the circle (``attnflow.solve_density``): growth
rates of the linearised modes against the closed form, the invariants (mass, positivity,
the uniform equilibrium, the energy's growth against its closed-form derivative),
particles converging to the density at a fitted rate in the circle's Wasserstein-1
distance, resolution, save and load, and the analyses that serve or refuse a density."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import attnflow as af
from attnflow.analysis import (
    circle_wasserstein,
    density_clusters,
    fourier_modes,
    interaction_energy,
    mode_rates,
)

TIGHT = af.AdaptiveSolver(rtol=1e-12, atol=1e-14, method="dopri8")


@pytest.mark.parametrize("kernel", ["softmax", "usa"])
@pytest.mark.parametrize("beta, k", [(5.0, 3), (20.0, 6), (5.0, 1)])
def test_linear_modes_grow_at_the_predicted_rates(kernel, beta, k):
    lam = float(mode_rates(beta, [k], kernel=kernel)[0][0])
    t1 = 2.0 / lam
    m = af.CircleMeanField(beta, kernel, modes=32)
    sol = af.solve_density(m, lambda th: 1 + 1e-6 * np.cos(k * th), t1, ts=[0.0, t1], solver=TIGHT)
    assert sol.status == "ok"
    c = np.abs(sol.coefficients(k)[:, k])
    assert math.log(c[1] / c[0]) / t1 == pytest.approx(lam, rel=1e-6)


def _bumpy(th):
    return 1 + 0.4 * np.cos(th) + 0.3 * np.cos(3 * th + 0.5)


@pytest.fixture(scope="module")
def bumpy():
    """beta = 5 SA from a bumpy start, resolved to t = 3 (three clusters from t = 2)."""
    m = af.CircleMeanField(5.0, modes=128)
    ts = np.linspace(0.0, 3.0, 13)
    return af.solve_density(m, _bumpy, 3.0, ts=ts).raise_for_status()


def test_mass_and_positivity_are_kept_and_the_uniform_measure_is_an_equilibrium(bumpy):
    np.testing.assert_allclose(bumpy.mass, 1.0, atol=1e-12)
    assert np.all(bumpy.density >= 0.0)
    assert bumpy.density.max() > 3 * bumpy.density[0].max()  # it did concentrate
    flat = af.solve_density(af.CircleMeanField(5.0, modes=16), np.ones(68), 3.0)
    np.testing.assert_allclose(flat.density, 1 / (2 * np.pi), rtol=1e-13)


def test_energy_grows_at_its_closed_form_rate(bumpy):
    """dE/dt = (1/beta^2) int rho (d_theta u)^2 / u with u = G * rho (SA), E the energy."""
    beta = 5.0
    E = interaction_energy(bumpy, beta)
    assert np.all(np.diff(E) > 0)
    th = bumpy.theta
    G = np.exp(beta * np.cos(th[:, None] - th[None, :]))
    dG = -beta * np.sin(th[:, None] - th[None, :]) * G
    h, dt = 2 * np.pi / th.size, bumpy.ts[1] - bumpy.ts[0]
    for k in (3, 6, 9):
        rho = bumpy.density[k]
        u, du = G @ rho * h, dG @ rho * h
        want = np.sum(rho * du**2 / u) * h / beta**2
        # fourth-order central difference of the saved energies
        got = (E[k - 2] - 8 * E[k - 1] + 8 * E[k + 1] - E[k + 2]) / (12 * dt)
        assert got == pytest.approx(want, rel=2e-3)


# slow: four particle ensembles cost 22 s; the default suite checks the density's modes, energy
# and Fourier statistics against particles
@pytest.mark.slow
def test_particles_converge_to_the_density_at_rate_one_over_n(bumpy):
    """Quantile-placed particles start at W1 = pi / (2 n) and stay near it while the
    density concentrates into three clusters: the fitted exponent is -1."""
    grid = np.linspace(0, 2 * np.pi, 20001)
    F = bumpy.cdf(grid, 0)
    ns = np.array([32, 64, 128, 256, 512])
    w0, w1 = [], []
    for n in ns:
        th0 = np.interp((np.arange(n) + 0.5) / n, F, grid)
        x0 = np.stack([np.cos(th0), np.sin(th0)], axis=1)
        traj = af.simulate(
            af.IsotropicAttention(2, beta=5.0), x0, 3.0, ts=bumpy.ts, frame="sphere", rtol=1e-10
        ).raise_for_status()
        w0.append(circle_wasserstein(traj, bumpy, save=0))
        w1.append(circle_wasserstein(traj, bumpy, save=-1))
    np.testing.assert_allclose(w0, np.pi / (2 * ns), rtol=2e-3)
    fit = stats.linregress(np.log(ns), np.log(w1))
    assert fit.slope == pytest.approx(-1.0, abs=0.1)
    assert np.all(np.asarray(w1) * ns < 1.3 * np.pi / 2)


def test_circle_wasserstein_against_closed_forms_and_scipy():
    rng = np.random.default_rng(0)
    # two point masses at arc distance 1 (and across 0)
    assert circle_wasserstein(np.array([0.0]), np.array([1.0])) == pytest.approx(1.0, abs=1e-9)
    assert circle_wasserstein(np.array([0.1]), np.array([2 * np.pi - 0.2])) == pytest.approx(
        0.3, abs=1e-9
    )
    # inside an arc of length < pi / 2 the circle's W1 is the line's
    a, b = rng.uniform(1.0, 2.0, 300), rng.uniform(1.2, 2.3, 500)
    assert circle_wasserstein(a, b) == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-9)
    # a point mass against the uniform density: int_0^pi s ds / pi = pi / 2
    flat = af.solve_density(af.CircleMeanField(2.0, modes=8), np.ones(36), 0.1)
    assert circle_wasserstein(np.array([1.0]), flat) == pytest.approx(np.pi / 2, rel=1e-6)


def test_fourier_modes_and_energy_agree_between_particles_and_their_density():
    m = af.CircleMeanField(3.0, modes=16)
    sol = af.solve_density(m, lambda th: np.exp(np.cos(2 * th)), 0.1, ts=[0.0])
    th = m.grid()
    # particles at the grid angles weighted by the density: the measure is the density's
    w = sol.density[0] / sol.density[0].sum()
    c_part = (w[:, None] * np.exp(-1j * np.outer(th, np.arange(9)))).sum(0)
    np.testing.assert_allclose(fourier_modes(sol, 8)[0], c_part, atol=1e-14)
    e = np.exp(3.0 * np.cos(th[:, None] - th[None, :]))
    assert interaction_energy(sol, 3.0)[0] == pytest.approx(w @ e @ w / 6.0, rel=1e-12)
    shifted = interaction_energy(sol, 3.0, shifted=True)[0]
    assert shifted == pytest.approx(w @ (e * np.exp(-3.0)) @ w, rel=1e-12)
    # unweighted angles: the particles' own formula
    ang = np.array([0.0, 0.5, 3.0])
    x = np.stack([np.cos(ang), np.sin(ang)], 1)[None]
    np.testing.assert_allclose(
        fourier_modes(ang, 2), np.exp(-1j * np.outer(ang, [0, 1, 2])).mean(0), atol=1e-15
    )
    e3 = np.exp(2.0 * np.cos(ang[:, None] - ang[None]))
    assert interaction_energy(x, 2.0)[0] == pytest.approx(e3.sum() / (4.0 * 9), rel=1e-12)


def test_density_clusters_count_peaks_not_ripples(bumpy):
    m = af.CircleMeanField(5.0, modes=32)
    sol = af.solve_density(m, lambda th: np.exp(3 * np.cos(3 * th)), 0.1)
    assert density_clusters(sol).tolist() == [3, 3]
    assert af.count_clusters(sol).tolist() == [3, 3]
    ripple = af.solve_density(m, lambda th: 1 + 1e-3 * np.cos(5 * th), 0.1)
    assert density_clusters(ripple).tolist() == [0, 0]
    counts = density_clusters(bumpy)
    assert counts[0] == 0 and counts[-1] == 3  # the bumpy start forms k* = 3 clusters
    assert af.predict_metastable(5.0).clusters == 3


def test_lost_resolution_is_a_status_and_raises_naming_modes():
    m = af.CircleMeanField(5.0, modes=24)
    with pytest.warns(RuntimeWarning, match="not resolved"):
        sol = af.solve_density(m, _bumpy, 3.0, ts=np.linspace(0, 3, 4))
    assert sol.status == "unresolved" and not sol.resolved[-1] and sol.tail[-1] > 10 * sol.tail[0]
    with pytest.raises(af.SimulationError, match="more modes"):
        sol.raise_for_status()


def test_save_and_load_round_trip_and_a_corrupted_file_is_refused(bumpy, tmp_path):
    path = bumpy.save(tmp_path / "rho.npz")
    back = af.DensityTrajectory.load(path)
    np.testing.assert_array_equal(back.q, bumpy.q)
    assert back.model.describe() == bumpy.model.describe() and back.status == bumpy.status
    with np.load(path) as f:
        parts = dict(f)
    parts["q"] = parts["q"] * (1 + 1e-15)
    np.savez(tmp_path / "bad.npz", **parts)
    with pytest.raises(ValueError, match="corrupted"):
        af.DensityTrajectory.load(tmp_path / "bad.npz")


def test_token_analyses_refuse_a_density_by_name(bumpy):
    for call in (
        lambda: af.predict_regime(bumpy.model),
        lambda: af.dispersion(bumpy.model),
        lambda: af.clustered_fraction(bumpy),
    ):
        with pytest.raises(ValueError, match="token density"):
            call()
    for call in (lambda: af.track_rank(bumpy), lambda: af.observe_limit(bumpy)):
        with pytest.raises(ValueError, match="must be an attnflow.Trajectory"):
            call()
    with pytest.raises(ValueError, match="density_clusters"):
        af.count_clusters(bumpy, threshold=0.9)


def test_bad_arguments_are_refused_by_name():
    m = af.CircleMeanField(2.0, modes=8)
    for kw, match in [
        ({"beta": 0.0}, "beta must be"),
        ({"beta": 800.0, "kernel": "usa"}, "too large for kernel='usa'"),
        ({"beta": 1.0, "kernel": "sigmoid"}, "kernel must be"),
        ({"beta": 1.0, "modes": 2}, "modes must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            af.CircleMeanField(**kw)
    with pytest.raises(ValueError, match="rho0 must be a function"):
        af.solve_density(m, np.ones(5), 1.0)
    with pytest.raises(ValueError, match="rho0 must be finite, >= 0"):
        af.solve_density(m, lambda th: np.cos(th), 1.0)
    with pytest.raises(ValueError, match="solver must be an attnflow.AdaptiveSolver"):
        af.solve_density(m, np.ones(36), 1.0, solver=af.LayerSolver(0.1))
    with pytest.raises(ValueError, match="ts must be increasing"):
        af.solve_density(m, np.ones(36), 1.0, ts=[0.5, 0.2])
    with pytest.raises(ValueError, match="model must be a CircleMeanField"):
        af.solve_density(af.IsotropicAttention(2), np.ones(36), 1.0)
