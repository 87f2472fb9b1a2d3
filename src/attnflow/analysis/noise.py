"""Two tokens of the stochastic transformer: the SDE of their inner product, the
antipodal threshold and the probability of each outcome.

Fedorov, Sander, Elie, Marion and Lauriere (2026), "Clustering in deep stochastic
transformers" (arXiv 2601.21942), prove that for two tokens a phase transition in the
interaction strength and the dimension makes antipodal pairs attract with positive
probability. This module gives the closed forms of that transition in attnflow's own
conventions (``attnflow.dynamics.stochastic``); the derivation below is ours.

Contract
--------
Two tokens ``x_1, x_2`` on ``S^{d-1}``, ``d >= 2``, one softmax head with ``V = I`` and
``Q^T K = I`` at inverse temperature ``beta`` (``attnflow.Attention(I, I, I,
beta=beta)``), and the Ito SDE of the stochastic transformer with noise scale ``sigma``
(``W`` of entries of variance ``t / d``, common to both tokens)::

    dx_i = Proj_{x_i}(m_i) dt + sigma Proj_{x_i}(dW m_i) - c sigma^2 |m_i|^2 x_i dt,

``c = (d - 1) / (2 d)``. With ``rho = <x_1, x_2>``, ``p = P_11 = P_22 = 1 / (1 +
e^{-beta (1 - rho)})``, ``q = 1 - p``, ``s = p^2 + q^2``, ``r = 2 p q``,
``m_1 = p x_1 + q x_2`` and ``m_2 = q x_1 + p x_2``, so ``|m_i|^2 = M = s + r rho`` and
``<m_1, m_2> = G = r + s rho``. Ito's formula, ``d rho = <dx_1, x_2> + <x_1, dx_2> +
<dx_1, dx_2>``, with ``E[(dW u)(dW v)^T] = <u, v> I dt / d`` and
``tr(Proj_1 Proj_2) = d - 2 + rho^2``, gives a scalar SDE (rotational invariance: the
law of ``W`` is invariant under ``W -> O W O^T``, so ``rho`` closes)::

    d rho = a(rho) dt + b(rho) dB,
    a(rho) = 2 q (1 - rho^2) - ((d - 1) / d) sigma^2 M rho + sigma^2 G (d - 2 + rho^2) / d,
    b(rho)^2 = 2 sigma^2 s (1 - rho^2)^2 / d

(the martingale part is ``sigma <dW, u_1 m_1^T + u_2 m_2^T>_F`` with ``u_1 = x_2 - rho
x_1``, ``u_2 = x_1 - rho x_2``, and ``|u_1 m_1^T + u_2 m_2^T|_F^2 = 2 s (1 - rho^2)^2``).
Both ``rho = 1`` (collapse) and ``rho = -1`` (antipodal pair) are fixed.

At the antipodal point, with ``u = 1 + rho -> 0`` and ``tau = tanh(beta)`` (there
``q = (1 - tau) / 2``, ``s = (1 + tau^2) / 2``, ``r = (1 - tau^2) / 2``), the linearised SDE
is ``du = a_1 u dt + b_1 u dB`` with

    a_1 = 2 (1 - tau) + (sigma^2 / d) [(1 + tau^2) + (d - 2)(1 - tau^2)],
    b_1^2 = 4 sigma^2 (1 + tau^2) / d,

and the Lyapunov exponent ``lambda = a_1 - b_1^2 / 2`` is

    lambda(beta, sigma, d) = 2 (1 - tau) - (sigma^2 / d) [(d - 1) tau^2 - (d - 3)].

``lambda < 0``: the antipodal pair attracts with positive probability. That needs
``(d - 1) tanh(beta)^2 > d - 3`` (always for ``d <= 3``; ``cosh(beta)^2 > (d - 1) / 2``
otherwise) and then ``sigma^2 > sigma_c^2 = 2 d (1 - tau) / ((d - 1) tau^2 - (d - 3))``.
At collapse (``v = 1 - rho -> 0``) the exponent is ``-2 - sigma^2 (d - 1) / d < 0``:
collapse always attracts, so for ``lambda >= 0`` the pair collapses almost surely.

Outcome probabilities (``lambda < 0``): with the scale density ``S'(rho) = exp(-int_0^rho
2 a / b^2)``, ``P(rho -> -1 | rho_0) = int_{rho_0}^1 S' / int_{-1}^1 S'``. Near the ends
``2 a / b^2 = k_- / (1 + rho) + k_+ / (1 - rho) + g(rho)``, ``g`` smooth, with
``k_- = 2 a_1 / b_1^2 < 1`` and ``k_+ = d / sigma^2 + (d - 3) / 2 > -1``, so
``S' = (1 - rho)^{k_+} (1 + rho)^{-k_-} e^{-int_0^rho g}``: Gauss-Jacobi quadrature of that
weight. For two independent uniform tokens ``rho_0`` has the density
``(1 - rho^2)^{(d - 3) / 2}`` (normalised), and the antipodal fraction is
``int S'(r) F_d(r) dr / int S'``, ``F_d`` its distribution function.

Everything is float64 numpy; invalid input raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Float

__all__ = [
    "antipodal_exponent",
    "antipodal_fraction",
    "antipodal_probability",
    "antipodal_threshold",
    "collapse_exponent",
    "rho_sde",
]


def _beta(beta: Any) -> np.ndarray:
    b = _real("beta", beta)
    if np.any(b <= 0):
        raise ValueError(f"beta must be > 0 (an inverse temperature); got {beta!r}.")
    return b


def _sigma(sigma: Any) -> np.ndarray:
    s = _real("sigma", sigma)
    if np.any(s < 0):
        raise ValueError(f"sigma must be >= 0 (a noise scale); got {sigma!r}.")
    return s


def _dim(d: Any) -> np.ndarray:
    arr = np.asarray(d)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"d must be an integer >= 2 (the token dimension); got {d!r}.")
    if np.any(arr < 2):
        raise ValueError(f"d must be >= 2 (two tokens on S^(d-1)); got {d!r}.")
    return arr.astype(np.float64)


def _real(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception:  # ragged lists and the like
        raise ValueError(f"{name} must be a real number or array; got {value!r}.") from None
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise ValueError(f"{name} must be a real number or array; got {value!r}.")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite; got {value!r}.")
    return arr


def _out(a: np.ndarray) -> Any:
    return float(a) if a.ndim == 0 else a


def rho_sde(
    rho: Float[npt.ArrayLike, "*s"], beta: Any, sigma: Any, d: Any
) -> tuple[Float[np.ndarray, "*s"], Float[np.ndarray, "*s"]]:
    """The drift ``a(rho)`` and diffusion ``b(rho) >= 0`` of ``d rho = a dt + b dB`` for
    two tokens (module docstring), broadcast over all arguments.

    Example:
        >>> a, b = rho_sde([-1.0, 1.0], 1.0, 0.7, 3)
        >>> [abs(float(v)) < 1e-15 for v in (*a, *b)]  # both ends are fixed
        [True, True, True, True]
    """
    r = _real("rho", rho)
    if np.any(np.abs(r) > 1):
        raise ValueError(
            f"rho must lie in [-1, 1] (an inner product of unit vectors); got {rho!r}."
        )
    be, sg, dd = _beta(beta), _sigma(sigma), _dim(d)
    # p = P_11 = 1 / (1 + e^{-beta (1 - rho)}), q = 1 - p, without cancellation
    e = np.exp(-be * (1 - r))
    p, q = 1 / (1 + e), e / (1 + e)
    s, rr = p * p + q * q, 2 * p * q
    M, G = s + rr * r, rr + s * r
    one = 1 - r * r
    s2 = sg * sg
    a = 2 * q * one - ((dd - 1) / dd) * s2 * M * r + s2 * G * (dd - 2 + r * r) / dd
    b = np.sqrt(2 * s2 * s / dd) * one
    return _out(a), _out(b)


def antipodal_exponent(beta: Any, sigma: Any, d: Any) -> Any:
    """The Lyapunov exponent of ``u = 1 + rho`` at the antipodal pair,
    ``lambda = 2 (1 - tau) - (sigma^2 / d) [(d - 1) tau^2 - (d - 3)]``, ``tau = tanh(beta)``;
    ``< 0``: antipodal pairs attract with positive probability. Broadcasts.

    Example:
        >>> round(antipodal_exponent(1.0, 0.0, 3), 6)  # no noise: 2 (1 - tanh 1) > 0
        0.476812
    """
    be, sg, dd = _beta(beta), _sigma(sigma), _dim(d)
    tau = np.tanh(be)
    one_minus = 2 / (1 + np.exp(2 * be))  # 1 - tanh(beta), without cancellation
    return _out(2 * one_minus - (sg * sg / dd) * ((dd - 1) * tau * tau - (dd - 3)))


def antipodal_threshold(beta: Any, d: Any) -> Any:
    """The critical ``sigma_c^2 = 2 d (1 - tau) / ((d - 1) tau^2 - (d - 3))`` above which
    antipodal pairs attract (``antipodal_exponent < 0``); ``inf`` where
    ``(d - 1) tanh(beta)^2 <= d - 3`` (they never do). Broadcasts.

    Example:
        >>> round(antipodal_threshold(1.0, 3), 4), antipodal_threshold(1.0, 8)
        (1.2331, inf)
    """
    be, dd = _beta(beta), _dim(d)
    tau = np.tanh(be)
    den = (dd - 1) * tau * tau - (dd - 3)
    one_minus = 2 / (1 + np.exp(2 * be))
    with np.errstate(divide="ignore"):
        out = np.where(den > 0, 2 * dd * one_minus / np.where(den > 0, den, 1.0), np.inf)
    return _out(out)


def collapse_exponent(beta: Any, sigma: Any, d: Any) -> Any:
    """The Lyapunov exponent of ``v = 1 - rho`` at collapse, ``-2 - sigma^2 (d - 1) / d``
    (always negative: collapse attracts). ``beta`` is checked, and drops out. Broadcasts."""
    be, sg, dd = _beta(beta), _sigma(sigma), _dim(d)
    out = -2 - sg * sg * (dd - 1) / dd
    return _out(np.broadcast_to(out, np.broadcast(be, out).shape).copy())


def _ends(beta: float, sigma: float, d: int) -> tuple[float, float]:
    """``(k_-, k_+)``: the residues of ``2 a / b^2`` at ``rho = -1`` and ``rho = 1``."""
    tau = math.tanh(beta)
    s2 = sigma * sigma
    a1 = 2 * (1 - tau) + (s2 / d) * ((1 + tau * tau) + (d - 2) * (1 - tau * tau))
    b1 = 4 * s2 * (1 + tau * tau) / d
    return 2 * a1 / b1, d / s2 + (d - 3) / 2


def _log_weight_rest(r: np.ndarray, beta: float, sigma: float, d: int) -> np.ndarray:
    """``-int_0^r g`` (``g`` the smooth part of ``2 a / b^2``), Gauss-Legendre."""
    k_minus, k_plus = _ends(beta, sigma, d)
    xi, w = np.polynomial.legendre.leggauss(48)
    t = np.multiply.outer(r, (xi + 1) / 2)  # nodes of [0, r]
    a, b = rho_sde(t, beta, sigma, d)
    g = 2 * a / (b * b) - k_minus / (1 + t) - k_plus / (1 - t)
    return -(r / 2) * (g @ w)


def _scalar_args(beta: Any, sigma: Any, d: Any) -> tuple[float, float, int]:
    be, sg, dd = _beta(beta), _sigma(sigma), _dim(d)
    if be.ndim or sg.ndim or dd.ndim:
        raise ValueError("beta, sigma and d must be scalars here (one parameter point).")
    return float(be), float(sg), int(dd)


def antipodal_probability(
    rho0: Float[npt.ArrayLike, " k"], beta: Any, sigma: Any, d: Any, *, nodes: int = 200
) -> Float[np.ndarray, " k"]:
    """``P(rho -> -1 | rho_0)`` for each start ``rho0`` in ``(-1, 1)``: the scale-function
    formula (module docstring); ``0`` where ``antipodal_exponent >= 0``.

    ``nodes``: Gauss-Jacobi nodes per integral (relative accuracy about 1e-8 at 200).
    """
    be, sg, dd = _scalar_args(beta, sigma, d)
    r0 = np.atleast_1d(_real("rho0", rho0))
    if r0.ndim != 1 or np.any(np.abs(r0) >= 1):
        raise ValueError(f"rho0 must be starts in (-1, 1); got {rho0!r}.")
    if sg == 0.0 or antipodal_exponent(be, sg, dd) >= 0:
        return np.zeros_like(r0)
    from scipy.special import roots_jacobi

    k_minus, k_plus = _ends(be, sg, dd)
    x, w = roots_jacobi(nodes, k_plus, -k_minus)  # weight (1 - r)^{k+} (1 + r)^{-k-}
    log_rest = _log_weight_rest(x, be, sg, dd)
    shift = np.max(log_rest)  # a common factor of every integral: no overflow
    total = np.sum(w * np.exp(log_rest - shift))
    out = np.empty_like(r0)
    xj, wj = roots_jacobi(nodes, k_plus, 0.0)  # [rho0, 1]: weight (1 - r)^{k+} only
    for i, lo in enumerate(r0):
        half = (1 - lo) / 2
        r = lo + half * (xj + 1)
        log_f = -k_minus * np.log1p(r) + _log_weight_rest(r, be, sg, dd) - shift
        out[i] = np.exp((1 + k_plus) * math.log(half)) * np.sum(wj * np.exp(log_f)) / total
    return np.clip(out, 0.0, 1.0)


def antipodal_fraction(beta: Any, sigma: Any, d: Any, *, nodes: int = 200) -> float:
    """The probability that two independent uniform tokens on ``S^{d-1}`` end antipodal:
    ``int S'(r) F_d(r) dr / int S'`` (module docstring); ``0`` where
    ``antipodal_exponent >= 0``.

    Example:
        >>> antipodal_fraction(1.0, 0.5, 3)  # below the threshold sigma^2 = 1.23
        0.0
    """
    be, sg, dd = _scalar_args(beta, sigma, d)
    if sg == 0.0 or antipodal_exponent(be, sg, dd) >= 0:
        return 0.0
    from scipy.special import betainc, roots_jacobi

    k_minus, k_plus = _ends(be, sg, dd)
    x, w = roots_jacobi(nodes, k_plus, -k_minus)
    log_rest = _log_weight_rest(x, be, sg, dd)
    f = w * np.exp(log_rest - np.max(log_rest))
    half = (dd - 1) / 2
    cdf = betainc(half, half, (1 + x) / 2)  # rho0 = 2 B - 1, B ~ Beta((d-1)/2, (d-1)/2)
    return float(np.sum(f * cdf) / np.sum(f))
