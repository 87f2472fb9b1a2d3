"""``Adaptive``: the adaptive temperature of Velickovic et al. (2024): ``p = softmax(L)``,
``H = -sum p log(p + 1e-9)`` (nats); ``1/theta = max(polyval([-0.037, 0.481, -2.3,
4.917, -1.791], H), 1)`` where ``H > 0.5``, else 1; the weights are ``softmax(L / theta)``.
The factor is 1 unless ``0.84858 < H < 5.94452`` and at most 2.4214 (at ``H = 4.412``)."""

from __future__ import annotations

import math
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._base import AbstractKernel
from .softmax import softmax

__all__ = [
    "Adaptive",
    "adaptive_softmax",
    "adaptive_inverse_temperature",
    "ADAPTIVE_POLY",
    "ADAPTIVE_MAX_INVERSE_TEMPERATURE",
]

# Velickovic et al. (2024), adaptive temperature: coefficients of 1/theta in the entropy.
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)


def _adaptive_peak() -> float:
    crit = np.roots(np.polyder(np.asarray(ADAPTIVE_POLY)))
    crit = crit[np.abs(crit.imag) < 1e-12].real
    vals = [np.polyval(ADAPTIVE_POLY, h) for h in crit if h > 0.5] + [1.0]
    return float(max(vals))


# Largest factor the adaptive rule can put on the logits (2.4214 at H = 4.412).
ADAPTIVE_MAX_INVERSE_TEMPERATURE = _adaptive_peak()


def adaptive_inverse_temperature(L: Array) -> Array:
    """``1/theta`` of each row of ``L`` ``(..., n)`` under the adaptive rule: ``(...)``."""
    p = softmax(L)
    H = -jnp.sum(p * jnp.log(p + 1e-9), axis=-1)
    poly = jnp.polyval(jnp.asarray(ADAPTIVE_POLY, L.dtype), H)
    return jnp.where(H > 0.5, jnp.maximum(poly, 1.0), 1.0).astype(L.dtype)


def adaptive_softmax(L: Array) -> Array:
    """``softmax(L / theta)`` with the adaptive temperature of each row."""
    return softmax(L * adaptive_inverse_temperature(L)[..., None])


class Adaptive(AbstractKernel):
    """``softmax(L / theta)`` with the adaptive temperature of each row."""

    name: ClassVar[str] = "adaptive"
    summary: ClassVar[str] = "softmax(L / theta), adaptive temperature of Velickovic et al."

    def weights(self, L: Array) -> Array:
        return adaptive_softmax(L)

    def log_gain(self, log_b: Array, m: int) -> Array:
        return log_b + math.log(ADAPTIVE_MAX_INVERSE_TEMPERATURE)
