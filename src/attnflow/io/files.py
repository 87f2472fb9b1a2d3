"""Writing result files safely, hashing their arrays, and reading array files defensively.

Contract. ``write_atomic(path, writer, tmp)`` writes through ``writer`` into the
temporary file ``tmp`` beside ``path`` (created with the mode of any new file: the
umask decides), flushes and fsyncs it, and renames it onto ``path``: a reader sees the
old file or the new one, never a part. On any failure the temporary file is removed.
``temporary_name(path)`` is a fresh such name, ``.<name>.<pid>.<random>.tmp``.
``write_text(path, text)`` writes a text file that way. A write killed before its
rename leaves its temporary file behind: the next ``write_atomic`` of the same path
removes the temporaries of ``path`` whose writing process is gone
(``remove_stale_temporaries``; a temporary of a live process is left alone).
``arrays_sha256`` is the SHA-256 of arrays by name (names, dtypes, shapes, C-order
bytes), the hash that sweep shards and trajectory files record.

Reading. ``read_npz`` and ``read_npy`` return the arrays numpy's ``np.load`` would
return (same dtypes, shapes, order and bytes; never a pickle), or raise one ``BadFile``
(a ``ValueError``) that names the file and says what is wrong: not a zip archive,
truncated, a damaged member (the zip CRC-32 of every member read is checked), a zip
directory that lists fewer members than its end record counts, a member
that is not an ``.npy`` array, an ``.npy`` header that cannot be parsed, that declares
Python objects, or that declares more or fewer bytes than the member holds. Every
declared size (a member's compressed and uncompressed sizes, an array's shape times its
item size) is checked against the bytes actually there before anything of that size is
read, and the data are read in bounded chunks, so a small crafted file never makes the
reader allocate more memory than about twice what it holds. ``read_npy_stream`` reads
one array from an open stream (a file of several ``.npy`` arrays in a row, say) the same
way; ``safetensors_layout`` checks a safetensors header against the bytes after it;
``json_object`` parses the JSON metadata of a file and ``json_field`` checks the kind of
one of its fields; ``read_bytes`` and ``read_json`` read a whole file (a JSON object, for
the latter) with the same one error naming it. The ``reason`` of a ``BadFile`` is the
"what is wrong" alone, for callers that name the file their own way.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import lzma
import math
import os
import re
import secrets
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = [
    "BadFile",
    "arrays_sha256",
    "json_field",
    "json_object",
    "read_npy",
    "read_npy_stream",
    "read_bytes",
    "read_json",
    "read_npz",
    "safetensors_layout",
    "remove_stale_temporaries",
    "temporary_name",
    "write_atomic",
    "write_text",
]

# What the standard library and numpy raise on a damaged zip archive or .npy stream.
_READ_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    OverflowError,
    NotImplementedError,  # an unknown compression method or flag
    RuntimeError,  # a member flagged as encrypted
    struct.error,
    zlib.error,
    lzma.LZMAError,
)
_NPY_MAX_HEADER = 10_000  # numpy's own limit on an .npy header (np.load's default)
_DEFLATE_MAX_RATIO = 1032  # deflate expands at most ~1032:1
_CHUNK = 1 << 24  # bytes read at a time


class BadFile(ValueError):
    """A file that cannot be read as what it should be.

    ``str(exc)`` is one line naming the file, saying what is wrong and, where given,
    what to do; ``path`` is the file and ``reason`` what is wrong alone.
    """

    def __init__(self, path: str | os.PathLike, reason: str, *, kind: str = "", fix: str = ""):
        self.path = Path(path)
        self.reason = reason
        where = f"cannot read {str(path)!r}" + (f" as {kind}" if kind else "")
        super().__init__(f"{where}: {reason}" + (f"; {fix}" if fix else "") + ".")


class _Malformed(Exception):
    """Internal: what is wrong with the file being read (becomes a ``BadFile``)."""


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


# after ".<name>.": "<pid>.tmp" (training checkpoints) or "<pid>.<random>.tmp"
_TEMPORARY = re.compile(r"(?P<pid>\d+)(\.[0-9a-f]+)?\.tmp")


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (True when it cannot be told)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # someone else's process, or no way to tell: keep its file
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that killed writes of ``path`` left beside it (named
    as ``temporary_name`` names them, by a process that no longer runs); returns them."""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    except OSError:
        return removed
    prefix = f".{path.name}."
    for tmp in candidates:
        m = _TEMPORARY.fullmatch(tmp.name[len(prefix) :])
        if not tmp.name.startswith(prefix) or m is None or _alive(int(m["pid"])):
            continue
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def write_atomic(path: Path, writer: Callable[[Any], None], tmp: Path) -> None:
    """Write ``path`` whole or not at all (see the module docstring)."""
    remove_stale_temporaries(path)
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


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (``write_atomic``); returns
    the path. On any failure the file that was there is left as it was."""
    path = Path(path)
    data = text.encode("utf-8")
    write_atomic(path, lambda f: f.write(data), temporary_name(path))
    return path


# ------------------------------------------------------------------ reading
@contextlib.contextmanager
def _said_as(error: Callable[[str], Exception]) -> Iterator[None]:
    """Turn what goes wrong while reading a file (a ``_Malformed`` of ours, or what the
    standard library and numpy raise on damaged bytes) into ``error(why)``."""
    try:
        yield
    except _Malformed as exc:
        raise error(str(exc)) from None
    except _READ_ERRORS as exc:
        raise error(_why(exc)) from None


def _why(exc: BaseException) -> str:
    """What an exception raised while reading says is wrong with the file, in words."""
    msg = " ".join(str(exc).split())
    if len(msg) > 160:
        msg = msg[:157] + "..."
    if isinstance(exc, zipfile.BadZipFile) and "CRC" in msg:
        return "its bytes do not match their CRC-32 (damaged)"
    if isinstance(exc, zipfile.BadZipFile) and "not a zip file" in msg:
        return "it is not an .npz archive (or it is truncated)"
    if isinstance(exc, zipfile.BadZipFile):
        return f"its zip headers are damaged ({msg})"
    if isinstance(exc, EOFError) or msg.startswith("EOF"):
        return "it is truncated (not fully written?)"
    if isinstance(exc, (zlib.error, lzma.LZMAError)):
        return f"its compressed data are damaged ({msg})"
    if isinstance(exc, (NotImplementedError, RuntimeError)):
        return f"its zip headers are damaged ({msg})"
    if isinstance(exc, FileNotFoundError):
        return "it does not exist"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return msg or type(exc).__name__


def read_npy_stream(fh: IO[bytes], size: int, *, exact: bool = True) -> np.ndarray:
    """One ``.npy`` array from the binary stream ``fh``, of which ``size`` bytes remain.

    The header is parsed and checked before any data are read: its dtype must hold no
    Python objects, and its shape times its item size must fit in the bytes that remain
    (equal them, with ``exact``: nothing may follow the array). The data are read in
    bounded chunks.

    Args:
        fh: a binary stream positioned at the start of an ``.npy`` array.
        size: the bytes left in ``fh`` (the member's or the file's size).
        exact: whether the array must end the stream (then one more read at the end
            lets a zip member check its CRC-32).

    Returns:
        The array, as ``np.load`` returns it (its dtype, shape and memory order).

    Raises:
        ValueError: what is wrong, without naming a file (the caller does).
    """
    with _said_as(ValueError):
        return _npy(fh, size, exact)


def _npy(fh: IO[bytes], size: int, exact: bool, *, header_only: bool = False) -> Any:
    fmt = np.lib.format
    start = fh.tell()
    if size < fmt.MAGIC_LEN:
        raise _Malformed("it is truncated (shorter than an .npy header)")
    try:
        version = fmt.read_magic(fh)
    except ValueError:
        raise _Malformed("it is not a .npy file (no .npy header)") from None
    if version not in ((1, 0), (2, 0)):
        raise _Malformed(f"its .npy header has format version {version}, not 1.0 or 2.0")
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    try:
        shape, fortran, dtype = read_header(fh, _NPY_MAX_HEADER)
    except Exception as exc:  # numpy parses the header's text: any error is a bad header
        why = _why(exc)
        raise _Malformed(
            why if "truncated" in why else f"its .npy header is damaged ({why})"
        ) from None
    if dtype.hasobject:
        raise _Malformed("it holds Python objects, not numbers (pickles are never read)")
    if any(s < 0 for s in shape):
        raise _Malformed(f"its .npy header declares the shape {shape}")
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    left = size - (fh.tell() - start)
    if nbytes > left or (exact and nbytes != left):
        short = " (truncated?)" if nbytes > left else ""
        raise _Malformed(
            f"its .npy header declares {nbytes} bytes of data (shape {shape}, dtype "
            f"{dtype.str}) but {left} follow it{short}"
        )
    if header_only:
        return shape, dtype
    buf = bytearray()
    while len(buf) < nbytes:
        chunk = fh.read(min(_CHUNK, nbytes - len(buf)))
        if not chunk:
            raise _Malformed("it is truncated (not fully written?)")
        buf += chunk
    if exact and fh.read(1):
        raise _Malformed("bytes follow the array its .npy header declares")
    flat = np.frombuffer(buf, dtype=dtype, count=count) if nbytes else np.ndarray(count, dtype)
    if fortran:
        return flat.reshape(shape[::-1]).transpose()
    return flat.reshape(shape)


def read_npy(path: str | os.PathLike, *, kind: str = "", fix: str = "") -> np.ndarray:
    """The array of an ``.npy`` file, checked (see the module docstring).

    Args:
        path: the file.
        kind: what the file should be, for the message (``"a matrix file"``).
        fix: what to do about a bad file, for the message.

    Returns:
        The array, as ``np.load(path, allow_pickle=False)`` returns it.

    Raises:
        BadFile: naming the file and what is wrong.
    """
    p = Path(path)
    with _said_as(lambda why: BadFile(p, why, kind=kind, fix=fix)), open(p, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise _Malformed("the file is empty")
        return _npy(fh, size, True)


def read_npz(
    path: str | os.PathLike,
    *,
    kind: str = "",
    fix: str = "",
    only: Any = None,
    headers: bool = False,
) -> dict[str, Any]:
    """The arrays of an ``.npz`` archive, each checked (see the module docstring).

    Args:
        path: the archive.
        kind: what the file should be, for the message (``"a trajectory file"``).
        fix: what to do about a bad file, for the message (``"re-save the run"``).
        only: the names of the arrays to read (default all; every member's declared
            sizes are checked either way).
        headers: return each array's ``(shape, dtype)`` from its ``.npy`` header instead
            of the array, reading no data (so a reader can check what a file declares
            against what it should hold before allocating it).

    Returns:
        ``{name: array}`` in the archive's order, as ``np.load`` returns them.

    Raises:
        BadFile: naming the file and what is wrong (which array, where it is one).
    """
    p = Path(path)
    wanted = None if only is None else set(only)
    with _said_as(lambda why: BadFile(p, why, kind=kind, fix=fix)):
        return _npz(p, wanted, headers)


def _npz(p: Path, wanted: set[str] | None = None, headers: bool = False) -> dict[str, Any]:
    size = p.stat().st_size
    if size == 0:
        raise _Malformed("the file is empty")
    out: dict[str, Any] = {}
    with zipfile.ZipFile(p) as zf:
        infos = zf.infolist()
        recorded = _recorded_entries(p, size)
        if recorded is not None and recorded != len(infos):
            # a damaged central directory that zipfile reads as a shorter one: the
            # arrays after the damage (the hash among them) would silently vanish
            raise _Malformed(
                f"its zip directory is damaged (it lists {len(infos)} of the "
                f"{recorded} arrays its end record counts)"
            )
        keys = [info.filename.removesuffix(".npy") for info in infos]
        for info, key in zip(infos, keys):
            if not info.filename.endswith(".npy"):
                raise _Malformed(f"it holds a member {info.filename!r} that is not an array")
            if keys.count(key) > 1:
                raise _Malformed(f"it holds two arrays named {key!r}")
            _check_sizes(info, size, key)
            if wanted is not None and key not in wanted:
                continue
            with _said_as(lambda why, key=key: _Malformed(f"its array {key!r}: {why}")):
                with zf.open(info) as fh:
                    out[key] = _npy(fh, info.file_size, True, header_only=headers)
    return out


_EOCD = b"PK\x05\x06"  # the zip's end-of-central-directory signature
_EOCD_SIZE = 22  # the record without its comment; a comment adds at most 65,535 bytes


def _recorded_entries(p: Path, size: int) -> int | None:
    """The entry count of the zip's end-of-central-directory record (None for a zip64
    archive, whose count lives elsewhere and which zipfile checks itself)."""
    tail = min(size, _EOCD_SIZE + 0xFFFF)
    with open(p, "rb") as f:
        f.seek(size - tail)
        data = f.read(tail)
    at = data.rfind(_EOCD)
    if at < 0 or at + _EOCD_SIZE > len(data):
        return None  # zipfile has opened it, so it found a record; leave it to zipfile
    total = int.from_bytes(data[at + 10 : at + 12], "little")
    return None if total == 0xFFFF else total


def read_bytes(path: str | os.PathLike, *, kind: str = "", fix: str = "") -> bytes:
    """The bytes of ``path``; a ``BadFile`` naming it when it cannot be read."""
    p = Path(path)
    with _said_as(lambda why: BadFile(p, why, kind=kind, fix=fix)):
        return p.read_bytes()


def read_json(path: str | os.PathLike, *, kind: str = "", fix: str = "") -> dict:
    """The JSON object a text file holds; a ``BadFile`` naming it when it cannot be read,
    is not JSON or not an object."""
    p = Path(path)
    raw = read_bytes(p, kind=kind, fix=fix)
    with _said_as(lambda why: BadFile(p, why, kind=kind, fix=fix)):
        return json_object(raw, "it")


def _check_sizes(info: zipfile.ZipInfo, size: int, key: str) -> None:
    """A member's declared sizes against the archive's size, before reading it."""
    stored = info.compress_type == zipfile.ZIP_STORED
    fits = info.header_offset + info.compress_size <= size
    if stored:
        fits = fits and info.file_size == info.compress_size
    else:
        fits = fits and info.file_size <= _DEFLATE_MAX_RATIO * info.compress_size + 1024
    if not fits:
        raise _Malformed(
            f"its array {key!r} declares {info.file_size} bytes ({info.compress_size} "
            f"stored) that an archive of {size} bytes cannot hold (truncated or damaged)"
        )


def json_object(raw: str | bytes | np.ndarray, what: str = "its metadata") -> dict:
    """The JSON object in ``raw`` (text, UTF-8 bytes, or an array holding either).

    Raises:
        ValueError: saying what is wrong (not JSON, not an object), without naming a
            file (the caller does).
    """
    text: str | bytes
    if not isinstance(raw, np.ndarray):
        text = raw
    elif raw.dtype == np.uint8:  # UTF-8 bytes
        text = raw.tobytes()
    elif raw.ndim != 0 or raw.dtype.kind not in "US":
        raise ValueError(f"{what} is an array of {raw.dtype} and shape {raw.shape}, not a text")
    else:
        text = raw.item()
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} is not JSON ({_why(exc)})") from None
    except RecursionError:
        raise ValueError(f"{what} is not JSON (nested too deeply)") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object")
    return value


_KINDS = {
    int: "a whole number",
    float: "a number",
    str: "a text",
    bool: "true or false",
    list: "a list",
    dict: "an object",
}


def json_field(
    obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str = ""
) -> Any:
    """``obj[key]``, checked to be of ``kind`` (a type or a tuple of them).

    ``float`` admits whole numbers too; ``True`` and ``False`` are never numbers.

    Raises:
        ValueError: the field is missing or of another kind, naming it (``what.key``)
            but not the file (the caller does).
    """
    kinds = kind if isinstance(kind, tuple) else (kind,)
    name = f"{what}.{key}" if what else key
    if key not in obj:
        raise ValueError(f"its metadata has no field {name!r}")
    value = obj[key]
    if isinstance(value, bool):
        ok = bool in kinds
    elif isinstance(value, int):
        ok = int in kinds or float in kinds
    else:
        ok = isinstance(value, kinds)
    if not ok:
        want = " or ".join(_KINDS.get(k, k.__name__) for k in kinds)
        raise ValueError(f"its metadata field {name!r} is {value!r:.60}, not {want}")
    return value


def _whole(v: Any) -> int:
    """A whole number of a header (never a bool, a float or a text)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not a whole number")
    return v


