"""Special functions in logs, finite where scipy's overflow, underflow or give NaN.

``log_ive(nu, x)`` is ``log(I_nu(x) e^{-x})`` for orders ``nu >= 0`` and arguments
``x > 0`` anywhere in the float64 range: the logs of the mean-field weights and mode
rates, where ``I_nu(x)`` itself overflows (``x > 709``), ``scipy.special.ive`` is NaN
(``x > 2^30``) or underflows to 0 (high orders at moderate ``x``, such as the harmonics
of spheres of dimension 300 and up).

Where ``scipy.special.ive`` returns a normal number (``>= 1e-250``) its log is used. Elsewhere:

- orders ``nu >= 15``: the uniform asymptotic (Debye) expansion (DLMF 10.41.3),
  ``I_nu(nu z) ~ e^{nu eta} / (sqrt(2 pi nu) (1 + z^2)^{1/4}) sum_k u_k(p) / nu^k``,
  ``p = (1 + z^2)^{-1/2}``, ``eta = 1/p - asinh(1/z)``, with 13 terms (the polynomials
  ``u_k`` from their recurrence, DLMF 10.41.10, in exact rationals); uniform in ``z``, so
  it holds for any ``x`` at these orders, the error below ``1e-15`` relative;
- orders ``nu < 15`` at large ``x`` (scipy's NaN past ``2^30``): Hankel's expansion
  (DLMF 10.40.1), ``I_nu(x) e^{-x} ~ (2 pi x)^{-1/2} sum_k (-1)^k a_k(nu) / x^k``;
- orders ``nu < 15`` at tiny ``x`` (underflow): the power series
  ``I_nu(x) = (x/2)^nu sum_k (x^2/4)^k / (k! Gamma(nu + k + 1))`` in logs.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["log_ive"]

DEBYE_MIN_ORDER = 15.0
_DEBYE_TERMS = 13
_SCIPY_NAN_ABOVE = 2.0**30  # scipy's ive (AMOS) gives NaN for larger arguments
_NORMAL = 1e-250  # below this scipy's value is near or past its underflow


def _debye_polynomials(count: int) -> list[np.ndarray]:
    """The coefficients (ascending powers of ``p``) of ``u_0 .. u_{count-1}``:
    ``u_{k+1}(p) = p^2 (1 - p^2) u_k'(p) / 2 + (1/8) int_0^p (1 - 5 t^2) u_k(t) dt``."""
    polys: list[list[Fraction]] = [[Fraction(1)]]
    for _ in range(count - 1):
        u = polys[-1]
        nxt = [Fraction(0)] * (len(u) + 3)
        for j, c in enumerate(u):  # p^2 (1 - p^2) u'(p) / 2
            if j:
                nxt[j + 1] += c * j / 2
                nxt[j + 3] -= c * j / 2
        for j, c in enumerate(u):  # (1/8) int_0^p (1 - 5 t^2) t^j dt
            nxt[j + 1] += c / (8 * (j + 1))
            nxt[j + 3] -= 5 * c / (8 * (j + 3))
        polys.append(nxt)
    return [np.array([float(c) for c in u]) for u in polys]


_U = _debye_polynomials(_DEBYE_TERMS)


def _log_ive_debye(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    z = x / nu
    s = np.hypot(1.0, z)  # sqrt(1 + z^2) without overflow
    p = 1.0 / s
    # nu eta - x = nu (s - z) - nu asinh(1/z), with s - z = 1 / (s + z): no cancellation
    head = nu / (s + z) - nu * np.arcsinh(nu / x)
    total = np.zeros_like(nu)
    for u in reversed(_U):  # sum_k u_k(p) nu^{-k} by Horner in 1/nu
        total = total / nu + np.polynomial.polynomial.polyval(p, u)
    return head - 0.5 * np.log(2.0 * math.pi * nu) - 0.5 * np.log(s) + np.log(total)


def _log_ive_hankel(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    mu = 4.0 * nu * nu
    term = np.ones_like(nu)
    total = np.ones_like(nu)
    for k in range(1, 40):
        term = -term * (mu - (2 * k - 1) ** 2) / (8.0 * k * x)
        total = total + term
        if np.all(np.abs(term) <= 1e-17 * np.abs(total)):
            break
    return -0.5 * np.log(2.0 * math.pi * x) + np.log(total)


def _log_ive_series(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    from scipy.special import gammaln

    q = x * x / 4.0
    term = np.ones_like(nu)
    total = np.ones_like(nu)
    for k in range(1, 200):
        term = term * q / (k * (nu + k))
        total = total + term
        if np.all(term <= 1e-17 * total):
            break
    return -x + nu * np.log(x / 2.0) - gammaln(nu + 1.0) + np.log(total)


def log_ive(nu: Any, x: Any) -> np.ndarray:
    """``log(I_nu(x) e^{-x})`` (``I_nu`` the modified Bessel function of the first kind),
    finite for every order ``nu >= 0`` and argument ``0 < x < inf`` (module docstring).

    Args:
        nu: orders, ``>= 0`` (broadcast against ``x``).
        x: arguments, ``> 0`` and finite.

    Returns:
        float64 array of the broadcast shape.

    Example:
        >>> round(float(log_ive(0.5, 2e9)), 6)  # I_{1/2}(x) e^{-x} = (1 - e^{-2x}) / sqrt(2 pi x)
        -11.627145
    """
    from scipy.special import ive

    nu_a, x_a = np.broadcast_arrays(np.asarray(nu, np.float64), np.asarray(x, np.float64))
    if np.any(~np.isfinite(nu_a) | (nu_a < 0)) or np.any(~np.isfinite(x_a) | (x_a <= 0)):
        raise ValueError("log_ive needs finite orders nu >= 0 and finite arguments x > 0.")
    nu_f, x_f = nu_a.ravel(), x_a.ravel()
    out = np.full(nu_f.shape, np.nan)
    direct = x_f <= _SCIPY_NAN_ABOVE
    if direct.any():
        with np.errstate(all="ignore"):
            v = ive(nu_f[direct], x_f[direct])
        ok = np.isfinite(v) & (v >= _NORMAL)
        idx = np.flatnonzero(direct)[ok]
        out[idx] = np.log(v[ok])
    rest = np.isnan(out)
    debye = rest & (nu_f >= DEBYE_MIN_ORDER)
    hankel = rest & ~debye & (x_f >= 1e6)
    series = rest & ~debye & ~hankel
    if debye.any():
        out[debye] = _log_ive_debye(nu_f[debye], x_f[debye])
    if hankel.any():
        out[hankel] = _log_ive_hankel(nu_f[hankel], x_f[hankel])
    if series.any():
        out[series] = _log_ive_series(nu_f[series], x_f[series])
    return out.reshape(nu_a.shape)
