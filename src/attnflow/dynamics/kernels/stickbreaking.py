"""``StickBreaking`` (Tan et al. 2024): ``P_j = sigmoid(L_j) prod_{k > j} (1 -
sigmoid(L_k))`` over the key order (the last key first), in log space. With a causal
mask: ``prod_{j < k <= i}``, ``j <= i`` (the query itself counts, since the masks keep
the diagonal; Tan et al.'s default is ``j < i``). Rows sum to
``1 - prod (1 - sigmoid) < 1``: original frame only."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._base import AbstractKernel

__all__ = ["StickBreaking", "stickbreaking"]


def stickbreaking(L: Array) -> Array:
    """Stick-breaking weights of logits ``L`` ``(..., n)`` over the key order, in log
    space: ``log P_j = log sigmoid(L_j) + sum_{k > j} log(1 - sigmoid(L_k))``. Masked
    keys (``-inf``) weigh 0 and break nothing."""
    log_keep = jax.nn.log_sigmoid(-L)  # log(1 - sigmoid(L)); 0 at a masked key
    after = jnp.flip(jnp.cumsum(jnp.flip(log_keep, -1), axis=-1), -1) - log_keep
    return jnp.exp(jax.nn.log_sigmoid(L) + after)


class StickBreaking(AbstractKernel):
    """Stick-breaking attention over the key order."""

    name: ClassVar[str] = "stickbreaking"
    summary: ClassVar[str] = (
        "sigmoid(L_j) prod_{k > j} (1 - sigmoid(L_k)), log space (original frame only)"
    )
    row_stochastic: ClassVar[bool] = False

    def weights(self, L: Array) -> Array:
        return stickbreaking(L)
