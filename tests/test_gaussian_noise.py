"""The Gaussian closure against its closed form, an independent ODE solve and particles;
the noisy transformer's critical noise and beta_* against closed forms of the Bessel
ratios."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.optimize import brentq
from scipy.special import iv

import attnflow as af

RNG = np.random.default_rng(11)


def test_closure_in_one_dimension_is_the_closed_form():
    s0, ts = 0.2, np.linspace(0.0, 2.0, 9)  # blows up at t = 1 / (2 s0) = 2.5
    g = af.gaussian_closure([[1.0]], [[1.0]], [[1.0]], [0.0], [[s0]], ts)
    assert g.ok
    np.testing.assert_allclose(g.covs[:, 0, 0], s0 / (1 - 2 * s0 * ts), rtol=1e-9)
    np.testing.assert_array_equal(g.means[:, 0], 0.0)
    late = af.gaussian_closure([[1.0]], [[1.0]], [[1.0]], [0.0], [[s0]], [0.0, 1.0, 3.0])
    assert not late.ok and np.isnan(late.covs[-1]).all()  # past the blow-up: said, not NaN ok


def test_closure_against_an_independent_ode_solve():
    d = 3
    Q, K, V = (RNG.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    m0 = RNG.normal(size=d)
    A = RNG.normal(size=(d, d))
    S0 = 0.3 * A @ A.T / d
    beta, ts = 0.7, np.array([0.0, 0.4, 0.8])
    g = af.gaussian_closure(Q, K, V, m0, S0, ts, beta=beta)

    def rhs(t, y):  # the tilted-mean field, written from its definition
        m, S = y[:d], y[d:].reshape(d, d)
        B = beta * V @ S @ K.T @ Q  # v(x) = V (m + beta S K^T Q x)
        return np.concatenate([V @ m + B @ m, (B @ S + S @ B.T).ravel()])

    ref = solve_ivp(rhs, (0, ts[-1]), np.concatenate([m0, S0.ravel()]), t_eval=ts,
                    rtol=1e-11, atol=1e-13, method="DOP853")  # fmt: skip
    np.testing.assert_allclose(g.means, ref.y[:d].T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(g.covs, ref.y[d:].T.reshape(-1, d, d), rtol=1e-8, atol=1e-10)


def test_particles_follow_the_closure_as_n_grows():
    """Tokens sampled from N(m0, S0) and run by simulate: their mean and covariance at t
    approach the closure's, the error shrinking like n^{-1/2} (four seeds per n)."""
    d, t1, beta = 2, 0.5, 1.0
    Q, K = np.eye(d), np.array([[0.8, 0.2], [-0.1, 0.9]])
    V = np.array([[0.3, -0.5], [0.4, 0.2]])
    m0, S0 = np.array([0.5, -0.3]), np.array([[0.4, 0.1], [0.1, 0.25]])
    g = af.gaussian_closure(Q, K, V, m0, S0, [0.0, t1], beta=beta)
    model = af.Attention(Q, K, V, beta=beta)
    errors = {}
    for n in (100, 1600):  # four seeds in one batch per n
        x0 = np.stack(
            [np.random.default_rng(seed).multivariate_normal(m0, S0, size=n) for seed in range(4)]
        )
        traj = af.simulate(model, x0, t1, frame="original", rtol=1e-7, atol=1e-9)
        errs = []
        for x in np.asarray(traj.x[:, -1]):
            errs.append(
                np.abs(np.cov(x.T) - g.covs[-1]).max() + np.abs(x.mean(0) - g.means[-1]).max()
            )
        errors[n] = float(np.mean(errs))
    # sixteen times the tokens: a quarter of the error, within a factor of two
    ratio = errors[1600] / errors[100]
    assert 0.125 < ratio < 0.5, errors
    assert errors[1600] < 0.08


def test_closure_refuses_bad_input_by_name():
    with pytest.raises(ValueError, match="cov"):
        af.gaussian_closure(np.eye(2), np.eye(2), np.eye(2), [0, 0], [[1, 2], [0, 1]], [0, 1])
    with pytest.raises(ValueError, match="cov"):
        af.gaussian_closure(np.eye(2), np.eye(2), np.eye(2), [0, 0], -np.eye(2), [0, 1])
    with pytest.raises(ValueError, match="beta"):
        af.gaussian_closure(np.eye(2), np.eye(2), np.eye(2), [0, 0], np.eye(2), [0, 1], beta=0)
    with pytest.raises(ValueError, match="K"):
        af.gaussian_closure(np.eye(2), np.eye(3), np.eye(2), [0, 0], np.eye(2), [0, 1])


