"""``OffByOne``: ``e^{L_j} / (1 + sum_k e^{L_k})``, softmax with an implicit sink of
logit 0; rows sum to less than one: original frame only."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel

__all__ = ["OffByOne", "offbyone"]


def offbyone(L: Array) -> Array:
    """``e^{L_j} / (1 + sum_k e^{L_k})`` of logits ``L`` ``(..., n)``."""
    m = jnp.maximum(jnp.max(L, axis=-1, keepdims=True), 0.0)
    e = jnp.exp(L - m)
    return e / (jnp.exp(-m) + jnp.sum(e, axis=-1, keepdims=True))


class OffByOne(AbstractKernel):
    """Softmax with an implicit sink of logit 0."""

    name: ClassVar[str] = "offbyone"
    summary: ClassVar[str] = "e^L / (1 + sum e^L), an implicit sink"
    row_stochastic: ClassVar[bool] = False

    def weights(self, L: Array) -> Array:
        return offbyone(L)
