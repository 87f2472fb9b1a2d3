"""The linear modes of the mean-field equation (``attnflow.predict_metastable``): the
published cluster counts, the Funk-Hecke factors against quadrature, and the growth of
a perturbed uniform configuration of particles against the predicted rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

import attnflow as af
from attnflow.analysis import mode_rates

# Bruno, Pasqualotto and Agazzi 2025: k* = argmax_k k^2 I_k(beta) on the circle
PUBLISHED = {1: 1, 2: 2, 3: 2, 5: 3, 8: 4, 10: 4, 20: 6, 32: 8, 50: 10, 64: 11, 100: 14}


@pytest.mark.parametrize("kernel", ["softmax", "usa"])
def test_cluster_counts_on_the_circle_are_the_published_ones(kernel):
    got = {b: af.predict_metastable(b, kernel=kernel).clusters for b in PUBLISHED}
    assert got == PUBLISHED
    # and the argmax of k^2 I_k(beta) computed here in plain scipy
    for b in PUBLISHED:
        k = np.arange(1, 60)
        assert int(k[np.argmax(k**2 * special.iv(k, b))]) == PUBLISHED[b]


def _funk_hecke(l: int, beta: float, d: int) -> float:
    """m_l = |S^{d-2}| / |S^{d-1}| int_{-1}^1 e^{beta t} P_l(t) (1 - t^2)^{(d-3)/2} dt with
    P_l the Gegenbauer polynomial normalised to P_l(1) = 1 (Chebyshev's T_l for d = 2)."""
    c = math.gamma(d / 2) / (math.sqrt(math.pi) * math.gamma((d - 1) / 2))
    if d == 2:  # t = cos(theta): (1/pi) int_0^pi e^{beta cos theta} cos(l theta)
        f = lambda th: math.exp(beta * math.cos(th)) * math.cos(l * th)  # noqa: E731
        return integrate.quad(f, 0, math.pi, epsabs=1e-13, epsrel=1e-12)[0] / math.pi
    a = d / 2 - 1
    g = lambda t: (  # noqa: E731
        math.exp(beta * t)
        * special.eval_gegenbauer(l, a, t)
        / special.eval_gegenbauer(l, a, 1.0)
        * (1 - t * t) ** ((d - 3) / 2)
    )
    return c * integrate.quad(g, -1, 1, epsabs=1e-13, epsrel=1e-12)[0]


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("beta", [0.7, 3.0])
def test_rates_are_the_funk_hecke_factors_times_the_laplacian(d, beta):
    ls = np.arange(1, 6)
    m = np.array([_funk_hecke(int(l), beta, d) for l in ls])
    m0 = _funk_hecke(0, beta, d)
    usa, log_usa = mode_rates(beta, ls, d=d, kernel="usa")
    sa, _ = mode_rates(beta, ls, d=d, kernel="softmax")
    want = ls * (ls + d - 2) * m / beta
    np.testing.assert_allclose(usa, want, rtol=1e-9)
    np.testing.assert_allclose(sa, want / m0, rtol=1e-9)
    np.testing.assert_allclose(np.exp(log_usa), usa, rtol=1e-12)


@pytest.mark.parametrize("kernel", ["softmax", "usa"])
def test_a_perturbed_uniform_configuration_grows_at_the_predicted_rate(kernel):
    """n evenly spaced tokens on the circle (an equilibrium), displaced by eps sin(k phi):
    the empirical measure's k-th Fourier coefficient grows as e^{lambda_k t}."""
    beta, k, n, eps = 5.0, 3, 240, 1e-5
    lam = float(mode_rates(beta, [k], kernel=kernel)[0][0])
    t1 = 1.5 / lam
    phi = 2 * np.pi * np.arange(n) / n
    theta = phi + eps * np.sin(k * phi)
    x0 = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    model = af.IsotropicAttention(2, beta=beta, kernel=kernel)
    traj = af.simulate(model, x0, t1, frame="sphere", rtol=1e-10, atol=1e-12)
    traj.raise_for_status()
    ang = np.arctan2(traj.x[:, :, 1], traj.x[:, :, 0])
    c = np.abs(np.mean(np.exp(-1j * k * ang), axis=1))
    measured = math.log(c[-1] / c[0]) / t1
    assert measured == pytest.approx(lam, rel=2e-4)


def test_large_beta_stays_finite_in_logs_and_near_sqrt_2_beta():
    r = af.predict_metastable(1e4, kernel="usa")
    assert np.all(np.isfinite(r.log_rates)) and math.isinf(r.rates.max())
    assert abs(r.clusters - math.sqrt(2e4)) < 3
    sa = af.predict_metastable(1e4)
    assert sa.clusters == r.clusters and math.isfinite(sa.rate) and sa.rate > 0
    assert sa.linear_time(1e-3) == pytest.approx(math.log(1e3) / sa.rate)
    assert sa.to_dict()["clusters"] == sa.clusters


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="kernel must be 'softmax'"):
        af.predict_metastable(2.0, kernel="sigmoid")
    with pytest.raises(ValueError, match="beta must be"):
        af.predict_metastable(0.0)
    with pytest.raises(ValueError, match="d must be an integer >= 2"):
        af.predict_metastable(2.0, d=1)
    with pytest.raises(ValueError, match="k must be a non-empty"):
        mode_rates(2.0, [0, 1])
    with pytest.raises(ValueError, match="eps must be"):
        af.predict_metastable(2.0).linear_time(1.5)


