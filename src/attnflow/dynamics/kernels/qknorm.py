"""``QKNorm``: queries and keys RMS-normalised per token (over the head dimension ``p``:
``q / sqrt(mean(q^2))``, so ``|q| = sqrt(p)``), each then multiplied channel by channel
by its learnable gain (``wq``, ``wk``, shape ``(p,)``; ``None``: unit gains), then
softmax. The logits ``beta <wq * q^, wk * k^>`` lie in ``[-B, B]`` with
``B = beta p max|wq| max|wk|`` (``qknorm_logit_bound``): the spread is at most ``2 B``
whatever the tokens, a cap fixed by the weights (``2 beta p`` at unit gains).

``QKNormSink`` is the same with a learned sink (see ``attnflow.dynamics.kernels.sink``):
an extra softmax column of logit ``b`` with no value, so rows sum to less than one
(original frame only)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._base import AbstractKernel, parameter
from .sink import sink_softmax
from .softmax import rms_normalize, softmax

__all__ = ["QKNorm", "QKNormSink", "qknorm_logit_bound"]


def _gain(kernel: str, name: str, value: Any) -> Array | None:
    """A gain checked by name: a 1-d array of finite numbers (concrete arrays of every
    kind checked on the host; a traced one, inside ``jit`` or ``grad``, passes as is)."""
    if value is None:
        return None
    if isinstance(value, jax_core.Tracer):
        if value.ndim != 1:
            raise ValueError(
                f"kernel_params[{name!r}] of {kernel!r} must be a 1-d array of gains; got "
                f"shape {value.shape}."
            )
        return value
    try:
        arr = np.asarray(value)
    except Exception:  # ragged lists and the like
        arr = np.asarray([np.nan])
    bad = arr.dtype == object or np.iscomplexobj(arr) or arr.ndim != 1 or arr.size == 0
    if bad or not np.all(np.isfinite(arr.astype(np.float64))):
        raise ValueError(
            f"kernel_params[{name!r}] of {kernel!r} must be a 1-d array of finite gains, "
            f"one per channel of the head (p,); got {value!r}."
        )
    return value if isinstance(value, jnp.ndarray) else jnp.asarray(arr.astype(np.float64))


def _scaled(u: Array, w: Array | None) -> Array:
    u = rms_normalize(u)
    if w is None:
        return u
    if w.shape[-1] != u.shape[-1]:
        raise ValueError(
            f"the QK-norm gains have {w.shape[-1]} channels; the head has p = "
            f"{u.shape[-1]}: give one gain per channel."
        )
    return u * w.astype(u.dtype).reshape((1,) * (u.ndim - 1) + (-1,))


def qknorm_logit_bound(kernel: QKNorm | QKNormSink, beta: Any, p: int) -> float:
    """``B = beta p max|wq| max|wk|``: no logit of the kernel exceeds ``B`` in absolute
    value, so no row spreads over more than ``2 B`` (unit gains: ``2 beta p``)."""
    mq = 1.0 if kernel.wq is None else float(np.max(np.abs(np.asarray(kernel.wq))))
    mk = 1.0 if kernel.wk is None else float(np.max(np.abs(np.asarray(kernel.wk))))
    return float(beta) * int(p) * mq * mk


class QKNorm(AbstractKernel):
    """Softmax of ``beta <wq * q^, wk * k^>``, ``q^``, ``k^`` RMS-normalised per token."""

    wq: Array | None
    wk: Array | None
    name: ClassVar[str] = "qknorm"
    bilinear_logits: ClassVar[bool] = False  # prepare maps the queries and keys
    summary: ClassVar[str] = (
        "softmax of beta <wq q^, wk k^>, q^ and k^ RMS-normalised per token, gains wq, wk"
    )

    def __init__(self, wq: Any = None, wk: Any = None):
        self.wq = _gain("qknorm", "wq", wq)
        self.wk = _gain("qknorm", "wk", wk)

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return _scaled(q, self.wq), _scaled(k, self.wk)

    def weights(self, L: Array) -> Array:
        return softmax(L)


class QKNormSink(AbstractKernel):
    """``QKNorm`` with a learned sink logit ``b`` (an extra column with no value)."""

    wq: Array | None
    wk: Array | None
    b: Array
    name: ClassVar[str] = "qknorm_sink"
    bilinear_logits: ClassVar[bool] = False  # prepare maps the queries and keys
    summary: ClassVar[str] = "qknorm with a learned sink logit b: e^L / (e^b + sum e^L)"
    row_stochastic: ClassVar[bool] = False

    def __init__(self, wq: Any = None, wk: Any = None, b: Any = 0.0):
        self.wq = _gain("qknorm_sink", "wq", wq)
        self.wk = _gain("qknorm_sink", "wk", wk)
        self.b = parameter("qknorm_sink", "b", b)

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return _scaled(q, self.wq), _scaled(k, self.wk)

    def weights(self, L: Array) -> Array:
        return sink_softmax(L, self.b)
