"""Plain-JSON conversion of results: numpy and JAX values, paths, complex numbers.

Every ``--json`` output of the command line and every sidecar of the figure scripts
goes through ``to_jsonable``, so they are strict JSON (non-finite floats become the
strings ``"nan"``, ``"inf"``, ``"-inf"``; complex values ``{"real", "imag"}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["to_jsonable"]


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/jax values (and containers of them) to plain JSON types.

    Args:
        obj: a value: dicts (keys become strings), lists, tuples, numpy or JAX arrays
            and scalars, paths, Python numbers, complex numbers, strings.

    Returns:
        The same structure in plain JSON types: arrays become nested lists, non-finite
        floats the strings ``"nan"``, ``"inf"``, ``"-inf"``, complex values
        ``{"real", "imag"}``, paths strings.
    """
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        if np.iscomplexobj(arr):
            return to_jsonable({"real": np.real(arr), "imag": np.imag(arr)})
        if arr.dtype == np.bool_:
            return arr.tolist()
        if arr.ndim == 0:
            return to_jsonable(arr.item())
        return [to_jsonable(v) for v in arr.tolist()]
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            return str(obj)
        return obj
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return to_jsonable(float(obj))
    if isinstance(obj, complex):
        return {"real": obj.real, "imag": obj.imag}
    return obj
