"""``SSMax``: scalable softmax ``softmax(s log(n) L)``, parameter ``s`` (default 1),
``n`` the number of keys. With one logit ``D`` above the rest the top weight is
``1 / (1 + (n - 1) n^{-s D})``: it tends to 1 if ``s D > 1``."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel, parameter
from .softmax import softmax

__all__ = ["SSMax", "ssmax"]


def ssmax(L: Array, s: Any = 1.0) -> Array:
    """Scalable softmax ``softmax(s log(n) L)`` of logits ``L`` ``(..., n)``."""
    n = L.shape[-1]
    return softmax((jnp.asarray(s, L.dtype) * math.log(n)) * L)


class SSMax(AbstractKernel):
    """``softmax(s log(n) L)``; ``s > 0`` is a trainable leaf."""

    s: Array
    name: ClassVar[str] = "ssmax"
    summary: ClassVar[str] = "scalable softmax: softmax(s log(n) L)"

    def __init__(self, s: Any = 1.0):
        self.s = parameter("ssmax", "s", s, positive=True)

    def _scaled(self, L: Array) -> Array:
        return (jnp.asarray(self.s, L.dtype) * math.log(L.shape[-1])) * L

    def weights(self, L: Array) -> Array:
        return softmax(self._scaled(L))

    def log_gain(self, log_b: Array, m: int) -> Array:
        return log_b + jnp.log(self.s * math.log(m))