def test_critical_noise_is_the_first_modes_closed_form():
    for beta in (0.1, 1.0, 7.5, 40.0):
        # the circle: I_1 / (beta I_0); S^2: I_{3/2} / (beta I_{1/2}) = (coth b - 1/b) / b
        r2 = af.predict_noise_threshold(beta, d=2)
        assert r2.noise == pytest.approx(iv(1, beta) / (beta * iv(0, beta)), rel=1e-12)
        r3 = af.predict_noise_threshold(beta, d=3)
        assert r3.noise == pytest.approx((1 / math.tanh(beta) - 1 / beta) / beta, rel=1e-10)
        # USA on the circle: I_1(beta) / beta
        ru = af.predict_noise_threshold(beta, kernel="usa")
        assert ru.noise == pytest.approx(iv(1, beta) / beta, rel=1e-12)
    # D_c -> 1/d as beta -> 0 (SA), and every mode is stable above it: D_c is the largest
    # rate of the deterministic modes divided by l (l + d - 2)
    assert af.predict_noise_threshold(1e-6, d=4).noise == pytest.approx(0.25, rel=1e-5)
    for d in (2, 3, 5):
        beta = 6.0
        ks = np.arange(1, 40)
        rates, _ = af.analysis.mode_rates(beta, ks, d=d)
        dc = af.predict_noise_threshold(beta, d=d).noise
        assert np.max(rates / (ks * (ks + d - 2))) == pytest.approx(dc, rel=1e-10)
    # far past the float range, in logs
    big = af.predict_noise_threshold(1e5, kernel="usa")
    want = 1e5 - 1.5 * math.log(1e5) - 0.5 * math.log(2 * math.pi)
    assert big.noise == math.inf and big.log_noise == pytest.approx(want, rel=1e-9)


def test_beta_star_solves_the_bessel_ratio():
    for d in (2, 3, 4):
        bs = af.predict_noise_threshold(1.0, d=d).beta_star
        assert iv(d / 2 + 1, bs) / iv(d / 2, bs) == pytest.approx(1 / d, rel=1e-12)
    # S^2 by the closed form of the half-integer ratio: I_{5/2}/I_{3/2} = 1/(coth b - 1/b) - 3/b
    ref = brentq(lambda b: 1 / (1 / math.tanh(b) - 1 / b) - 3 / b - 1 / 3, 0.1, 10, xtol=1e-14)
    assert af.predict_noise_threshold(1.0, d=3).beta_star == pytest.approx(ref, rel=1e-10)
    assert af.predict_noise_threshold(1.0, d=2).continuous
    assert not af.predict_noise_threshold(5.0, d=2).continuous


@pytest.mark.slow  # about a minute on the shared 2-core machine
def test_fig_gaussian_closure_quick(tmp_path):
    """The figure's quick run: in both cases the particles' moments come closer to the
    closure as n grows fourfold, the closure started from a sample's own moments is
    closer than the law's, and every sample's seed is recorded."""
    import json

    from attnflow.experiments import fig_gaussian_closure as F

    F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_gaussian_closure.json").read_text())
    assert side["seeds"] == [0] and len(side["sample_seeds"]) == 2 * 2 * 2
    for case in side["cases"]:
        law, own = case["to_law_mean"], case["to_own_mean"]
        assert law[-1] < 0.75 * law[0], case["name"]
        assert all(o < w for o, w in zip(own, law, strict=True)), case["name"]
        closure = af.gaussian_closure(
            np.asarray(case["Q"]),
            np.asarray(case["K"]),
            np.asarray(case["V"]),
            np.asarray(case["m0"]),
            np.asarray(case["S0"]),
            np.array([0.0, side["t1"]]),
            beta=side["beta"],
        )
        np.testing.assert_allclose(closure.covs[-1], case["closure_cov_t1"], rtol=1e-10)


@pytest.mark.parametrize("D", [0.0, 0.1, 0.3])
def test_mean_field_laplacian_moves_every_mode_by_minus_D_k2(D, tmp_path):
    """``CircleMeanField(beta, diffusion=D)``: a small mode ``k`` about the uniform density
    grows at ``k^2 (I_k(beta) / (beta I_0(beta)) - D)`` (SA on the circle, scipy's
    Bessel functions here), the mass stays 1, and a run with diffusion saves and loads."""
    beta, eps, t1 = 3.0, 1e-6, 1.0
    model = af.CircleMeanField(beta, modes=32, diffusion=D)
    for k in (1, 2, 3):
        sol = af.solve_density(model, lambda th, k=k: 1 + eps * np.cos(k * th), t1, ts=[0.0, t1])
        c = sol.coefficients(kmax=k)
        rate = math.log(abs(c[-1, k]) / abs(c[0, k])) / t1
        want = k * k * (iv(k, beta) / (beta * iv(0, beta)) - D)
        assert abs(rate - want) < 1e-5, (k, rate, want)
        assert abs(sol.mass[-1] - 1.0) < 1e-12
    back = af.DensityTrajectory.load(sol.save(tmp_path / "density"))
    assert back.model.diffusion == D
    np.testing.assert_array_equal(back.q, sol.q)
    with pytest.raises(ValueError, match="diffusion"):
        af.CircleMeanField(beta, diffusion=-0.1)
