"""Lost in the middle: the kinetic theory's retrieval profile over source positions.

Contract. Causal attention with ALiBi-like weights ``e^{-(lambda/N)(j - k)}`` among
``N`` tokens on the circle, in the large-``N`` kinetic limit of Duerinckx, Geshkovski and
Rossi (2026, "Kinetic theory for Transformers and the lost-in-the-middle phenomenon";
borjanG/2026-lost-in-the-middle). A source at relative position ``s in (0, 1]`` is
retrieved at time ``t`` with the truncated soft-accuracy profile

    S_t(s) = sum_{k=1}^{modes} w_k c_lambda(s) psi_{a_k t}(Y_lambda(s)),

    a_k = k^2 I_k(beta),   w_k = exp(-pi^2 k^2 / (2 M^2)),
    c_lambda(s) = lambda e^{lambda s} / (e^lambda - 1),
    Y_lambda(s) = log((e^lambda - 1) / (e^{lambda s} - 1)),
    psi_c(y) = sum_{m >= 0} c^{m+1} y^m / (m! (m+1)!) = sqrt(c / y) I_1(2 sqrt(c y))

(``lambda = 0``: ``c = 1``, ``Y = log(1/s)``). ``I_k`` are modified Bessel functions
(``scipy.special.ive``, scaled so that nothing overflows). Near ``s = 0`` the profile
is high (primacy), and its slope at ``s = 1`` is positive (recency) until the threshold

    t_crit(beta) = 2 (1 - e^{-lambda}) sum_k w_k a_k / sum_k w_k a_k^2,

where that slope changes sign (``lost_in_middle_threshold``; the slope at ``s = 1`` is
``lambda^2 e^lambda / (e^lambda - 1) sum_k w_k a_k t (1 - e^lambda a_k t /
(2 (e^lambda - 1)))``, whose root is ``t_crit``). Closed forms in float64 numpy; nothing
simulates.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from jaxtyping import Float

from .. import _checks

__all__ = ["lost_in_middle_threshold", "lost_in_middle_profile"]


def _modes(beta: float, M: float, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a_k, w_k)`` for ``k = 1 .. modes``."""
    from scipy.special import ive

    k = np.arange(1, modes + 1, dtype=np.float64)
    a = k**2 * ive(k, beta) * math.exp(beta)
    w = np.exp(-0.5 * (math.pi * k / M) ** 2)
    return a, w


def _args(beta, lam, M, modes) -> tuple[float, float, float, int]:
    beta = _checks.positive("beta", beta)
    lam = _checks.number("lam", lam, lo=0.0)
    M = _checks.positive("M", M)
    modes = _checks.integer("modes", modes, lo=1)
    return beta, lam, M, modes


def lost_in_middle_threshold(
    beta: float, *, lam: float = 1.0, M: float = 8.0, modes: int = 20
) -> float:
    """The time ``t_crit(beta)`` at which the retrieval profile's slope at the last
    position changes sign (the module docstring has the formula).

    Args:
        beta: inverse temperature, > 0.
        lam: the ALiBi decay ``lambda >= 0`` (weights ``e^{-(lambda/N)(j - k)}``).
        M: the width parameter of the mode weights ``w_k``.
        modes: Fourier modes kept.

    Returns:
        ``t_crit`` (float). ``lam = 0`` gives 0: without the decay the slope at ``s = 1``
        is ``-sum_k w_k (a_k t)^2 / 2 < 0`` for every ``t > 0`` (no recency).

    Examples:
        >>> from attnflow.analysis.position import lost_in_middle_threshold
        >>> round(lost_in_middle_threshold(1.0), 3)  # lambda = 1, M = 8, 20 modes
        2.457
    """
    beta, lam, M, modes = _args(beta, lam, M, modes)
    a, w = _modes(beta, M, modes)
    return float(2.0 * (-math.expm1(-lam)) * np.sum(w * a) / np.sum(w * a * a))


def _psi(c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``psi_c(y) = sqrt(c / y) I_1(2 sqrt(c y))``, and its series near ``c y = 0``."""
    from scipy.special import ive

    cy = c * y
    small = cy < 1e-8
    safe = np.where(small, 1.0, cy)
    zs = 2.0 * np.sqrt(safe)
    big = c * ive(1, zs) * np.exp(zs) / np.sqrt(safe)  # sqrt(c/y) I_1(z) = c I_1(z) / sqrt(cy)
    return np.where(small, c * (1.0 + cy / 2.0 + cy * cy / 12.0), big)


def lost_in_middle_profile(
    s: Float[Any, " m"],
    t: float,
    beta: float,
    *,
    lam: float = 1.0,
    M: float = 8.0,
    modes: int = 20,
) -> np.ndarray:
    """The truncated soft-accuracy profile ``S_t(s)`` at source positions ``s``.

    Args:
        s: relative source positions in ``(0, 1]`` (1 the most recent).
        t: time (depth), ``>= 0``.
        beta, lam, M, modes: as in ``lost_in_middle_threshold``.

    Returns:
        ``S_t(s)``, same shape as ``s`` (float64).

    Examples:
        >>> import numpy as np
        >>> from attnflow.analysis.position import lost_in_middle_profile
        >>> S = lost_in_middle_profile(np.linspace(0.02, 1.0, 50), 1.0, 1.0)
        >>> bool(S[0] > S.min() < S[-1])  # primacy, a minimum in the middle, recency
        True
    """
    beta, lam, M, modes = _args(beta, lam, M, modes)
    t = _checks.number("t", t, lo=0.0)
    s_arr = np.asarray(s, np.float64)
    if s_arr.size and (np.any(~np.isfinite(s_arr)) or np.any(s_arr <= 0) or np.any(s_arr > 1)):
        raise ValueError("s must hold relative positions in (0, 1] (1 the most recent).")
    if lam == 0:
        coef = np.ones_like(s_arr)
        y = np.log(1.0 / s_arr)
    else:
        coef = lam * np.exp(lam * s_arr) / math.expm1(lam)
        y = np.log(math.expm1(lam) / np.expm1(lam * s_arr))
    y = np.maximum(y, 0.0)  # s = 1 gives 0 up to rounding
    a, w = _modes(beta, M, modes)
    c = (a * t).reshape((-1,) + (1,) * s_arr.ndim)
    return np.sum(w.reshape(c.shape) * coef * _psi(c, y[None]), axis=0)
