"""``USA``: unnormalised self-attention of Geshkovski et al., ``e^{L} / n``. Rows need
not sum to one, so only the original and sphere frames apply. With ``Q = K = V = I`` on
the sphere its field is the gradient ascent of
``E_beta = (1/(2 beta n^2)) sum_{i,j} e^{beta <x_i, x_j>}``."""

from __future__ import annotations

import math
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel

__all__ = ["USA", "usa"]


def usa(L: Array) -> Array:
    """``e^{L} / n`` of logits ``L`` ``(..., n)``."""
    return jnp.exp(L) / L.shape[-1]


class USA(AbstractKernel):
    """``e^L / n``, unnormalised."""

    name: ClassVar[str] = "usa"
    summary: ClassVar[str] = "e^L / n, unnormalised (original and sphere frames)"
    row_stochastic: ClassVar[bool] = False

    def weights(self, L: Array) -> Array:
        return usa(L)

    def log_gain(self, log_b: Array, m: int) -> Array:
        # The largest weight is e^{max L} / n <= e^{e^{log_b}} / n: the guard's exponent is
        # e^{log_b} - log n, so it stops once a logit passes log(finfo.max) - 4 + log n
        # (about 705.8 + log n in float64, 84.7 + log n in float32).
        return jnp.exp(log_b) - math.log(m)
