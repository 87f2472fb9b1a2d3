"""The entry points: ``compute`` in memory, ``run`` into a shard directory, ``merge``.

Contract: the numbers never depend on ``workers``, ``chunk``, ``shard``, ``shards`` or
``executor``, only on the ``Sweep`` (see ``streams``). ``run`` verifies every shard
already on disk and recomputes the bad ones (naming them in a ``BadShardWarning``),
claims each shard just before computing it, skips the shards another run wrote
meanwhile, waits for (or, with ``wait=False``, reports as ``busy``) those another live
run is computing, and releases its claims however it stops; a crash loses at most the
shards in flight. ``merge`` returns the arrays in index order only if every shard is
present and verified, else raises naming what is missing or bad.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from ... import _checks
from .claims import CLAIM_STALE_SECONDS, CLAIM_SUFFIX, POLL_SECONDS, Claims
from .execute import check_executor, execute, resolve_workers_for
from .spec import IDENTITY, RunReport, Sweep, SweepData, parse_shard, shard_slice
from .store import (
    BadShard,
    BadShardWarning,
    prepare_dir,
    present,
    read_manifest,
    read_shard,
    remove_dead_tmp,
    shard_name,
    signature,
    verify,
)

__all__ = ["compute", "merge", "run"]


def _progress_bar(progress: bool, total: int, initial: int, desc: str, unit: str) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, unit_scale=True, smoothing=0.1)


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
    executor = check_executor(executor)
    workers = resolve_workers_for(workers, executor)
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
        for start, stop, arrays, _ in execute(tasks, workers, pooled, 2 * workers, executor):
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
    executor = check_executor(executor)
    workers = resolve_workers_for(workers, executor)
    parsed = parse_shard(shard)
    if shards is not None:
        if parsed is not None:
            raise ValueError("give shard ('i/N') or shards (explicit numbers), not both.")
        hi = sweep.n_shards - 1
        selected = sorted({_checks.integer("shards", k, lo=0, hi=hi) for k in shards})
    else:
        selected = list(shard_slice(sweep.n_shards, parsed))
    man = prepare_dir(sweep, out_dir)
    digest = str(man["digest"])

    def path_of(k: int) -> Path:
        return out_dir / shard_name(*sweep.shard_range(k))

    def claim_of(k: int) -> Path:
        return out_dir / (shard_name(*sweep.shard_range(k)) + CLAIM_SUFFIX)

    # what is on disk, verified (after removing what killed runs of this host left)
    remove_dead_tmp(out_dir)
    names = present(out_dir)
    claimed = {e.name for e in os.scandir(out_dir) if e.name.endswith(CLAIM_SUFFIX)}
    claims = Claims(CLAIM_STALE_SECONDS)
    skipped: list[int] = []
    todo: list[int] = []
    bad: list[str] = []
    seen: dict[int, tuple[int, int, int] | None] = {}  # the file we judged, per shard
    for k in selected:
        s, e = sweep.shard_range(k)
        if (s, e) in names:
            seen[k] = signature(path_of(k))
            reason = verify(path_of(k), digest, s, e)
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
        sig = signature(path_of(k))
        if sig is None or sig == seen[k]:
            return False
        seen[k] = sig
        return verify(path_of(k), digest, *sweep.shard_range(k)) is None

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
            for start, _, _, _ in execute(jobs, workers, pooled, executor=executor):
                k = by_start[start]
                claims.release(claim_of(k))
                computed.append(k)
                advance(k)
            pending = held_elsewhere
            if pending and not wait:
                busy = sorted(pending)
                break
            if pending:
                time.sleep(POLL_SECONDS)
    finally:
        claims.close()
        if bar is not None:
            bar.close()
    names = present(out_dir)
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
        diff = [k for k in IDENTITY if man.get(k) != want[k]]
        if diff:
            raise ValueError(
                f"{str(out_dir)!r} holds a different sweep (differs in {', '.join(diff)})."
            )
    size, shard_size = int(man["size"]), int(man["shard_size"])
    ranges = [(s, min(s + shard_size, size)) for s in range(0, size, shard_size)]
    on_disk = present(out_dir)
    missing = [r for r in ranges if r not in on_disk]
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
        path = out_dir / shard_name(s, e)
        try:
            parts.append(read_shard(path, str(man["digest"]), s, e))
        except BadShard as exc:
            bad.append(f"{str(path)!r}: {exc}")
    if bad:
        raise ValueError(
            f"{len(bad)} shard file(s) in {str(out_dir)!r} failed verification: "
            + "; ".join(bad)
            + ". Rerun the sweep with the same parameters: it recomputes them."
        )
    return SweepData(_concat(parts, str(man.get("name"))), man)
