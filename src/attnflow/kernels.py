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

__all__ = ["KERNELS", "logits", "softmax", "weights", "apply_weights", "attend",
           "row_stochastic", "auto_block", "DENSE_MAX_N", "BLOCK_ENTRIES"]

# Above this many tokens ``attend`` never forms the (n, n) matrix: it processes blocks of
# query rows, each against all keys, so memory is O(n * block).
DENSE_MAX_N = 2048
# Entries of one (block, n) logit tile.
BLOCK_ENTRIES = 1 << 22


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


def auto_block(n: int) -> int:
    """Query rows per tile for ``n`` tokens: 0 (dense) up to ``DENSE_MAX_N``, else about
    ``BLOCK_ENTRIES / n`` (at least 16): a tile of 4M entries, 16 MB in float32."""
    if n <= DENSE_MAX_N:
        return 0
    return max(16, BLOCK_ENTRIES // n)


def attend(kernel: str, q: Array, k: Array, beta, values: Array, *,
           block: int | None = None) -> Array:
    """``weights(kernel, beta q k^T) @ values`` without the ``(n, n)`` matrix when n is large.

    Args:
        kernel: a kernel name.
        q: queries ``(n, p)``; k: keys ``(m, p)``; values: ``(m, d)``.
        beta: inverse temperature.
        block: query rows per tile; ``None`` chooses by size (``auto_block``), 0 forces
            the dense path.

    Each tile holds whole rows of logits (a block of queries against every key), so every
    row-wise kernel is evaluated exactly as in the dense path: the results agree to
    rounding (the same operations per row). Memory ``O(block * m)``.
    """
    n = q.shape[0]
    if block is None:
        block = auto_block(k.shape[0])
    if block <= 0 or block >= n:
        return weights(kernel, logits(q, k, beta)) @ values
    nb = -(-n // block)
    pad = nb * block - n
    qb = jnp.pad(q, ((0, pad), (0, 0))).reshape(nb, block, q.shape[-1])

    def tile(qi):
        return weights(kernel, logits(qi, k, beta)) @ values

    out = jax.lax.map(tile, qb)
    return out.reshape(nb * block, values.shape[-1])[:n]
