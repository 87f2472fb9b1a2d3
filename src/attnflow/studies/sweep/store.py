"""The shard store: a directory of hashed shard files and the manifest they belong to.

Contract:

* Every file appears atomically under its final name: shards through a temporary file
  beside it, fsync and ``os.replace``; the manifest through a complete temporary file
  hard-linked into place (``O_EXCL`` where hard links are not supported), so of two runs
  creating it together exactly one wins and the other reads it whole.
* A shard file records its sweep's digest, its sample range and the SHA-256 of its
  arrays (names, dtypes, shapes and C-order bytes); ``read_shard`` returns its arrays
  only if all of these hold, else raises ``BadShard`` saying what is wrong (truncated,
  corrupted, edited, or from another sweep); a shard without the hash is refused
  (nothing vouches for its arrays; a run recomputes it). Shards are read by
  ``io.files.read_npz``: every size a file declares is checked before it is read.
  ``read_manifest`` refuses, naming it, a manifest that is not JSON, whose identity no
  longer matches the digest it records (edited by hand) or is of the wrong kinds.
* A directory holds one sweep: ``prepare_dir`` and ``check_dir`` refuse a different
  identity before anything is computed, naming each field that differs.
* Temporary files are named ``.<name>.<host>.<pid>.<random>.tmp``; ``remove_dead_tmp``
  deletes only those of dead processes of this host, never a live writer's or another
  host's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ... import _checks
from ...io.files import BadFile, arrays_sha256, json_object, read_npz, write_atomic
from .spec import IDENTITY, Sweep, identity_digest

__all__ = [
    "HOST",
    "HOST_TAG",
    "MANIFEST",
    "BadShard",
    "BadShardWarning",
    "arrays_sha256",
    "check_dir",
    "pid_alive",
    "prepare_dir",
    "present",
    "read_manifest",
    "read_shard",
    "remove_dead_tmp",
    "shard_name",
    "signature",
    "verify",
    "write_shard",
]

MANIFEST = "manifest.json"
_SHARD_RE = re.compile(r"^shard-(\d{10})-(\d{10})\.npz$")
_META_KEY = "__meta__"
HOST = socket.gethostname()
HOST_TAG = HOST.replace(".", "_") or "host"


class BadShardWarning(UserWarning):
    """A rerun found shard files that fail verification; it recomputes them."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie does not)."""
    if os.name == "nt":  # pragma: no cover - os.kill(pid, 0) would stop it there
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def shard_name(start: int, stop: int) -> str:
    return f"shard-{start:010d}-{stop:010d}.npz"


