"""Figure sidecars compared number by number.

Contract. ``differences(before, after, floor)`` walks two JSON trees in step and reports
the largest relative difference ``|a - b| / max(|a|, |b|, floor)`` over the numbers at the
same place, where it is, how many numbers changed, and every difference of shape (keys,
lengths, types, non-finite values). Keys that record the run rather than its numbers
(``SKIP``: times, versions, builds, dates, paths, the list of files written) are not
compared. ``same_numbers(before, after)`` is the runner's test of "the same figure": no
difference of shape and every number within the tolerance of the sidecar's precision,
``FLOAT64_TOLERANCE`` or, when the sidecar computes in float32 anywhere,
``FLOAT32_TOLERANCE`` (relative, and absolute below 1: a rounding-level error estimate
of 1e-13 may move by 1e-17).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = [
    "SKIP",
    "FLOAT64_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "differences",
    "tolerance",
    "same_numbers",
]

SKIP = frozenset(
    {
        "seconds",
        "wall_seconds",
        "runtime_seconds",
        "compute_seconds",
        "time",
        "date",
        "created",
        "versions",
        "attnflow_build",
        "attnflow",
        "python",
        "jax",
        "host",
        "machine",
        "command",
        "path",
        "git",
        "figures",
        "movies",
    }
)
FLOAT64_TOLERANCE = 1e-12
FLOAT32_TOLERANCE = 1e-5


def _walk(a: Any, b: Any, where: str, floor: float, out: dict) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in SKIP:
                continue
            if k not in a or k not in b:
                out["shape"].append(f"{where}/{k}: only in {'after' if k in b else 'before'}")
                continue
            _walk(a[k], b[k], f"{where}/{k}", floor, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out["shape"].append(f"{where}: length {len(a)} before, {len(b)} after")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{where}[{i}]", floor, out)
    elif isinstance(a, bool) or isinstance(b, bool):
        if a != b:
            out["shape"].append(f"{where}: {a!r} before, {b!r} after")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        x, y = float(a), float(b)
        if (math.isnan(x) and math.isnan(y)) or x == y:
            return
        if not (math.isfinite(x) and math.isfinite(y)):
            out["shape"].append(f"{where}: {x!r} before, {y!r} after")
            return
        rel = abs(x - y) / max(abs(x), abs(y), floor)
        if rel > out["max"]:
            out["max"], out["at"], out["values"] = rel, where, (x, y)
        out["changed"] += 1
    elif a != b:
        out["shape"].append(f"{where}: {a!r} before, {b!r} after")


def differences(before: Any, after: Any, floor: float = 1e-12) -> dict[str, Any]:
    """The differences of two JSON trees (see the module docstring).

    Returns:
        ``{"max": largest relative difference, "at": its place, "values": (before,
        after) there, "changed": numbers that differ, "shape": [differences of shape]}``.

    Example:
        >>> d = differences({"a": [1.0, 2.0], "seconds": 3}, {"a": [1.0, 2.5], "seconds": 9})
        >>> d["max"], d["at"], d["changed"], d["shape"]
        (0.2, '/a[1]', 1, [])
    """
    out: dict[str, Any] = {"max": 0.0, "at": None, "values": None, "changed": 0, "shape": []}
    _walk(before, after, "", floor, out)
    return out


def tolerance(sidecar: Any) -> float:
    """``FLOAT32_TOLERANCE`` when the sidecar computes in float32 anywhere (a ``"float32"``
    value, or ``"x64": false``), else ``FLOAT64_TOLERANCE``."""
    text = json.dumps(sidecar)
    if '"float32"' in text or '"x64": false' in text:
        return FLOAT32_TOLERANCE
    return FLOAT64_TOLERANCE


def same_numbers(before: Any, after: Any) -> bool:
    """Whether two sidecars hold the same figure: the same shape, and every number within
    ``tolerance`` (of either) relative, absolute below 1.

    Example:
        >>> same_numbers({"r": 0.5, "e": 8.0195e-13}, {"r": 0.5, "e": 8.0199e-13})
        True
        >>> same_numbers({"r": 0.5}, {"r": 0.5000001})
        False
    """
    d = differences(before, after, floor=1.0)
    return not d["shape"] and d["max"] <= max(tolerance(before), tolerance(after))
