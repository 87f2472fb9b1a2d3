"""Linear attention (Katharopoulos et al. 2020), ``phi = elu + 1 > 0``:

``Linear``      ``P_ij = beta phi(q_i) . phi(k_j)``, unnormalised (rows need not sum to
                one: original frame only). Nothing is exponentiated; the guard's bound is
                that of ``|P|`` itself.
``LinearNorm``  the same divided by its row sum (rows sum to one, every frame; beta
                cancels).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel

__all__ = ["Linear", "LinearNorm", "linear_attention", "linear_normalized"]


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
    summary: ClassVar[str] = (
        "beta phi(q) . phi(k), phi = elu + 1, unnormalised (original frame only)"
    )
    row_stochastic: ClassVar[bool] = False

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return _elu1(q), _elu1(k)

    def weights(self, L: Array) -> Array:
        return linear_attention(L)


class LinearNorm(AbstractKernel):
    """``phi(q) . phi(k)`` normalised by its row sum."""

    name: ClassVar[str] = "linearnorm"
    summary: ClassVar[str] = "phi(q) . phi(k) / sum_k phi(q) . phi(k_k), phi = elu + 1"

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return _elu1(q), _elu1(k)

    def weights(self, L: Array) -> Array:
        return linear_normalized(L)
