"""Critical attention scaling (``attnflow.analysis.critical``): the closed forms of one
layer on simplex tokens against the model's own layer, and their three limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis import critical_gamma, critical_layer, simplex_tokens


def _cos(z: np.ndarray) -> np.ndarray:
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    return u @ u.T


@pytest.mark.parametrize("gamma", [0.8, 2.0, 3.5])
@pytest.mark.parametrize("n", [16, 200])
def test_closed_forms_equal_the_models_own_layer(gamma, n):
    """One softmax layer (Q = K = V = I, beta = gamma log n, no residual) through
    attnflow's model, and through ssmax with s = gamma at beta = 1: the self-weight and
    the outputs' cosine are the closed forms at this n."""
    rho = 0.5  # gamma_c = 2
    y = simplex_tokens(n, rho)
    eye = np.eye(n + 1)
    r = critical_layer(gamma, rho, n)
    for model in (
        af.Attention(eye, eye, eye, beta=gamma * math.log(n)),
        af.Attention(eye, eye, eye, kernel="ssmax", kernel_params={"s": gamma}),
    ):
        P = np.asarray(model.attention(y))
        np.testing.assert_allclose(np.diag(P), r.self_weight, rtol=1e-12)
        C = _cos(np.asarray(model.pure_layer(y)))
        off = C[~np.eye(n, dtype=bool)]
        np.testing.assert_allclose(off, r.cosine, rtol=1e-11)


@pytest.mark.parametrize("rho", [0.2, 0.5, 0.8])
def test_the_three_limits_as_n_grows(rho):
    gc = critical_gamma(rho)
    assert gc == pytest.approx(1 / (1 - rho))
    big = 10**15
    below, at, above = (critical_layer(g, rho, big) for g in (0.5 * gc, gc, 1.5 * gc))
    assert (below.phase, at.phase, above.phase) == ("collapse", "critical", "preserved")
    assert below.cosine == pytest.approx(1.0, abs=1e-3) and below.limit_cosine == 1.0
    assert at.self_weight == pytest.approx(0.5, abs=1e-12)
    assert at.cosine == pytest.approx(4 * rho / (1 + 3 * rho), abs=1e-6)
    assert above.cosine == pytest.approx(rho, abs=1e-3) and above.limit_cosine == rho
    # at the critical scale the cosine approaches its limit as n grows, like 1/n
    errs = [abs(critical_layer(gc, rho, n).cosine - at.limit_cosine) for n in (10**2, 10**4)]
    assert errs[1] < errs[0] / 50


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="rho must be"):
        critical_layer(1.0, 1.0, 10)
    with pytest.raises(ValueError, match="gamma must be"):
        critical_layer(0.0, 0.5, 10)
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        critical_layer(1.0, 0.5, 1)


# ------------------------------------------------------------------ keys on the sphere
def _uniform(rng, shape, d):
    x = rng.normal(size=(*shape, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _brute_largest(beta, q, K):
    """Plain numpy: the largest softmax weight of each query q (m, d) on its keys
    K (m, n, d)."""
    logits = beta * np.einsum("md,mnd->mn", q, K)
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)).max(axis=1)


def _ein(lam):
    from scipy import special

    if lam < 1e-2:
        return lam - lam**2 / 4 + lam**3 / 18 - lam**4 / 96
    return float(special.exp1(lam)) + np.euler_gamma + math.log(lam)


def _d3_limit(a):
    """d = 3, n -> infinity, a = 2 beta / n: E M = int exp(-l - Ein(l) / a) dl (shot noise
    over a unit-rate Poisson process of the gaps)."""
    from scipy import integrate

    f = lambda lam: math.exp(-lam - _ein(lam) / a)  # noqa: E731
    return integrate.quad(f, 0, np.inf, limit=200, epsabs=0, epsrel=1e-12)[0]


