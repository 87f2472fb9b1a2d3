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

__all__ = ["KERNELS", "logits", "softmax", "weights", "apply_weights", "row_stochastic"]


def softmax(L: Array) -> Array:
    """Row softmax of logits ``L`` ``(..., n)``, exact to the accuracy of the logits.

    ``exp(L_j - max_k L_k)`` with the shifted exponents clamped at 0 and the argmax entry
    pinned to ``e^0 = 1``. Inside ``jit`` on CPU, XLA may recompute a low-rank logit
    product inside the fused subtraction and contract it into one fused multiply-add;
    the shifted logit of the maximum then comes out as the product's rounding error
    (``+-ulp/2``) instead of 0, which past ``|logit| ~ 1e18`` (float64) exceeds
    ``log(finfo.max)``, and ``jax.nn.softmax`` returns ``inf / inf = NaN``. The max
    shift is not stop-gradiented: with the argmax pinned, this is the exact
    reparametrisation ``softmax(L)_j = e^{L_j - L_max} / sum_k e^{L_k - L_max}`` and its
    gradient is the softmax gradient.
    """
    n = L.shape[-1]
    m = jnp.max(L, axis=-1, keepdims=True)
    top = jnp.arange(n) == jnp.argmax(L, axis=-1)[..., None]
    e = jnp.where(top, 1.0, jnp.exp(jnp.minimum(L - m, 0.0))).astype(L.dtype)
    return e / jnp.sum(e, axis=-1, keepdims=True)


# name -> (function of the logit matrix, rows sum to one?)
_REGISTRY = {
    "softmax": (softmax, True),
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
