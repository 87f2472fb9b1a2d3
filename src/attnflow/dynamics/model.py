"""The self-attention head as a particle system, and its vector fields in both frames.

Tokens are the rows of an ``(n, d)`` array. With ``P = kernel(beta <Q x_i, K x_j>)``:

original frame   ``dx_i/dt = sum_j P_ij V x_j``
rescaled frame   ``dz_i/dt = sum_j P_ij(t) V (z_j - z_i)``, ``z_i = e^{-tV} x_i``, where
                 ``P(t)`` is evaluated at ``x = e^{tV} z``.

In matrix form (tokens as rows): ``dX = P X V^T`` and ``dZ = (P Z - Z) V^T``.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.core as jax_core
import numpy as np
from jaxtyping import Array

from .. import _checks
from .._host import put
from .._precision import mm
from . import kernels as _kernels
from .base import AbstractKernelAttention, saved_kernel_params
from .propagator import FlowCache, Propagator

__all__ = [
    "Attention",
    "kernel_and_mask",
    "describe_kernel",
    "describe_head",
    "head_arrays",
    "saved_kernel",
]


def _is_concrete(x) -> bool:
    return not isinstance(x, jax_core.Tracer)


def _as_matrix(name: str, A, square: bool = True) -> Any:
    """Validate one weight matrix and return it as a JAX array (not yet cast)."""
    if isinstance(A, jax_core.Tracer):
        arr = A
    else:
        try:
            arr = np.asarray(A)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"{name} must be a (d, d) array of real numbers: {exc}") from None
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(
            f"{name} must be real; got a complex array. Pass the real matrix "
            f"(complex spectra are fine, complex entries are not)."
        )
    if not (
        np.issubdtype(arr.dtype, np.floating)
        or np.issubdtype(arr.dtype, np.integer)
        or arr.dtype == np.bool_
    ):
        raise ValueError(f"{name} must be a real numeric array; got dtype {arr.dtype}.")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-d (d, d) matrix; got shape {tuple(arr.shape)}.")
    if square and arr.shape[0] != arr.shape[1]:
        hint = " (a (p, d) head map needs rectangular=True)" if name in ("Q", "K") else ""
        raise ValueError(f"{name} must be square (d, d); got shape {tuple(arr.shape)}{hint}.")
    if min(arr.shape) < 1:
        raise ValueError(f"{name} must have d >= 1; got shape {tuple(arr.shape)}.")
    if _is_concrete(arr) and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries (NaN or inf); all entries must be finite.")
    return arr


def kernel_and_mask(kernel: Any, kernel_params: Any, mask: Any, dtype: Any = None) -> tuple:
    """``(kernel object, mask object or None)`` of a family's arguments, checked: a name
    with ``kernel_params`` or a kernel object (its parameters cast to ``dtype``); a mask
    object, its older spelling or ``None``; the pair checked together."""
    if isinstance(kernel, _kernels.AbstractKernel) and kernel_params:
        raise ValueError(
            f"kernel_params go with a kernel name; a kernel object carries its own "
            f"parameters (pass {type(kernel).__name__}(...) alone); got {kernel_params!r}."
        )
    kobj = _kernels.as_kernel(
        kernel, None if isinstance(kernel, _kernels.AbstractKernel) else kernel_params
    )
    mobj = _kernels.check_mask(mask)
    _kernels.check_kernel_mask(kobj, mobj)
    if dtype is not None:
        kobj = kobj.astype(dtype)
    return kobj, mobj


def describe_kernel(kernel: _kernels.AbstractKernel, mask: Any) -> dict:
    """The saved form of a kernel and a mask (``kernel``, ``kernel_params``, and
    ``kernel_settings``/``mask`` where there are any)."""
    out: dict[str, Any] = {
        "kernel": kernel.name,
        "kernel_params": {k: np.asarray(v).tolist() for k, v in kernel.params().items()},
    }
    if kernel.settings():
        out["kernel_settings"] = kernel.settings()
    if mask is not None:
        out["mask"] = mask.describe()
    return out


def describe_head(model: AbstractKernelAttention) -> dict:
    """The saved form of a one-head kernel family: its ``family``, beta, kernel and mask,
    propagator method, tiling, and ``Q``, ``K`` (``query_key_maps``) and ``V`` as lists."""
    kern = describe_kernel(model.kernel, model.mask)
    mask = {"mask": kern.pop("mask")} if "mask" in kern else {}
    Q, K = model.query_key_maps()
    V = model.value_matrix()
    assert V is not None  # a kernel head's value map is u V^T
    return {
        "family": model.family,
        "beta": float(model.beta),
        **kern,
        "propagator": model.propagator.method,
        "block": model.block,
        "rectangular": tuple(Q.shape) != tuple(V.shape),
        "Q": np.asarray(Q).tolist(),
        "K": np.asarray(K).tolist(),
        "V": np.asarray(V).tolist(),
        **mask,
    }


def head_arrays(model: AbstractKernelAttention) -> dict:
    """The arrays of a one-head kernel family: ``Q``, ``K``, ``V``, ``beta`` and the
    kernel's parameters (``kernel_params.<name>``)."""
    Q, K = model.query_key_maps()
    out = {"Q": Q, "K": K, "V": model.value_matrix(), "beta": model.beta}
    out.update({f"kernel_params.{k}": v for k, v in model.kernel_params.items()})
    return out


