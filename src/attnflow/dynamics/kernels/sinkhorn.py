"""``Sinkhorn``: doubly stochastic attention (Sander, Ablin, Blondel and Peyre 2022,
Sinkformers). Starting from ``log K = L``, each of ``iters`` iterations normalises the
columns and then the rows, in the log domain (``logsumexp``; no overflow):
``L <- L - logsumexp_i L``, ``L <- L - logsumexp_j L``; ``P = e^L``. The rows sum to one
exactly and the columns to one in the limit of many iterations (for a square ``L``).
``iters = 1`` is softmax of the column-normalised logits.

Every column depends on every query row, so the kernel is not row-wise: it is computed
densely (``block=0``). Masked logits (``-inf``) stay at weight 0; every mask here keeps
the diagonal, so no row or column is empty; a user's mask (a graph) that leaves a column
or a row empty leaves it at weight 0 (the other columns still normalised): such a row
then sums to 0, not 1.
"""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
from jaxtyping import Array

from ... import _checks
from ._base import AbstractKernel

__all__ = ["Sinkhorn", "sinkhorn"]


def sinkhorn(L: Array, iters: int = 3) -> Array:
    """``iters`` log-domain Sinkhorn iterations of the logits ``L`` ``(..., n, m)``
    (columns, then rows); the weights ``e^L``."""

    def one(_, L):
        # a column (or row) that a mask leaves empty keeps weight 0: its logsumexp is
        # -inf, and -inf - (-inf) would be NaN
        c = jax.nn.logsumexp(L, axis=-2, keepdims=True)
        L = L - jax.numpy.where(jax.numpy.isfinite(c), c, 0.0)
        r = jax.nn.logsumexp(L, axis=-1, keepdims=True)
        return L - jax.numpy.where(jax.numpy.isfinite(r), r, 0.0)

    # a loop, not unrolled: the compile time no longer grows with iters (a static trip
    # count, so reverse-mode derivatives go through it)
    return jax.numpy.exp(jax.lax.fori_loop(0, int(iters), one, L))


class Sinkhorn(AbstractKernel):
    """Doubly stochastic attention by ``iters`` Sinkhorn iterations (a setting)."""

    iters: int = eqx.field(static=True)
    name: ClassVar[str] = "sinkhorn"
    summary: ClassVar[str] = "iters log-domain Sinkhorn iterations: doubly stochastic (dense only)"
    rowwise: ClassVar[bool] = False

    def __init__(self, iters: Any = 3):
        self.iters = _checks.integer("kernel_params['iters'] of 'sinkhorn'", iters, lo=1, hi=1000)

    def weights(self, L: Array) -> Array:
        return sinkhorn(L, self.iters)
