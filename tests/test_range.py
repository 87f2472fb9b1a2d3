"""Numbers at the ends of their documented ranges: ``log_ive`` (the logs of ``I_nu(x)
e^{-x}`` behind the mode rates and the mean-field weights) for every order and argument
in the float range, ``predict_metastable`` up to ``beta = 1e11`` and on spheres of any
dimension, ``CircleMeanField`` past scipy's NaN at ``beta = 2^30``, and the sphere
observables and Renyi centres for tokens of any norm.

References, none of them attnflow's code nor scipy's Bessel functions:

- integer orders, moderate ``x``: the power series ``sum_k (x/2)^{2k+n} / (k! (n+k)!)``
  in 60-digit decimals (every term positive: no cancellation);
- half-integer orders: the closed form of ``I_{n+1/2}`` (a finite sum times ``e^{+-x}``),
  exact in rationals where ``e^{-2x}`` is below the precision;
- integer orders, large ``x`` (past ``2^30``): ``I_n(x) e^{-x} = (1 / 2 pi) int e^{-2x
  sin^2(t/2)} cos(n t) dt`` by the trapezoidal rule over one period (exponentially
  accurate for periodic integrands);
- identities: the three-term recurrence ``I_{nu-1} - I_{nu+1} = (2 nu / x) I_nu`` and
  monotonicity in the order (hypothesis).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnflow as af
from attnflow._special import log_ive
from attnflow.analysis import sphere
from attnflow.analysis.modes import MAX_BETA, mode_rates, predict_metastable


# ------------------------------------------------------------------ references
def series_log_ive(n: int, x: float, digits: int = 60) -> float:
    """``log(I_n(x) e^{-x})`` for an integer order by the power series in decimals."""
    with localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = digits, 10**8, -(10**8)
        h = Decimal(x) / 2
        term = h**n / Decimal(math.factorial(n))
        total, k, q = term, 0, h * h
        while True:
            k += 1
            term = term * q / (k * (n + k))
            total += term
            if term < total * Decimal(10) ** (-digits):
                break
        return float(total.ln() - Decimal(x))


def half_integer_log_ive(n: int, x: float) -> float:
    """``log(I_{n+1/2}(x) e^{-x})`` from the closed form (x large enough that ``e^{-2x}``
    is below 1e-40 of the leading sum, which is then exact in rationals)."""
    xf = Fraction(x)
    s = sum(
        Fraction((-1) ** k * math.factorial(n + k), math.factorial(k) * math.factorial(n - k))
        / (2 * xf) ** k
        for k in range(n + 1)
    )
    assert 2 * x > 100 + 2 * n * abs(math.log(x)) + 100
    return math.log(s) - 0.5 * math.log(2 * math.pi) - 0.5 * math.log(x)


def quadrature_log_ive(orders: np.ndarray, x: float) -> np.ndarray:
    """``log(I_n(x) e^{-x})`` for integer orders by the periodic trapezoidal rule."""
    N = int(12 * math.sqrt(x)) + 4 * int(orders.max()) + 64
    t = (np.arange(N) - N // 2) * (2 * math.pi / N)
    e = 2.0 * x * np.sin(t / 2) ** 2
    t, g = t[e < 800], np.exp(-e[e < 800])  # the rest is below 1e-340 of the peak
    vals = np.array([np.sum(g * np.cos(n * t)) / N for n in orders])
    return np.log(vals)


# ------------------------------------------------------------------ log_ive
@pytest.mark.parametrize("n", [0, 1, 14, 15, 16, 100, 191, 192, 1000, 3000])
@pytest.mark.parametrize("x", [1e-300, 1e-20, 1e-5, 1.0, 5.0, 100.0, 700.0])
def test_log_ive_matches_the_power_series(n, x):
    got = float(log_ive(n, x))
    want = series_log_ive(n, x)
    assert math.isfinite(got)
    assert got == pytest.approx(want, rel=1e-13, abs=1e-12)


@pytest.mark.parametrize("x", [2.0**30 + 1, 2e9, 1e12])
def test_log_ive_past_scipys_nan_matches_quadrature(x):
    orders = np.array([0, 1, 2, 14, 15, 16, 100, int(math.sqrt(x)), int(math.sqrt(2 * x))])
    got = log_ive(orders.astype(float), x)
    want = quadrature_log_ive(orders, x)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-12)


@pytest.mark.parametrize(
    "n, x",
    [(n, x) for n in (0, 1, 7, 20, 300) for x in (1e4, 2e9)]
    + [(n, x) for n in (0, 1, 7, 20) for x in (1e100, 1e299)],
)
def test_log_ive_half_integer_orders_match_the_closed_form(n, x):
    assert float(log_ive(n + 0.5, x)) == pytest.approx(half_integer_log_ive(n, x), abs=1e-12)


def test_log_ive_refuses_what_is_outside_its_domain():
    for nu, x in [(-1.0, 1.0), (1.0, 0.0), (1.0, math.inf), (math.nan, 1.0)]:
        with pytest.raises(ValueError, match="nu >= 0 .* x > 0"):
            log_ive(nu, x)


@settings(max_examples=60, deadline=None)
@given(
    nu=st.integers(1, 5000),
    log10x=st.floats(-300.0, 299.0, allow_nan=False),
)
def test_log_ive_recurrence_and_monotone_in_the_order(nu, log10x):
    x = 10.0**log10x
    lo, mid, hi = log_ive(np.array([nu - 1.0, nu, nu + 1.0]), x)
    assert np.isfinite([lo, mid, hi]).all()
    slack = 1e-14 * abs(mid)  # adjacent orders agree to rounding when x >> nu^2
    assert lo >= mid - slack and mid >= hi - slack  # I_nu(x) decreases in the order
    r_lo, r_hi = math.exp(lo - mid), math.exp(hi - mid)  # I_{nu -+ 1} / I_nu
    # I_{nu-1} - I_{nu+1} = (2 nu / x) I_nu, relative to the larger side
    assert r_lo - r_hi == pytest.approx(2 * nu / x, rel=1e-9, abs=1e-11 * r_lo)


# ------------------------------------------------------------------ modes
def test_predict_metastable_at_2e9_matches_quadrature():
    beta = 2e9
    r = predict_metastable(beta)
    ks = np.arange(63230, 63262)
    # SA: lambda_k = k^2 I_k(beta) / (beta I_0(beta))
    ref = quadrature_log_ive(np.concatenate([[0], ks]), beta)
    log_rates = np.log(ks**2 / beta) + ref[1:] - ref[0]
    assert r.clusters == int(ks[np.argmax(log_rates)]) == 63246
    assert math.isfinite(r.rate)
    assert r.rate == pytest.approx(math.exp(log_rates.max()), rel=1e-10)
    assert r.rate == pytest.approx(2 / math.e, rel=1e-6)  # 2 e^{-1} as beta -> infinity


@pytest.mark.parametrize("kernel", ["softmax", "usa"])
def test_predict_metastable_at_the_ends_of_its_range(kernel):
    top = predict_metastable(MAX_BETA, kernel=kernel)
    assert abs(top.clusters - math.sqrt(2 * MAX_BETA)) < 2
    assert np.all(np.isfinite(top.log_rates))
    low = predict_metastable(1e-300, kernel=kernel)
    assert low.clusters == 1
    if kernel == "softmax":  # I_1(b) / (b I_0(b)) -> 1/2 as b -> 0
        assert low.rate == pytest.approx(0.5, rel=1e-12)
    else:  # I_1(b) / b -> 1/2
        assert low.rate == pytest.approx(0.5, rel=1e-12)
    with pytest.raises(ValueError, match=r"beta = 2e\+11 is beyond .*mode_rates"):
        predict_metastable(2 * MAX_BETA, kernel=kernel)


def test_mode_rates_to_1e300():
    _, log_rates = mode_rates(1e299, [1, 10**6], kernel="softmax")
    # log lambda_k = log(k^2 / beta) + log I_k - log I_0 ~ log(k^2 / beta) - k^2/(2 beta)
    np.testing.assert_allclose(log_rates, [math.log(1 / 1e299), math.log(1e12 / 1e299)], atol=1e-12)
    with pytest.raises(ValueError, match="beta must be below 1e300"):
        mode_rates(1e300, [1])


@pytest.mark.parametrize("d", [300, 384, 1001, 4000])
def test_mode_rates_on_high_dimensional_spheres(d):
    beta = 3.0
    r = predict_metastable(beta, d=d)
    assert np.all(np.isfinite(r.rates)) and np.all(np.isfinite(r.log_rates))
    # SA, degree l: l (l + d - 2) I_{l + d/2 - 1}(b) / (b I_{d/2 - 1}(b)); d even: integers
    if d % 2 == 0:
        nu0 = d // 2 - 1
        for l in (1, 2, 5):
            want = (
                math.log(l * (l + d - 2) / beta)
                + series_log_ive(nu0 + l, beta)
                - series_log_ive(nu0, beta)
            )
            assert r.log_rates[l - 1] == pytest.approx(want, abs=1e-11)
    assert r.clusters == 1  # high orders: the first harmonic grows fastest


def test_cli_modes_on_a_sphere_of_dimension_384(capsys):
    from attnflow.cli import main

    with pytest.raises(SystemExit) as e:
        main(["modes", "--d", "384", "--json"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    data = json.loads(out)
    assert all(math.isfinite(v) for v in data["rates"]) and math.isfinite(data["rate"])
    # (d - 1) I_{d/2}(1) / I_{d/2 - 1}(1)
    want = math.exp(math.log(383) + series_log_ive(192, 1.0) - series_log_ive(191, 1.0))
    assert data["rate"] == pytest.approx(want, rel=1e-12)


def test_cli_modes_beyond_its_range_is_refused_by_name(capsys):
    from attnflow.cli import main

    with pytest.raises(SystemExit) as e:
        main(["modes", "--beta", "1e15"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "beta = 1e+15 is beyond" in err and "--n" not in err


@settings(max_examples=30, deadline=None)
@given(log10b=st.floats(-300.0, 11.0), d=st.integers(2, 3000))
def test_predict_metastable_is_finite_everywhere_in_range(log10b, d):
    r = predict_metastable(10.0**log10b, d=d)
    assert np.all(np.isfinite(r.log_rates))
    assert math.isfinite(r.rate) and r.rate > 0 and 1 <= r.clusters <= len(r.k)


# ------------------------------------------------------------------ mean field
@pytest.mark.parametrize("beta", [2.0**30 + 1, 2e9, 1e12])
def test_circle_mean_field_weights_past_2_to_the_30(beta):
    m = af.CircleMeanField(beta, modes=16)
    w = np.asarray(m.weights)
    k = np.arange(w.size)
    assert np.all(np.isfinite(w))
    want = 2 * math.pi * np.exp(quadrature_log_ive(k[: 2 * m.modes + 1], beta))
    np.testing.assert_allclose(w[: 2 * m.modes + 1], want, rtol=1e-11)
    assert np.all(w[2 * m.modes + 1 :] == 0)


@settings(max_examples=30, deadline=None)
@given(log10b=st.floats(-3.0, 15.0), modes=st.sampled_from([4, 8, 32]))
def test_circle_mean_field_weights_are_finite_and_decreasing(log10b, modes):
    w = np.asarray(af.CircleMeanField(10.0**log10b, modes=modes).weights)[: 2 * modes + 1]
    assert np.all(np.isfinite(w)) and np.all(w >= 0) and w[0] > 0
    assert np.all(np.diff(w) <= 0)


# ------------------------------------------------------------------ sphere observables
def _tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(2, 6, 3))


@pytest.mark.parametrize("scale", [1e-300, 1e-160, 1e160, 1e300])
def test_sphere_observables_at_any_token_norm(scale):
    x = _tokens()
    assert np.array_equal(sphere.count_clusters(x * scale, 0.3), sphere.count_clusters(x, 0.3))
    np.testing.assert_allclose(sphere.gram(x * scale), sphere.gram(x), rtol=0, atol=1e-15)
    np.testing.assert_allclose(
        sphere.clustered_fraction(x * scale, 0.3), sphere.clustered_fraction(x, 0.3)
    )
    np.testing.assert_allclose(
        sphere.interaction_energy(x * scale, 2.0), sphere.interaction_energy(x, 2.0), rtol=1e-14
    )
    u = x[0] / np.linalg.norm(x[0], axis=-1, keepdims=True)
    assert sphere.renyi_centres(x[0] * scale, delta=1.0).tolist() == (
        sphere.renyi_centres(u, delta=1.0).tolist()
    )


def test_renyi_centres_of_huge_tokens_are_the_centres_of_their_directions():
    # two tokens 1e200 long at 90 degrees: squaring overflowed, every distance was NaN
    x = np.array([[1e200, 0.0], [0.0, 3e200], [1e200, 1e199]])
    assert sphere.renyi_centres(x, delta=0.5).tolist() == [0, 1]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    exps=st.lists(st.integers(-300, 300), min_size=6, max_size=6),
)
def test_gram_is_scale_free_token_by_token(seed, exps):
    x = np.random.default_rng(seed).normal(size=(1, 6, 4))
    scaled = x * (10.0 ** np.array(exps, dtype=float))[None, :, None]
    np.testing.assert_allclose(sphere.gram(scaled), sphere.gram(x), rtol=0, atol=1e-15)


def test_complex_tokens_are_refused_by_name():
    x = _tokens().astype(complex) + 1e-3j
    for f in (sphere.count_clusters, sphere.clustered_fraction, sphere.gram):
        with pytest.raises(ValueError, match="traj must be real tokens; got a complex"):
            f(x)
    with pytest.raises(ValueError, match="x must be real tokens; got a complex"):
        sphere.renyi_centres(x[0], delta=0.5)
    with pytest.raises(ValueError, match="traj must be a real numeric array"):
        sphere.count_clusters(np.array([[["a", "b"], ["c", "d"]]]))