def test_largest_weight_equals_softmax_of_explicit_vectors():
    from attnflow.analysis import largest_weight

    rng = np.random.default_rng(5)
    q, K = _uniform(rng, (7,), 4), _uniform(rng, (7, 30), 4)
    c = np.einsum("md,mnd->mn", q, K)
    for beta in (0.0, 0.7, 12.0, 400.0):
        ours = largest_weight(beta, c.max(axis=1, keepdims=True) - c)
        np.testing.assert_allclose(ours, _brute_largest(beta, q, K), rtol=1e-13)
    assert np.all(largest_weight(0.0, c.max(1, keepdims=True) - c) == 1 / 30)  # beta = 0
    with pytest.raises(ValueError, match="gaps must be >= 0"):
        largest_weight(1.0, np.array([0.0, -1.0]))


@pytest.mark.parametrize("d", [2, 3, 4])
def test_sphere_gaps_are_the_order_statistics_of_explicit_vectors(d):
    """The smallest gaps from the order-statistics sampler and from explicit uniform
    queries and keys have the same distribution (two-sample KS on the second and fifth
    gaps, and equal mean largest weight at one beta)."""
    from scipy import stats

    from attnflow.analysis import largest_weight, sphere_gaps

    n, m = 200, 400
    rng = np.random.default_rng(d)
    q, K = _uniform(rng, (m,), d), _uniform(rng, (m, n), d)
    c = np.sort(np.einsum("md,mnd->mn", q, K), axis=1)[:, ::-1]
    brute = c[:, :1] - c
    ours = sphere_gaps(n, d, m, rng=d + 10)
    assert ours.shape == (m, n) and np.all(ours[:, 0] == 0)
    for k in (1, 4):
        assert stats.ks_2samp(brute[:, k], ours[:, k]).pvalue > 1e-3
    beta = 1.0 / np.median(brute[:, 1])
    a, b = largest_weight(beta, brute), largest_weight(beta, ours)
    assert abs(a.mean() - b.mean()) < 4 * math.hypot(a.std(), b.std()) / math.sqrt(m)


def test_critical_beta_sphere_against_brute_force_and_monotone():
    """At the reported beta_c the mean largest weight of explicit uniform vectors (plain
    numpy softmax) is the level, within its sampling error; the mean weight increases
    with beta; n = 2 at d = 3 has the closed form E M = E expit(beta |t1 - t2|)."""
    from scipy import integrate, special

    from attnflow.analysis import critical_beta_sphere

    n, d = 100, 3
    r = critical_beta_sphere(n, d, seeds=4, samples=256)
    assert r.interval[0] < r.beta_c < r.interval[1] and r.betas.shape == (4,)
    rng = np.random.default_rng(11)
    q, K = _uniform(rng, (4000,), d), _uniform(rng, (4000, n), d)
    means = [_brute_largest(b, q, K).mean() for b in (0.5 * r.beta_c, r.beta_c, 2 * r.beta_c)]
    assert means[0] < means[1] < means[2]
    err = _brute_largest(r.beta_c, q, K).std() / math.sqrt(4000)
    assert abs(means[1] - 0.5) < 4 * err + 0.01
    # n = 2, d = 3: t uniform on [-1, 1], |t1 - t2| has density (2 - x) / 2 on [0, 2]
    exact = lambda b: integrate.quad(lambda x: special.expit(b * x) * (2 - x) / 2, 0, 2)[0]  # noqa: E731
    from scipy.optimize import brentq

    b2 = brentq(lambda b: exact(b) - 0.75, 0.1, 100.0)
    r2 = critical_beta_sphere(2, 3, level=0.75, seeds=8, samples=2000)
    assert r2.interval[0] < b2 < r2.interval[1]
    assert abs(r2.beta_c / b2 - 1) < 0.05


def test_d3_critical_beta_is_the_poisson_limit():
    """d = 3: beta_c / n tends to a_c / 2 with a_c the root of the shot-noise integral
    (0.39896 at level 1/2); measured at n = 10^4 and 10^6."""
    from scipy.optimize import brentq

    from attnflow.analysis import critical_beta_sphere

    a_c = brentq(lambda a: _d3_limit(a) - 0.5, 0.1, 10.0, xtol=1e-13)
    assert a_c / 2 == pytest.approx(0.39896, abs=1e-5)
    for n in (10**4, 10**6):
        r = critical_beta_sphere(n, 3, seeds=16, samples=256)
        lo, hi = (v / n for v in r.interval)
        assert lo < a_c / 2 < hi, (n, lo, hi)


