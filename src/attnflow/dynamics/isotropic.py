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

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .base import saved_kernel_params
from .model import Attention

__all__ = ["IsotropicAttention"]


class IsotropicAttention(Attention):
    """One self-attention head with ``Q = K = V = I_d``: ``dx_i/dt = sum_j P_ij x_j``,
    ``P = kernel(beta <x_i, x_j>)``.

    Args:
        d: token dimension (>= 1).
        beta: inverse temperature (> 0); an array leaf, as in ``Attention``.
        kernel: any kernel of ``attnflow.kernels.KERNELS``.
        dtype: working precision of the (identity) weights, e.g. ``np.float32``;
            default the default float (float64 with x64 on).
        mask, block, kernel_params: as in ``Attention``.

    Everything else (frames, save/load, analyses) is ``Attention``'s, with the three
    products by the identity skipped in the queries, keys and values.
    """

    def __init__(
        self,
        d: int,
        *,
        beta: Any = 1.0,
        kernel: str = "softmax",
        dtype: Any = None,
        kernel_params=None,
        mask=None,
        block: int | None = None,
    ):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be an integer >= 1; got {d!r}.")
        eye = np.eye(int(d), dtype=dtype if dtype is not None else float)
        super().__init__(
            eye,
            eye,
            eye,
            beta=beta,
            kernel=kernel,
            kernel_params=kernel_params,
            mask=mask,
            block=block,
        )

    def queries_keys(self, x: Float[Array, "n d"]) -> tuple[Array, Array]:
        return x, x

    def value_map(self, u: Array) -> Array:
        return u

    def describe(self) -> dict:
        return {**super().describe(), "family": "IsotropicAttention"}

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> IsotropicAttention:
        kparams = saved_kernel_params(arrays)
        return cls(
            int(np.asarray(arrays["V"]).shape[0]),
            beta=jnp.asarray(arrays["beta"]),
            kernel=description["kernel"],
            dtype=np.asarray(arrays["V"]).dtype,
            kernel_params=kparams or None,
            mask=description.get("mask"),
            block=description.get("block"),
        )
