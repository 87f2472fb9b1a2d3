"""Sweeps: sampling studies that shard over devices and machines and resume after a crash.

A *sweep* is ``size`` independent samples with global indices ``0 .. size - 1``, computed
by a *kernel*, a pure function

    kernel(config, start, stop, seed) -> {name: array with leading axis stop - start}

whose row ``i`` depends only on ``(config, seed, start + i)`` -- never on ``start`` or
``stop`` themselves. Draw randomness per sample (``rng(seed, ..., index)``) or per fixed
block of samples (``rng(seed, ..., index // block)``, then slice), never from one stream
for the whole range. Then every split of the index range (shards, chunks, job-array
slices, worker processes, devices) gives the same numbers, bit for bit.

On disk (``run``), the index range is cut into shards of ``shard_size`` samples; each
shard is one file, written atomically (a temporary file, fsync, ``os.replace``), so a
crash loses at most the shards in flight. Rerunning skips the shards already written;
``shard=(i, N)`` runs the ``i``-th of ``N`` contiguous slices of the shards (a job array
on many machines writing into one shared directory); ``merge`` concatenates the shards
in index order and refuses if any is missing. Layout of ``out_dir``::

    manifest.json                     name, config, size, seed, shard_size, versions
    shard-0000000000-0000001024.npz   the kernel's arrays for samples [0, 1024)
    ...

In memory (``compute``), the same kernel runs over chunks and the arrays are
concatenated; the chunking does not change the numbers.

Parallelism. ``workers > 1`` runs shards (or chunks) concurrently in a pool of spawned
worker processes, each with one BLAS/OpenMP thread (``OPENBLAS_NUM_THREADS=1`` etc.), so
that ``workers`` processes use ``workers`` cores without oversubscription; kernel calls
in this process run with one OpenBLAS thread as well (``blas_threads(1)``), so the
rounding is the same wherever a sample is computed. That is the right "device" for host
LAPACK work (non-symmetric eigenvalues have no accelerator implementation in JAX).
Kernels that compute with JAX call ``map_devices`` instead, which shards a batch over all
local JAX devices (padded to the device count) and returns the unpadded result.

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
``blas_threads``, ``parse_shard``, ``shard_slice``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._meta import run_metadata

__all__ = [
    "Sweep",
    "SweepData",
    "RunReport",
    "compute",
    "run",
    "merge",
    "read_manifest",
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
# Identity of a sweep on disk: a directory holds shards of exactly one of these.
_IDENTITY = ("name", "config", "size", "seed", "shard_size")
# One thread per worker process for the usual BLAS/OpenMP runtimes.
_WORKER_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "BLIS_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


# ----------------------------------------------------------------------- helpers
def _nonneg_int(name: str, value, *, minimum: int = 0) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}.")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {v}.")
    return v


def rng(seed: int, *key: int) -> np.random.Generator:
    """The random stream of one sample (or one block of samples).

    ``seed``: the sweep's seed, an integer >= 0. ``key``: integers >= 0 naming the stream,
    e.g. ``(study_tag, d, stream, index)``. Returns
    ``np.random.Generator(PCG64(SeedSequence([seed, *key])))``: streams with different
    keys are statistically independent, and a sample's stream does not depend on which
    shard, chunk or worker computes it.
    """
    ints = [_nonneg_int("seed", seed)]
    for k in key:
        ints.append(_nonneg_int("rng key", k))
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
        ints = [_nonneg_int("seed", seed)] + [_nonneg_int("rng key", k) for k in key]
        self._bg = np.random.PCG64(np.random.SeedSequence(ints))
        self._base = self._bg.state
        self._gen = np.random.Generator(self._bg)

    def __getitem__(self, j: int) -> np.random.Generator:
        j = _nonneg_int("substream index", j)
        self._bg.state = self._base
        if j:
            self._bg.advance(j << 64)
        return self._gen


def sample_key(seed: int, index: int):
    """A ``jax.random`` key for sample ``index`` of a sweep seeded with ``seed``.

    ``fold_in(fold_in(key(seed), index >> 32), index & 0xffffffff)``, so indices beyond
    2**32 are fine; for JAX kernels that draw their randomness with ``jax.random``.
    """
    import jax

    index = _nonneg_int("index", index)
    k = jax.random.key(_nonneg_int("seed", seed))
    k = jax.random.fold_in(k, index >> 32)
    return jax.random.fold_in(k, index & 0xFFFFFFFF)


def parse_shard(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """Parse ``"i/N"`` (0 <= i < N) into ``(i, N)``; ``None`` stays ``None``."""
    if text is None:
        return None
    if isinstance(text, tuple):
        i, n = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise ValueError(
                f"shard must look like 'i/N' with 0 <= i < N (e.g. '0/4'); got {text!r}."
            )
        i, n = int(m.group(1)), int(m.group(2))
    if not (isinstance(i, (int, np.integer)) and isinstance(n, (int, np.integer))):
        raise ValueError(f"shard must be two integers (i, N); got {text!r}.")
    if n < 1 or not 0 <= i < n:
        raise ValueError(
            f"shard i/N needs N >= 1 and 0 <= i < N (job i of N counts from 0); got {i}/{n}."
        )
    return int(i), int(n)


def shard_slice(n_shards: int, shard: tuple[int, int] | None) -> range:
    """The shard numbers that job ``i`` of ``N`` runs: the ``i``-th of ``N`` contiguous,
    nearly equal slices of ``range(n_shards)`` (all of them when ``shard`` is None)."""
    if shard is None:
        return range(n_shards)
    i, n = parse_shard(shard)
    return range(i * n_shards // n, (i + 1) * n_shards // n)


# ------------------------------------------------------------------------ sweep
@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sampling study: ``size`` samples of ``kernel`` under ``config`` and ``seed``.

    Arguments:
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
        object.__setattr__(self, "size", _nonneg_int("size", self.size, minimum=1))
        object.__setattr__(self, "seed", _nonneg_int("seed", self.seed))
        object.__setattr__(
            self, "shard_size", _nonneg_int("shard_size", self.shard_size, minimum=1)
        )
        object.__setattr__(self, "align", _nonneg_int("align", self.align, minimum=1))

    @property
    def n_shards(self) -> int:
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

    arrays: dict[str, np.ndarray]
    manifest: dict

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def size(self) -> int:
        return int(self.manifest["size"])


@dataclasses.dataclass
class RunReport:
    """What ``run`` did in ``out_dir``: shard numbers ``selected`` for this job (all, or
    slice i of N), of which ``computed`` were computed now and ``skipped`` were already on
    disk; ``complete`` says whether every shard of the sweep (all jobs) is on disk now."""

    out_dir: Path
    n_shards: int
    selected: list[int]
    computed: list[int]
    skipped: list[int]
    complete: bool
    missing: int
    seconds: float

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
        }


# ------------------------------------------------------------------ BLAS threads
_BLAS_SETTERS: dict[str, Any] = {}


def _openblas_thread_setters() -> list:
    """``openblas_set_num_threads_local`` of every OpenBLAS loaded in this process
    (numpy's, scipy's, ...), found through /proc/self/maps; [] where unavailable."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower()}
    except OSError:  # not Linux
        return []
    for p in sorted(paths):
        if p in _BLAS_SETTERS or not p.startswith("/"):
            continue
        fn = None
        with contextlib.suppress(OSError, AttributeError):
            fn = ctypes.CDLL(p).openblas_set_num_threads_local  # OpenBLAS >= 0.3.27
            fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        _BLAS_SETTERS[p] = fn
    return [fn for p, fn in _BLAS_SETTERS.items() if fn is not None and p in paths]


