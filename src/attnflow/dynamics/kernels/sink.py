"""``Sink``: softmax with a learned sink (as in gpt-oss): one extra column of logit ``b``
per head with no value, ``P_j = e^{L_j} / (e^b + sum_k e^{L_k})``. The sink enters the
denominator only (it weighs nothing in ``P @ V``), and the stable pivot includes it:
everything is computed with ``m = max(max_k L_k, b)`` factored out, so neither a large
``b`` nor large logits overflow. Rows sum to ``1 - e^b / (e^b + sum e^L) < 1``: the
sink's share is what the row lacks. ``b = 0`` is ``offbyone``. Original frame only."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel, parameter

__all__ = ["Sink", "sink_softmax", "sink_share"]


def _pivoted(L: Array, b: Any) -> tuple[Array, Array, Array]:
    """``(e^{L - m}, e^{b - m}, their row sum)`` with the pivot ``m = max(max L, b)``."""
    b = jnp.asarray(b, L.dtype)
    m = jax.lax.stop_gradient(jnp.maximum(jnp.max(L, axis=-1, keepdims=True), b))
    e, eb = jnp.exp(L - m), jnp.exp(b - m)
    return e, eb, eb + jnp.sum(e, axis=-1, keepdims=True)


def sink_softmax(L: Array, b: Any) -> Array:
    """``e^{L_j} / (e^b + sum_k e^{L_k})`` of logits ``L`` ``(..., n)`` (masked ``-inf``
    keys weigh 0), pivoted at ``max(max L, b)``."""
    e, _, total = _pivoted(L, b)
    return e / total


def sink_share(L: Array, b: Any) -> Array:
    """The sink column's weight ``1 / (1 + sum_j e^{L_j - b})`` per row (pivoted)."""
    _, eb, total = _pivoted(L, b)
    return (eb / total)[..., 0]


class Sink(AbstractKernel):
    """Softmax with a learned sink logit ``b`` (a trainable leaf)."""

    b: Array
    name: ClassVar[str] = "sink"
    summary: ClassVar[str] = "softmax with a learned sink logit b: e^L / (e^b + sum e^L)"
    row_stochastic: ClassVar[bool] = False

    def __init__(self, b: Any = 0.0):
        self.b = parameter("sink", "b", b)

    def weights(self, L: Array) -> Array:
        return sink_softmax(L, self.b)
