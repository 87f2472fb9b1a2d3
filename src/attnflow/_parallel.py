"""Process pools for attnflow: loky's workers, one BLAS thread each, that die with their parent.

Everything that runs work in other processes goes through here (sweeps' shards and
chunks, ``attnflow figures --jobs``), so every pool is made the same way, on loky's
executors (the process pools under joblib):

- ``process_pool(workers)``: a ``loky.ProcessPoolExecutor`` whose workers are started as
  fresh interpreters (never forked from this one: forking a process in which JAX runs
  threads can deadlock), with ``WORKER_ENV`` (one BLAS/OpenMP thread) in their
  environment from their first instruction, so that ``workers`` processes use
  ``workers`` cores without oversubscription. This process's environment is untouched.
- ``shared_pool(workers)``: loky's reusable executor for this thread, resized to
  ``workers`` (a started worker costs seconds of imports, so sweeps reuse it); loky
  closes it at exit, and in a worker that is itself asked to stop.
- Workers exit when their parent dies, however it dies (``kill -9`` included), even in
  the middle of a task (loky's workers notice only at their next task): on Linux the
  kernel kills them (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, asked for when the pool is
  made in the main thread, since the signal follows the spawning *thread*), and
  everywhere a watchdog thread in each worker polls ``os.getppid()`` and exits once the
  parent is gone.
- ``shutdown_on_sigterm(pool)``: while the block runs, SIGTERM kills the pool's workers
  and raises ``SystemExit(143)`` in the main thread, so that ``finally`` blocks run.
- ``blas_threads(n)``: BLAS calls on ``n`` threads inside a block, for every BLAS loaded
  (OpenBLAS, MKL, BLIS, ...), through ``threadpoolctl``; thread-safe (blocks in several
  threads share one limit), so it also holds for tasks of a thread pool.
- ``imap_unordered(pool, fn, tasks, inflight)``: results as they complete, with at most
  ``inflight`` tasks submitted at a time, so that tasks can be created (claimed) lazily;
  ``pool`` is any ``concurrent.futures.Executor`` (a cluster engine's included).
- ``map_devices(fn, *args)``: a batched JAX function with its batch sharded over devices.

A task is sent to a worker with cloudpickle (loky's pickler): it also sends functions
defined in ``__main__``; callers that record a function by name (sweeps) check that it
pickles by reference first.

Private: below every layer, imports no attnflow module but ``_checks``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from . import _checks

if TYPE_CHECKING:
    from jaxtyping import Array, Shaped
    from loky import ProcessPoolExecutor

__all__ = [
    "WORKER_ENV",
    "available_cores",
    "resolve_workers",
    "blas_threads",
    "process_pool",
    "shared_pool",
    "drop_shared_pool",
    "worker_pids",
    "kill_workers",
    "shutdown_on_sigterm",
    "imap_unordered",
    "map_devices",
]

_T = TypeVar("_T")
_R = TypeVar("_R")

# One thread per worker process for the usual BLAS/OpenMP runtimes.
WORKER_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "BLIS_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}
# Tells a worker whether it may ask the kernel for a parent-death signal (see
# _worker_env); read once by the worker's initializer.
_PDEATHSIG_VAR = "ATTNFLOW_WORKER_PDEATHSIG"
# Use prctl(PR_SET_PDEATHSIG) where available (tests turn it off to check the watchdog).
USE_PDEATHSIG = sys.platform.startswith("linux")
# Seconds between two looks of a worker's watchdog at its parent.
PARENT_POLL_SECONDS = 0.5
# Seconds an idle worker of the shared pool waits for a task before it exits (loky
# starts a new one on the next submit): long enough that a sweep's chunks and the next
# sweep of a script reuse the workers' imports and compiled programs.
SHARED_IDLE_SECONDS = 300


# ------------------------------------------------------------------------ cores
def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_workers(workers: Any, name: str = "workers") -> int:
    """``None`` -> one worker per available core; else an integer >= 1."""
    if workers is None:
        return available_cores()
    return _checks.integer(name, workers, lo=1)


# ------------------------------------------------------------------ BLAS threads
class _Limit:
    """One process-wide BLAS limit, shared by every block that asked for it."""

    def __init__(self, n: int, limiter: Any):
        self.n, self.limiter, self.users = n, limiter, 1


# The limits in force, innermost last. BLAS thread counts are process-wide, so blocks
# entered by several threads at once share one limit (the first sets it, the last one
# out restores it) instead of each saving and restoring the others' setting.
_BLAS_LIMITS: list[_Limit] = []
_BLAS_LOCK = threading.Lock()


@contextlib.contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Run BLAS calls on ``n`` threads inside the block; ``None`` does nothing.

    Every BLAS loaded in this process (OpenBLAS, MKL, BLIS, Accelerate, as
    ``threadpoolctl`` finds them) is limited, process-wide, and its previous setting is
    restored on exit. Sweeps use ``n = 1`` for every kernel call: worker processes are
    the parallelism, one BLAS thread gives the same rounding in this process as in the
    workers, and it avoids OpenBLAS's spinning threads, which on a busy machine made
    ``geev`` at d = 128 up to 40 times slower in our measurements.

    Thread-safe: blocks asking for the same ``n`` in several threads at once (kernels
    run by a thread pool) share one limit, set by the first and restored when the last
    one leaves; a block asking for another ``n`` sets its own limit over it, and the
    limits are undone in the order they were set.

    Args:
        n: threads per BLAS call (an integer >= 1), or None to leave them alone.
    """
    if n is None:
        yield
        return
    n = _checks.integer("blas threads", n, lo=1)
    from threadpoolctl import threadpool_limits

    with _BLAS_LOCK:
        if _BLAS_LIMITS and _BLAS_LIMITS[-1].n == n and _BLAS_LIMITS[-1].users:
            mine = _BLAS_LIMITS[-1]
            mine.users += 1
        else:
            mine = _Limit(n, threadpool_limits(limits=n, user_api="blas"))
            _BLAS_LIMITS.append(mine)
    try:
        yield
    finally:
        with _BLAS_LOCK:
            mine.users -= 1
            # undo the finished limits from the innermost one (a limit left by its
            # blocks while another thread's inner limit is still set waits for it)
            while _BLAS_LIMITS and not _BLAS_LIMITS[-1].users:
                _BLAS_LIMITS.pop().limiter.restore_original_limits()