def _tmp_path(path: Path) -> Path:
    """A temporary name beside ``path``: ``.<name>.<host>.<pid>.<random>.tmp`` (the host
    with its dots replaced), so a later run can tell the leftovers of a dead process of
    its own host (``remove_dead_tmp``)."""
    return path.with_name(f".{path.name}.{HOST_TAG}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def remove_dead_tmp(out_dir: Path) -> None:
    """Delete the temporary files that a process of this host left when it was killed
    mid-write (SIGKILL runs no cleanup). Files of live processes or of other hosts stay."""
    for e in os.scandir(out_dir):
        if not (e.name.startswith(".") and e.name.endswith(".tmp")):
            continue
        parts = e.name[: -len(".tmp")].rsplit(".", 3)
        if len(parts) != 4 or parts[1] != HOST_TAG or not parts[2].isdigit():
            continue
        if not pid_alive(int(parts[2])):
            with contextlib.suppress(OSError):
                os.unlink(e.path)


def _write_atomic(path: Path, writer: Callable[[Any], None]) -> None:
    write_atomic(path, writer, _tmp_path(path))


def write_shard(
    path: Path, out: Mapping[str, np.ndarray], start: int, stop: int, seed: int, digest: str
) -> None:
    """Write a shard file atomically, with its metadata and the SHA-256 of its arrays."""
    meta = json.dumps(
        {
            "start": start,
            "stop": stop,
            "seed": seed,
            "digest": digest,
            "sha256": arrays_sha256(out),
        }
    )

    def writer(f):
        np.savez(f, **out, **{_META_KEY: np.array(meta)})  # pyright: ignore[reportArgumentType]

    _write_atomic(path, writer)


class BadShard(Exception):
    """A shard file that fails verification; the message says why."""


def read_shard(path: Path, digest: str, start: int, stop: int) -> dict[str, np.ndarray]:
    """The arrays of a shard file, verified: readable, of this sweep (digest), for
    samples ``[start, stop)``, and equal to the SHA-256 in its metadata (a shard without
    one is refused: nothing vouches for its arrays). Raises ``BadShard`` saying what is
    wrong."""
    try:
        arrays = read_npz(path)
    except BadFile as exc:  # truncated, corrupted, not a zip, a size that does not fit
        raise BadShard(f"it cannot be read ({exc.reason})") from None
    if _META_KEY not in arrays:
        raise BadShard("it has no metadata")
    try:
        meta = json_object(arrays.pop(_META_KEY))
    except ValueError as exc:
        raise BadShard(str(exc)) from None
    if meta.get("digest") != digest:
        raise BadShard("it does not belong to this sweep (its sweep digest differs)")
    if meta.get("start") != start or meta.get("stop", stop) != stop:
        raise BadShard(
            f"its metadata says samples [{meta.get('start')}, {meta.get('stop')}), "
            f"its name [{start}, {stop})"
        )
    if not arrays:
        raise BadShard("it holds no arrays")
    for k, a in arrays.items():
        if a.ndim < 1 or a.shape[0] != stop - start:
            raise BadShard(f"array {k!r} has shape {a.shape}, not {stop - start} rows")
    want = meta.get("sha256")
    if want is None:  # nothing vouches for its arrays: recomputed, not trusted
        raise BadShard(
            "it records no SHA-256 of its arrays (edited, or written before shards were hashed)"
        )
    if arrays_sha256(arrays) != want:
        raise BadShard("its arrays do not match the SHA-256 in its metadata (edited or corrupted)")
    return arrays


def verify(path: Path, digest: str, start: int, stop: int) -> str | None:
    """None if the shard file is good, else the reason it is not."""
    try:
        read_shard(path, digest, start, stop)
    except BadShard as exc:
        return str(exc)
    return None


def signature(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a file, None if absent: tells a file replaced since."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of the sweep stored in ``out_dir`` (ValueError if there is none)."""
    p = Path(out_dir) / MANIFEST
    if not p.is_file():
        raise ValueError(
            f"{str(out_dir)!r} holds no sweep (no {MANIFEST}); run the sweep "
            f"with this output directory first."
        )
    for attempt in range(50):
        raw = p.read_bytes()
        text = raw.decode("utf-8", errors="replace")
        try:
            man = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # a manifest being created without hard links is empty for a moment
            if attempt < 49 and not text.strip() and time.time() - p.stat().st_mtime < 5:
                time.sleep(0.05)
                continue
            raise ValueError(
                f"{str(p)!r} is not valid JSON ({exc}); delete the directory or choose another one."
            ) from None
        _check_manifest(man, p)
        return man
    raise AssertionError("unreachable")  # pragma: no cover


def _check_manifest(man: Any, p: Path) -> None:
    """A manifest edited by hand (its size, seed, ...) no longer matches the digest it
    records, which every shard records too: refused, naming the file."""
    if not isinstance(man, dict) or any(k not in man for k in (*IDENTITY, "digest")):
        raise ValueError(
            f"{str(p)!r} is not a sweep manifest (it lacks {', '.join(IDENTITY)} or its "
            f"digest); delete the directory or choose another one."
        )
    try:
        ok = identity_digest(man) == man["digest"]
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"{str(p)!r} was edited: its identity ({', '.join(IDENTITY)}) does not match the "
            f"digest it records; restore it, or delete the directory and rerun the sweep."
        )
    kinds = {"name": str, "config": dict, "size": int, "seed": int, "shard_size": int}
    bad = [
        k
        for k, kind in kinds.items()
        if isinstance(man[k], bool)
        or not isinstance(man[k], kind)
        or (kind is int and k != "seed" and man[k] < 1)
    ]
    if bad:  # a digest recomputed over values no sweep has
        raise ValueError(
            f"{str(p)!r} is not a sweep manifest ({', '.join(bad)} of the wrong kind: a "
            f"name, a config object, whole numbers); delete the directory or choose another one."
        )


def _create_exclusive(path: Path, text: str) -> None:
    """Create ``path`` holding ``text`` unless it exists, atomically: a complete
    temporary file hard-linked into place (``os.link`` fails if the name exists), or
    where hard links are not supported, an ``O_EXCL`` creation."""
    tmp = _tmp_path(path)
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return
        except OSError:  # no hard links on this file system
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _check_identity(sweep: Sweep, out_dir: Path, old: dict) -> None:
    man = sweep.manifest()
    diff = [k for k in IDENTITY if old.get(k) != man[k]]
    if diff:
        detail = "; ".join(f"{k}: stored {old.get(k)!r}, asked {man[k]!r}" for k in diff)
        raise ValueError(
            f"{str(out_dir)!r} holds a different sweep ({detail}); use the "
            f"same parameters to resume it, or another output directory."
        )


def check_dir(sweep: Sweep, out_dir: str | os.PathLike) -> None:
    """Check, writing nothing, that ``run(sweep, out_dir)`` could start: ``out_dir`` is
    a folder or can be created, and holds no other sweep (ValueError naming the
    difference). Studies of several sweeps check every folder before computing any."""
    path = _checks.output_dir("out_dir", out_dir)
    if (path / MANIFEST).is_file():
        _check_identity(sweep, path, read_manifest(path))


def prepare_dir(sweep: Sweep, out_dir: Path) -> dict:
    """Create ``out_dir`` and its manifest (atomically: of two runs starting together,
    one writes it), or check that the stored sweep is this one; returns the stored
    manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / MANIFEST
    if not p.exists():
        _create_exclusive(p, json.dumps(sweep.manifest(), indent=2, sort_keys=True) + "\n")
    old = read_manifest(out_dir)
    _check_identity(sweep, out_dir, old)
    return old


def present(out_dir: Path) -> set[tuple[int, int]]:
    """The ``(start, stop)`` ranges of the shard files in ``out_dir`` (by name only)."""
    found = set()
    with os.scandir(out_dir) as it:
        for e in it:
            m = _SHARD_RE.match(e.name)
            if m:
                found.add((int(m.group(1)), int(m.group(2))))
    return found
