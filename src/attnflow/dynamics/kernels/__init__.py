"""Attention kernels: how the logits of one query row become attention weights.

A kernel maps the logit matrix ``L_ij = beta <q_i, k_j>`` to the weights ``P``, row by
row. Each kernel is a final subclass of ``AbstractKernel`` in a module of its own
(``softmax``, ``qknorm``, ``ssmax``, ...); its parameters are fields (trainable array
leaves), its facts class attributes (``row_stochastic``, ``rowwise``, ``takes_mask``,
``takes_positions``, ``normalizes_tokens``). Names stay as a lookup for strings and the
command line: ``Attention(Q, K, V, kernel="ssmax", kernel_params={"s": 2.0})`` and
``Attention(Q, K, V, kernel=SSMax(s=2.0))`` are the same model; ``get("ssmax", s=2.0)``
builds the object.

``KERNELS``: the names of the kernels shipped here. The functions ``weights``, ``attend``,
``prepare``, ``prepare_tokens``, ``log_logit_bound`` and ``row_stochastic`` take a name or
an object.

Every kernel is evaluated in the working precision of its inputs (float64 stays float64).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxtyping import Array

from ..._precision import mm
from ._base import KERNEL_CLASSES, AbstractKernel, parameter
from ._tiling import BLOCK_ENTRIES, DENSE_MAX_N, attend_with, auto_block, logits
from ._tiling import check_kernel_mask as _check_kernel_mask
from .adaptive import (
    ADAPTIVE_MAX_INVERSE_TEMPERATURE,
    ADAPTIVE_POLY,
    Adaptive,
    adaptive_inverse_temperature,
    adaptive_softmax,
)
from .differential import Differential, differential_attention
from .linear import Linear, LinearNorm, linear_attention, linear_normalized
from .masks import (
    AbstractMask,
    ALiBi,
    Causal,
    RoPE,
    SinkWindow,
    Window,
    alibi_slopes,
    apply_mask,
    check_mask,
    mask_keep,
)
from .offbyone import OffByOne, offbyone
from .prenorm import PreNorm
from .qknorm import QKNorm, QKNormSink, qknorm_logit_bound
from .selective import Selective, selective_attention
from .sigmoid import Sigmoid, sigmoid_attention
from .sink import Sink, sink_share, sink_softmax
from .sinkhorn import Sinkhorn, sinkhorn
from .softmax import (
    Softmax,
    SoftmaxParts,
    log_mass,
    rms_normalize,
    softmax,
    softmax_log_mass,
    softmax_parts,
)
from .sparse import (
    Entmax,
    Hardmax,
    Softpick,
    Sparsemax,
    entmax,
    hardmax,
    softpick,
    sparsemax,
    sparsemax_threshold,
)
from .ssmax import SSMax, ssmax
from .stickbreaking import StickBreaking, stickbreaking
from .usa import USA, usa

__all__ = [
    "AbstractKernel",
    "AbstractMask",
    "KERNELS",
    "KERNEL_CLASSES",
    "Softmax",
    "QKNorm",
    "PreNorm",
    "SSMax",
    "Sigmoid",
    "Adaptive",
    "USA",
    "Linear",
    "LinearNorm",
    "StickBreaking",
    "Selective",
    "Differential",
    "OffByOne",
    "Sink",
    "QKNormSink",
    "Sinkhorn",
    "Sparsemax",
    "Entmax",
    "Softpick",
    "Hardmax",
    "Causal",
    "Window",
    "ALiBi",
    "RoPE",
    "SinkWindow",
    "alibi_slopes",
    "get",
    "as_kernel",
    "parameter",
    "kernel_params",
    "logits",
    "softmax",
    "softmax_parts",
    "SoftmaxParts",
    "log_mass",
    "softmax_log_mass",
    "weights",
    "apply_weights",
    "attend",
    "attend_with",
    "row_stochastic",
    "auto_block",
    "DENSE_MAX_N",
    "BLOCK_ENTRIES",
    "prepare",
    "prepare_tokens",
    "rms_normalize",
    "ssmax",
    "sigmoid_attention",
    "adaptive_softmax",
    "adaptive_inverse_temperature",
    "log_logit_bound",
    "ADAPTIVE_POLY",
    "ADAPTIVE_MAX_INVERSE_TEMPERATURE",
    "check_mask",
    "mask_keep",
    "apply_mask",
    "check_kernel_mask",
    "linear_attention",
    "linear_normalized",
    "stickbreaking",
    "selective_attention",
    "differential_attention",
    "offbyone",
    "usa",
    "sink_softmax",
    "sink_share",
    "qknorm_logit_bound",
    "sinkhorn",
    "sparsemax",
    "sparsemax_threshold",
    "entmax",
    "softpick",
    "hardmax",
]

# The kernels shipped here, in their documented order (a kernel defined elsewhere is
# found by ``get`` once its class is defined, but is not listed here).
KERNELS: tuple[str, ...] = (
    "softmax",
    "qknorm",
    "ssmax",
    "sigmoid",
    "adaptive",
    "usa",
    "linear",
    "linearnorm",
    "stickbreaking",
    "selective",
    "differential",
    "offbyone",
    "prenorm",
    "sink",
    "qknorm_sink",
    "sinkhorn",
    "sparsemax",
    "entmax",
    "softpick",
    "hardmax",
)
assert all(name in KERNEL_CLASSES for name in KERNELS)


def _param_names(cls: type[AbstractKernel]) -> tuple[str, ...]:
    """What the kernel's constructor takes: its numeric parameters (array leaves) and its
    settings (static fields); not its class-level facts."""
    return tuple(f.name for f in dataclasses.fields(cls))  # pyright: ignore[reportArgumentType]


def get(kernel: str | AbstractKernel, **params: Any) -> AbstractKernel:
    """The kernel object of a name (with its parameters), or ``kernel`` itself.

    Examples:
        >>> from attnflow import kernels
        >>> kernels.get("ssmax", s=2.0).describe()
        'ssmax(s=2.0)'

    Raises:
        ValueError: an unknown name (the message lists ``KERNELS``) or parameter.
    """
    if isinstance(kernel, AbstractKernel):
        if params:
            raise ValueError(
                f"kernel_params: pass the parameters of a kernel object to its constructor "
                f"({type(kernel).__name__}(...)), not beside it; got {sorted(params)}."
            )
        return kernel
    try:
        cls = KERNEL_CLASSES[kernel]
    except (KeyError, TypeError):
        raise ValueError(
            f"kernel must be one of {KERNELS} or an attnflow.kernels.AbstractKernel; "
            f"got {kernel!r}."
        ) from None
    names = _param_names(cls)
    unknown = sorted(set(params) - set(names))
    if unknown:
        allowed = ", ".join(names) or "none"
        raise ValueError(
            f"kernel_params: {kernel!r} takes no parameter {unknown[0]!r} "
            f"(its parameters: {allowed})."
        )
    return cls(**params)


def as_kernel(kernel: str | AbstractKernel, params: Mapping | None = None) -> AbstractKernel:
    """``get(kernel, **params)`` with ``params`` a mapping (``kernel_params=``), checked."""
    if params is not None and not hasattr(params, "items"):
        raise ValueError(f"kernel_params must be a mapping such as {{'s': 2.0}}; got {params!r}.")
    return get(kernel, **dict(params or {}))


def kernel_params(kernel: str | AbstractKernel, params: Mapping | None = None) -> dict:
    """The kernel's parameters by name: ``params`` over the defaults, checked."""
    return as_kernel(kernel, params).params()


