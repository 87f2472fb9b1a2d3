"""A study's results, one file per sentence, for runs that resume after a crash.

Contract. A store is a folder with ``meta.json`` (the study's configuration: whatever
determines the numbers, as plain JSON) and ``sentences/SNNNNN.npz``, one archive per
finished sentence, each written whole or not at all (``attnflow.io.files.write_atomic``:
a temporary name, fsync, rename). Opening a store whose ``meta.json`` holds another
configuration is refused (``ValueError`` naming the folder and the first key that
differs; ``StoreMismatch``): a resumed run never mixes two settings. ``locked()`` holds
an exclusive lock on the folder (``fcntl.flock`` of ``.lock``) while a run computes, so
that two processes given the same folder take turns: the second finds the first's
sentences done and computes none of them again. ``done()`` lists the sentences whose
archive reads back whole; a damaged archive (a kill cannot leave one, a disk can) is
named in a warning and counts as not done, so it is computed again. Nothing is computed
twice and nothing is lost: a sentence is either in its finished archive or computed on
the next run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..io.files import read_json, read_npz, temporary_name, write_atomic

__all__ = ["SentenceStore", "StoreMismatch", "code_hash"]

_FILE = re.compile(r"^S(\d{5})\.npz$")


class StoreMismatch(ValueError):
    """The folder holds a run with another configuration."""


def code_hash(*modules: str) -> str:
    """SHA-256 (first 16 hex digits) of the source files of ``modules`` (dotted names):
    part of a store's configuration, so that results of other code are not resumed."""
    import importlib.util

    h = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        h.update(name.encode())
        if origin:
            h.update(Path(origin).read_bytes())
    return h.hexdigest()[:16]


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            here = f"{where}.{k}" if where else str(k)
            if k not in a or k not in b:
                return here
            found = _first_difference(a[k], b[k], here)
            if found:
                return found
        return None
    return None if a == b else (where or "<top>")


class SentenceStore:
    """One folder of per-sentence results (module docstring).

    Args:
        folder: the store's folder (created when missing).
        kind: the study's name, checked against the saved one.
        config: plain-JSON configuration; written on first use, compared afterwards.
        info: more metadata (versions, dates), written on first use, never compared.
    """

    def __init__(self, folder: str | Path, kind: str, config: dict, info: dict | None = None):
        self.folder = Path(folder)
        self.kind = kind
        self.config = _plain(config)
        meta_path = self.folder / "meta.json"
        if meta_path.is_file():
            meta = read_json(meta_path, kind=f"the metadata of a {kind} store")
            if meta.get("kind") != kind:
                raise ValueError(
                    f"{self.folder} holds a {meta.get('kind')!r} study, not {kind!r}; give "
                    f"another folder."
                )
            where = _first_difference(meta.get("config"), self.config)
            if where is not None:
                raise StoreMismatch(
                    f"{self.folder} holds a {kind} run with another configuration (first "
                    f"difference: {where!r}); resume it with the same settings or give "
                    f"another folder."
                )
            self.info = meta.get("info", {})
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.info = _plain(info or {})
            body = json.dumps(
                {"kind": kind, "config": self.config, "info": self.info}, indent=1
            ).encode()
            write_atomic(meta_path, lambda f: f.write(body), temporary_name(meta_path))
        (self.folder / "sentences").mkdir(exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's exclusive lock (waiting for another holder to finish)."""
        import fcntl

        with open(self.folder / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def path(self, k: int) -> Path:
        return self.folder / "sentences" / f"S{int(k):05d}.npz"

    def done(self) -> set[int]:
        """The sentences whose archive reads back whole."""
        out = set()
        for p in sorted((self.folder / "sentences").iterdir()):
            m = _FILE.match(p.name)
            if not m:
                continue
            try:
                read_npz(p)
            except ValueError as exc:
                warnings.warn(f"{p} is damaged and is computed again ({exc}).", stacklevel=2)
                continue
            out.add(int(m.group(1)))
        return out

    def write(self, k: int, arrays: dict[str, Any]) -> None:
        """Write sentence ``k``'s arrays atomically."""
        path = self.path(k)
        payload = {key: np.asarray(v) for key, v in arrays.items()}
        write_atomic(path, lambda f: np.savez(f, **payload), temporary_name(path))  # pyright: ignore[reportArgumentType]

    def read(self, k: int) -> dict[str, np.ndarray]:
        """Sentence ``k``'s arrays (``BadFile`` naming it when damaged or missing)."""
        return read_npz(self.path(k), kind=f"a sentence of a {self.kind} store")
