"""``Softmax``: ``P = softmax(L)`` row by row, and the exact softmax arithmetic every
softmax-based kernel shares (the band rule, the log-normaliser, log-masses of subsets,
the RMS normalisation of ``qknorm`` and ``prenorm``).

Every function here computes in the working precision of its inputs (float64 stays
float64: ``jax.nn.dot_product_attention`` is deliberately not used, as it computes its
softmax in float32).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ._base import AbstractKernel

__all__ = [
    "Softmax",
    "softmax",
    "softmax_parts",
    "SoftmaxParts",
    "log_mass",
    "rms_normalize",
    "softmax_log_mass",
]


def _band_shift(L: Array, m: Array) -> Array:
    """``L - m`` with every entry within ``8 eps |m|`` of 0 (or above it) taken as exactly
    0, on values only (the gradient is that of ``L - m``). See ``softmax``."""
    s = L - m
    band = s >= -8 * jnp.finfo(L.dtype).eps * jnp.abs(m)
    return s - jax.lax.stop_gradient(jnp.where(band, s, 0.0))


def softmax(L: Float[Array, "*b n"]) -> Float[Array, "*b n"]:
    """Row softmax of logits ``L`` ``(..., n)``, exact to the accuracy of the logits.

    ``exp(s_j)`` with ``s_j = L_j - max_k L_k``, where every shifted logit within
    ``8 eps |max_k L_k|`` of 0 (or above it) is taken as exactly 0. The reason: inside
    ``jit`` on CPU, XLA may recompute a low-rank logit product inside the fused
    subtraction and contract it into one fused multiply-add, so the shifted logit of
    the maximum comes out as the product's rounding error (up to ``eps |max| / 2``
    for one product) instead of 0. Past ``|logit| ~ 1e18`` (float64) that error
    exceeds ``log(finfo.max)`` and ``jax.nn.softmax`` returns ``inf / inf = NaN`` (or
    drops the maximum). Entries within the band are ties at the precision of the
    logits, so giving them weight ``e^0`` changes nothing beyond that precision, and
    every row keeps its maximum at exactly 1.

    The band is applied to values only (``s - stop_gradient(s)`` inside it), and the
    max shift is not stop-gradiented: the gradient is the softmax gradient, ties
    included. ``softmax_parts`` is the same computation with its row max and
    log-normaliser.
    """
    m = jnp.max(L, axis=-1, keepdims=True)
    e = jnp.exp(_band_shift(L, m))
    return e / jnp.sum(e, axis=-1, keepdims=True)


class SoftmaxParts(NamedTuple):
    """``softmax_parts(L)``: the weights and what the log-masses of subsets need.

    Attributes:
        P: ``(..., n)`` the weights, equal to ``softmax(L)``.
        max: ``(...)`` the row max ``m = max_j L_j``.
        log_norm: ``(...)`` ``log sum_j e^{s_j}``, ``s`` the shifted logits of
            ``softmax`` (band included), so that ``P_j = e^{s_j - log_norm}``.
    """

    P: Array
    max: Array
    log_norm: Array


def softmax_parts(L: Float[Array, "*b n"]) -> SoftmaxParts:
    """``softmax(L)`` with its row max and log-normaliser (the same band rule).

    Args:
        L: logits ``(..., n)``.

    Returns:
        A ``SoftmaxParts`` ``(P, max, log_norm)``; ``log_mass`` takes it.
    """
    m = jnp.max(L, axis=-1, keepdims=True)
    e = jnp.exp(_band_shift(L, m))
    S = jnp.sum(e, axis=-1, keepdims=True)
    return SoftmaxParts(e / S, m[..., 0], jnp.log(S[..., 0]))


def log_mass(
    L: Float[Array, "*b n"], keep: Bool[Array, "*b n"], parts: SoftmaxParts
) -> Float[Array, "*b"]:
    """``log sum_{j in keep} P_j`` per row, for ``P = softmax(L)``, from the logits.

    Finite long after the mass itself underflows (a subset far below the row max), and
    exact to relative rounding: the subset's own max ``m_k`` is shifted with the band
    rule of ``softmax`` (``e^0`` for the entries tied with it), and ``m_k - max`` with
    the band of the row (0 when ``m_k`` ties with the row max, as ``P`` has it), so the
    result is ``log`` of the sum of exactly the weights ``P`` holds. ``-inf`` for a row
    with nothing kept.

    Args:
        L: logits ``(..., n)``.
        keep: ``(..., n)`` the subset, per row.
        parts: ``softmax_parts(L)``.

    Returns:
        ``(...)`` the log-masses.
    """
    Lk = jnp.where(keep, L, -jnp.inf)
    mk = jnp.max(Lk, axis=-1, keepdims=True)
    some = jnp.isfinite(mk)
    mk = jnp.where(some, mk, 0.0)
    e = jnp.where(keep, jnp.exp(_band_shift(jnp.where(keep, L, mk), mk)), 0.0)
    shift = _band_shift(mk, parts.max[..., None])
    out = shift + jnp.log(jnp.sum(e, axis=-1, keepdims=True)) - parts.log_norm[..., None]
    return jnp.where(some, out, -jnp.inf)[..., 0]


def softmax_log_mass(L: Array, keep: Array) -> Array:
    """``log_mass(L, keep, softmax_parts(L))``: the log-mass of a subset under softmax."""
    return log_mass(L, keep, softmax_parts(L))


def rms_normalize(u: Float[Array, "*b p"]) -> Float[Array, "*b p"]:
    """``u / sqrt(mean(u^2))`` over the last axis (``|result| = sqrt(p)``); zero rows stay 0.

    Exact scale invariance, no epsilon: each row is first divided by its largest
    ``|entry|``, so the mean square can neither underflow nor overflow (tokens of size
    1e-200 or 1e200 normalise to the same thing). Rows with a NaN or an infinite entry
    give NaN (reported by the overflow guard, never hidden as a finite row)."""
    a = jnp.max(jnp.abs(u), axis=-1, keepdims=True)
    zero = a == 0  # a NaN row has a NaN max: not zero, so it stays NaN below
    v = u / jnp.where(zero, 1.0, a)
    r = jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True))
    return jnp.where(zero, 0.0, v / jnp.where(zero, 1.0, r)).astype(u.dtype)


class Softmax(AbstractKernel):
    """``P = softmax(L)``: the kernel of the transformer and of the theory."""

    name: ClassVar[str] = "softmax"
    summary: ClassVar[str] = "softmax(L)"

    def weights(self, L: Array) -> Array:
        return softmax(L)

    def log_mass(self, L: Array, keep: Array) -> Array | None:
        return softmax_log_mass(L, keep)

    def argmax(self, L: Array, P: Array) -> Array:
        del P
        return jnp.argmax(L, axis=-1)
