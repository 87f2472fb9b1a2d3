"""Linear attention (Katharopoulos et al. 2020), ``phi = elu + 1 > 0``:

``Linear``      ``P_ij = beta phi(q_i) . phi(k_j)``, unnormalised (rows need not sum to
                one: original frame only). Nothing is exponentiated; the guard's bound is
                that of ``|P|`` itself.
``LinearNorm``  the same divided by its row sum (rows sum to one, every frame; beta
                cancels).

The weights are the logits themselves, positive because ``phi`` is: neither takes a mask
that moves the logits (``takes_positions`` False). ALiBi's bias ``-slope (i - j)`` and
RoPE's rotation of ``phi(q)``, ``phi(k)`` make weights negative, and in ``LinearNorm`` the
row sum can pass through 0 (weights and field without bound). Masks that only drop keys
(causal, window, sink window) are taken.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel

__all__ = ["Linear", "LinearNorm", "linear_attention", "linear_normalized"]


_NO_POSITIONS = (
    "its weights are the logits beta phi(q) . phi(k) themselves, positive only because phi "
    "is: a bias or a rotation of phi(q), phi(k) makes them negative"
)


def _elu1(u: Array) -> Array:
    """``phi(u) = elu(u) + 1 > 0``, entry-wise."""
    return jax.nn.elu(u) + 1.0


def linear_attention(L: Array) -> Array:
    """Unnormalised linear attention: the logits ``L = beta phi(q) . phi(k)`` themselves
    (``-inf``, a masked key, gives 0). Rows need not sum to 1."""
    return jnp.where(L == -jnp.inf, 0.0, L)


def linear_normalized(L: Array) -> Array:
    """Normalised linear attention ``L_ij / sum_k L_ik`` (``L > 0``; masked keys 0)."""
    P = linear_attention(L)
    return P / jnp.sum(P, axis=-1, keepdims=True)


class Linear(AbstractKernel):
    """``beta phi(q) . phi(k)``, unnormalised."""

    name: ClassVar[str] = "linear"
    bilinear_logits: ClassVar[bool] = False  # prepare maps the queries and keys
    summary: ClassVar[str] = (
        "beta phi(q) . phi(k), phi = elu + 1, unnormalised (original frame only)"
    )
    row_stochastic: ClassVar[bool] = False
    takes_positions: ClassVar[bool] = False
    no_positions_reason: ClassVar[str] = _NO_POSITIONS

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return _elu1(q), _elu1(k)

    def weights(self, L: Array) -> Array:
        return linear_attention(L)


class LinearNorm(AbstractKernel):
    """``phi(q) . phi(k)`` normalised by its row sum."""

    name: ClassVar[str] = "linearnorm"
    bilinear_logits: ClassVar[bool] = False  # prepare maps the queries and keys
    summary: ClassVar[str] = "phi(q) . phi(k) / sum_k phi(q) . phi(k_k), phi = elu + 1"
    takes_positions: ClassVar[bool] = False
    no_positions_reason: ClassVar[str] = _NO_POSITIONS

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return _elu1(q), _elu1(k)

    def weights(self, L: Array) -> Array:
        return linear_normalized(L)
