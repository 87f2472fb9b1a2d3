"""Kernels with exact zeros: ``Sparsemax``, ``Entmax`` (alpha-entmax), ``Softpick`` and
``Hardmax``.

``Sparsemax``  the Euclidean projection of the logit row onto the simplex (Martins and
               Astudillo 2016): ``P_j = max(L_j - tau, 0)`` with the closed-form
               threshold ``tau = (sum_{j <= k} z_(j) - 1) / k``, ``z`` the row sorted
               down and ``k`` the largest index with ``1 + k z_(k) > sum_{j <= k} z_(j)``.
``Entmax``     alpha-entmax (Peters, Niculae and Martins 2019), ``alpha > 1`` a setting:
               ``P_j = [(alpha - 1) L_j - tau]_+^{1 / (alpha - 1)}``, ``tau`` found by
               bisection (``iters`` halvings of an interval of width 1, then the row
               renormalised). ``alpha -> 1`` is softmax and ``alpha = 2`` sparsemax.
               Its derivative is the closed form ``diag(s) - s s^T / sum(s)``,
               ``s = P^{2 - alpha}`` on the support (a custom JVP; no derivative in
               ``alpha``, which is static).
``Softpick``   ``relu(e^{L_j} - 1) / sum_k |e^{L_k} - 1|`` (Zuhri et al. 2025): rows sum
               to at most one (a row of zero logits weighs nothing), so only the
               original frame applies. Masked keys are left out of the sum.
``Hardmax``    the ``beta -> infinity`` limit of softmax: weight ``1 / c`` on each of the
               ``c`` keys of the row's largest logit, 0 elsewhere (ties split evenly;
               masked keys never win, the diagonal is always kept). Piecewise constant:
               its derivative is 0.

All are row-wise and take masks (``-inf`` logits weigh 0).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ... import _checks
from ._base import AbstractKernel

__all__ = [
    "Sparsemax",
    "Entmax",
    "Softpick",
    "Hardmax",
    "sparsemax",
    "sparsemax_threshold",
    "entmax",
    "softpick",
    "hardmax",
]


def sparsemax_threshold(L: Array) -> Array:
    """The closed-form threshold ``tau`` of each row of ``L`` ``(..., m)`` (``-inf``
    entries allowed, at least one finite per row): ``sparsemax(L) = max(L - tau, 0)``."""
    z = -jnp.sort(-L, axis=-1)  # sorted down; -inf last
    m = L.shape[-1]
    k = jnp.arange(1, m + 1, dtype=L.dtype).reshape((1,) * (L.ndim - 1) + (m,))
    cs = jnp.cumsum(jnp.where(jnp.isfinite(z), z, 0.0), axis=-1)
    support = (1 + k * z > cs) & jnp.isfinite(z)
    ks = jnp.sum(support, axis=-1, keepdims=True)  # >= 1: the largest logit is in
    return (jnp.take_along_axis(cs, ks - 1, axis=-1) - 1) / ks.astype(L.dtype)


def sparsemax(L: Array) -> Array:
    """``sparsemax`` of each row of ``L`` ``(..., m)``: the projection onto the simplex."""
    return jnp.maximum(L - sparsemax_threshold(L), 0.0)


def _entmax_forward(L: Array, alpha: float, iters: int) -> Array:
    a1 = alpha - 1.0
    X = a1 * L
    top = jnp.max(X, axis=-1, keepdims=True)
    power = 1.0 / a1

    def weights(tau):
        return jnp.maximum(X - tau, 0.0) ** power

    def halve(_, lohi):
        lo, hi = lohi
        mid = 0.5 * (lo + hi)
        over = jnp.sum(weights(mid), axis=-1, keepdims=True) >= 1
        return jnp.where(over, mid, lo), jnp.where(over, hi, mid)

    # sum of weights(top - 1) >= 1 (the top key alone weighs 1); weights(top) sums to 0
    lo, hi = jax.lax.fori_loop(0, iters, halve, (top - 1.0, top))
    P = weights(0.5 * (lo + hi))
    return P / jnp.sum(P, axis=-1, keepdims=True)


@jax.custom_jvp
def _entmax(L: Array, alpha: float, iters: int) -> Array:
    return _entmax_forward(L, alpha, iters)


@_entmax.defjvp
def _entmax_jvp(primals, tangents):
    L, alpha, iters = primals
    dL = tangents[0]
    P = _entmax_forward(L, alpha, iters)
    s = jnp.where(P > 0, P ** (2.0 - alpha), 0.0)
    dL = jnp.where(jnp.isfinite(L), dL, 0.0)
    sv = jnp.sum(s * dL, axis=-1, keepdims=True) / jnp.sum(s, axis=-1, keepdims=True)
    return P, s * (dL - sv)


def entmax(L: Array, alpha: float = 1.5, iters: int = 64) -> Array:
    """alpha-entmax of each row of ``L`` ``(..., m)`` (bisection, ``iters`` halvings)."""
    return _entmax(L, float(alpha), int(iters))


def softpick(L: Array) -> Array:
    """``relu(e^{L_j} - 1) / sum_k |e^{L_k} - 1|`` of each row of ``L`` ``(..., m)``,
    masked (``-inf``) keys left out; computed with the row's ``max(max L, 0)`` factored
    out (no overflow), and 0 for a row whose every kept logit is 0."""
    kept = L > -jnp.inf
    top = jnp.maximum(jnp.max(L, axis=-1, keepdims=True), 0.0)
    e = jnp.where(kept, jnp.exp(jnp.where(kept, L, 0.0) - top) - jnp.exp(-top), 0.0)
    den = jnp.sum(jnp.abs(e), axis=-1, keepdims=True)
    return jnp.maximum(e, 0.0) / jnp.where(den > 0, den, 1.0)


def hardmax(L: Array) -> Array:
    """Weight ``1 / c`` on the ``c`` largest (tied) logits of each row, 0 elsewhere."""
    L = jax.lax.stop_gradient(L)
    win = (L == jnp.max(L, axis=-1, keepdims=True)).astype(L.dtype)
    return win / jnp.sum(win, axis=-1, keepdims=True)


class Sparsemax(AbstractKernel):
    """The projection of the logits onto the simplex: exact zeros."""

    name: ClassVar[str] = "sparsemax"
    summary: ClassVar[str] = "projection of the logit row onto the simplex (exact zeros)"

    def weights(self, L: Array) -> Array:
        return sparsemax(L)


class Entmax(AbstractKernel):
    """alpha-entmax, ``alpha > 1`` (static) and ``iters`` bisection steps."""

    alpha: float = eqx.field(static=True)
    iters: int = eqx.field(static=True)
    name: ClassVar[str] = "entmax"
    summary: ClassVar[str] = "alpha-entmax: [(alpha - 1) L - tau]_+^(1/(alpha - 1)), exact zeros"

    def __init__(self, alpha: Any = 1.5, iters: Any = 64):
        try:  # a number, not a string that spells one ("2" is refused)
            a = math.nan if isinstance(alpha, (str, bytes, bool)) else float(alpha)
        except (TypeError, ValueError, OverflowError):
            a = math.nan
        if not math.isfinite(a) or a <= 1:
            raise ValueError(
                f"kernel_params['alpha'] must be a number > 1 for 'entmax' (1 is softmax, "
                f"2 sparsemax); got {alpha!r}."
            )
        self.alpha = a
        self.iters = _checks.integer("kernel_params['iters'] of 'entmax'", iters, lo=8, hi=200)

    def weights(self, L: Array) -> Array:
        return entmax(L, self.alpha, self.iters)


class Softpick(AbstractKernel):
    """``relu(e^L - 1) / sum |e^L - 1|``: rows sum to at most one."""

    name: ClassVar[str] = "softpick"
    summary: ClassVar[str] = "relu(e^L - 1) / sum |e^L - 1|, rows sum to <= 1 (original frame only)"
    row_stochastic: ClassVar[bool] = False

    def weights(self, L: Array) -> Array:
        return softpick(L)


class Hardmax(AbstractKernel):
    """The ``beta -> infinity`` limit: the largest logits share the weight."""

    name: ClassVar[str] = "hardmax"
    summary: ClassVar[str] = "weight 1/c on the c largest logits (beta -> infinity)"

    def weights(self, L: Array) -> Array:
        return hardmax(L)
