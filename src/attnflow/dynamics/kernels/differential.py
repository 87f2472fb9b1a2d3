"""``Differential`` (Ye et al. 2024): the head is split in halves, ``Q = [Q1; Q2]``,
``K = [K1; K2]`` (head size ``p`` even): ``P = softmax(beta q1 k1^T) - lam
softmax(beta q2 k2^T)``, parameter ``lam`` (default 0.2, Ye et al.'s ``lambda_init`` of
the first layer). Rows sum to ``1 - lam`` and entries may be negative: original frame
only. Its logits are the two maps side by side, ``(n, 2n)``; it takes no mask."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel, parameter
from .softmax import softmax

__all__ = ["Differential", "differential_attention"]


def differential_attention(L: Array, lam: Any = 0.2) -> Array:
    """``softmax(L1) - lam softmax(L2)`` of the stacked logits ``[L1 | L2]`` ``(..., 2m)``."""
    m = L.shape[-1] // 2
    return softmax(L[..., :m]) - jnp.asarray(lam, L.dtype) * softmax(L[..., m:])


class Differential(AbstractKernel):
    """Differential attention; ``lam`` is a trainable leaf."""

    lam: Array
    name: ClassVar[str] = "differential"
    bilinear_logits: ClassVar[bool] = False  # prepare maps the queries and keys
    summary: ClassVar[str] = "softmax(beta q1 k1) - lam softmax(beta q2 k2), rows sum to 1 - lam"
    row_stochastic: ClassVar[bool] = False
    takes_mask: ClassVar[bool] = False
    no_mask_reason: ClassVar[str] = "its logits are two maps side by side"

    def __init__(self, lam: Any = 0.2):
        self.lam = parameter("differential", "lam", lam)

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        """Split the head in halves ``q = [q1 | q2]``, ``k = [k1 | k2]`` and stack the
        keys block-diagonally, ``[[k1, 0], [0, k2]]`` ``(2m, p)``, so that
        ``beta q @ k.T = [beta q1 k1^T | beta q2 k2^T]`` ``(n, 2m)``."""
        p = q.shape[-1]
        if p % 2:
            raise ValueError(
                f"kernel 'differential' splits the head into two halves (Q = [Q1; Q2], "
                f"K = [K1; K2]); the head size p must be even, got p = {p}."
            )
        h = p // 2
        z = jnp.zeros_like(k[..., :h])
        k2 = jnp.concatenate(
            [jnp.concatenate([k[..., :h], z], -1), jnp.concatenate([z, k[..., h:]], -1)], -2
        )
        return q, k2

    def weights(self, L: Array) -> Array:
        return differential_attention(L, self.lam)
