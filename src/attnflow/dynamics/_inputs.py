"""Argument checks of ``simulate``: each raises ``ValueError`` naming the argument and
what to give, before any work is done.

``check_x0`` accepts numpy arrays and lists (checked on the host), JAX arrays (checked
on their device, sharded or not: one boolean comes back) and tracers (shapes only).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .. import _checks
from .base import AbstractModel

__all__ = ["check_x0", "check_ts", "check_flags", "all_finite"]


def check_x0(model: AbstractModel, x0) -> np.ndarray | Array:
    shape = f"(n, {model.d}) or (b, n, {model.d})"
    if isinstance(x0, jax_core.Tracer):
        arr = x0
        if arr.ndim not in (2, 3):
            raise ValueError(f"x0 must have shape {shape}; got shape {tuple(arr.shape)}.")
    elif isinstance(x0, jax.Array):
        # used where it is (sharded or not): shapes and dtype read, finiteness checked on
        # the device; only one boolean comes back to the host
        arr = x0
        if arr.ndim not in (2, 3):
            raise ValueError(
                f"x0 must have 2 or 3 dimensions {shape}; got shape {tuple(arr.shape)}."
            )
        if jnp.issubdtype(arr.dtype, jnp.complexfloating):
            raise ValueError("x0 must be real; got a complex array.")
        if arr.dtype == jnp.bool_ or not (
            jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
        ):
            raise ValueError(f"x0 must hold real numbers {shape}; got dtype {arr.dtype}.")
        if any(s < 1 for s in arr.shape):
            raise ValueError(f"x0 must not be empty {shape}; got shape {tuple(arr.shape)}.")
        if not bool(all_finite(arr)):
            raise ValueError("x0 has non-finite entries (NaN or inf); all entries must be finite.")
    else:
        arr = _checks.real_array("x0", x0, ndim=(2, 3), shape_hint=shape)
        if arr.dtype == np.bool_:
            raise ValueError("x0 must hold real numbers; got a boolean array.")
    if arr.shape[-1] != model.d:
        raise ValueError(
            f"x0 has token dimension {arr.shape[-1]} but the model has d = {model.d}; "
            f"x0 must be {shape}."
        )
    return arr


@jax.jit
def all_finite(a):
    return jnp.all(jnp.isfinite(a))


def check_ts(ts, t1: float) -> np.ndarray:
    if ts is None:
        return np.array([0.0, t1])
    arr = _checks.real_array("ts", ts, ndim=1, shape_hint="(a 1-d array of times)")
    arr = arr.astype(np.float64)
    if np.any(np.diff(arr) < 0):
        raise ValueError("ts must be sorted in increasing order.")
    tol = 1e-12 * max(1.0, t1)
    if arr[0] < -tol or arr[-1] > t1 + tol:
        raise ValueError(f"ts must lie within [0, t1] = [0, {t1}]; got [{arr[0]}, {arr[-1]}].")
    return np.clip(arr, 0.0, t1)


def check_flags(**flags: Any) -> None:
    """``ValueError`` naming a flag that is not ``True`` or ``False`` (``"yes"`` or
    ``0.5`` would be taken for true)."""
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False; got {value!r}.")