def saved_kernel(description: dict, arrays: dict) -> _kernels.AbstractKernel:
    """The kernel object of a saved model (``describe_kernel`` and its arrays)."""
    params = {**saved_kernel_params(arrays), **description.get("kernel_settings", {})}
    return _kernels.get(description["kernel"], **params)


class Attention(AbstractKernelAttention):
    """One self-attention head with weights fixed in time.

    Args:
        Q, K, V: query, key and value matrices, each ``(d, d)``, real and finite.
            With ``rectangular=True``, Q and K may be ``(p, d)`` (a head of size ``p``
            acting on tokens of dimension ``d``, as in a trained transformer); V stays
            ``(d, d)``. The logits ``<Q x_i, K x_j> = x_i^T Q^T K x_j`` then depend on
            ``Q^T K`` only (for the softmax kernel).
        beta: inverse temperature multiplying every logit ``<Q x_i, K x_j>``; finite, > 0.
        kernel: the attention kernel: an ``attnflow.kernels.AbstractKernel`` object
            (``kernels.SSMax(s=2.0)``) or one of the names ``attnflow.kernels.KERNELS``:
            ``"softmax"``,
            ``"qknorm"`` (queries and keys RMS-normalised per token, then softmax of
            ``beta <q^, k^>``), ``"ssmax"`` (``softmax(s log(n) L)``), ``"sigmoid"``
            (``sigmoid(L - log n)``, not row-stochastic: original frame only),
            ``"adaptive"`` (adaptive temperature); see ``attnflow.kernels``.
        kernel_params: with a kernel name, its numeric parameters, a mapping over its
            defaults, e.g. ``{"s": 2.0}`` for ``"ssmax"``.
            Stored as array leaves of the working dtype: changing a value does not
            recompile a jitted function of the model.
        propagator: how ``e^{tV}`` is computed: ``"auto"`` (default), ``"eigh"``,
            ``"eig"`` or ``"expm"``; see ``attnflow.propagator``.
        rectangular: allow ``(p, d)`` query and key matrices (see above).
        block: query rows per tile in the vector field (``attnflow.kernels.attend``):
            ``None`` chooses by size (dense up to 2048 tokens, then tiles of ~4M logits,
            never the ``(n, n)`` matrix), ``0`` forces the dense path.
        mask: ``None`` (default), ``"causal"`` or ``attnflow.masks.Causal()``
            (``P_ij = 0`` for ``j > i``, token order = index order) or ``("window", w)``
            or ``attnflow.masks.Window(w)`` (``P_ij = 0`` unless ``|i - j| <= w``): the
            dropped logits are ``-inf`` before the kernel, in the dense and tiled paths
            alike (``attnflow.kernels.check_mask``). ``logits(x)`` stays unmasked.

    The working precision is the promoted dtype of ``Q, K, V`` (integers become the
    default float): float64 inputs stay float64 when x64 is on, and become float32 when it
    is off. The spectral decomposition of ``V`` is computed once, here.

    Invalid input raises ``ValueError`` naming the argument, at construction.
    """

    Q: Array
    K: Array
    V: Array
    beta: Array
    flow: FlowCache
    kernel: _kernels.AbstractKernel
    mask: Any
    block: int | None = eqx.field(static=True)
    family = "Attention"

    def __init__(
        self,
        Q,
        K,
        V,
        *,
        beta=1.0,
        kernel: Any = "softmax",
        propagator: str = "auto",
        rectangular: bool = False,
        block: int | None = None,
        kernel_params=None,
        mask=None,
    ):
        if any(np.ndim(a) == 3 for a in (Q, K, V)):  # stacked weights: one head per row
            self._init_stacked(
                Q,
                K,
                V,
                beta=beta,
                kernel=kernel,
                propagator=propagator,
                rectangular=rectangular,
                block=block,
                kernel_params=kernel_params,
                mask=mask,
            )
            return
        Qa = _as_matrix("Q", Q, square=not rectangular)
        Ka = _as_matrix("K", K, square=not rectangular)
        Va = _as_matrix("V", V)
        shapes = {"Q": tuple(Qa.shape), "K": tuple(Ka.shape), "V": tuple(Va.shape)}
        if rectangular:
            d = Va.shape[0]
            if Qa.shape != Ka.shape or Qa.shape[1] != d:
                raise ValueError(
                    f"with rectangular=True, Q and K must both be (p, d) with d = {d} from "
                    f"V; got {shapes}."
                )
        elif len(set(shapes.values())) != 1:
            raise ValueError(
                f"Q, K and V must all have the same shape (d, d); got {shapes}. "
                f"The token dimension d is fixed by V (for heads with p x d query and key "
                f"maps pass rectangular=True)."
            )
        kobj, self.mask = kernel_and_mask(kernel, kernel_params, mask)
        if self.mask is not None and self.mask.heads is not None:
            if self.mask.heads != 1:
                raise ValueError(
                    f"mask has parameters for {self.mask.heads} heads (ALiBi slopes, say); "
                    f"one attention head takes one: pass mask.head(h), or use "
                    f"MultiHeadAttention."
                )
            self.mask = self.mask.head(0)
        if _is_concrete(beta):
            try:
                b = float(np.asarray(beta))
            except Exception:
                raise ValueError(f"beta must be a positive finite number; got {beta!r}.") from None
            if np.ndim(beta) != 0 or np.iscomplexobj(beta):
                raise ValueError(f"beta must be a real scalar; got {beta!r}.")
            if not math.isfinite(b) or b <= 0:
                raise ValueError(f"beta must be a positive finite number; got {beta!r}.")
        dtype = jax.dtypes.canonicalize_dtype(
            np.result_type(np.float32, *(a.dtype for a in (Qa, Ka, Va)))
        )
        # 5: past equinox's module constructor, to the line that built the model
        _checks.warn_float64_cast(Qa, Ka, Va, stacklevel=5)
        # an overflowing cast is reported just below, naming the matrix; not as numpy's warning
        with np.errstate(over="ignore"):
            self.Q, self.K, self.V, self.beta = (put(a, dtype) for a in (Qa, Ka, Va, beta))
        for name, arr in (("Q", self.Q), ("K", self.K), ("V", self.V), ("beta", self.beta)):
            if _is_concrete(arr) and not np.all(np.isfinite(np.asarray(arr))):
                raise ValueError(
                    f"{name} has entries beyond the {np.dtype(dtype).name} range (largest "
                    f"{float(np.finfo(dtype).max):.3g}); enable x64 "
                    f"(jax.config.update('jax_enable_x64', True)) or rescale the weights."
                )
        if block is not None and (not isinstance(block, (int, np.integer)) or block < 0):
            raise ValueError(
                f"block must be None (automatic) or an integer >= 0 (0: dense); got {block!r}."
            )
        self.kernel = kobj.astype(dtype)
        self.block = None if block is None else int(block)
        self.flow = FlowCache(self.V, propagator)

    def _init_stacked(self, Q, K, V, *, beta, kernel_params, **options) -> None:
        """``Q, K, V`` of shape ``(b, d, d)`` (or ``(b, p, d)``): ``b`` heads built one by
        one (every check of a single head applies to each) and stacked
        (``attnflow.stack``). ``beta`` and each kernel parameter are a scalar or ``(b,)``."""
        from .stack import stack

        shapes = {"Q": np.shape(Q), "K": np.shape(K), "V": np.shape(V)}
        if any(len(s) != 3 for s in shapes.values()) or len({s[0] for s in shapes.values()}) != 1:
            raise ValueError(
                f"stacked weights: Q, K and V must all be (b, d, d) with the same number b "
                f"of heads; got {shapes}."
            )
        b = shapes["V"][0]
        if b < 1:
            raise ValueError("stacked weights: Q, K and V hold no head (b = 0).")

        def pick(name, value, i) -> Any:
            if value is None or np.ndim(value) == 0:
                return value
            if np.shape(value) != (b,):
                raise ValueError(
                    f"{name} must be a scalar or one value per head, shape ({b},); got shape "
                    f"{np.shape(value)}."
                )
            return value[i]

        if isinstance(options["kernel"], _kernels.AbstractKernel):
            if kernel_params:
                kernel_and_mask(options["kernel"], kernel_params, None)  # the error
            kernel_params = options["kernel"].params()
            options["kernel"] = options["kernel"].name
        params = dict(kernel_params or {})
        heads = [
            Attention(
                Q[i],
                K[i],
                V[i],
                beta=pick("beta", beta, i),
                kernel_params={k: pick(f"kernel_params[{k!r}]", v, i) for k, v in params.items()}
                or None,
                **options,
            )
            for i in range(b)
        ]
        st = stack(heads)
        assert isinstance(st, Attention)
        for name in ("Q", "K", "V", "beta", "flow", "kernel", "mask", "block"):
            setattr(self, name, getattr(st, name))

    # ----------------------------------------------------------------- basic facts
    @property
    def stack_size(self) -> int | None:
        """The number of stacked heads (weights ``(b, d, d)``), or ``None`` for one."""
        return self.V.shape[0] if self.V.ndim == 3 else None

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def dtype(self):
        return self.V.dtype

    @property
    def propagator(self) -> Propagator:  # pyright: ignore[reportIncompatibleVariableOverride]
        """``e^{tV}`` of the model's own ``V`` through its cached decomposition
        (``flow``)."""
        return Propagator(self.V, flow=self.flow)

    # --------------------------------------------------- the attention system seam
    def query_key_maps(self) -> tuple[Array, Array]:
        return self.Q, self.K

    def value_map(self, u: Array) -> Array:
        """``u V^T``: the averaged values mapped by V."""
        return mm(u, self.V.T)

    def value_matrix(self) -> Array:
        return self.V

    # ---------------------------------------------------------------- saved form
    def describe(self) -> dict:
        return describe_head(self)

    def arrays(self) -> dict:
        return head_arrays(self)

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> Attention:
        prop = description.get("propagator", "auto")
        return cls(
            arrays["Q"],
            arrays["K"],
            arrays["V"],
            beta=arrays["beta"],
            kernel=saved_kernel(description, arrays),
            propagator="auto" if prop == "guarded" else prop,
            rectangular=bool(description.get("rectangular", False)),
            block=description.get("block"),
            mask=description.get("mask"),
        )
