"""One checked reader for what a checkpoint folder tells the forward pass and the head
loaders: its ``config.json`` and its tensors.

Contract. Nothing read from a checkpoint is trusted. ``read_checkpoint_config(path)``
returns the ``config.json`` beside a checkpoint file as a ``CheckpointConfig`` (a
``dict``, ``{}`` when there is none) after checking that it is a readable JSON object;
its accessors (``integer``, ``number``, ``boolean``, ``text``, ``texts``, ``mapping``)
return a key's value, or its default when the key is absent or ``null``, after checking
its type and range: whole numbers are JSON integers (``1.5`` and ``true`` are refused,
not truncated or read as 1), numbers are finite and in their interval (``rope_theta: 0``
is refused, not replaced by the default). ``checked_tensor`` returns a tensor as float64
after checking that it is numeric, finite and of the shape the layout requires
(``expect_shape``). Every error is one ``ValueError`` that names the file (and the key
or tensor) and says what would be accepted, before any computation sees the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CheckpointConfig", "read_checkpoint_config", "checked_tensor", "expect_shape"]

_ABSENT = object()


class CheckpointConfig(dict):
    """A checkpoint's ``config.json`` (a plain ``dict`` of its keys) with checked reads.

    Attributes:
        path: the ``config.json`` file (it may not exist: then the dict is empty).
    """

    path: Path

    def __init__(self, data: dict, path: Path):
        super().__init__(data)
        self.path = path

    # ------------------------------------------------------------------ helpers
    def _value(self, key: str, default: Any) -> Any:
        v = self.get(key)
        return default if v is None else v

    def _fail(self, key: str, value: Any, want: str) -> ValueError:
        shown = json.dumps(value) if _jsonable(value) else repr(value)
        return ValueError(
            f"{self.path}: {key} = {shown[:200]} is not {want}; fix config.json (or remove "
            f"the key for its default)."
        )

    def require(self, key: str, why: str) -> None:
        """Refuse a config without ``key`` (``why``: what needs it)."""
        if self.get(key) is None:
            where = str(self.path) if self.path.is_file() else f"no config.json ({self.path})"
            raise ValueError(f"{where}: {key} is needed {why}; add it to config.json.")

    # ------------------------------------------------------------------ accessors
    def integer(self, key: str, default: Any = None, *, lo: int = 1, hi: int | None = None):
        """A JSON integer in ``[lo, hi]`` (``default`` when absent)."""
        v = self._value(key, _ABSENT)
        if v is _ABSENT:
            return default
        want = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise self._fail(key, v, want)
        return int(v)

    def number(
        self,
        key: str,
        default: Any = None,
        *,
        lo: float | None = None,
        lo_open: bool = False,
        hi: float | None = None,
        hi_open: bool = False,
    ):
        """A finite JSON number in the interval (``default`` when absent)."""
        v = self._value(key, _ABSENT)
        if v is _ABSENT:
            return default
        left = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
        right = "" if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
        want = "a finite number" + "".join(f" {s}" for s in (left, right) if s)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._fail(key, v, want)
        f = float(v)
        if lo is not None and (f < lo or (lo_open and f == lo)):
            raise self._fail(key, v, want)
        if hi is not None and (f > hi or (hi_open and f == hi)):
            raise self._fail(key, v, want)
        return f

    def boolean(self, key: str, default: bool) -> bool:
        """``true`` or ``false`` (``default`` when absent)."""
        v = self._value(key, _ABSENT)
        if v is _ABSENT:
            return default
        if not isinstance(v, bool):
            raise self._fail(key, v, "true or false")
        return v

    def text(self, key: str, default: Any = None, choices: Sequence[str] | None = None):
        """A JSON string (one of ``choices`` when given; ``default`` when absent)."""
        v = self._value(key, _ABSENT)
        if v is _ABSENT:
            return default
        if not isinstance(v, str) or (choices is not None and v not in choices):
            want = "a string" if choices is None else f"one of {sorted(choices)}"
            raise self._fail(key, v, want)
        return v

    def texts(self, key: str) -> list[str]:
        """A list of strings (``[]`` when absent)."""
        v = self._value(key, [])
        if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
            raise self._fail(key, v, "a list of strings")
        return list(v)

    def mapping(self, key: str) -> dict | None:
        """A JSON object (``None`` when absent)."""
        v = self._value(key, _ABSENT)
        if v is _ABSENT:
            return None
        if not isinstance(v, dict):
            raise self._fail(key, v, "an object")
        return v


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def read_checkpoint_config(checkpoint_file: str | Path) -> CheckpointConfig:
    """The ``config.json`` beside ``checkpoint_file``, checked to be a JSON object
    (empty when there is none).

    Raises:
        ValueError: naming ``config.json``: unreadable (not a file, not UTF-8, not JSON)
            or not an object (a list, a number).
    """
    cfg = Path(checkpoint_file).parent / "config.json"
    if not cfg.exists():
        return CheckpointConfig({}, cfg)
    try:
        data = json.loads(cfg.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{cfg}: unreadable config.json ({exc}).") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{cfg}: config.json must be a JSON object of settings; got a {type(data).__name__}."
        )
    return CheckpointConfig(data, cfg)


def checked_tensor(path: str | Path, name: str, value: Any) -> np.ndarray:
    """A checkpoint tensor as float64, refused (naming the file and the tensor) when it is
    not numeric or holds NaN or inf."""
    a = np.asarray(value)
    if a.dtype.kind not in "biuf":
        raise ValueError(
            f"checkpoint {str(path)!r}: tensor {name!r} has dtype {a.dtype}; the weights "
            f"must be real numbers."
        )
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(
            f"checkpoint {str(path)!r}: tensor {name!r} has non-finite entries (NaN or inf)."
        )
    return a


def expect_shape(path: str | Path, name: str, a: np.ndarray, want: tuple[int, ...], why: str):
    """Refuse a tensor whose shape is not ``want`` (no broadcasting of a ``(1,)`` weight)."""
    if tuple(a.shape) != tuple(want):
        raise ValueError(
            f"checkpoint {str(path)!r}: tensor {name!r} has shape {tuple(a.shape)}; expected "
            f"{tuple(want)} ({why})."
        )
