"""``AbstractKernel``: how the logits of a query row become attention weights.

A kernel is an equinox module. Its numeric parameters are its array fields (leaves:
trainable, and changing a value never recompiles); settings that fix the program (an
iteration count, say) are static fields. Class-level facts tell the frames and the
analyses what they may assume:

``row_stochastic``     every row of ``P`` sums to one (the rescaled frame needs it)
``rowwise``            row ``i`` of ``P`` depends on row ``i`` of the logits only (only then
                       may the field tile the query rows)
``takes_mask``         the kernel accepts a mask (``-inf`` logits weigh 0)
``takes_positions``    the kernel accepts a mask that moves the logits, not only drops
                       them: an additive bias (ALiBi) or a turn of the queries and keys
                       by position (RoPE)
``normalizes_tokens``  the kernel rescales the tokens before the query and key maps
                       (``prepare_tokens`` is not the identity), so the modal rescaled
                       frame, whose coordinates are not the tokens', cannot serve it
``bilinear_logits``    the kernel weighs the logits ``beta <q_i, k_j>`` of the queries and
                       keys themselves (``prepare`` is the identity); False for a kernel
                       that maps them first (``qknorm``, ``linear``, ``differential``)
``causal``             the kernel itself drops the keys after the query (``j > i``),
                       whatever the mask (``selective``): the keys a row keeps are then
                       those of the mask and ``j <= i``

The analyses read these facts; they never inspect a kernel's methods.

Methods: ``weights(L)`` (row-wise on logits ``(..., m)``), ``prepare(q, k)`` (per-token
preparation of queries and keys, default none), ``prepare_tokens(x)`` (default none),
``log_gain(log_b, m)`` (from a bound of ``log max |L|`` to a bound of the log of what the
kernel exponentiates, for the overflow guard), ``argmax(L, P)`` (the key of the largest
weight), ``log_mass(L, keep)`` (the log of the weight of a subset of keys, exact far below
underflow; ``None`` where the kernel has no exact form).

Every kernel is final; ``name`` registers it for lookup by string (``kernels.get``).
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

__all__ = ["AbstractKernel", "parameter", "KERNEL_CLASSES"]

# name -> final kernel class, filled as the classes are defined (``name`` class attribute)
KERNEL_CLASSES: dict[str, type[AbstractKernel]] = {}


def parameter(kernel: str, name: str, value: Any, *, positive: bool = False) -> Any:
    """One numeric kernel parameter, checked: a finite real scalar (``> 0`` if
    ``positive``), returned as a JAX array; traced values pass unchecked. ``ValueError``
    naming ``kernel_params[name]`` otherwise."""
    if isinstance(value, jax_core.Tracer):
        return value
    try:
        arr = np.asarray(value)
        v = float(arr)
    except Exception:
        raise ValueError(f"kernel_params[{name!r}] must be a real number; got {value!r}.") from None
    if arr.ndim != 0 or np.iscomplexobj(arr) or not math.isfinite(v):
        raise ValueError(f"kernel_params[{name!r}] must be a finite real scalar; got {value!r}.")
    if positive and v <= 0:
        raise ValueError(f"kernel_params[{name!r}] must be > 0 for {kernel!r}; got {value!r}.")
    return value if isinstance(value, jax.Array) else jnp.asarray(value)


class AbstractKernel(eqx.Module):
    """What a kernel subclasses (see the module docstring for the contract)."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    row_stochastic: ClassVar[bool] = True
    rowwise: ClassVar[bool] = True
    takes_mask: ClassVar[bool] = True
    takes_positions: ClassVar[bool] = True
    normalizes_tokens: ClassVar[bool] = False
    bilinear_logits: ClassVar[bool] = True
    causal: ClassVar[bool] = False
    # why ``takes_mask`` (``takes_positions``) is False, for the error message
    no_mask_reason: ClassVar[str] = ""
    no_positions_reason: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            KERNEL_CLASSES.setdefault(name, cls)

    @abc.abstractmethod
    def weights(self, L: Float[Array, "*b m"]) -> Float[Array, "*b m"]:
        """The weights ``P`` of logits ``L`` (masked logits are ``-inf``)."""

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        """Queries and keys as the kernel sees them (per token); default unchanged."""
        return q, k

    def prepare_tokens(self, x: Array) -> Array:
        """The tokens as the query and key maps see them; default unchanged."""
        return x

    def log_gain(self, log_b: Array, m: int) -> Array:
        """From ``log_b >= log max |L|`` (``m`` keys) to a bound of the log of the largest
        number the kernel exponentiates; default ``log_b`` (softmax)."""
        del m
        return log_b

    def log_mass(self, L: Array, keep: Bool[Array, "*b m"]) -> Array | None:
        """``log sum_{j in keep} P_j`` per row, exact where ``P`` underflows; ``None``
        when the kernel has no such form (the analyses then take ``log`` of the sum of
        ``P``)."""
        del L, keep
        return None

    def argmax(self, L: Array, P: Array) -> Array:
        """Per row, the key of the largest weight, from the logits ``L`` and the weights
        ``P = weights(L)`` (default: ``argmax P``)."""
        del L
        return jnp.argmax(P, axis=-1)

    # ----------------------------------------------------------------- derived
    def log_bound(self, q: Array, k: Array, beta: Any) -> Array:
        """``log(beta max_i |q_i| max_j |k_j|)`` of the prepared queries and keys,
        enlarged by ``log_gain``: a bound of the log of what the kernel exponentiates.
        Cheap (``O((n + m) p)``); ``+inf`` rather than NaN once the inputs overflow."""
        q, k = self.prepare(q, k)
        qn = jnp.max(jnp.linalg.norm(q, axis=-1))
        kn = jnp.max(jnp.linalg.norm(k, axis=-1))
        out = jnp.log(beta) + jnp.log(qn) + jnp.log(kn)
        out = self.log_gain(out, k.shape[0])
        return jnp.where(jnp.isnan(out), jnp.inf, out)

    def params(self) -> dict[str, Array]:
        """The numeric parameters by field name (the array leaves)."""
        return {
            f.name: getattr(self, f.name)
            for f in self.__dataclass_fields__.values()
            if not f.metadata.get("static", False) and eqx.is_array(getattr(self, f.name))
        }

    def settings(self) -> dict[str, Any]:
        """The static settings by field name (JSON-ready)."""
        return {
            f.name: getattr(self, f.name)
            for f in self.__dataclass_fields__.values()
            if f.metadata.get("static", False)
        }

    def astype(self, dtype: Any) -> AbstractKernel:
        """The same kernel with its floating parameters in ``dtype``."""

        def cast(a):
            if eqx.is_array(a) and jnp.issubdtype(a.dtype, jnp.floating):
                return a.astype(dtype)
            return a

        return jax.tree_util.tree_map(cast, self)

    def describe(self) -> str:
        """``name(param=value, ...)`` for messages and help."""

        def value(v):
            a = np.asarray(v)
            return float(a) if a.ndim == 0 else a.tolist()

        items = {**{k: value(v) for k, v in self.params().items()}, **self.settings()}
        inner = ", ".join(f"{k}={v!r}" for k, v in items.items())
        return f"{self.name}({inner})" if inner else self.name
