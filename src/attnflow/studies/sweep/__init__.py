"""Sweeps: sampling studies that shard over devices and machines and survive faults.

A *sweep* is ``size`` independent samples with global indices ``0 .. size - 1``, computed
by a *kernel*, a pure function

    kernel(config, start, stop, seed) -> {name: array with leading axis stop - start}

whose row ``i`` depends only on ``(config, seed, start + i)`` -- never on ``start`` or
``stop`` themselves. Draw randomness per sample (``rng(seed, ..., index)``) or per fixed
block of samples (``rng(seed, ..., index // block)``, then slice), never from one stream
for the whole range. Then every split of the index range (shards, chunks, job-array
slices, worker processes, concurrent runs) gives the same numbers, bit for bit. (A
kernel that batches with JAX through ``map_devices`` gives them to rounding across
device counts: XLA may vectorise blocks of different sizes differently.)

On disk (``run``), the index range is cut into shards of ``shard_size`` samples; each
shard is one file, written atomically (a temporary file, fsync, ``os.replace``), so a
crash loses at most the shards in flight. Each shard's metadata holds the SHA-256 of its
arrays: a rerun verifies every shard already on disk, recomputes the bad ones (truncated,
corrupted, edited, or from another sweep) and names them in a ``BadShardWarning``;
``merge`` verifies them too and names any bad file. ``shard=(i, N)`` runs the ``i``-th of
``N`` contiguous slices of the shards (a job array on many machines writing into one
shared directory); ``merge`` concatenates the shards in index order and refuses if any is
missing or bad.

Runs into one directory share it safely. The manifest is created atomically (a hard link
of a complete temporary file), so of two runs started together with different seeds or
configs one is refused before it computes anything. A run claims each shard just before
computing it (``<shard>.claim``, created with ``O_CREAT | O_EXCL``, holding its pid and
host, its modification time refreshed while the run lives), so two identical runs split
the work, and each waits for the shards the other is computing. A claim is taken over
when its process is dead (same host) or when it has not been refreshed for
``CLAIM_STALE_SECONDS`` (another host that crashed). Correctness never depends on the
claims: shard files appear atomically, and two computations of a shard are bit-identical.
Layout of ``out_dir``::

    manifest.json                           name, config, size, seed, shard_size, versions
    shard-0000000000-0000001024.npz         the kernel's arrays for samples [0, 1024)
    shard-0000001024-0000002048.npz.claim   a run is computing samples [1024, 2048)
    ...

In memory (``compute``), the same kernel runs over chunks and the arrays are
concatenated; the chunking does not change the numbers.

Parallelism. ``workers > 1`` runs shards (or chunks) concurrently in a pool of spawned
worker processes (``attnflow._parallel``), each with one BLAS/OpenMP thread
(``OPENBLAS_NUM_THREADS=1`` etc.), so that ``workers`` processes use ``workers`` cores
without oversubscription; workers exit when the process that started them dies, even by
``kill -9``, and SIGTERM stops them with it. Every kernel call runs with one BLAS thread
(``blas_threads(1)``, for any BLAS that ``threadpoolctl`` knows), so the rounding is the
same wherever a sample is computed. That is the right "device" for host LAPACK work
(non-symmetric eigenvalues have no accelerator implementation in JAX). Kernels that
compute with JAX call ``map_devices`` instead, which shards a batch over all local JAX
devices (padded to the device count) and returns the unpadded result.

Engines. ``executor=`` runs the shards (or chunks) in any ``concurrent.futures.Executor``
instead: a thread pool, a cluster engine's (Dask's ``Client.get_executor()``,
``mpi4py.futures.MPIPoolExecutor``), used as it is and never shut down by attnflow.
Its tasks only compute, with one BLAS thread, and return their arrays; the process that
calls ``run`` claims the shards and writes, hashes and verifies the files, so the
guarantees above hold unchanged and the engine's workers need not share ``out_dir``.
``workers`` is then the number of shards in flight.

Example (a later sweep)::

    def kernel(config, start, stop, seed):            # module level: picklable
        x0 = np.stack([rng(seed, 7, i).uniform(-1, 1, (config["n"], config["d"]))
                       for i in range(start, stop)])
        out = map_devices(batched_solve, x0)          # vmapped, throw=False inside
        return {"label": out}

    sw = Sweep("phase", kernel, {"n": 32, "d": 8, "beta": 1.0}, size=10_000, seed=0,
               shard_size=256)
    run(sw, "runs/phase", shard="3/16")               # job 3 of a 16-job array
    data = merge("runs/phase")                        # once every job has finished
    data["label"]                                     # (10_000,)

Public names: ``Sweep``, ``SweepData``, ``RunReport``, ``compute``, ``run``, ``merge``,
``read_manifest``, ``rng``, ``Substreams``, ``sample_key``, ``map_devices``,
``blas_threads``, ``parse_shard``, ``shard_slice``, ``BadShardWarning``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import re
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Shaped

from ... import _checks, _parallel
from ..._meta import run_metadata
from ..._parallel import blas_threads, map_devices

__all__ = [
    "Sweep",
    "SweepData",
    "RunReport",
    "BadShardWarning",
    "compute",
    "run",
    "merge",
    "read_manifest",
    "check_dir",
    "rng",
    "Substreams",
    "map_devices",
    "blas_threads",
    "sample_key",
    "parse_shard",
    "shard_slice",
]

MANIFEST = "manifest.json"
_SHARD_RE = re.compile(r"^shard-(\d{10})-(\d{10})\.npz$")
_META_KEY = "__meta__"
_CLAIM = ".claim"
# Identity of a sweep on disk: a directory holds shards of exactly one of these.
_IDENTITY = ("name", "config", "size", "seed", "shard_size")
# A claim whose file has not been refreshed for this long is abandoned (its run's host
# crashed); a run refreshes its claims every CLAIM_STALE_SECONDS / 10 (at most 30 s).
CLAIM_STALE_SECONDS = 600.0
# How often a run looks at shards that another run is computing.
_POLL_SECONDS = 0.2
_HOST = socket.gethostname()
_HOST_TAG = _HOST.replace(".", "_") or "host"
# Tokens of the claims held by runs in this process (a claim with this process's pid
# whose token is not here was left by an earlier process that had the same pid).
_LIVE_TOKENS: set[str] = set()
# The name the Ginibre study calls (None -> one worker per available core).
_resolve_workers = _parallel.resolve_workers


class BadShardWarning(UserWarning):
    """A rerun found shard files that fail verification; it recomputes them."""


# ----------------------------------------------------------------------- helpers
def rng(seed: int, *key: int) -> np.random.Generator:
    """The random stream of one sample (or one block of samples).

    Streams with different keys are statistically independent, and a sample's stream
    does not depend on which shard, chunk or worker computes it.

    Args:
        seed: the sweep's seed, an integer >= 0.
        *key: integers >= 0 naming the stream, e.g. ``(study_tag, d, stream, index)``.

    Returns:
        ``np.random.Generator(PCG64(SeedSequence([seed, *key])))``.
    """
    ints = [_checks.integer("seed", seed, lo=0)]
    for k in key:
        ints.append(_checks.integer("rng key", k, lo=0))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(ints)))


class Substreams:
    """Independent random streams for the samples of one block, cheap to look up.

    ``Substreams(seed, *key)[j]`` is a ``numpy.random.Generator`` on the PCG64 stream of
    ``SeedSequence([seed, *key])`` advanced by ``j * 2**64`` draws: one SeedSequence per
    block instead of one per sample (a look-up is a state reset and an ``advance``, about
    a microsecond). Streams ``2**64`` draws apart never overlap in practice. The returned
    generator is shared: it is valid until the next look-up.
    """

    def __init__(self, seed: int, *key: int):
        ints = [_checks.integer("seed", seed, lo=0)]
        ints += [_checks.integer("rng key", k, lo=0) for k in key]
        self._bg = np.random.PCG64(np.random.SeedSequence(ints))
        self._base = self._bg.state
        self._gen = np.random.Generator(self._bg)

    def __getitem__(self, j: int) -> np.random.Generator:
        j = _checks.integer("substream index", j, lo=0)
        self._bg.state = self._base
        if j:
            self._bg.advance(j << 64)
        return self._gen


def sample_key(seed: int, index: int) -> Any:
    """A ``jax.random`` key for sample ``index`` of a sweep seeded with ``seed``.

    ``fold_in(fold_in(key(seed), index >> 32), index & 0xffffffff)``, so indices beyond
    2**32 are fine; for JAX kernels that draw their randomness with ``jax.random``.
    """
    import jax

    index = _checks.integer("index", index, lo=0)
    k = jax.random.key(_checks.integer("seed", seed, lo=0))
    k = jax.random.fold_in(k, index >> 32)
    return jax.random.fold_in(k, index & 0xFFFFFFFF)


def parse_shard(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """Parse ``"i/N"`` (0 <= i < N) into ``(i, N)``; ``None`` stays ``None``."""
    if text is None:
        return None
    if isinstance(text, tuple):
        if len(text) != 2:
            raise ValueError(f"shard must be two integers (i, N); got {text!r}.")
        i = _checks.integer("shard i", text[0])
        n = _checks.integer("shard N", text[1])
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise ValueError(
                f"shard must look like 'i/N' with 0 <= i < N (e.g. '0/4'); got {text!r}."
            )
        i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise ValueError(
            f"shard i/N needs N >= 1 and 0 <= i < N (job i of N counts from 0); got {i}/{n}."
        )
    return i, n


def shard_slice(n_shards: int, shard: str | tuple[int, int] | None) -> range:
    """The shard numbers that job ``i`` of ``N`` runs: the ``i``-th of ``N`` contiguous,
    nearly equal slices of ``range(n_shards)`` (all of them when ``shard`` is None)."""
    parsed = parse_shard(shard)
    if parsed is None:
        return range(n_shards)
    i, n = parsed
    return range(i * n_shards // n, (i + 1) * n_shards // n)


# ------------------------------------------------------------------------ sweep
@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sampling study: ``size`` samples of ``kernel`` under ``config`` and ``seed``.

    Args:
        name: a short label (``"ginibre"``), recorded in the manifest and the progress bar.
        kernel: ``kernel(config, start, stop, seed) -> dict[str, np.ndarray]``, each array
            of shape ``(stop - start, ...)``; row ``i`` must depend only on
            ``(config, seed, start + i)``. With ``workers > 1`` it must be importable
            (a module-level function), since it is sent to worker processes.
        config: the kernel's parameters, a JSON-serialisable mapping (ints, floats,
            strings, lists); part of the sweep's identity on disk.
        size: the number of samples, >= 1.
        seed: an integer >= 0.
        shard_size: samples per shard file, >= 1 (the unit of resumption on disk).
        align: in-memory chunks start at multiples of this (e.g. the kernel's block of
            samples per random stream); an efficiency hint only, never a correctness one.
        unit: the progress bar's unit name.
    """

    name: str
    kernel: Callable[[Mapping, int, int, int], Mapping[str, np.ndarray]]
    config: Mapping[str, Any]
    size: int
    seed: int = 0
    shard_size: int = 1024
    align: int = 1
    unit: str = "sample"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Sweep name must be a non-empty string; got {self.name!r}.")
        if not callable(self.kernel):
            raise ValueError("Sweep kernel must be callable as kernel(config, start, stop, seed).")
        if not isinstance(self.config, Mapping):
            raise ValueError(f"Sweep config must be a mapping; got {type(self.config)}.")
        try:
            json.dumps(dict(self.config), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"Sweep config must be JSON-serialisable (ints, floats, strings, lists): {exc}"
            ) from None
        object.__setattr__(self, "size", _checks.integer("size", self.size, lo=1))
        object.__setattr__(self, "seed", _checks.integer("seed", self.seed, lo=0))
        object.__setattr__(self, "shard_size", _checks.integer("shard_size", self.shard_size, lo=1))
        object.__setattr__(self, "align", _checks.integer("align", self.align, lo=1))

    @property
    def n_shards(self) -> int:
        """The number of shard files: ``ceil(size / shard_size)``."""
        return -(-self.size // self.shard_size)

    def shard_range(self, k: int) -> tuple[int, int]:
        """The global index range ``[start, stop)`` of shard number ``k``."""
        start = k * self.shard_size
        return start, min(start + self.shard_size, self.size)

    def identity(self) -> dict:
        """The fields that must match for two runs to share a directory."""
        return {
            "name": self.name,
            "config": json.loads(json.dumps(dict(self.config), sort_keys=True)),
            "size": self.size,
            "seed": self.seed,
            "shard_size": self.shard_size,
        }

    def manifest(self) -> dict:
        """The manifest written into a run's directory: the identity, its digest (which
        every shard records), the shard count, the kernel's name and versions."""
        ident = self.identity()
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
        kern = (
            f"{getattr(self.kernel, '__module__', '?')}.{getattr(self.kernel, '__qualname__', '?')}"
        )
        return {
            **ident,
            "digest": digest[:16],
            "n_shards": self.n_shards,
            "kernel": kern,
            "versions": run_metadata(),
        }


@dataclasses.dataclass
class SweepData:
    """The merged result of a sweep: ``arrays[name]`` has shape ``(size, ...)``, row ``i``
    being sample ``i``; ``manifest`` is the sweep's manifest dict."""

    arrays: dict[str, Shaped[np.ndarray, "size ..."]]
    manifest: dict

    def __getitem__(self, name: str) -> Shaped[np.ndarray, "size ..."]:
        return self.arrays[name]

    @property
    def size(self) -> int:
        return int(self.manifest["size"])


@dataclasses.dataclass
class RunReport:
    """What ``run`` did in ``out_dir``.

    Attributes:
        out_dir: the shard directory.
        n_shards: shards of the whole sweep.
        selected: shard numbers of this job (all, slice i of N, or the explicit list).
        computed: shards this run computed (bad files found on disk included).
        skipped: shards already on disk and verified when the run started.
        complete: whether every shard of the sweep (all jobs) is on disk now.
        missing: shards of the sweep not on disk now.
        seconds: wall time of the run.
        others: shards that another run (process or host) computed meanwhile.
        busy: shards still being computed by another run when this one returned
            (only with ``wait=False``).
        bad: the shard files that failed verification and were recomputed, each
            ``"name: reason"``.
    """

    out_dir: Path
    n_shards: int
    selected: list[int]
    computed: list[int]
    skipped: list[int]
    complete: bool
    missing: int
    seconds: float
    others: list[int] = dataclasses.field(default_factory=list)
    busy: list[int] = dataclasses.field(default_factory=list)
    bad: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "out_dir": str(self.out_dir),
            "n_shards": self.n_shards,
            "selected": list(self.selected),
            "computed": list(self.computed),
            "skipped": list(self.skipped),
            "complete": self.complete,
            "missing": self.missing,
            "seconds": self.seconds,
            "others": list(self.others),
            "busy": list(self.busy),
            "bad": list(self.bad),
        }