@contextlib.contextmanager
def blas_threads(n: int | None):
    """Run this thread's BLAS calls on ``n`` threads inside the block (OpenBLAS's
    thread-local setting, restored on exit; other threads and BLAS libraries are not
    touched). ``None`` does nothing.

    Sweeps use ``n = 1`` for every kernel call: worker processes are the parallelism,
    one BLAS thread gives the same rounding in this process as in the workers, and it
    avoids OpenBLAS's spinning threads, which on a busy machine made ``geev`` at d = 128
    up to 40 times slower in our measurements.
    """
    if n is None:
        yield
        return
    n = _nonneg_int("blas threads", n, minimum=1)
    setters = _openblas_thread_setters()
    prev = [fn(n) for fn in setters]
    try:
        yield
    finally:
        for fn, p in zip(setters, prev):
            fn(p)


# ------------------------------------------------------------------ kernel calls
def _check_output(out, start: int, stop: int, name: str) -> dict[str, np.ndarray]:
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


def _write_atomic(path: Path, writer: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
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


def _run_one(task) -> tuple[int, int, Any, float]:
    """Compute one range; write it to ``path`` if given, else return the arrays."""
    kernel, config, start, stop, seed, name, path, digest = task
    t0 = time.perf_counter()
    with blas_threads(1):
        out = _check_output(kernel(config, start, stop, seed), start, stop, name)
    if path is None:
        return start, stop, out, time.perf_counter() - t0
    meta = json.dumps({"start": start, "stop": stop, "seed": seed, "digest": digest})

    def writer(f):
        np.savez(f, **out, **{_META_KEY: np.array(meta)})

    _write_atomic(Path(path), writer)
    return start, stop, str(path), time.perf_counter() - t0


# ------------------------------------------------------------------- worker pool
_POOLS: dict[int, Any] = {}


@contextlib.contextmanager
def _worker_environment():
    """One BLAS/OpenMP thread in processes started inside this block (the libraries
    read these variables when they load, so they must be in a child's environment from
    the start)."""
    saved = {k: os.environ.get(k) for k in _WORKER_ENV}
    os.environ.update(_WORKER_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pool(workers: int):
    """A cached ``ProcessPoolExecutor`` of ``workers`` spawned processes."""
    from concurrent.futures import ProcessPoolExecutor

    pool = _POOLS.get(workers)
    if pool is None:
        # spawn, never fork: forking a process in which JAX runs threads can deadlock.
        pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")
        )
        _POOLS[workers] = pool
    return pool


def _drop_pool(workers: int) -> None:
    pool = _POOLS.pop(workers, None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


@atexit.register
def _close_pools() -> None:
    for w in list(_POOLS):
        with contextlib.suppress(Exception):
            _POOLS.pop(w).shutdown(wait=True, cancel_futures=True)


# A process started by multiprocessing (a worker of `attnflow figures --jobs`, say) ends
# with os._exit: atexit handlers never run there, and multiprocessing joins the
# process's children first, so a cached pool's idle workers would keep it alive for
# ever. Finalizers with a priority >= 0 run before that join, highest first: above the
# pool's own queues (priority 10), whose closing would swallow the workers' stop signals.
multiprocessing.util.Finalize(None, _close_pools, exitpriority=100)


def _resolve_workers(workers) -> int:
    if workers is None:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)
    return _nonneg_int("workers", workers, minimum=1)


def _in_pool(tasks: list, workers: int) -> Iterable:
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    pool = _pool(workers)
    try:
        with _worker_environment():  # worker processes start during submit
            futures = [pool.submit(_run_one, t) for t in tasks]
        for fut in as_completed(futures):
            yield fut.result()
    except BrokenProcessPool as exc:
        _drop_pool(workers)
        raise RuntimeError(
            "a sweep worker process died (killed, out of memory, or it could not start: "
            "worker processes are spawned and re-import your main script, so run "
            "scripts that use workers > 1 from a file, under "
            '`if __name__ == "__main__":`; or use workers=1).'
        ) from exc
    except BaseException:
        _drop_pool(workers)  # do not leave workers computing abandoned tasks
        raise


def _execute(
    tasks: list, workers: int, progress, desc: str, unit: str, total: int, initial: int = 0
) -> Iterable:
    """Run tasks (in order for one worker, as completed for several), with a bar."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total, initial=initial, unit=unit, desc=desc, unit_scale=True, smoothing=0.1
        )
    try:
        it = map(_run_one, tasks) if workers == 1 or len(tasks) <= 1 else _in_pool(tasks, workers)
        for res in it:
            if bar is not None:
                bar.update(res[1] - res[0])
            yield res
    finally:
        if bar is not None:
            bar.close()


# ---------------------------------------------------------------- in memory
def compute(
    sweep: Sweep, *, workers: int | None = 1, progress: bool = False, chunk: int | None = None
) -> SweepData:
    """Run the whole sweep in memory and return the concatenated arrays.

    ``workers``: processes to spread the chunks over (1: in this process; None: one per
    available core). ``chunk``: samples per kernel call (default: at most ``shard_size``,
    small enough to give every worker a few chunks, a multiple of ``sweep.align``).
    The result does not depend on ``workers`` or ``chunk``.
    """
    workers = _resolve_workers(workers)
    n = sweep.size
    if chunk is None:
        want = -(-n // (4 * workers))
        chunk = min(sweep.shard_size, max(want, 1))
        chunk = max(sweep.align, -(-chunk // sweep.align) * sweep.align)
    chunk = _nonneg_int("chunk", chunk, minimum=1)
    tasks = [
        (sweep.kernel, dict(sweep.config), s, min(s + chunk, n), sweep.seed, sweep.name, None, None)
        for s in range(0, n, chunk)
    ]
    parts = {}
    for start, _, arrays, _ in _execute(tasks, workers, progress, sweep.name, sweep.unit, n):
        parts[start] = arrays
    return SweepData(_concat([parts[s] for s in sorted(parts)], sweep.name), sweep.manifest())


def _concat(parts: Sequence[dict], name: str) -> dict[str, np.ndarray]:
    keys = list(parts[0])
    for p in parts[1:]:
        if list(p) != keys:
            raise ValueError(
                f"sweep {name!r}: shards hold different arrays ({sorted(keys)} vs {sorted(p)})."
            )
    return {k: np.concatenate([p[k] for p in parts], axis=0) for k in keys}


# ---------------------------------------------------------------------- on disk
def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of the sweep stored in ``out_dir`` (ValueError if there is none)."""
    p = Path(out_dir) / MANIFEST
    if not p.is_file():
        raise ValueError(
            f"{str(out_dir)!r} holds no sweep (no {MANIFEST}); run the sweep "
            f"with this output directory first."
        )
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{str(p)!r} is not valid JSON ({exc}); delete the directory or choose another one."
        ) from None


