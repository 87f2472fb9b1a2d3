"""Critical attention scaling at long context: one attention layer on simplex tokens.

Contract. ``n`` unit tokens with pairwise inner products ``rho`` (``0 <= rho < 1``; the
regular simplex is ``rho = -1/(n-1)``, here the tokens share a common direction), one
softmax head with ``Q = K = V = I`` and inverse temperature ``beta = gamma log n``, no
residual: ``z_i = sum_j P_ij y_j``. Then (Chen, Lin, Polyanskiy and Rigollet 2026)

- the self-weight is ``p = P_ii = 1 / (1 + (n - 1) n^{-gamma (1 - rho)})``;
- ``P`` and the Gram matrix ``G = (1 - rho) I + rho 1 1^T`` commute, and ``P G P^T`` has
  the eigenvalue ``1 + (n - 1) rho`` on ``1`` and ``(p - q)^2 (1 - rho)`` on ``1^perp``
  (``q = (1 - p) / (n - 1)`` the other weights), so the outputs' cosine is

      cos(z_i, z_k) = B / A,  A = (1 + (n-1) rho) / n + (p - q)^2 (1 - rho) (1 - 1/n),
                              B = (1 + (n-1) rho) / n - (p - q)^2 (1 - rho) / n;

- as ``n -> infinity`` the cosine tends to 1 for ``gamma < gamma_c = 1 / (1 - rho)`` (the
  outputs collapse), to ``4 rho / (1 + 3 rho)`` at ``gamma_c`` (self-weight 1/2), and to
  ``rho`` above it (the geometry is kept).

``ssmax`` multiplies the logits by ``s log n``: with ``Q = K = I`` and ``beta = 1`` it is
this layer with ``gamma = s``, so its scale is critical at ``s = 1 / (1 - rho)``.
Everything here is closed form (float64 numpy, the self-weight through
``scipy.special.expit``, finite for any ``n``); nothing simulates.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .. import _checks

__all__ = ["CriticalLayer", "critical_layer", "critical_gamma", "simplex_tokens"]


@dataclasses.dataclass(frozen=True)
class CriticalLayer:
    """One layer on simplex tokens at ``beta = gamma log n`` (``critical_layer``).

    Attributes:
        gamma, rho, n: the set-up; ``beta = gamma log n``.
        self_weight: ``P_ii`` at this ``n``.
        cosine: the outputs' pairwise cosine at this ``n``.
        phase: ``"collapse"`` (``gamma < gamma_c``), ``"critical"`` or ``"preserved"``.
        limit_self_weight: the self-weight as ``n -> infinity`` (0, 1/2 or 1).
        limit_cosine: the cosine as ``n -> infinity`` (1, ``4 rho / (1 + 3 rho)``, rho).
    """

    gamma: float
    rho: float
    n: int
    beta: float
    self_weight: float
    cosine: float
    phase: str
    limit_self_weight: float
    limit_cosine: float


def critical_gamma(rho: float) -> float:
    """``gamma_c = 1 / (1 - rho)``: where ``beta = gamma log n`` turns critical."""
    rho = _checks.number("rho", rho, lo=0.0, hi=1.0, hi_open=True)
    return 1.0 / (1.0 - rho)


def critical_layer(gamma: float, rho: float, n: int) -> CriticalLayer:
    """The self-weight and the outputs' cosine of one layer at ``beta = gamma log n``.

    Args:
        gamma: the scale of ``beta`` in ``log n`` (> 0).
        rho: the tokens' pairwise inner product, ``0 <= rho < 1``.
        n: the number of tokens (>= 2).

    Returns:
        A ``CriticalLayer``: the finite-``n`` values and their limits.

    Example:
        >>> r = critical_layer(2.0, 0.5, 10**6)      # gamma_c = 2: critical
        >>> r.phase, round(r.self_weight, 6), round(r.limit_cosine, 6)
        ('critical', 0.5, 0.8)
    """
    from scipy import special

    gamma = _checks.positive("gamma", gamma)
    gc = critical_gamma(rho)
    n = _checks.integer("n", n, lo=2)
    beta = gamma * math.log(n)
    # p = 1 / (1 + (n - 1) e^{-beta (1 - rho)}), in logs
    p = float(special.expit(beta * (1.0 - rho) - math.log(n - 1)))
    q = (1.0 - p) / (n - 1)
    mean = (1.0 + (n - 1) * rho) / n
    spread = (p - q) ** 2 * (1.0 - rho)
    cosine = (mean - spread / n) / (mean + spread * (1.0 - 1.0 / n))
    if math.isclose(gamma, gc, rel_tol=1e-12):
        phase, lim_p, lim_c = "critical", 0.5, 4 * rho / (1 + 3 * rho)
    elif gamma < gc:
        phase, lim_p, lim_c = "collapse", 0.0, 1.0
    else:
        phase, lim_p, lim_c = "preserved", 1.0, rho
    return CriticalLayer(
        gamma=gamma,
        rho=rho,
        n=n,
        beta=beta,
        self_weight=p,
        cosine=float(cosine),
        phase=phase,
        limit_self_weight=lim_p,
        limit_cosine=float(lim_c),
    )


def simplex_tokens(n: int, rho: float, *, dtype: Any = np.float64) -> np.ndarray:
    """``n`` unit tokens in ``R^{n+1}`` with pairwise inner products ``rho``:
    ``y_i = sqrt(rho) e_0 + sqrt(1 - rho) e_i``.

    Example:
        >>> y = simplex_tokens(4, 0.25)
        >>> np.allclose(y @ y.T, 0.75 * np.eye(4) + 0.25)
        True
    """
    n = _checks.integer("n", n, lo=1)
    rho = _checks.number("rho", rho, lo=0.0, hi=1.0, hi_open=True)
    y = np.zeros((n, n + 1), dtype=dtype)
    y[:, 0] = math.sqrt(rho)
    y[np.arange(n), np.arange(1, n + 1)] = math.sqrt(1.0 - rho)
    return y
