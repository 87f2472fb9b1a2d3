"""A training checkpoint as one file, written atomically, with the previous one kept.

Contract. ``save(path, tree, state)`` writes the array leaves of ``tree`` (equinox's
serialisation) and the JSON ``state`` (step counter, history) into one file: a header
line ``attnflow-checkpoint 1 <sha256 of the rest> <bytes of the state>``, the state, then
the leaves. It goes to a temporary name in the same directory, is flushed and fsynced,
the current checkpoint (if any) becomes ``<path>.prev``, and the new one is renamed into
place; a kill at any moment leaves a whole checkpoint under ``path`` or ``<path>.prev``
(or both). ``load(path, like)`` reads the newest whole one: a file that is truncated,
altered or not a checkpoint is named in a warning and the previous one is read instead;
``None`` when neither is whole (training then starts over).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import equinox as eqx

MAGIC = b"attnflow-checkpoint 1"


def save(path: Path, tree: Any, state: dict) -> None:
    """Write ``tree`` and ``state`` to ``path`` atomically, keeping the old one as
    ``<path>.prev``."""
    path = Path(path)
    leaves = io.BytesIO()
    eqx.tree_serialise_leaves(leaves, tree)
    body = json.dumps(state).encode() + leaves.getvalue()
    n_state = len(body) - len(leaves.getvalue())
    header = MAGIC + f" {hashlib.sha256(body).hexdigest()} {n_state}\n".encode()
    from ..io.files import remove_stale_temporaries

    remove_stale_temporaries(path)  # of killed saves
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(header + body)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".prev"))
    os.replace(tmp, path)
    try:  # the renames themselves, on filesystems that need it
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _read(path: Path, like: Any) -> tuple[Any, dict]:
    raw = path.read_bytes()
    head, sep, body = raw.partition(b"\n")
    parts = head.split(b" ")
    if not sep or not head.startswith(MAGIC) or len(parts) != 4:
        raise ValueError("not an attnflow checkpoint (no header)")
    digest, n_state = parts[2].decode(), int(parts[3])
    if hashlib.sha256(body).hexdigest() != digest:
        raise ValueError("its content does not match its hash (truncated or altered)")
    state = json.loads(body[:n_state])
    tree = eqx.tree_deserialise_leaves(io.BytesIO(body[n_state:]), like)
    return tree, state


def load(path: Path, like: Any) -> tuple[Any, dict] | None:
    """The newest whole checkpoint at ``path`` or ``<path>.prev``, as ``(tree, state)``;
    ``None`` when there is none."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".prev")):
        if not p.exists():
            continue
        try:
            return _read(p, like)
        except Exception as exc:  # any unreadable file: named, then the older one
            warnings.warn(
                f"checkpoint {p} is unreadable ({exc}); "
                + ("trying the previous one." if p == path else "training starts over."),
                RuntimeWarning,
                stacklevel=3,
            )
    return None


def remove(path: Path) -> None:
    """Delete the checkpoint and its previous copy."""
    path = Path(path)
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".prev").unlink(missing_ok=True)