# ------------------------------------------------------------------ kernel calls
def _check_output(out: Any, start: int, stop: int, name: str) -> dict[str, np.ndarray]:
    if not isinstance(out, Mapping) or not out:
        raise ValueError(
            f"the kernel of sweep {name!r} must return a non-empty dict of "
            f"arrays; got {type(out).__name__}."
        )
    res = {}
    for k, v in out.items():
        if not isinstance(k, str) or not k.isidentifier() or k.startswith("__"):
            raise ValueError(
                f"sweep {name!r}: array names must be identifiers not "
                f"starting with '__'; got {k!r}."
            )
        a = np.asarray(v)
        if a.ndim < 1 or a.shape[0] != stop - start:
            raise ValueError(
                f"sweep {name!r}: kernel array {k!r} has shape {a.shape}; its "
                f"leading axis must be stop - start = {stop - start}."
            )
        if a.dtype == object:
            raise ValueError(
                f"sweep {name!r}: kernel array {k!r} has dtype object; "
                f"return numeric or boolean arrays."
            )
        res[k] = a
    return res


def _shard_name(start: int, stop: int) -> str:
    return f"shard-{start:010d}-{stop:010d}.npz"


def _arrays_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of a shard's arrays: names, dtypes, shapes and C-order bytes, by name."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(json.dumps([k, a.dtype.str, list(a.shape)]).encode())
        if a.size:
            h.update(a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _tmp_path(path: Path) -> Path:
    """A temporary name beside ``path``: ``.<name>.<host>.<pid>.<random>.tmp`` (the host
    with its dots replaced), so a later run can tell the leftovers of a dead process of
    its own host (``_remove_dead_tmp``)."""
    return path.with_name(f".{path.name}.{_HOST_TAG}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _remove_dead_tmp(out_dir: Path) -> None:
    """Delete the temporary files that a process of this host left when it was killed
    mid-write (SIGKILL runs no cleanup). Files of live processes or of other hosts stay."""
    for e in os.scandir(out_dir):
        if not (e.name.startswith(".") and e.name.endswith(".tmp")):
            continue
        parts = e.name[: -len(".tmp")].rsplit(".", 3)
        if len(parts) != 4 or parts[1] != _HOST_TAG or not parts[2].isdigit():
            continue
        if not _pid_alive(int(parts[2])):
            with contextlib.suppress(OSError):
                os.unlink(e.path)


def _write_atomic(path: Path, writer: Callable[[Any], None]) -> None:
    tmp = _tmp_path(path)
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


def _run_one(task: tuple) -> tuple[int, int, Any, float]:
    """Compute one range; write it to ``path`` if given, else return the arrays.

    Runs wherever the executor puts it, so it limits BLAS to one thread itself."""
    kernel, config, start, stop, seed, name, path, digest = task
    t0 = time.perf_counter()
    with blas_threads(1):
        out = _check_output(kernel(config, start, stop, seed), start, stop, name)
    if path is None:
        return start, stop, out, time.perf_counter() - t0
    _write_shard(Path(path), out, start, stop, seed, digest)
    return start, stop, str(path), time.perf_counter() - t0


def _write_shard(
    path: Path, out: Mapping[str, np.ndarray], start: int, stop: int, seed: int, digest: str
) -> None:
    """Write a shard file atomically, with its metadata and the SHA-256 of its arrays."""
    meta = json.dumps(
        {
            "start": start,
            "stop": stop,
            "seed": seed,
            "digest": digest,
            "sha256": _arrays_sha256(out),
        }
    )

    def writer(f):
        np.savez(f, **out, **{_META_KEY: np.array(meta)})  # pyright: ignore[reportArgumentType]

    _write_atomic(path, writer)


class _BadShard(Exception):
    """A shard file that fails verification; the message says why."""


def _read_shard(path: Path, digest: str, start: int, stop: int) -> dict[str, np.ndarray]:
    """The arrays of a shard file, verified: readable, of this sweep (digest), for
    samples ``[start, stop)``, and equal to the SHA-256 in its metadata. Shards written
    before the hash was recorded are accepted when everything else holds. Raises
    ``_BadShard`` saying what is wrong."""
    try:
        # our own handle: np.load leaves its file open when the zip cannot be read
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as f:
            names = list(f.files)
            if _META_KEY not in names:
                raise _BadShard("it has no metadata")
            meta = json.loads(str(f[_META_KEY]))
            arrays = {k: f[k] for k in names if k != _META_KEY}
    except _BadShard:
        raise
    except Exception as exc:  # truncated, corrupted, not a zip: whatever numpy raises
        raise _BadShard(f"it cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise _BadShard("its metadata is not a JSON object")
    if meta.get("digest") != digest:
        raise _BadShard("it does not belong to this sweep (its sweep digest differs)")
    if meta.get("start") != start or meta.get("stop", stop) != stop:
        raise _BadShard(
            f"its metadata says samples [{meta.get('start')}, {meta.get('stop')}), "
            f"its name [{start}, {stop})"
        )
    if not arrays:
        raise _BadShard("it holds no arrays")
    for k, a in arrays.items():
        if a.ndim < 1 or a.shape[0] != stop - start:
            raise _BadShard(f"array {k!r} has shape {a.shape}, not {stop - start} rows")
    want = meta.get("sha256")
    if want is not None and _arrays_sha256(arrays) != want:
        raise _BadShard("its arrays do not match the SHA-256 in its metadata (edited or corrupted)")
    return arrays


def _verify(path: Path, digest: str, start: int, stop: int) -> str | None:
    """None if the shard file is good, else the reason it is not."""
    try:
        _read_shard(path, digest, start, stop)
    except _BadShard as exc:
        return str(exc)
    return None


def _signature(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a file, None if absent: tells a file replaced since."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


# ------------------------------------------------------------------- execution
_BROKEN = (
    "a sweep worker process died (killed, out of memory, or it could not start: "
    "worker processes are spawned and re-import your main script, so run "
    "scripts that use workers > 1 from a file, under "
    '`if __name__ == "__main__":`; or use workers=1).'
)


def _kernel_name(kernel: Any) -> str:
    """``module.qualname`` of a function, ``partial(...)`` of a partial, else the class."""
    if isinstance(kernel, functools.partial):
        return f"partial({_kernel_name(kernel.func)})"
    qual = getattr(kernel, "__qualname__", None)
    if not isinstance(qual, str):
        qual = f"{type(kernel).__qualname__} instance"
    return f"{getattr(kernel, '__module__', None) or type(kernel).__module__}.{qual}"


def _check_executor(executor: Any) -> Executor | None:
    if executor is None or isinstance(executor, Executor):
        return executor
    raise ValueError(
        "executor must be a concurrent.futures.Executor (a ThreadPoolExecutor, Dask's "
        "Client.get_executor(), mpi4py.futures.MPIPoolExecutor, ...) or None for the "
        f"embedded process pool; got {type(executor).__name__}."
    )


def _resolve_workers_for(workers: Any, executor: Executor | None) -> int:
    """``workers`` as a count; with an executor and ``workers=None``, the executor's
    own width when it tells it (the standard library's pools), else the local cores."""
    if executor is not None and workers is None:
        width = getattr(executor, "_max_workers", None)
        if isinstance(width, int) and width >= 1:
            return width
    return _parallel.resolve_workers(workers)


def _unpicklable(kernel: Any, name: str, exc: BaseException) -> ValueError:
    return ValueError(
        f"sweep {name!r}: its kernel {_kernel_name(kernel)} could not travel to the "
        f"workers ({type(exc).__name__}: {exc}). Kernels sent to worker processes or "
        "another engine's workers are pickled: define the kernel as a module-level "
        "function of an importable module (not a lambda, a nested function or a "
        "function of __main__ run interactively), or compute in this process "
        "(workers=1, or a ThreadPoolExecutor)."
    )


def _is_serialization_error(exc: BaseException, kernel: Any) -> bool:
    """Whether an engine's failure ``exc`` came from pickling: the kernel itself does
    not pickle (asked directly, since the pickler's wording differs between Python
    releases), or ``exc`` (or an exception it was raised from) is a pickling error."""
    if isinstance(exc, (TypeError, AttributeError, pickle.PicklingError)):
        try:
            pickle.dumps(kernel)
        except Exception:
            return True
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, pickle.PicklingError):
            return True
        text = f"{type(e).__name__} {e}".lower()
        if isinstance(e, (TypeError, AttributeError)) and ("pickl" in text or "serializ" in text):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _picklable_first(tasks: Iterable[tuple]) -> Iterator[tuple]:
    """The tasks, after checking that the first one's kernel and config pickle (the
    embedded pool sends them with ``pickle``): a clear error before any worker starts."""
    first = True
    for task in tasks:
        if first:
            first = False
            try:
                pickle.dumps((task[0], task[1]))
            except Exception as exc:
                raise _unpicklable(task[0], task[5], exc) from exc
        yield task


def _execute(
    tasks: Iterable[tuple],
    workers: int,
    pooled: bool,
    inflight: int | None = None,
    executor: Executor | None = None,
) -> Iterator[tuple]:
    """``_run_one`` of every task: in this process in order, in ``executor`` (when given),
    or in the shared pool of ``workers`` processes, as they complete, at most
    ``inflight`` (default ``workers``) submitted at a time, so that ``tasks`` may claim
    its shards lazily."""
    if executor is not None:
        yield from _execute_on(executor, tasks, inflight or workers)
        return
    if not pooled:
        yield from map(_run_one, tasks)
        return
    pool = _parallel.shared_pool(workers)
    try:
        with _parallel.shutdown_on_sigterm(pool):
            yield from _parallel.imap_unordered(
                pool, _run_one, _picklable_first(tasks), inflight=inflight or workers
            )
    except BrokenProcessPool as exc:
        _parallel.drop_shared_pool(workers, kill=True)
        raise RuntimeError(_BROKEN) from exc
    except Exception:
        _parallel.drop_shared_pool(workers)  # do not queue abandoned tasks
        raise
    except BaseException:  # SIGTERM (SystemExit), Ctrl-C, an abandoned generator
        _parallel.drop_shared_pool(workers, kill=True)
        raise


def _execute_on(executor: Executor, tasks: Iterable[tuple], inflight: int) -> Iterator[tuple]:
    """``_run_one`` of every task in a caller's executor, which attnflow neither starts
    nor shuts down. Its workers only compute: each task returns its arrays (through the
    executor, pickled if it sends them elsewhere) and this process writes the shard
    files, so the workers need not see ``out_dir`` and every claim, hash and atomic
    write stays in the process that runs the sweep. Tasks still queued when this stops
    early are cancelled."""
    sent: dict[int, tuple] = {}
    kernel: list[tuple[Any, str]] = []  # the first task's kernel and sweep name

    def bare(it: Iterable[tuple]) -> Iterator[tuple]:
        for task in it:
            sent[task[2]] = task
            if not kernel:
                kernel.append((task[0], task[5]))
            yield (*task[:6], None, None)

    try:
        for start, stop, out, seconds in _parallel.imap_unordered(
            executor, _run_one, bare(tasks), inflight=inflight
        ):
            task = sent.pop(start)
            path = task[6]
            if path is not None:
                _write_shard(Path(path), out, start, stop, task[4], task[7])
                out = path
            yield start, stop, out, seconds
    except Exception as exc:
        if kernel and _is_serialization_error(exc, kernel[0][0]):
            raise _unpicklable(kernel[0][0], kernel[0][1], exc) from exc
        raise


def _progress_bar(progress: bool, total: int, initial: int, desc: str, unit: str) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, unit_scale=True, smoothing=0.1)


# ---------------------------------------------------------------- in memory
def compute(
    sweep: Sweep,
    *,
    workers: int | None = 1,
    progress: bool = False,
    chunk: int | None = None,
    executor: Executor | None = None,
) -> SweepData:
    """Run the whole sweep in memory and return the concatenated arrays.

    The result does not depend on ``workers``, ``chunk`` or ``executor``.

    Args:
        sweep: the ``Sweep``.
        workers: processes to spread the chunks over (1: in this process; None: one per
            available core). With an ``executor``, the number of its workers to keep
            busy: up to ``2 * workers`` chunks are submitted at a time (None: the
            executor's ``max_workers`` when it is a standard-library pool, else the
            cores of this machine).
        progress: show a tqdm progress bar (samples) on stderr.
        chunk: samples per kernel call (default: at most ``shard_size``, small enough to
            give every worker a few chunks, a multiple of ``sweep.align``).
        executor: a ``concurrent.futures.Executor`` to run the chunks in (a thread pool,
            Dask's ``Client.get_executor()``, ``mpi4py.futures.MPIPoolExecutor``...),
            used as it is and not shut down; None: in this process or attnflow's own
            process pool, by ``workers``. A kernel sent to other processes must pickle
            (ValueError naming it otherwise); its arrays come back the same way.

    Returns:
        A ``SweepData`` with every array of shape ``(size, ...)``.
    """
    executor = _check_executor(executor)
    workers = _resolve_workers_for(workers, executor)
    n = sweep.size
    if chunk is None:
        want = -(-n // (4 * workers))
        chunk = min(sweep.shard_size, max(want, 1))
        chunk = max(sweep.align, -(-chunk // sweep.align) * sweep.align)
    chunk = _checks.integer("chunk", chunk, lo=1)
    tasks = [
        (sweep.kernel, dict(sweep.config), s, min(s + chunk, n), sweep.seed, sweep.name, None, None)
        for s in range(0, n, chunk)
    ]
    parts = {}
    bar = _progress_bar(progress, n, 0, sweep.name, sweep.unit)
    try:
        # nothing is claimed here: keep a second task queued per worker (no idle gap)
        pooled = workers > 1 and len(tasks) > 1
        for start, stop, arrays, _ in _execute(tasks, workers, pooled, 2 * workers, executor):
            parts[start] = arrays
            if bar is not None:
                bar.update(stop - start)
    finally:
        if bar is not None:
            bar.close()
    return SweepData(_concat([parts[s] for s in sorted(parts)], sweep.name), sweep.manifest())


def _concat(parts: Sequence[dict], name: str) -> dict[str, np.ndarray]:
    keys = list(parts[0])
    for p in parts[1:]:
        if list(p) != keys:
            raise ValueError(
                f"sweep {name!r}: shards hold different arrays ({sorted(keys)} vs {sorted(p)})."
            )
    return {k: np.concatenate([p[k] for p in parts], axis=0) for k in keys}


# -------------------------------------------------------------------- manifest
def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of the sweep stored in ``out_dir`` (ValueError if there is none)."""
    p = Path(out_dir) / MANIFEST
    if not p.is_file():
        raise ValueError(
            f"{str(out_dir)!r} holds no sweep (no {MANIFEST}); run the sweep "
            f"with this output directory first."
        )
    for attempt in range(50):
        text = p.read_text()
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            # a manifest being created without hard links is empty for a moment
            if attempt < 49 and not text.strip() and time.time() - p.stat().st_mtime < 5:
                time.sleep(0.05)
                continue
            raise ValueError(
                f"{str(p)!r} is not valid JSON ({exc}); delete the directory or choose another one."
            ) from None
    raise AssertionError("unreachable")  # pragma: no cover


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
    diff = [k for k in _IDENTITY if old.get(k) != man[k]]
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


def _prepare_dir(sweep: Sweep, out_dir: Path) -> dict:
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


def _present(out_dir: Path) -> set[tuple[int, int]]:
    """The ``(start, stop)`` ranges of the shard files in ``out_dir`` (by name only)."""
    found = set()
    with os.scandir(out_dir) as it:
        for e in it:
            m = _SHARD_RE.match(e.name)
            if m:
                found.add((int(m.group(1)), int(m.group(2))))
    return found


# ----------------------------------------------------------------------- claims
def _pid_alive(pid: int) -> bool:
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


def _read_claim(path: Path) -> dict | None:
    """A claim's content, or None (gone, or still being written)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


class _Claims:
    """The shard claims of one run: created exclusively, refreshed by a heartbeat
    thread while held, released when done."""

    def __init__(self, stale_after: float):
        self.stale_after = float(stale_after)
        self.held: dict[Path, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, path: Path) -> bool:
        """Claim ``path``; False if another live run holds it."""
        for _ in range(4):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = _read_claim(path)
                if not self._stale(path, info) or not self._take_over(path, info):
                    return False
                continue
            token = uuid.uuid4().hex
            _LIVE_TOKENS.add(token)
            with os.fdopen(fd, "w") as f:
                json.dump(
                    {"pid": os.getpid(), "host": _HOST, "token": token, "time": time.time()}, f
                )
            with self._lock:
                self.held[path] = token
            self._start_heartbeat()
            return True
        return False

    def remove_stale(self, path: Path) -> None:
        """Remove the claim at ``path`` if it is stale."""
        info = _read_claim(path)
        if self._stale(path, info):
            self._take_over(path, info)

    def _stale(self, path: Path, info: dict | None) -> bool:
        if info is not None and info.get("host") == _HOST and isinstance(info.get("pid"), int):
            if info["pid"] == os.getpid():
                return info.get("token") not in _LIVE_TOKENS
            if not _pid_alive(info["pid"]):
                return True
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return True
        return age > self.stale_after

    @staticmethod
    def _take_over(path: Path, info: dict | None) -> bool:
        """Remove the stale claim ``info`` at ``path``; False if another run replaced it
        meanwhile (then it is put back)."""
        aside = path.with_name(f"{path.name}.{uuid.uuid4().hex}.stale")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True
        moved = _read_claim(aside)
        if info is not None and moved is not None and moved.get("token") != info.get("token"):
            with contextlib.suppress(OSError):
                os.link(aside, path)  # a fresh claim of another run: give it back
            with contextlib.suppress(OSError):
                os.unlink(aside)
            return False
        with contextlib.suppress(OSError):
            os.unlink(aside)
        return True

    def release(self, path: Path) -> None:
        """Remove our claim at ``path`` (if it is still ours)."""
        with self._lock:
            token = self.held.pop(path, None)
        if token is None:
            return
        _LIVE_TOKENS.discard(token)
        info = _read_claim(path)
        if info is not None and info.get("token") == token:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        """Release every claim and stop the heartbeat."""
        self._stop.set()
        for path in list(self.held):
            with contextlib.suppress(OSError):
                self.release(path)

    def _start_heartbeat(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._beat, name="attnflow-sweep-claims", daemon=True
            )
            self._thread.start()

    def _beat(self) -> None:
        period = min(30.0, self.stale_after / 10)
        while not self._stop.wait(period):
            with self._lock:
                paths = list(self.held)
            for p in paths:
                with contextlib.suppress(OSError):
                    os.utime(p)


# ---------------------------------------------------------------------- on disk
def run(
    sweep: Sweep,
    out_dir: str | os.PathLike,
    *,
    shard: str | tuple[int, int] | None = None,
    shards: Sequence[int] | None = None,
    workers: int | None = 1,
    progress: bool = False,
    wait: bool = True,
    executor: Executor | None = None,
) -> RunReport:
    """Compute this job's shards of ``sweep`` into ``out_dir``, skipping the good ones.

    Every shard file already on disk is verified (readable, of this sweep, its arrays
    equal to the SHA-256 in its metadata); bad ones are recomputed and named in a
    ``BadShardWarning``. Shards are claimed one at a time just before they are computed,
    so concurrent runs into one directory split the work.

    Args:
        sweep: the ``Sweep``.
        out_dir: the shard directory (created if needed). If it already holds a sweep,
            its identity (name, config, size, seed, shard_size) must match, else
            ValueError before anything is computed.
        shard: ``"i/N"`` or ``(i, N)``: run only the i-th of N contiguous slices of the
            shards (a job array); None runs all of them.
        shards: alternatively, the explicit shard numbers to run (``0 .. n_shards - 1``),
            e.g. a slice of several sweeps' shards taken together.
        workers: processes computing shards concurrently (1: this process; None: one per
            available core). With an ``executor``, only the number of shards in flight
            (claimed and submitted at a time): give the engine's worker count (None: the
            executor's ``max_workers`` when it is a standard-library pool, else the cores
            of this machine). A crash loses at most the ``workers`` shards in flight.
        progress: show a tqdm progress bar (samples) on stderr.
        wait: when another run is computing some of this job's shards, wait for them
            (taking over those whose run dies); False returns at once, listing them in
            ``busy``.
        executor: a ``concurrent.futures.Executor`` to compute the shards in (a thread
            pool, Dask's ``Client.get_executor()``, ``mpi4py.futures.MPIPoolExecutor``,
            ...), used as it is and not shut down; None: in this process or attnflow's
            own process pool, by ``workers``. Its tasks only compute (each with one BLAS
            thread) and send their arrays back; this process claims the shards, checks
            and writes the files, so the engine's workers need not see ``out_dir``. A
            kernel sent to other processes must pickle (ValueError naming it otherwise).

    Returns:
        A ``RunReport``; ``merge(out_dir)`` gives the arrays once ``complete``.
    """
    t0 = time.perf_counter()
    out_dir = _checks.output_dir("out_dir", out_dir)
    executor = _check_executor(executor)
    workers = _resolve_workers_for(workers, executor)
    parsed = parse_shard(shard)
    if shards is not None:
        if parsed is not None:
            raise ValueError("give shard ('i/N') or shards (explicit numbers), not both.")
        hi = sweep.n_shards - 1
        selected = sorted({_checks.integer("shards", k, lo=0, hi=hi) for k in shards})
    else:
        selected = list(shard_slice(sweep.n_shards, parsed))
    man = _prepare_dir(sweep, out_dir)
    digest = str(man["digest"])

    def path_of(k: int) -> Path:
        return out_dir / _shard_name(*sweep.shard_range(k))

    def claim_of(k: int) -> Path:
        return out_dir / (_shard_name(*sweep.shard_range(k)) + _CLAIM)

    # what is on disk, verified (after removing what killed runs of this host left)
    _remove_dead_tmp(out_dir)
    names = _present(out_dir)
    claimed = {e.name for e in os.scandir(out_dir) if e.name.endswith(_CLAIM)}
    claims = _Claims(CLAIM_STALE_SECONDS)
    skipped: list[int] = []
    todo: list[int] = []
    bad: list[str] = []
    seen: dict[int, tuple[int, int, int] | None] = {}  # the file we judged, per shard
    for k in selected:
        s, e = sweep.shard_range(k)
        if (s, e) in names:
            seen[k] = _signature(path_of(k))
            reason = _verify(path_of(k), digest, s, e)
            if reason is None:
                skipped.append(k)
                if claim_of(k).name in claimed:  # left by a run that died after writing
                    claims.remove_stale(claim_of(k))
                continue
            bad.append(f"{path_of(k).name}: {reason}")
        else:
            seen[k] = None
        todo.append(k)
    if bad:
        warnings.warn(
            f"{str(out_dir)!r}: {len(bad)} shard file(s) failed verification and are "
            "recomputed: " + "; ".join(bad),
            BadShardWarning,
            stacklevel=2,
        )

    def written_meanwhile(k: int) -> bool:
        """A good shard ``k`` appeared since we looked (another run wrote it)."""
        sig = _signature(path_of(k))
        if sig is None or sig == seen[k]:
            return False
        seen[k] = sig
        return _verify(path_of(k), digest, *sweep.shard_range(k)) is None

    computed: list[int] = []
    others: list[int] = []
    busy: list[int] = []
    sel_total = sum(e - s for s, e in map(sweep.shard_range, selected))
    done = sum(e - s for s, e in map(sweep.shard_range, skipped))
    bar = _progress_bar(progress, int(sel_total), int(done), sweep.name, sweep.unit)

    def advance(k: int) -> None:
        if bar is not None:
            s, e = sweep.shard_range(k)
            bar.update(e - s)

    def tasks(pending: list[int], held_elsewhere: list[int]) -> Iterator[tuple]:
        for k in pending:
            if written_meanwhile(k):
                others.append(k)
                advance(k)
                continue
            if not claims.acquire(claim_of(k)):
                held_elsewhere.append(k)
                continue
            if written_meanwhile(k):  # finished by another run just before our claim
                claims.release(claim_of(k))
                others.append(k)
                advance(k)
                continue
            s, e = sweep.shard_range(k)
            yield (
                sweep.kernel,
                dict(sweep.config),
                s,
                e,
                sweep.seed,
                sweep.name,
                str(path_of(k)),
                digest,
            )

    by_start = {sweep.shard_range(k)[0]: k for k in todo}
    try:
        pending = todo
        while pending:
            held_elsewhere: list[int] = []
            pooled = workers > 1 and len(pending) > 1
            jobs = tasks(pending, held_elsewhere)
            for start, _, _, _ in _execute(jobs, workers, pooled, executor=executor):
                k = by_start[start]
                claims.release(claim_of(k))
                computed.append(k)
                advance(k)
            pending = held_elsewhere
            if pending and not wait:
                busy = sorted(pending)
                break
            if pending:
                time.sleep(_POLL_SECONDS)
    finally:
        claims.close()
        if bar is not None:
            bar.close()
    names = _present(out_dir)
    missing = sum(1 for k in range(sweep.n_shards) if sweep.shard_range(k) not in names)
    return RunReport(
        out_dir=out_dir,
        n_shards=sweep.n_shards,
        selected=selected,
        computed=sorted(computed),
        skipped=skipped,
        complete=missing == 0,
        missing=missing,
        seconds=time.perf_counter() - t0,
        others=sorted(others),
        busy=busy,
        bad=bad,
    )


def merge(out_dir: str | os.PathLike, *, expect: Sweep | None = None) -> SweepData:
    """Concatenate the shards in ``out_dir`` in index order, each verified.

    Temporary files left by a crash and claim files are ignored.

    Args:
        out_dir: the shard directory of a sweep.
        expect: if given, the stored sweep must have this identity (else ValueError).

    Returns:
        A ``SweepData`` with every array of shape ``(size, ...)``.

    Raises:
        ValueError: if any shard is missing (saying how many and which), or any shard
            file fails verification (naming every bad file and why: unreadable, from
            another sweep, or its arrays differ from the SHA-256 in its metadata).
    """
    out_dir = Path(out_dir)
    man = read_manifest(out_dir)
    if expect is not None:
        want = expect.manifest()
        diff = [k for k in _IDENTITY if man.get(k) != want[k]]
        if diff:
            raise ValueError(
                f"{str(out_dir)!r} holds a different sweep (differs in {', '.join(diff)})."
            )
    size, shard_size = int(man["size"]), int(man["shard_size"])
    ranges = [(s, min(s + shard_size, size)) for s in range(0, size, shard_size)]
    present = _present(out_dir)
    missing = [r for r in ranges if r not in present]
    if missing:
        shown = ", ".join(f"[{s}, {e})" for s, e in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(
            f"{str(out_dir)!r} is incomplete: {len(missing)} of {len(ranges)} "
            f"shards missing (samples {shown}{more}); rerun the sweep with the "
            f"same parameters (it resumes) or run the missing --shard slices."
        )
    parts, bad = [], []
    for s, e in ranges:
        path = out_dir / _shard_name(s, e)
        try:
            parts.append(_read_shard(path, str(man["digest"]), s, e))
        except _BadShard as exc:
            bad.append(f"{str(path)!r}: {exc}")
    if bad:
        raise ValueError(
            f"{len(bad)} shard file(s) in {str(out_dir)!r} failed verification: "
            + "; ".join(bad)
            + ". Rerun the sweep with the same parameters: it recomputes them."
        )
    return SweepData(_concat(parts, str(man.get("name"))), man)
