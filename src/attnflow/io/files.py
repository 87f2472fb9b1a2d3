"""Writing result files safely, and hashing their arrays.

Contract. ``write_atomic(path, writer, tmp)`` writes through ``writer`` into the
temporary file ``tmp`` beside ``path`` (created with the mode of any new file: the
umask decides), flushes and fsyncs it, and renames it onto ``path``: a reader sees the
old file or the new one, never a part. On any failure the temporary file is removed.
``temporary_name(path)`` is a fresh such name, ``.<name>.<pid>.<random>.tmp``.
``arrays_sha256`` is the SHA-256 of arrays by name (names, dtypes, shapes, C-order
bytes), the hash that sweep shards and trajectory files record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["arrays_sha256", "temporary_name", "write_atomic"]


def arrays_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of arrays: names, dtypes, shapes and C-order bytes, by name."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(json.dumps([k, a.dtype.str, list(a.shape)]).encode())
        if a.size:
            h.update(a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def temporary_name(path: Path) -> Path:
    """A fresh temporary name beside ``path``."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def write_atomic(path: Path, writer: Callable[[Any], None], tmp: Path) -> None:
    """Write ``path`` whole or not at all (see the module docstring)."""
    try:
        with open(tmp, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