def test_cli_modes_prints_the_prediction_and_refuses_other_kernels(capsys):
    import json

    from attnflow.cli import main

    with pytest.raises(SystemExit) as e:
        main(["modes", "--beta", "5", "--json"])
    assert e.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clusters"] == 3 and out["rate"] == pytest.approx(af.predict_metastable(5).rate)
    with pytest.raises(SystemExit) as e:
        main(["modes", "--beta", "5", "--kernel", "sigmoid"])
    assert e.value.code == 2 and "kernel must be 'softmax'" in capsys.readouterr().err


@pytest.mark.parametrize("beta, published", [(1.0, 8.072), (4.0, 14.633), (16.0, 2.80e5)])
def test_two_tokens_merge_at_the_published_times(beta, published):
    """Two tokens on the circle (SA, self-attention included) at angle pi/2 close to 1e-3
    in the time of Delta' = -2 sin(Delta) e^{beta cos Delta} / (e^beta + e^{beta cos
    Delta}): 8.072, 14.633 and 2.80e5 at beta = 1, 4, 16 (metastability ~ e^{beta})."""

    def f(a: float) -> float:  # dt / dDelta
        c = math.exp(beta * math.cos(a))
        return (math.exp(beta) + c) / (2 * math.sin(a) * c)

    quad = integrate.quad(f, 1e-3, math.pi / 2, epsrel=1e-12, limit=200)[0]
    assert quad == pytest.approx(published, rel=5e-4 if beta < 16 else 5e-3)
    # saves every 0.02 around the predicted crossing: near it the angle decays like e^{-t}
    ts = np.concatenate([[0.0], quad + np.linspace(-min(30.0, 0.9 * quad), 30.0, 3001)])
    x0 = np.array([[1.0, 0.0], [0.0, 1.0]])
    traj = af.simulate(
        af.IsotropicAttention(2, beta=beta),
        x0,
        ts[-1],
        ts=ts,
        frame="sphere",
        rtol=1e-10,
        atol=1e-12,
    )
    traj.raise_for_status()
    angle = np.arccos(np.clip(np.sum(traj.x[:, 0] * traj.x[:, 1], axis=-1), -1.0, 1.0))
    i = int(np.argmax(angle < 1e-3))
    assert i > 0
    # log-linear interpolation between the saves around the crossing
    a0, a1 = np.log(angle[i - 1]), np.log(angle[i])
    t_cross = ts[i - 1] + (np.log(1e-3) - a0) / (a1 - a0) * (ts[i] - ts[i - 1])
    assert t_cross == pytest.approx(quad, rel=2e-3)
