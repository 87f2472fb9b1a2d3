"""Traced programs kept across processes: a warm command skips tracing its solve.

``call(name, fn, args, statics)`` returns ``fn(*args, **statics)``. Inside ``allowed()``
(the command line wraps the solves it builds from its own options in it), and when JAX's
persistent compilation cache is on, the call is first looked up as a serialized
``jax.export.Exported`` in the cache directory; on a miss the program is exported once
(traced as ``jax.jit`` would trace it), written there, and called. Either way the
numbers are those of the exported program, which is the program ``jax.jit`` lowers, so a
warm call and a cold one agree to the bit (``tests/test_exported.py``); XLA compiles it
once and keeps it in the same cache.

The key of a program holds everything that decides what is traced: ``name``, the tree
structure of ``args`` with the value of every non-array leaf (an equinox module's
fields, a kernel's settings), the shape and dtype of every array leaf, ``statics``,
the digest of attnflow's own source files, the versions of JAX, jaxlib, equinox and
diffrax, ``jax_enable_x64``, the default matmul precision and the backend. A call whose
key cannot be written down faithfully (a leaf whose text holds an object address, a
function defined inside another function or a lambda) is not kept: it runs as
``fn(*args, **statics)``. So is any call when the export or the file fails: the cache
never changes whether a computation runs, only how long it takes to start.

Files are named ``<sha256>-attnflow-export-cache``: ``attnflow cache info`` counts them
and ``attnflow cache clear`` deletes them with JAX's own entries. A file is the pickled
``Exported`` (JAX's own serialization needs ``flatbuffers``, which attnflow does not
require), read only under the same key, so by the same versions of JAX and attnflow; it
is trusted as JAX's cache beside it is, whose entries are compiled machine code: the
directory is the user's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from ._meta import source_digest

__all__ = ["allowed", "call", "SUFFIX"]

SUFFIX = "-attnflow-export-cache"
_STATE = {"allowed": 0}
_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+|<lambda>|<locals>")


@contextlib.contextmanager
def allowed() -> Iterator[None]:
    """Let ``call`` keep exported programs inside this block (nestable)."""
    _STATE["allowed"] += 1
    try:
        yield
    finally:
        _STATE["allowed"] -= 1


# the package's source, read once per process (its code does not change under it)
_source_digest = cache(source_digest)


@cache
def _versions() -> str:
    out = []
    for dist in ("jax", "jaxlib", "equinox", "diffrax"):
        try:
            out.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist}=?")
    return ";".join(out)


def _leaf_text(leaf: Any) -> str:
    """A non-array leaf as text that names it faithfully: its type and its repr; a
    callable by its module and qualified name."""
    kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
    if callable(leaf) and hasattr(leaf, "__qualname__"):
        return f"{kind}:{getattr(leaf, '__module__', '?')}.{leaf.__qualname__}"
    return f"{kind}:{leaf!r}"


def _key(name: str, args: tuple, statics: dict) -> tuple[str | None, list, Any]:
    """The program's key (None when it cannot be written down faithfully), the array
    leaves of ``args`` and a function putting ``args`` back together from them."""
    import equinox as eqx
    import jax

    dyn, static = eqx.partition(args, eqx.is_array)
    leaves, dyn_def = jax.tree_util.tree_flatten(dyn)
    static_leaves, static_def = jax.tree_util.tree_flatten(static)
    parts = [
        name,
        str(dyn_def),
        str(static_def),
        *(_leaf_text(x) for x in static_leaves),
        *(f"{x.shape}:{x.dtype}:{getattr(x, 'weak_type', False)}" for x in leaves),
        *(f"{k}={_leaf_text(v)}" for k, v in sorted(statics.items())),
        _source_digest(),
        _versions(),
        f"x64={jax.config.read('jax_enable_x64')}",
        f"precision={jax.config.values.get('jax_default_matmul_precision')}",
        f"backend={jax.default_backend()}",
    ]
    text = "\n".join(parts)

    def rebuild(arrays: list) -> tuple:
        return eqx.combine(jax.tree_util.tree_unflatten(dyn_def, arrays), static)

    if _ADDRESS.search(text):
        return None, leaves, rebuild
    return hashlib.sha256(text.encode()).hexdigest(), leaves, rebuild


def _directory() -> Path | None:
    if not _STATE["allowed"]:
        return None
    import jax

    where = jax.config.values.get("jax_compilation_cache_dir")
    return Path(where) if where else None


def call(name: str, fn: Callable[..., Any], args: tuple, statics: dict) -> Any:
    """``fn(*args, **statics)``, through a kept export when ``allowed`` and the
    compilation cache is on (see the module docstring). ``fn`` must return a tree of
    tuples, lists and dicts of arrays."""
    directory = _directory()
    if directory is None:
        return fn(*args, **statics)
    key, leaves, rebuild = _key(name, args, statics)
    if key is None:
        return fn(*args, **statics)
    import jax
    from jax import export

    path = directory / f"{key}{SUFFIX}"
    exp = None
    with contextlib.suppress(Exception):  # missing, damaged, or of another layout
        exp = pickle.loads(path.read_bytes())
        if not isinstance(exp, export.Exported):
            exp = None
    if exp is None:

        def flat(*arrays):
            return fn(*rebuild(list(arrays)), **statics)

        try:
            exp = export.export(jax.jit(flat))(*leaves)
            # without the closure that would differentiate it: a kept program is called,
            # never differentiated (``simulate`` returns host arrays)
            blob = pickle.dumps(dataclasses.replace(exp, _get_vjp=None))
        except Exception:  # what cannot be kept runs as before
            return fn(*args, **statics)
        _write(path, blob)
    return exp.call(*leaves)


def _write(path: Path, blob: bytes | bytearray) -> None:
    """Write ``blob`` to ``path`` atomically; a folder that cannot be written is left
    as it is."""
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".export-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
