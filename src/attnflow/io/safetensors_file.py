"""Reading and writing safetensors files without the safetensors package (numpy memory
maps), or through it when it is installed and the file holds no bfloat16: every header
passes the checks of ``files.safetensors_layout`` first, and every error names the file."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .files import safetensors_layout

__all__ = ["read_safetensors", "write_safetensors"]


# ================================================================ safetensors I/O
# https://github.com/huggingface/safetensors: 8-byte little-endian header length N, a JSON
# header of N bytes {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional
# "__metadata__": {str: str}}, then the raw little-endian, C-order bytes; offsets are
# relative to the end of the header.
_ST_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "BF16": np.dtype("<u2"),  # decoded to float32 below
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items() if k != "BF16"}
_MAX_HEADER = 100 * 2**20


def _read_header(path: Path) -> tuple[dict, int, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"checkpoint {str(path)!r} is not a safetensors file (too short).")
        n = int.from_bytes(raw, "little")
        if n < 2 or n > min(_MAX_HEADER, size - 8):
            raise ValueError(
                f"checkpoint {str(path)!r} is not a safetensors file (header "
                f"length {n} for a file of {size} bytes)."
            )
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(
                f"checkpoint {str(path)!r}: unreadable safetensors header ({exc})."
            ) from None
    if not isinstance(header, dict):
        raise ValueError(f"checkpoint {str(path)!r}: the safetensors header is not an object.")
    return header, 8 + n, size


def read_safetensors(
    path: str | Path, names: Sequence[str] | None = None, *, reader: str = "auto"
) -> dict[str, np.ndarray]:
    """Read tensors from a ``.safetensors`` file as numpy arrays.

    Args:
        path: the file.
        names: the tensors to read (default: all).
        reader: ``"safetensors"`` (the package's ``safe_open``, framework numpy),
            ``"numpy"`` (the built-in reader: numpy only, memory-mapped), or ``"auto"``
            (the package when installed and no requested tensor is ``BF16``, else the
            built-in reader). ``BF16`` tensors become float32 with the built-in reader.

    Returns:
        ``{name: array}`` with the stored shapes and dtypes.

    Raises:
        ValueError: naming the file: it is not a safetensors file, its header is
            damaged, or a tensor's entry does not fit the file (built-in reader).
    """
    path = Path(path)
    if reader not in ("auto", "safetensors", "numpy"):
        raise ValueError(f"reader must be 'auto', 'safetensors' or 'numpy'; got {reader!r}.")
    header, base, size = _read_header(path)
    available = [k for k in header if k != "__metadata__"]
    wanted = available if names is None else list(names)
    missing = [k for k in wanted if k not in header or k == "__metadata__"]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} has no tensor(s) {missing[:5]}.")
    if reader == "auto":
        bf16 = any(
            isinstance(header[k], dict) and header[k].get("dtype") == "BF16" for k in wanted
        )  # numpy has no bfloat16: the package cannot return it
        reader = "safetensors" if importlib.util.find_spec("safetensors") and not bf16 else "numpy"
    try:  # every entry checked against the file before any tensor is read, by any reader
        entries = safetensors_layout(header, _ST_DTYPES, size - base)
    except ValueError as exc:
        raise ValueError(
            f"checkpoint {str(path)!r}: {exc}; the file is damaged or not a safetensors file."
        ) from None
    if reader == "safetensors":
        try:
            from safetensors import safe_open  # pyright: ignore[reportMissingImports]  (extra "heads")
        except ImportError:
            raise ValueError(
                "reader='safetensors' needs the safetensors package: "
                "pip install safetensors (or reader='numpy')."
            ) from None
        try:
            with safe_open(str(path), framework="numpy") as f:
                return {k: f.get_tensor(k) for k in wanted}
        except Exception as exc:  # SafetensorError and the like: the file, named
            raise ValueError(
                f"checkpoint {str(path)!r}: the safetensors package cannot read it "
                f"({type(exc).__name__}: {exc}); the file is damaged (reader='numpy' "
                f"reads the same format with numpy alone)."
            ) from None
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for k in wanted:
        name, dt, shape, begin = entries[k]
        end = begin + math.prod(shape) * dt.itemsize
        arr = np.frombuffer(mm[base + begin : base + end], dtype=dt).reshape(shape)
        if name == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[k] = np.array(arr, dtype=arr.dtype.newbyteorder("="))
    return out


def write_safetensors(
    path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> Path:
    """Write numpy arrays to a ``.safetensors`` file (numpy only; for tests and fixtures).

    Args:
        path: the file to write.
        tensors: ``{name: array}``; dtypes float16/32/64, (u)int8-64 or bool.
        metadata: optional ``{str: str}`` stored as ``__metadata__``.

    The layout follows the format specification (header padded with spaces to a multiple
    of 8 bytes, tensors in name order, contiguous, no gaps), so
    ``safetensors.numpy.load_file`` reads it.
    """
    path = Path(path)
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map str to str.")
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder not in ("|",) else arr.dtype
        if dt not in _ST_NAMES:
            raise ValueError(f"tensors[{name!r}] has unsupported dtype {arr.dtype}.")
        data = arr.astype(dt, copy=False).tobytes(order="C")
        header[name] = {
            "dtype": _ST_NAMES[dt],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    from .files import temporary_name, write_atomic

    def writer(f) -> None:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)

    write_atomic(Path(path), writer, temporary_name(Path(path)))
    return path
