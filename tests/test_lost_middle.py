"""The lost-in-the-middle closed forms against the authors' published thresholds, and the
threshold against the profile it describes (its slope at the last position, by finite
differences of the series), plus the U shape and the authors' own series for psi."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from attnflow.analysis import lost_in_middle_profile, lost_in_middle_threshold

# Duerinckx, Geshkovski and Rossi 2026, lambda = 1, M = 8, 20 modes
PUBLISHED = {0.5: 5.912, 1.0: 2.457, 2.0: 0.601, 3.0: 0.174, 4.8: 0.0223}


@pytest.mark.parametrize(("beta", "t_crit"), sorted(PUBLISHED.items()))
def test_threshold_matches_the_published_values(beta, t_crit):
    digits = 4 if t_crit >= 1 else 3  # the published numbers carry 3-4 significant digits
    assert f"{lost_in_middle_threshold(beta):.{digits}g}" == f"{t_crit:.{digits}g}"


def _end_slope(t, beta, h=1e-5):
    """d S_t / ds at s = 1 from the left (second order one-sided differences)."""
    f = lost_in_middle_profile(np.array([1.0, 1.0 - h, 1.0 - 2 * h]), t, beta)
    return (3 * f[0] - 4 * f[1] + f[2]) / (2 * h)


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_threshold_is_where_the_end_slope_of_the_profile_changes_sign(beta):
    tc = lost_in_middle_threshold(beta)
    assert _end_slope(0.8 * tc, beta) > 0 > _end_slope(1.25 * tc, beta)
    root = brentq(lambda t: _end_slope(t, beta), 0.5 * tc, 2 * tc, xtol=1e-12)
    assert root == pytest.approx(tc, rel=1e-5)


def test_profile_is_u_shaped_before_the_threshold():
    s = np.linspace(0.02, 1.0, 400)
    tc = lost_in_middle_threshold(1.0)
    S = lost_in_middle_profile(s, 0.5 * tc, 1.0)
    i = int(np.argmin(S))
    assert 0 < i < s.size - 1 and S[0] > S[i] < S[-1]  # primacy, a minimum, recency
    late = lost_in_middle_profile(s, 2 * tc, 1.0)
    assert np.all(np.diff(late[-40:]) < 0)  # past the threshold the recency end falls


def test_psi_against_the_authors_series():
    """psi_c(y) = sum_m c^{m+1} y^m / (m! (m+1)!): at s where y = Y_lambda(s), one mode."""
    beta, t, lam, M = 1.3, 0.7, 1.0, 8.0
    a1 = 1 * 1 * _bessel_series(1, beta)
    c = a1 * t
    for s in (0.05, 0.3, 0.9, 1.0):
        y = math.log(math.expm1(lam) / math.expm1(lam * s))
        psi = sum(
            c ** (m + 1) * y**m / (math.factorial(m) * math.factorial(m + 1)) for m in range(60)
        )
        coef = lam * math.exp(lam * s) / math.expm1(lam)
        w1 = math.exp(-0.5 * (math.pi / M) ** 2)
        got = lost_in_middle_profile(np.array([s]), t, beta, modes=1)[0]
        assert got == pytest.approx(w1 * coef * psi, rel=1e-12)


def _bessel_series(n, x):
    return sum(
        (x / 2) ** (2 * k + n) / (math.factorial(k) * math.factorial(k + n)) for k in range(60)
    )


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="beta"):
        lost_in_middle_threshold(0.0)
    assert lost_in_middle_threshold(1.0, lam=0.0) == 0.0  # no recency without the decay
    assert _end_slope(1e-3, 1.0) > 0
    s0 = lost_in_middle_profile(np.array([1.0, 1.0 - 1e-5]), 1e-3, 1.0, lam=0.0)
    assert s0[0] < s0[1]  # lam = 0: the end slope is negative at once
    with pytest.raises(ValueError, match=r"s must hold relative positions in \(0, 1\]"):
        lost_in_middle_profile(np.array([0.0, 0.5]), 1.0, 1.0)