def _prepare_dir(sweep: Sweep, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    man = sweep.manifest()
    p = out_dir / MANIFEST
    if p.exists():
        old = read_manifest(out_dir)
        diff = [k for k in _IDENTITY if old.get(k) != man[k]]
        if diff:
            detail = "; ".join(f"{k}: stored {old.get(k)!r}, asked {man[k]!r}" for k in diff)
            raise ValueError(
                f"{str(out_dir)!r} holds a different sweep ({detail}); use the "
                f"same parameters to resume it, or another output directory."
            )
        return old
    text = json.dumps(man, indent=2, sort_keys=True) + "\n"
    _write_atomic(p, lambda f: f.write(text.encode()))
    return man


def _present(out_dir: Path) -> set[tuple[int, int]]:
    found = set()
    with os.scandir(out_dir) as it:
        for e in it:
            m = _SHARD_RE.match(e.name)
            if m:
                found.add((int(m.group(1)), int(m.group(2))))
    return found


def run(
    sweep: Sweep,
    out_dir: str | os.PathLike,
    *,
    shard: str | tuple[int, int] | None = None,
    shards: Sequence[int] | None = None,
    workers: int | None = 1,
    progress: bool = False,
) -> RunReport:
    """Compute this job's shards of ``sweep`` into ``out_dir``, skipping those on disk.

    Arguments:
        sweep: the ``Sweep``.
        out_dir: the shard directory (created if needed). If it already holds a sweep,
            its identity (name, config, size, seed, shard_size) must match, else
            ValueError.
        shard: ``"i/N"`` or ``(i, N)``: run only the i-th of N contiguous slices of the
            shards (a job array); None runs all of them.
        shards: alternatively, the explicit shard numbers to run (``0 .. n_shards - 1``),
            e.g. a slice of several sweeps' shards taken together.
        workers: processes computing shards concurrently (1: this process; None: one per
            available core). A crash loses at most the ``workers`` shards in flight.
        progress: show a tqdm progress bar (samples) on stderr.

    Returns a ``RunReport``; ``merge(out_dir)`` gives the arrays once ``complete``.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    workers = _resolve_workers(workers)
    shard = parse_shard(shard)
    man = _prepare_dir(sweep, out_dir)
    if shards is not None:
        if shard is not None:
            raise ValueError("give shard ('i/N') or shards (explicit numbers), not both.")
        selected = sorted({_nonneg_int("shards", k) for k in shards})
        if selected and selected[-1] >= sweep.n_shards:
            raise ValueError(f"shards must lie in 0 .. {sweep.n_shards - 1}; got {selected[-1]}.")
    else:
        selected = list(shard_slice(sweep.n_shards, shard))
    present = _present(out_dir)
    todo, skipped = [], []
    for k in selected:
        (skipped if sweep.shard_range(k) in present else todo).append(k)
    tasks = []
    for k in todo:
        s, e = sweep.shard_range(k)
        tasks.append(
            (
                sweep.kernel,
                dict(sweep.config),
                s,
                e,
                sweep.seed,
                sweep.name,
                str(out_dir / _shard_name(s, e)),
                man["digest"],
            )
        )
    sel_total = sum(e - s for s, e in map(sweep.shard_range, selected))
    done = sum(e - s for s, e in map(sweep.shard_range, skipped))
    computed = []
    by_start = {sweep.shard_range(k)[0]: k for k in todo}
    for start, _, _, _ in _execute(
        tasks, workers, progress, sweep.name, sweep.unit, int(sel_total), int(done)
    ):
        computed.append(by_start[start])
    present = _present(out_dir)
    missing = sum(1 for k in range(sweep.n_shards) if sweep.shard_range(k) not in present)
    return RunReport(
        out_dir=out_dir,
        n_shards=sweep.n_shards,
        selected=selected,
        computed=sorted(computed),
        skipped=skipped,
        complete=missing == 0,
        missing=missing,
        seconds=time.perf_counter() - t0,
    )


def merge(out_dir: str | os.PathLike, *, expect: Sweep | None = None) -> SweepData:
    """Concatenate the shards in ``out_dir`` in index order.

    ``expect``: if given, the stored sweep must have this identity (else ValueError).
    Raises ValueError if any shard is missing (saying how many and which), or a shard
    file does not belong to this sweep. Temporary files left by a crash are ignored.
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
    parts = []
    for s, e in ranges:
        path = out_dir / _shard_name(s, e)
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f[_META_KEY])) if _META_KEY in f else {}
            if meta.get("digest") != man["digest"] or meta.get("start") != s:
                raise ValueError(
                    f"shard {str(path)!r} does not belong to the sweep in "
                    f"{str(out_dir)!r}; delete it and rerun."
                )
            parts.append({k: f[k] for k in f.files if k != _META_KEY})
    return SweepData(_concat(parts, str(man.get("name"))), man)


