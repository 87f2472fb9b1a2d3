"""``USA``: unnormalised self-attention of Geshkovski et al., ``e^{L - shift} / n``
(``shift`` 0 by default). Rows need not sum to one, so only the original and sphere
frames apply. With ``Q = K = V = I`` on the sphere its field is the gradient ascent of
``E_beta = (1/(2 beta n^2)) sum_{i,j} e^{beta <x_i, x_j>}``; the shift only scales the
field by ``e^{-shift}`` (so the same paths at another speed), and ``shift = beta`` keeps
the weights of unit tokens in ``(0, 1]`` at any beta: ``e^{beta (<x_i, x_j> - 1)} / n``,
the form of Geshkovski, Koubbi, Polyanskiy and Rigollet (2024) at beta in the thousands,
where ``e^{beta}`` overflows."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel, parameter

__all__ = ["USA", "usa"]


def usa(L: Array, shift: Any = 0.0) -> Array:
    """``e^{L - shift} / n`` of logits ``L`` ``(..., n)``."""
    return jnp.exp(L - jnp.asarray(shift, L.dtype)) / L.shape[-1]


class USA(AbstractKernel):
    """``e^{L - shift} / n``, unnormalised; ``shift`` (default 0) a finite leaf."""

    shift: Array
    name: ClassVar[str] = "usa"
    summary: ClassVar[str] = "e^(L - shift) / n, unnormalised (original and sphere frames)"
    row_stochastic: ClassVar[bool] = False

    def __init__(self, shift: Any = 0.0):
        self.shift = parameter("usa", "shift", shift)

    def weights(self, L: Array) -> Array:
        return usa(L, self.shift)

    def log_gain(self, log_b: Array, m: int) -> Array:
        # The largest weight is e^{max L - shift} / n <= e^{e^{log_b} - shift} / n: the
        # guard's exponent is e^{log_b} - shift - log n, so with shift 0 it stops once a
        # logit passes log(finfo.max) - 4 + log n (about 705.8 + log n in float64, 84.7 +
        # log n in float32).
        return jnp.exp(log_b) - self.shift - math.log(m)
