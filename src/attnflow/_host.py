"""Arrays placed from the host without a compiled program of their own.

``jnp.asarray`` of a host value runs a small compiled program per shape and dtype
(lowered, then compiled or read from the compilation cache): milliseconds each, which a
short command pays for every one. ``put`` casts a host value on the host (numpy's cast
rounds as XLA's does) and places it as it is; a JAX array, placed or traced, is cast
where it is, as before. The result equals ``jnp.asarray(a, dtype)`` bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np

__all__ = ["put"]


def put(a: Any, dtype: Any = None) -> Any:
    """``jnp.asarray(a, dtype)``: a host value (numpy, a Python number) cast on the host
    and placed on the default device; a JAX array (traced, or placed, perhaps sharded)
    cast where it is."""
    if isinstance(a, (jax.Array, jax_core.Tracer)):
        return jnp.asarray(a, dtype=dtype)
    h = np.asarray(a)
    dt = jax.dtypes.canonicalize_dtype(h.dtype if dtype is None else dtype)
    return jax.device_put(h.astype(dt, copy=False))
