"""Attention kernels: how the logits of one query row become attention weights.

A kernel maps the ``(n, n)`` logit matrix ``L_ij = beta <Q x_i, K x_j>`` to the weight
matrix ``P``. ``"softmax"`` is the kernel of the transformer and of the theory.

Every kernel here is evaluated in the working precision of its inputs (float64 stays
float64: ``jax.nn.dot_product_attention`` is deliberately not used, as it computes its
softmax in float32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array

__all__ = ["KERNELS", "logits", "weights", "apply_weights", "row_stochastic"]


def _softmax(L: Array) -> Array:
    return jax.nn.softmax(L, axis=-1)


# name -> (function of the logit matrix, rows sum to one?)
_REGISTRY = {
    "softmax": (_softmax, True),
}

KERNELS = tuple(_REGISTRY)


def logits(q: Array, k: Array, beta) -> Array:
    """``beta * q @ k.T``: queries ``q`` ``(n, p)``, keys ``k`` ``(n, p)`` -> ``(n, n)``."""
    return (beta * q) @ k.T


def weights(kernel: str, L: Array) -> Array:
    """The attention matrix of the logits ``L`` ``(..., n)`` under ``kernel``."""
    return _REGISTRY[kernel][0](L)


def apply_weights(kernel: str, L: Array, values: Array) -> Array:
    """``weights(kernel, L) @ values`` for ``values`` of shape ``(n, d)``."""
    return weights(kernel, L) @ values


def row_stochastic(kernel: str) -> bool:
    """Whether the kernel's rows sum to one (needed by the rescaled frame)."""
    return _REGISTRY[kernel][1]