# --------------------------------------------------------------- JAX devices
_JITTED: dict = {}


def map_devices(fn: Callable, *args, devices: Sequence | None = None):
    """Apply a batched JAX function with its batch sharded over devices.

    Arguments:
        fn: maps arrays with a leading batch axis ``b`` to a pytree of arrays with leading
            axis ``b``, row-independently (typically a ``jax.vmap`` of a per-sample
            function; diffrax solves inside should use ``throw=False``, since a throw
            inside a sharded batch can hang).
        *args: arrays of shape ``(b, ...)`` with the same ``b >= 1``.
        devices: the devices to use (default: ``jax.local_devices()``).

    The batch is padded up to a multiple of the device count by repeating its last row (a
    valid input, so padding never creates NaNs), placed with a ``NamedSharding`` over a
    1-D mesh ``("batch",)``, run under ``jax.jit``, and returned as numpy arrays with the
    padding removed. The values do not depend on the device count.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    if not args:
        raise ValueError("map_devices needs at least one batched array argument.")
    arrs = [np.asarray(a) if not isinstance(a, jax.Array) else a for a in args]
    b = arrs[0].shape[0] if arrs[0].ndim else None
    if b is None or b < 1 or any(a.ndim < 1 or a.shape[0] != b for a in arrs):
        raise ValueError(
            f"map_devices: every argument needs the same leading batch size "
            f">= 1; got shapes {[tuple(a.shape) for a in arrs]}."
        )
    devs = list(jax.local_devices() if devices is None else devices)
    if not devs:
        raise ValueError("map_devices: devices is empty.")
    n = len(devs)
    pad = (-b) % n
    if pad:
        arrs = [
            np.concatenate([np.asarray(a), np.repeat(np.asarray(a)[-1:], pad, 0)], 0) for a in arrs
        ]
    mesh = jax.make_mesh((n,), ("batch",), axis_types=(AxisType.Auto,), devices=devs)
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    placed = [jax.device_put(a, sharding) for a in arrs]
    f = _JITTED.get(fn)
    if f is None:
        f = _JITTED[fn] = jax.jit(fn)
    out = f(*placed)
    return jax.tree_util.tree_map(lambda y: np.asarray(y)[:b], out)
