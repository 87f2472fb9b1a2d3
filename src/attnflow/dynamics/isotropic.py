"""``IsotropicAttention``: one head with ``Q = K = V = I``, the products by the identity
skipped.

The sphere papers' model (Geshkovski et al.; the authors' phase diagrams use it) has
identity weights. ``Attention(I, I, I)`` multiplies every token by three ``(d, d)``
identities per evaluation, ``3 n d^2`` operations against the ``2 n^2 d`` of the
attention itself: at ``n = 32``, ``d = 128`` six times the work. This family computes the
same numbers (``x @ I = x`` exactly in floating point; the compiled programs differ, so
results agree to rounding, 1e-16 relative, not bit for bit) without them.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import kernels as _kernels
from .base import AbstractKernelAttention
from .model import Attention, describe_head, head_arrays, saved_kernel
from .propagator import FlowCache, Propagator

__all__ = ["IsotropicAttention"]


class IsotropicAttention(AbstractKernelAttention):
    """One self-attention head with ``Q = K = V = I_d``: ``dx_i/dt = sum_j P_ij x_j``,
    ``P = kernel(beta <x_i, x_j>)``.

    Args:
        d: token dimension (>= 1).
        beta: inverse temperature (> 0); an array leaf, as in ``Attention``.
        kernel: a kernel object or name, as in ``Attention``.
        dtype: working precision of the (identity) weights, e.g. ``np.float32``;
            default the default float (float64 with x64 on).
        mask, block, kernel_params: as in ``Attention``.

    Every analysis and frame serves it through the seam, with the three products by the
    identity skipped in the queries, keys and values; it saves and loads as before (the
    identity written as ``Q``, ``K`` and ``V``).
    """

    V: Array
    beta: Array
    flow: FlowCache
    kernel: _kernels.AbstractKernel
    mask: Any
    block: int | None = eqx.field(static=True)
    family = "IsotropicAttention"

    def __init__(
        self,
        d: int,
        *,
        beta: Any = 1.0,
        kernel: Any = "softmax",
        dtype: Any = None,
        kernel_params=None,
        mask=None,
        block: int | None = None,
    ):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be an integer >= 1; got {d!r}.")
        try:
            dt = np.dtype(dtype if dtype is not None else float)
        except TypeError:
            dt = None
        if dt is None or dt.kind != "f":
            raise ValueError(
                f"dtype must be a floating-point dtype such as np.float32 or np.float64 "
                f"(or None); got {dtype!r}."
            )
        eye = np.eye(int(d), dtype=dt)
        # every check of Attention (beta, kernel, mask, block, the dtype rules) applies
        ref = Attention(
            eye,
            eye,
            eye,
            beta=beta,
            kernel=kernel,
            kernel_params=kernel_params,
            mask=mask,
            block=block,
        )
        self.V, self.beta, self.flow = ref.V, ref.beta, ref.flow
        self.kernel, self.mask, self.block = ref.kernel, ref.mask, ref.block

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def propagator(self) -> Propagator:  # pyright: ignore[reportIncompatibleVariableOverride]
        """``e^{tV}`` of the model's own ``V`` (the identity) through its cache."""
        return Propagator(self.V, flow=self.flow)

    @property
    def dtype(self):
        return self.V.dtype

    @property
    def stack_size(self) -> int | None:
        return self.V.shape[0] if self.V.ndim == 3 else None

    def query_key_maps(self) -> tuple[Array, Array]:
        return self.V, self.V

    def queries_keys(self, x: Float[Array, "n d"]) -> tuple[Array, Array]:
        x = self.prepare_tokens(x)
        return x, x

    def value_map(self, u: Array) -> Array:
        return u

    def value_matrix(self) -> Array:
        return self.V

    def describe(self) -> dict:
        return describe_head(self)  # the identity written as Q, K and V

    def arrays(self) -> dict:
        return head_arrays(self)

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> IsotropicAttention:
        V = np.asarray(arrays["V"])
        return cls(
            int(V.shape[0]),
            beta=jnp.asarray(arrays["beta"]),
            kernel=saved_kernel(description, arrays),
            dtype=V.dtype,
            mask=description.get("mask"),
            block=description.get("block"),
        )
