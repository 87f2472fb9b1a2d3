"""Argument checks shared by every layer: one message style, raised before any work.

Each check takes the argument's ``name`` as the user spells it and raises ``ValueError``
saying what the argument must be and what was given; on success it returns the value
converted to the type the caller works with. Below every layer (imports no module of
attnflow).
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "number",
    "positive",
    "integer",
    "choice",
    "real_array",
    "index",
    "OutOfRange",
    "output_file",
    "output_dir",
]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number(
    name: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    what: str | None = None,
) -> float:
    """A finite real scalar within ``[lo, hi]`` (ends open on request) -> ``float``.

    Rejects booleans, strings, sequences, complex numbers, NaN and infinities."""
    interval = what or _interval(lo, hi, lo_open, hi_open)
    if isinstance(value, (bool, np.bool_, str, bytes)) or np.ndim(value) != 0:
        raise ValueError(f"{name} must be a number {interval}; got {_show(value)}.")
    if np.iscomplexobj(value):
        raise ValueError(f"{name} must be a real number {interval}; got {_show(value)}.")
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        raise ValueError(
            f"{name} must be a finite number {interval}; got an integer beyond the float "
            f"range ({len(str(abs(int(value))))} digits)."
        ) from None
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number {interval}; got {_show(value)}.") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number {interval}; got {_show(value)}.")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name} must be {interval}; got {_show(value)}.")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{name} must be {interval}; got {_show(value)}.")
    return v


def _interval(lo, hi, lo_open, hi_open) -> str:
    if lo is None and hi is None:
        return "(finite)"
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    if lo is None:
        return f"{'<' if hi_open else '<='} {hi:g}"
    return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """A finite number ``> 0`` (or ``>= 0``) -> ``float``."""
    return number(name, value, lo=0.0, lo_open=not allow_zero)


def integer(name: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    """A whole number (Python or numpy integer; not a bool, not 10.7) in ``[lo, hi]``."""
    bounds = _interval(lo, hi, False, False).replace("(finite)", "").strip()
    what = f"an integer {bounds}".strip()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral,)):
        raise ValueError(f"{name} must be {what}; got {_show(value)}.")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name} must be {what}; got {v}.")
    return v


def choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """One of ``choices`` (compared as strings, so str-valued enums pass)."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, options))}; got {_show(value)}."
        )
    return str(value)


def real_array(
    name: str,
    value: Any,
    *,
    ndim: int | tuple[int, ...] | None = None,
    finite: bool = True,
    shape_hint: str = "",
) -> np.ndarray:
    """A real numeric array (integers and booleans allowed), ``ndim`` as asked, at least
    one entry per axis, finite unless ``finite=False``. Returns ``np.asarray(value)``
    with its own dtype (the caller casts)."""
    hint = f" {shape_hint}" if shape_hint else ""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} must be a real array{hint}: {exc}") from None
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real; got a complex array.")
    if not (
        np.issubdtype(arr.dtype, np.floating)
        or np.issubdtype(arr.dtype, np.integer)
        or arr.dtype == np.bool_
    ):
        raise ValueError(f"{name} must be a real numeric array{hint}; got dtype {arr.dtype}.")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in dims:
            raise ValueError(
                f"{name} must have {' or '.join(map(str, dims))} dimensions"
                f"{hint}; got shape {arr.shape}."
            )
    if any(s < 1 for s in arr.shape):
        raise ValueError(f"{name} must not be empty{hint}; got shape {arr.shape}.")
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries (NaN or inf); all entries must be finite.")
    return arr


class OutOfRange(IndexError, ValueError):
    """An index outside its range: both an ``IndexError`` and a ``ValueError``."""


def index(name: str, value: Any, size: int, *, what: str = "entries") -> int:
    """An integer index into ``size`` items, negative from the end; returns it in
    ``[0, size)``. JAX would clamp an index out of range silently: this refuses it
    (``OutOfRange``)."""
    k = integer(name, value)
    if not -size <= k < size:
        raise OutOfRange(
            f"{name} = {k} is out of range for {size} {what} (valid: {-size} ... {size - 1})."
        )
    return k % size


def output_file(name: str, path: Any, *, suffix: str | None = None) -> Path:
    """A file that can be written: not an existing directory, and its folder exists or
    can be created (the nearest existing ancestor is a writable directory). With
    ``suffix``, the suffix is appended when missing. Checked before any work."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{name} must be a file path; got {_show(path)}.")
    p = Path(path)
    if str(path) == "":
        raise ValueError(f"{name} must be a file path; got an empty string.")
    if p.is_dir():
        raise ValueError(
            f"{name} {str(p)!r} is a directory; give a file name such as "
            f"{str(p / ('run' + (suffix or '')))!r}."
        )
    if suffix is not None and p.suffix != suffix:
        p = p.with_name(p.name + suffix)
    _writable_parent(name, p.parent)
    return p


def output_dir(name: str, path: Any) -> Path:
    """A folder that exists (as a folder) or can be created."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{name} must be a folder path; got {_show(path)}.")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{name} {str(p)!r} exists and is not a folder.")
    _writable_parent(name, p)
    return p


def _writable_parent(name: str, folder: Path) -> None:
    probe = folder if str(folder) else Path(".")
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(
            f"{name}: {str(probe)!r} is a file, so {str(folder)!r} cannot be a folder."
        )
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: cannot write in {str(probe)!r} (permission denied).")


# Set once the float32 cast has been reported (the warning is given once per process).
_CAST_WARNED = False


def warn_float64_cast(*inputs: Any, stacklevel: int = 3) -> None:
    """Warn, once per process, when float64 user arrays are about to be cast to float32
    because JAX's x64 mode is off."""
    global _CAST_WARNED
    if _CAST_WARNED:
        return
    import jax  # here: the other checks need no JAX

    if jax.config.read("jax_enable_x64"):
        return
    if any(getattr(a, "dtype", None) == np.float64 for a in inputs):
        _CAST_WARNED = True
        warnings.warn(
            "float64 input cast to float32 because JAX's x64 mode is off; enable it with "
            "jax.config.update('jax_enable_x64', True) or --x64",
            UserWarning,
            stacklevel=stacklevel,
        )


def refuse_mean_field(obj: Any, analysis: str, instead: str) -> None:
    """Refuse a mean-field density (``CircleMeanField``, ``DensityTrajectory``: class fact
    ``mean_field = True``) in an analysis of tokens or attention matrices, by name."""
    if getattr(type(obj), "mean_field", False):
        raise ValueError(
            f"{analysis} reads tokens and attention matrices; a {type(obj).__name__} is a "
            f"token density (n = infinity) and has neither. {instead}"
        )
