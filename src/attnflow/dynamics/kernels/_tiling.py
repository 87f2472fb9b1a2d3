"""``attend``: ``P @ values`` of a kernel, dense or in tiles of query rows.

Each tile holds whole rows of logits (a block of queries against every key), so every
row-wise kernel is evaluated exactly as in the dense path (``ssmax`` and ``sigmoid``
see the full ``m`` keys in every tile): the results agree to rounding. Memory
``O(block * m)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..._precision import mm
from ._base import AbstractKernel
from .masks import AbstractMask

__all__ = [
    "attend_with",
    "prepared",
    "auto_block",
    "check_kernel_mask",
    "logits",
    "DENSE_MAX_N",
    "BLOCK_ENTRIES",
]

# Above this many tokens ``attend`` never forms the (n, n) matrix: it processes blocks of
# query rows, each against all keys, so memory is O(n * block).
DENSE_MAX_N = 2048
# Entries of one (block, n) logit tile.
BLOCK_ENTRIES = 1 << 22


def auto_block(n: int) -> int:
    """Query rows per tile for ``n`` tokens: 0 (dense) up to ``DENSE_MAX_N``, else about
    ``BLOCK_ENTRIES / n`` (at least 16): a tile of 4M entries, 16 MB in float32."""
    if n <= DENSE_MAX_N:
        return 0
    return max(16, BLOCK_ENTRIES // n)


def moves_logits(mask: AbstractMask) -> bool:
    """Whether the mask does more than drop logits: it adds a bias (ALiBi) or turns the
    queries and keys by position (RoPE), as its class declares (``positional``)."""
    return bool(mask.positional)


def check_kernel_mask(kernel: AbstractKernel, mask: AbstractMask | None) -> None:
    """``ValueError`` for a mask the kernel cannot take: any mask (``takes_mask`` False),
    or one that moves the logits (``takes_positions`` False; ``moves_logits``)."""
    if mask is not None and not kernel.takes_mask:
        why = f" ({kernel.no_mask_reason})" if kernel.no_mask_reason else ""
        raise ValueError(f"kernel {kernel.name!r} takes no mask{why}; use mask=None.")
    if mask is not None and not kernel.takes_positions and moves_logits(mask):
        why = f" ({kernel.no_positions_reason})" if kernel.no_positions_reason else ""
        name = mask.name or type(mask).__name__
        raise ValueError(
            f"kernel {kernel.name!r} takes no mask that biases or turns the logits (got "
            f"mask={name!r}){why}; use a mask that only drops keys (None, 'causal', "
            f"('window', w), SinkWindow(sinks, w))."
        )


def prepared(
    kernel: AbstractKernel, mask: AbstractMask | None, q: Array, k: Array
) -> tuple[Array, Array]:
    """Queries and keys as the logits see them: the kernel's preparation, then the
    mask's turn by position (RoPE)."""
    q, k = kernel.prepare(q, k)
    return (q, k) if mask is None else mask.turn(q, k)


def logits(q: Array, k: Array, beta: Any) -> Array:
    """``beta * q @ k.T``: queries ``(n, p)``, keys ``(m, p)`` -> ``(n, m)``.

    The raw product: for ``qknorm`` pass ``prepare("qknorm", q, k)`` first."""
    return mm(beta * q, k.T)


def attend_with(
    kernel: AbstractKernel,
    q: Array,
    k: Array,
    beta: Any,
    values: Array,
    *,
    block: int | None = None,
    mask: AbstractMask | None = None,
) -> Array:
    """``kernel.weights(beta q k^T) @ values`` without the ``(n, m)`` matrix when large.

    Args:
        kernel: a kernel object.
        q: queries ``(n, p)``; k: keys ``(m, p)``; values: ``(m, c)``. Raw: the kernel's
            ``prepare`` is applied here.
        beta: inverse temperature.
        block: query rows per tile; ``None`` chooses by size (``auto_block``), 0 forces
            the dense path.
        mask: a mask object or ``None``: it turns the queries and keys by position
            (RoPE), adds its bias, and dropped logits are ``-inf`` before the kernel;
            each tile masks its own rows.
    """
    check_kernel_mask(kernel, mask)
    q, k = prepared(kernel, mask, q, k)
    n = q.shape[0]
    if block is None:
        block = auto_block(k.shape[0])
    if not kernel.rowwise and 0 < block < n:
        raise ValueError(
            f"kernel {kernel.name!r} couples the query rows (a row's weights read other "
            f"rows' logits), so query tiles cannot compute it exactly; use block=0 "
            f"(dense, O(n^2) memory) for n = {n}."
        )

    def masked(L, row0):
        return L if mask is None else mask.apply(L, row0)

    if block <= 0 or block >= n:
        return mm(kernel.weights(masked(logits(q, k, beta), 0)), values)
    nb = -(-n // block)
    pad = nb * block - n
    qb = jnp.pad(q, ((0, pad), (0, 0))).reshape(nb, block, q.shape[-1])

    if mask is None:

        def tile(qi):
            return mm(kernel.weights(logits(qi, k, beta)), values)

        out = jax.lax.map(tile, qb)
    else:

        def masked_tile(args):
            qi, row0 = args
            return mm(kernel.weights(masked(logits(qi, k, beta), row0)), values)

        out = jax.lax.map(masked_tile, (qb, jnp.arange(nb) * block))
    return out.reshape(nb * block, values.shape[-1])[:n]