def row_stochastic(kernel: str | AbstractKernel) -> bool:
    """Whether the kernel's rows sum to one (needed by the rescaled frame)."""
    if isinstance(kernel, AbstractKernel):
        return kernel.row_stochastic
    cls = KERNEL_CLASSES.get(kernel) if isinstance(kernel, str) else None
    return (cls if cls is not None else type(get(kernel))).row_stochastic


def prepare(kernel: str | AbstractKernel, q: Array, k: Array) -> tuple[Array, Array]:
    """Queries and keys as the kernel sees them (``qknorm``: RMS-normalised per token)."""
    return get(kernel).prepare(q, k)


def prepare_tokens(kernel: str | AbstractKernel, x: Array) -> Array:
    """The tokens as the kernel's query and key maps see them (``prenorm``: ``x / rms(x)``
    per token); the tokens themselves otherwise."""
    return get(kernel).prepare_tokens(x)


def _with_params(kernel: str | AbstractKernel, params: Mapping | None) -> AbstractKernel:
    if isinstance(kernel, AbstractKernel):
        return kernel
    cls = KERNEL_CLASSES.get(kernel) if isinstance(kernel, str) else None
    if cls is not None and not _param_names(cls):
        return cls()  # parameterless: extra params are ignored, as they always were
    return as_kernel(kernel, params)


def weights(kernel: str | AbstractKernel, L: Array, params: Mapping | None = None) -> Array:
    """The attention matrix of the logits ``L`` ``(..., m)`` under ``kernel``.

    ``L`` are the pre-kernel logits (for ``qknorm``, those of the normalised queries and
    keys); ``params`` the parameters of a named kernel (defaults where missing)."""
    return _with_params(kernel, params).weights(L)


def apply_weights(
    kernel: str | AbstractKernel, L: Array, values: Array, params: Mapping | None = None
) -> Array:
    """``weights(kernel, L) @ values`` for ``values`` of shape ``(m, c)``."""
    return mm(weights(kernel, L, params), values)


def log_logit_bound(
    q: Array,
    k: Array,
    beta: Any,
    *,
    kernel: str | AbstractKernel = "softmax",
    params: Mapping | None = None,
) -> Array:
    """An upper bound of the log of the largest ``|number|`` the kernel exponentiates
    (``AbstractKernel.log_bound``): ``log(beta max_i |q_i| max_j |k_j|)`` of the prepared
    queries and keys plus what the kernel multiplies the logits by. ``+inf`` rather than
    NaN when the inputs have overflowed."""
    return _with_params(kernel, params).log_bound(q, k, beta)


def check_kernel_mask(kernel: str | AbstractKernel, mask: Any) -> None:
    """``ValueError`` for a mask the kernel cannot take (``differential``)."""
    _check_kernel_mask(get(kernel), check_mask(mask))


def attend(
    kernel: str | AbstractKernel,
    q: Array,
    k: Array,
    beta: Any,
    values: Array,
    *,
    block: int | None = None,
    params: Mapping | None = None,
    mask: Any = None,
) -> Array:
    """``weights(kernel, beta q k^T) @ values`` without the ``(n, m)`` matrix when n is
    large (``attend_with``); ``mask`` a mask object or its older spelling."""
    return attend_with(
        _with_params(kernel, params), q, k, beta, values, block=block, mask=check_mask(mask)
    )
