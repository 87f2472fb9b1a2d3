"""A trained head's attention, computed by the dynamics' kernels and masks.

Every network here (the encoder, the long-context decoder, the needle and retrieval
models) turns its queries and keys into weights with the objects a particle model uses:
an ``attnflow.kernels.AbstractKernel`` and an ``attnflow.masks.AbstractMask``. The steps
are those of ``AbstractKernelAttention.weights`` (``attnflow.dynamics.base``), in its
order:

    q, k = mask.turn(*kernel.prepare(q, k))      (``kernels._tiling.prepared``)
    L    = beta q k^T                            (``kernels.logits``)
    L    = mask.apply_rows(L, rows)              (bias added, dropped entries -inf)
    P    = kernel.weights(L)

``head_weights`` is all four. A network whose logits were fitted (or published, the
encoder's ``q . k / sqrt(d_h)``) with the product in another order passes ``logits``, a
function of the prepared queries and keys, so that its numbers stay bit for bit those it
was trained with: the decoder and the needle model multiply ``beta (q k^T)``, the encoder
divides ``(q k^T) / sqrt(d_h)``; ``kernels.logits`` is ``(beta q) k^T``, the same numbers
to rounding. ``masked_weights`` is the last two steps. No network writes a softmax of its
own: the one softmax of logits is ``attnflow.dynamics.kernels.softmax``.

``key_padding(keep)`` is the mask of a padded sentence (``attnflow.masks.Graph``: every
row keeps the sentence's own tokens), so that a padded key weighs exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Bool

from ..dynamics import kernels as _kernels
from ..dynamics.kernels._tiling import prepared
from ..dynamics.kernels.masks import AbstractMask, Graph

__all__ = ["head_weights", "masked_weights", "key_padding"]


def masked_weights(
    kernel: _kernels.AbstractKernel,
    L: Array,
    mask: AbstractMask | None = None,
    rows: Array | None = None,
) -> tuple[Array, Array]:
    """``(P, L)``: the weights of logits ``L`` ``(r, m)`` of query rows ``rows`` (token
    indices; default ``0 .. r-1``) under ``mask`` (its bias added, the entries it drops
    ``-inf``), and the logits as the kernel received them."""
    if mask is not None:
        rows = jnp.arange(L.shape[-2]) if rows is None else rows
        L = mask.apply_rows(L, rows)
    return kernel.weights(L), L


def head_weights(
    kernel: _kernels.AbstractKernel,
    q: Array,
    k: Array,
    beta: Any,
    *,
    mask: AbstractMask | None = None,
    rows: Array | None = None,
    logits: Callable[[Array, Array], Array] | None = None,
) -> tuple[Array, Array]:
    """``(P, L)`` of one head: queries ``q`` ``(r, p)`` (of the token indices ``rows``,
    default ``0 .. r-1``) and keys ``k`` ``(m, p)`` through the kernel's preparation,
    the mask's turn, the logits ``beta q k^T``, the mask and ``kernel.weights``: the
    computation of ``AbstractKernelAttention.weights``. ``logits(q, k)``, when given,
    forms the logits of the prepared queries and keys instead of ``kernels.logits(q, k,
    beta)`` (a network's own order of the product; ``beta`` is then unused).

    Example:
        >>> import numpy as np
        >>> from attnflow.dynamics.kernels import Softmax
        >>> from attnflow.masks import Causal
        >>> q = k = np.eye(3)
        >>> P, L = head_weights(Softmax(), q, k, 1.0, mask=Causal())
        >>> np.round(np.asarray(P), 3).tolist()[1]
        [0.269, 0.731, 0.0]
    """
    q, k = jnp.asarray(q), jnp.asarray(k)
    q, k = prepared(kernel, mask, q, k)
    L = _kernels.logits(q, k, beta) if logits is None else logits(q, k)
    return masked_weights(kernel, L, mask, rows)


def key_padding(keep: Bool[Array, " n"]) -> Graph:
    """The mask of a padded sentence of ``n`` positions: every row keeps the keys with
    ``keep`` True (at least one), a ``Graph`` whose rows are all ``keep``."""
    keep = jnp.asarray(keep, bool)
    n = keep.shape[-1]
    return Graph(jnp.broadcast_to(keep[None, :], (n, n)))
