"""``Sinkhorn``: doubly stochastic attention (Sander, Ablin, Blondel and Peyre 2022,
Sinkformers). Starting from ``log K = L``, each iteration normalises the columns and then
the rows, in the log domain (``logsumexp``; no overflow): ``L <- L - logsumexp_i L``,
``L <- L - logsumexp_j L``; ``P = e^L``. The rows sum to one exactly after every
iteration; the columns reach one (for a square ``L``; ``n / m`` for ``n`` queries and
``m`` keys) only in the limit.

By default the iterations run to a tolerance: until every column sum is within ``tol``
of its limit (``max_j |sum_i P_ij - n / m| <= tol``), at most ``max_iters`` of them
(``tol`` defaults to 1e-6 in float32 and 1e-12 in float64: ``TOLERANCES``). Where the cap
stops them short the matrix is not doubly stochastic to ``tol``: ``sinkhorn_info`` (and
``Sinkhorn.info``) return the iterations taken and the residual, and ``Sinkhorn.weights``
called outside a trace warns with both. An explicit ``iters`` is a fixed count, as in
earlier versions (whose default was ``iters = 3``: runs saved with it load and compute as
before); ``iters = 1`` is softmax of the column-normalised logits.

The loop is ``equinox.internal.while_loop(kind="checkpointed")`` with ``max_iters`` as
its bound: reverse-mode differentiable (the fixed count is a ``fori_loop`` of static
length). Slow cases: the iteration converges linearly, slowly for logits of a wide
spread, and a support without a doubly stochastic matrix of its own (a causal mask: the
only doubly stochastic lower-triangular matrix is the identity) is approached only
sublinearly, so such runs stop at the cap, with their residual.

Every column depends on every query row, so the kernel is not row-wise: it is computed
densely (``block=0``). Masked logits (``-inf``) stay at weight 0; every mask here keeps
the diagonal, so no row or column is empty; a user's mask (a graph) that leaves a column
or a row empty leaves it at weight 0 (the other columns still normalised): such a row
then sums to 0, not 1, and such a column is left out of the residual.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jax import core as jax_core
from jaxtyping import Array

from ... import _checks
from ._base import AbstractKernel

__all__ = ["Sinkhorn", "SinkhornInfo", "TOLERANCES", "sinkhorn", "sinkhorn_info"]

# the default tolerance on the column sums, by the logits' floating type
TOLERANCES = {"float32": 1e-6, "float64": 1e-12}
MAX_ITERS = 1000  # the default cap of the iterations to a tolerance


class SinkhornInfo(NamedTuple):
    """What ``sinkhorn_info`` returns: the weights, the iterations taken and the residual
    ``max_j |sum_i P_ij - n / m|`` of the returned weights (a scalar over a batch)."""

    weights: Array
    iterations: Array
    residual: Array


def default_tol(dtype: Any) -> float:
    """The default tolerance of logits of floating type ``dtype`` (``TOLERANCES``:
    float64's for float64, float32's otherwise)."""
    return TOLERANCES["float64" if jnp.dtype(dtype) == jnp.float64 else "float32"]


def _one(L: Array) -> tuple[Array, Array]:
    """One iteration (columns, then rows) and the log column sums after it."""
    # a column (or row) that a mask leaves empty keeps weight 0: its logsumexp is -inf,
    # and -inf - (-inf) would be NaN
    c = jax.nn.logsumexp(L, axis=-2, keepdims=True)
    L = L - jnp.where(jnp.isfinite(c), c, 0.0)
    r = jax.nn.logsumexp(L, axis=-1, keepdims=True)
    L = L - jnp.where(jnp.isfinite(r), r, 0.0)
    return L, jax.nn.logsumexp(L, axis=-2)


def _residual(log_cols: Array, target: float) -> Array:
    """``max |column sum - target|`` over the columns that hold weight."""
    cols = jnp.exp(log_cols)
    off = jnp.where(jnp.isfinite(log_cols), jnp.abs(cols - target), 0.0)
    return jnp.max(off)


def sinkhorn_info(
    L: Array, iters: int | None = None, *, tol: float | None = None, max_iters: int = MAX_ITERS
) -> SinkhornInfo:
    """Log-domain Sinkhorn iterations of the logits ``L`` ``(..., n, m)`` (columns, then
    rows): the weights ``e^L``, the iterations taken and the residual.

    Args:
        L: the logits (``-inf`` for masked entries).
        iters: a fixed number of iterations; ``None`` (default): to the tolerance.
        tol: the tolerance on the column sums (default ``TOLERANCES`` of ``L``'s type);
            used when ``iters`` is ``None``.
        max_iters: the cap of the iterations to the tolerance.

    Returns:
        ``SinkhornInfo(weights, iterations, residual)``.
    """
    L = jnp.asarray(L)
    target = L.shape[-2] / L.shape[-1]
    if iters is not None:
        # a loop, not unrolled: the compile time does not grow with iters (a static trip
        # count, so reverse-mode derivatives go through it)
        n = int(iters)
        L = jax.lax.fori_loop(0, n - 1, lambda _, L: _one(L)[0], L) if n > 1 else L
        L, c = _one(L)
        return SinkhornInfo(jnp.exp(L), jnp.asarray(n), _residual(c, target))
    tol = default_tol(L.dtype) if tol is None else float(tol)
    cap = int(max_iters)

    def cond(state):
        _, c, k = state
        return (k < 1) | ((k < cap) & (_residual(c, target) > tol))

    def body(state):
        L, _, k = state
        L, c = _one(L)
        return L, c, k + 1

    c0 = jnp.zeros(L.shape[:-2] + L.shape[-1:], L.dtype)
    L, c, k = eqxi.while_loop(
        cond, body, (L, c0, jnp.asarray(0)), max_steps=cap, kind="checkpointed"
    )
    return SinkhornInfo(jnp.exp(L), k, _residual(c, target))


def sinkhorn(
    L: Array, iters: int | None = None, *, tol: float | None = None, max_iters: int = MAX_ITERS
) -> Array:
    """The weights of ``sinkhorn_info`` alone: ``iters`` iterations of the logits ``L``
    ``(..., n, m)`` if given, else to the tolerance ``tol`` on the column sums, at most
    ``max_iters``."""
    return sinkhorn_info(L, iters, tol=tol, max_iters=max_iters).weights


class Sinkhorn(AbstractKernel):
    """Doubly stochastic attention by Sinkhorn iterations (settings): to the tolerance
    ``tol`` on the column sums (default ``TOLERANCES`` by the logits' type), at most
    ``max_iters``; or exactly ``iters`` of them when ``iters`` is given."""

    iters: int | None = eqx.field(static=True)
    tol: float | None = eqx.field(static=True)
    max_iters: int = eqx.field(static=True)
    name: ClassVar[str] = "sinkhorn"
    summary: ClassVar[str] = (
        "log-domain Sinkhorn iterations to a tolerance on the column sums (capped; or a "
        "fixed iters): doubly stochastic to tol (dense only)"
    )
    rowwise: ClassVar[bool] = False

    def __init__(self, iters: Any = None, tol: Any = None, max_iters: Any = MAX_ITERS):
        where = "kernel_params['{}'] of 'sinkhorn'"
        self.iters = (
            None if iters is None else _checks.integer(where.format("iters"), iters, lo=1, hi=1000)
        )
        self.tol = (
            None
            if tol is None
            else _checks.number(where.format("tol"), tol, lo=0.0, hi=1.0, lo_open=True)
        )
        self.max_iters = _checks.integer(where.format("max_iters"), max_iters, lo=1, hi=100_000)
        if self.iters is not None and self.tol is not None:
            raise ValueError(
                "kernel_params of 'sinkhorn': give iters (a fixed count) or tol (iterate "
                f"to it, at most max_iters), not both; got iters={self.iters}, tol={self.tol}."
            )

    def info(self, L: Array) -> SinkhornInfo:
        """The weights of ``L`` with the iterations taken and the residual."""
        return sinkhorn_info(L, self.iters, tol=self.tol, max_iters=self.max_iters)

    def weights(self, L: Array) -> Array:
        out = self.info(L)
        if self.iters is None and not isinstance(out.residual, jax_core.Tracer):
            tol = default_tol(jnp.asarray(L).dtype) if self.tol is None else self.tol
            residual = float(np.asarray(out.residual))
            if residual > tol:
                warnings.warn(
                    f"sinkhorn stopped at its cap of {self.max_iters} iterations with the "
                    f"column sums {residual:.3g} from their limit (tol {tol:g}): raise "
                    "max_iters, or give a larger tol",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return out.weights