@pytest.mark.parametrize("d", [2, 3, 4])
def test_the_critical_exponent_is_two_over_d_minus_one_without_log_correction(d):
    from attnflow.analysis import critical_exponent_sphere

    ns = [100, 1000, 10**4, 10**5] if d < 4 else [100, 1000, 10**4]
    fit = critical_exponent_sphere(ns, d, seeds=6, samples=32)
    assert fit.predicted == pytest.approx(2 / (d - 1))
    assert fit.interval[0] < fit.predicted < fit.interval[1], fit.interval
    assert fit.interval[1] - fit.interval[0] < 0.1
    assert fit.log_interval[0] < 0 < fit.log_interval[1]  # no log n correction seen
    # ssmax: s log n equals beta_c at s_c(n) = beta_c / log n, which grows with n, so a
    # fixed s (the one critical at the smallest n) is subcritical at the largest
    s_c = [p.ssmax_scale for p in fit.points]
    assert np.all(np.diff(s_c) > 0)
    assert s_c[0] * math.log(ns[-1]) < fit.points[-1].interval[0]


def test_ssmax_at_the_simplex_critical_scale_has_self_weight_one_half():
    """Simplex tokens: ssmax with s = critical_gamma(rho) is critical at every n (the
    self-weight n^s(1-rho) / (n^s(1-rho) + n - 1) = n / (2n - 1) -> 1/2); sphere keys:
    ssmax at a fixed s gives a largest weight that falls with n."""
    from attnflow import kernels
    from attnflow.analysis import critical_beta_sphere

    rho = 0.6
    s = critical_gamma(rho)
    for n in (10, 1000):
        y = simplex_tokens(n, rho)
        P = np.asarray(kernels.weights("ssmax", y @ y.T, {"s": s}))
        np.testing.assert_allclose(np.diag(P), n / (2 * n - 1), rtol=1e-12)
    d, small = 3, 100
    s_sphere = critical_beta_sphere(small, d, seeds=4, samples=64).ssmax_scale
    rng = np.random.default_rng(2)
    shares = []
    for n in (small, 10 * small, 100 * small):
        q, K = _uniform(rng, (100,), d), _uniform(rng, (100, n), d)
        L = np.einsum("md,mnd->mn", q, K)
        w = np.asarray(kernels.weights("ssmax", L, {"s": s_sphere}))
        shares.append(w.max(axis=1).mean())
    assert abs(shares[0] - 0.5) < 0.06 and shares[1] < 0.4 and shares[2] < 0.25


def test_sphere_arguments_are_refused_by_name():
    from attnflow.analysis import critical_beta_sphere, critical_exponent_sphere

    with pytest.raises(ValueError, match="level must be"):
        critical_beta_sphere(10, 3, level=0.05)
    with pytest.raises(ValueError, match="d must be an integer >= 2"):
        critical_beta_sphere(10, 1)
    with pytest.raises(ValueError, match="seeds must be"):
        critical_beta_sphere(10, 3, seeds=1)
    with pytest.raises(ValueError, match="at least three distinct"):
        critical_exponent_sphere([10, 10, 100], 3)


def test_fig_critical_quick(tmp_path):
    """The figure's measured layer equals the closed form, the sphere's exponents hold
    2/(d-1) in their intervals, and the transition's probe is attnflow's own layer."""
    import json

    from attnflow.experiments import fig_critical as F

    F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_critical.json").read_text())
    for r in side["simplex"]:
        assert r["max_abs_error"] < 1e-12
        np.testing.assert_allclose(r["measured_cosine"], r["closed_cosine"], rtol=1e-12)
    phases = [r["phase"] for r in side["simplex"]]
    assert phases == ["collapse", "critical", "preserved"]
    t = side["transition"]
    np.testing.assert_allclose(t["probe_cosine"], t["probe_closed"], rtol=1e-12)
    for r in side["sphere"]:
        assert r["agrees"], r
    assert "| 2 | critical | 256 |" in (tmp_path / "fig_critical.md").read_text()
