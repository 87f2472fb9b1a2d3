"""``Sigmoid``: ``sigmoid(L - log n)``, not normalised: rows need not sum to one (zero
logits give ``1 / (n + 1)``), so only the original frame applies."""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel

__all__ = ["Sigmoid", "sigmoid_attention"]


def sigmoid_attention(L: Array) -> Array:
    """``sigmoid(L - log n)`` of logits ``L`` ``(..., n)``; rows need not sum to 1."""
    n = L.shape[-1]
    return jax.nn.sigmoid(L - math.log(n))


class Sigmoid(AbstractKernel):
    """``sigmoid(L - log n)``, unnormalised."""

    name: ClassVar[str] = "sigmoid"
    summary: ClassVar[str] = "sigmoid(L - log n), unnormalised (original frame only)"
    row_stochastic: ClassVar[bool] = False

    def weights(self, L: Array) -> Array:
        return sigmoid_attention(L)

    def log_gain(self, log_b: Array, m: int) -> Array:
        # |L - log n| <= |L| + log n <= 2 max(|L|, log n)
        return jnp.logaddexp(log_b, math.log(math.log(m)) if m > 1 else -jnp.inf)