def safetensors_layout(
    header: Mapping[str, Any], dtypes: Mapping[str, np.dtype], data_size: int
) -> dict[str, tuple[str, np.dtype, tuple[int, ...], int]]:
    """Every tensor of a safetensors header as ``(dtype name, dtype, shape, begin)``,
    checked against the ``data_size`` bytes that follow the header, as the format
    requires: ``__metadata__`` (optional) an object of texts; each entry a dtype of
    ``dtypes``, a shape of whole numbers >= 0 and offsets ``[begin, end]`` that hold
    exactly that many bytes; the tensors tiling the data with no gap, overlap or
    trailing bytes. So a truncated, extended or edited file is refused before any
    tensor is read.

    Raises:
        ValueError: saying what is wrong, without naming the file (the caller does).
    """
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("its __metadata__ is not an object of texts")
    out, spans = {}, []
    for k, info in header.items():
        if k == "__metadata__":
            continue
        try:
            name = info["dtype"]
            dt = dtypes[name]
            shape = tuple(_whole(s) for s in info["shape"])
            begin, end = (_whole(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {k!r} has a malformed header entry {info!r:.200}") from None
        if any(n < 0 for n in shape) or begin < 0 or end - begin != math.prod(shape) * dt.itemsize:
            raise ValueError(
                f"tensor {k!r} has offsets [{begin}, {end}] inconsistent with dtype {name} "
                f"shape {shape}"
            )
        out[k] = (name, dt, shape, begin)
        spans.append((begin, end, k))
    at = 0
    for begin, end, k in sorted(spans):
        if begin != at:
            raise ValueError(f"tensor {k!r} starts at {begin}, not at {at} (a gap or an overlap)")
        at = end
    if at != data_size:
        raise ValueError(
            f"its tensors hold {at} bytes and the file {data_size} after its header "
            f"(truncated or extended)"
        )
    return out