# ------------------------------------------------------------------ worker side
def _set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when the thread that spawned it exits."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _watch_parent(parent: int, poll: float) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)  # orphaned: the parent died without shutting the pool down
        time.sleep(poll)


def _worker_start(
    parent: int, poll: float, initializer: Callable[..., object] | None, initargs: tuple
) -> None:
    """Initializer of every pool worker: tie its life to the parent's, then run the
    caller's own initializer."""
    if os.environ.get(_PDEATHSIG_VAR) == "1":
        _set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before we could ask for the signal
        os._exit(1)
    threading.Thread(
        target=_watch_parent, args=(parent, poll), name="attnflow-parent-watch", daemon=True
    ).start()
    if initializer is not None:
        initializer(*initargs)


# ------------------------------------------------------------------ parent side
def _worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a worker starts with: one BLAS thread, the caller's ``extra``, and
    whether it may ask for the parent-death signal (only when the pool is made in the
    main thread)."""
    flag = USE_PDEATHSIG and threading.current_thread() is threading.main_thread()
    return {**WORKER_ENV, **(extra or {}), _PDEATHSIG_VAR: "1" if flag else "0"}


def _initargs(initializer: Callable[..., object] | None, initargs: tuple) -> tuple:
    return (os.getpid(), PARENT_POLL_SECONDS, initializer, tuple(initargs))


def process_pool(
    workers: int,
    *,
    initializer: Callable[..., object] | None = None,
    initargs: tuple = (),
    env: dict[str, str] | None = None,
) -> ProcessPoolExecutor:
    """A pool of ``workers`` fresh processes, one BLAS thread each, tied to this process.

    Args:
        workers: the number of worker processes, >= 1.
        initializer: called with ``initargs`` in each worker when it starts (after the
            worker has tied its life to this process); must be picklable.
        initargs: the arguments of ``initializer``.
        env: more variables of the workers' environment (set before their first
            instruction, so that XLA reads them when JAX starts: ``XLA_FLAGS``); this
            process's environment is untouched.

    Returns:
        A ``loky.ProcessPoolExecutor`` (a ``concurrent.futures.Executor``); use it as a
        context manager or call ``shutdown``. Its workers exit if this process dies.
    """
    workers = _checks.integer("workers", workers, lo=1)
    from loky import ProcessPoolExecutor

    return ProcessPoolExecutor(
        max_workers=workers,
        initializer=_worker_start,
        initargs=_initargs(initializer, initargs),
        env=_worker_env(env),
    )


def worker_pids(pool: ProcessPoolExecutor) -> list[int]:
    """The process ids of the pool's live workers (loky keeps them in ``_processes``)."""
    procs = getattr(pool, "_processes", None) or {}
    return [int(p) for p in procs]


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now (SIGKILL, with any processes they started) and shut
    the pool down without waiting; tasks in flight are lost.

    The workers are also sent SIGKILL here, directly: loky kills them from its manager
    thread, and a later ``shutdown()`` (a ``with`` block's exit) that comes before that
    thread has read the request turns it back into a graceful shutdown, which lets the
    running tasks, and the queued ones, run to the end."""
    pids = worker_pids(pool)
    with contextlib.suppress(Exception):
        pool.shutdown(wait=False, kill_workers=True)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------ SIGTERM
_GUARDED: list[ProcessPoolExecutor] = []


def _on_sigterm(signum: int, frame: Any) -> None:
    for pool in list(_GUARDED):
        kill_workers(pool)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def shutdown_on_sigterm(pool: ProcessPoolExecutor) -> Iterator[None]:
    """Inside the block, SIGTERM stops ``pool``'s workers and raises ``SystemExit(143)``.

    Installed only from the main thread and only over the default SIGTERM action (a
    handler of the caller's is left alone); the previous action is restored on exit.

    Args:
        pool: the pool whose workers must not outlive a SIGTERM of this process.
    """
    installed = False
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            installed = True  # an outer block installed it; share it
        elif current == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
            installed = True
    if installed:
        _GUARDED.append(pool)
    try:
        yield
    finally:
        if installed:
            _GUARDED.remove(pool)
            if not _GUARDED and signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)


# ------------------------------------------------------------------ shared pools
# The shared pool last handed out in each thread (loky keeps one reusable executor per
# thread).
_SHARED = threading.local()


def shared_pool(workers: int) -> ProcessPoolExecutor:
    """loky's reusable executor of this thread with ``workers`` processes (started on
    first use, resized or restarted when asked for another count or after a crash)."""
    workers = _checks.integer("workers", workers, lo=1)
    from loky import get_reusable_executor

    pool = get_reusable_executor(
        max_workers=workers,
        timeout=SHARED_IDLE_SECONDS,
        initializer=_worker_start,
        initargs=_initargs(None, ()),
        env=_worker_env(),
    )
    _SHARED.pool = pool
    return pool


def drop_shared_pool(*, kill: bool = False) -> None:
    """Shut this thread's shared pool down without waiting (the tasks it already holds
    finish; ``imap_unordered`` cancels its own queued ones when it stops), or with
    ``kill`` stop its workers; the next ``shared_pool`` starts anew."""
    pool = getattr(_SHARED, "pool", None)
    _SHARED.pool = None
    if pool is None:
        return
    if kill:
        kill_workers(pool)
    else:
        with contextlib.suppress(Exception):
            pool.shutdown(wait=False)


# ------------------------------------------------------------------ scheduling
def imap_unordered(
    pool: Executor,
    fn: Callable[[_T], _R],
    tasks: Iterable[_T],
    *,
    inflight: int,
) -> Iterator[_R]:
    """``fn(task)`` for every task, in the pool, yielded as they complete.

    At most ``inflight`` tasks are submitted at a time and ``tasks`` is read only when a
    slot is free, so a task can be created (a shard claimed, say) just before it runs.
    An exception of a task is raised here. When the iteration stops early (an exception,
    or the generator closed), the tasks still queued are cancelled; those already
    running are left to the caller (shut the pool down or kill its workers).

    Args:
        pool: any ``concurrent.futures.Executor`` whose ``submit`` returns
            ``concurrent.futures.Future`` objects.
        fn: a picklable function of one task.
        tasks: an iterable of picklable tasks, read lazily.
        inflight: tasks submitted at once, >= 1.
    """
    inflight = _checks.integer("inflight", inflight, lo=1)
    it = iter(tasks)
    running: set[Future[_R]] = set()
    exhausted = False
    try:
        while True:
            while not exhausted and len(running) < inflight:
                try:
                    task = next(it)
                except StopIteration:
                    exhausted = True
                    break
                running.add(pool.submit(fn, task))
            if not running:
                return
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:
        for fut in running:
            fut.cancel()


# --------------------------------------------------------------- JAX devices
_JITTED: dict = {}


def map_devices(
    fn: Callable[..., Any],
    *args: Shaped[Array, "b ..."] | Shaped[np.ndarray, "b ..."],
    devices: Sequence[Any] | None = None,
) -> Any:
    """Apply a batched JAX function with its batch sharded over devices.

    The batch is padded up to a multiple of the device count by repeating its last row (a
    valid input, so padding never creates NaNs), placed with a ``NamedSharding`` over a
    1-D mesh ``("batch",)``, run under ``jax.jit``, and returned as numpy arrays with the
    padding removed. The values do not depend on the device count beyond rounding: XLA
    may vectorise a block of 4 rows and one of 7 differently (an ulp apart, seen with
    jax 0.12), so a decision taken on them (a sign, a tie) can differ only at ties.

    Args:
        fn: maps arrays with a leading batch axis ``b`` to a pytree of arrays with leading
            axis ``b``, row-independently (typically a ``jax.vmap`` of a per-sample
            function; diffrax solves inside should use ``throw=False``, since a throw
            inside a sharded batch can hang).
        *args: arrays of shape ``(b, ...)`` with the same ``b >= 1``.
        devices: the devices to use (default: ``jax.local_devices()``).

    Returns:
        ``fn``'s pytree with numpy arrays of leading axis ``b``.
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
