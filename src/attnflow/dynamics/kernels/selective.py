"""``Selective`` (Leviathan et al. 2024), causal always: ``S = relu(L)`` below the
diagonal, ``S[:, 0] = 0``, ``S_ii = 0``, ``F_ij = sum_{k<i} S_kj``, ``P = softmax(L - F)``
over ``j <= i``. Rows sum to one. Not row-wise (row ``i`` reads rows ``k < i``): dense
only, the tiled path refuses."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel
from .softmax import softmax

__all__ = ["Selective", "selective_attention"]


def selective_attention(L: Array) -> Array:
    """Selective attention of the full square logits ``(..., n, n)`` of one head, in
    causal order. The head's own logits are its selection logits (the paper takes those
    of head 0)."""
    n = L.shape[-1]
    if L.ndim < 2 or L.shape[-2] != n:
        raise ValueError(
            f"kernel 'selective' needs the full square (n, n) logits of a sequence (row i "
            f"reads the selection scores of the rows before it); got shape {L.shape}. "
            f"Pass every query row (dense path, block=0)."
        )
    i = jnp.arange(n)
    causal = i[None, :] <= i[:, None]
    S = jnp.where(causal & (i[None, :] > 0) & (i[None, :] != i[:, None]), L, 0.0)
    S = jnp.maximum(jnp.where(jnp.isfinite(S), S, 0.0), 0.0)
    F = jnp.cumsum(S, axis=-2) - S
    return softmax(jnp.where(causal, L - F, -jnp.inf))


class Selective(AbstractKernel):
    """Selective attention; couples the query rows."""

    name: ClassVar[str] = "selective"
    summary: ClassVar[str] = "softmax(L - F), F_ij = sum_{k<i} relu(L_kj) (causal; dense only)"
    rowwise: ClassVar[bool] = False
    causal: ClassVar[bool] = True  # row i keeps the keys j <= i whatever the mask

    def weights(self, L: Array) -> Array:
        return selective_attention(L)
