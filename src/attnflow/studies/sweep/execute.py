"""Execution: where kernel calls run (this process, a process pool, any executor).

Contract: every kernel call runs with one BLAS thread (``blas_threads(1)``), wherever it
runs, so that its rounding does not depend on the place; its output is checked
(``check_output``) before anything is written. ``execute`` yields one result per task:
in this process in order, or, unordered, in attnflow's shared pool of worker processes
(loky's, through ``attnflow._parallel``: one BLAS thread each, gone when their parent
dies; a dead worker is a ``RuntimeError`` saying why, SIGTERM and Ctrl-C stop the pool)
or in a caller's ``concurrent.futures.Executor``, used as it is and never shut down. At
most ``inflight`` tasks are submitted at a time, so the task iterator may claim its
shards lazily. A caller's executor only computes: its tasks return their arrays and the
shard files are written in the process that runs the sweep, so every claim, hash and
atomic write stays there. A kernel that cannot travel to other processes is a
``ValueError`` naming it, raised before any worker starts where that can be known. A
task is ``(kernel, config, start, stop, seed, name, path, digest)``; ``path`` None
returns the arrays, else the shard file is written there.
"""

from __future__ import annotations

import functools
import pickle
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ... import _parallel
from ..._parallel import blas_threads
from .spec import check_output
from .store import write_shard

__all__ = ["check_executor", "execute", "resolve_workers_for", "run_one"]


def run_one(task: tuple) -> tuple[int, int, Any, float]:
    """Compute one range; write it to ``path`` if given, else return the arrays.

    Runs wherever the executor puts it, so it limits BLAS to one thread itself."""
    kernel, config, start, stop, seed, name, path, digest = task
    t0 = time.perf_counter()
    with blas_threads(1):
        out = check_output(kernel(config, start, stop, seed), start, stop, name)
    if path is None:
        return start, stop, out, time.perf_counter() - t0
    write_shard(Path(path), out, start, stop, seed, digest)
    return start, stop, str(path), time.perf_counter() - t0


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


def check_executor(executor: Any) -> Executor | None:
    if executor is None or isinstance(executor, Executor):
        return executor
    raise ValueError(
        "executor must be a concurrent.futures.Executor (a ThreadPoolExecutor, Dask's "
        "Client.get_executor(), mpi4py.futures.MPIPoolExecutor, ...) or None for the "
        f"embedded process pool; got {type(executor).__name__}."
    )


def resolve_workers_for(workers: Any, executor: Executor | None) -> int:
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
    """The tasks, after checking that the first one's kernel and config pickle by
    reference, as plain ``pickle`` sends them (loky's cloudpickle would also send a
    lambda, which another engine's workers might not): a clear error before any worker
    starts, and the same rule for every engine."""
    first = True
    for task in tasks:
        if first:
            first = False
            try:
                pickle.dumps((task[0], task[1]))
            except Exception as exc:
                raise _unpicklable(task[0], task[5], exc) from exc
        yield task


def execute(
    tasks: Iterable[tuple],
    workers: int,
    pooled: bool,
    inflight: int | None = None,
    executor: Executor | None = None,
) -> Iterator[tuple]:
    """``run_one`` of every task: in this process in order, in ``executor`` (when given),
    or in the shared pool of ``workers`` processes, as they complete, at most
    ``inflight`` (default ``workers``) submitted at a time, so that ``tasks`` may claim
    its shards lazily."""
    if executor is not None:
        yield from _execute_on(executor, tasks, inflight or workers)
        return
    if not pooled:
        yield from map(run_one, tasks)
        return
    pool = _parallel.shared_pool(workers)
    try:
        with _parallel.shutdown_on_sigterm(pool):
            yield from _parallel.imap_unordered(
                pool, run_one, _picklable_first(tasks), inflight=inflight or workers
            )
    except BrokenProcessPool as exc:
        _parallel.drop_shared_pool(kill=True)
        raise RuntimeError(_BROKEN) from exc
    except Exception:
        _parallel.drop_shared_pool()  # do not queue abandoned tasks
        raise
    except BaseException:  # SIGTERM (SystemExit), Ctrl-C, an abandoned generator
        _parallel.drop_shared_pool(kill=True)
        raise


def _execute_on(executor: Executor, tasks: Iterable[tuple], inflight: int) -> Iterator[tuple]:
    """``run_one`` of every task in a caller's executor, which attnflow neither starts
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
            executor, run_one, bare(tasks), inflight=inflight
        ):
            task = sent.pop(start)
            path = task[6]
            if path is not None:
                write_shard(Path(path), out, start, stop, task[4], task[7])
                out = path
            yield start, stop, out, seconds
    except Exception as exc:
        if kernel and _is_serialization_error(exc, kernel[0][0]):
            raise _unpicklable(kernel[0][0], kernel[0][1], exc) from exc
        raise
