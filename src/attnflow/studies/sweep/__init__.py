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

Parallelism. ``workers > 1`` runs shards (or chunks) concurrently in a pool of worker
processes (loky's reusable executor, through ``attnflow._parallel``), each with one
BLAS/OpenMP thread (``OPENBLAS_NUM_THREADS=1`` etc.), so that ``workers`` processes use
``workers`` cores without oversubscription; workers exit when the process that started
them dies, even by ``kill -9``, and SIGTERM stops them with it. Every kernel call runs
with one BLAS thread (``blas_threads(1)``, for any BLAS that ``threadpoolctl`` knows),
so the rounding is the same wherever a sample is computed. That is the right "device"
for host LAPACK work (non-symmetric eigenvalues have no accelerator implementation in
JAX). Kernels that compute with JAX call ``map_devices`` instead, which shards a batch
over all local JAX devices (padded to the device count) and returns the unpadded result.

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
``read_manifest``, ``check_dir``, ``rng``, ``Substreams``, ``sample_key``,
``map_devices``, ``blas_threads``, ``parse_shard``, ``shard_slice``, ``BadShardWarning``;
also ``MANIFEST`` and ``CLAIM_STALE_SECONDS``.

Modules, one concern each, each stating its contract: ``spec`` (the ``Sweep``, its
identity and validation, the kernel's output contract, the results), ``streams`` (the
random streams), ``store`` (shard files, their hashes, the manifest, atomic writes,
temporary files), ``claims`` (claims with heartbeats, across processes and hosts),
``execute`` (where kernel calls run: this process, the process pool, an executor) and
``runs`` (``compute``, ``run`` and ``merge``, which tie them together).
"""

from __future__ import annotations

from ..._parallel import blas_threads, map_devices
from . import execute, store
from .claims import CLAIM_STALE_SECONDS as CLAIM_STALE_SECONDS
from .runs import compute, merge, run
from .spec import RunReport, Sweep, SweepData, parse_shard, shard_slice
from .store import MANIFEST as MANIFEST
from .store import BadShardWarning, check_dir, read_manifest
from .streams import Substreams, rng, sample_key

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

# The engine's inner names under the spelling its tests read (``attnflow.sweep`` reads
# any name not in ``__all__`` from here, so these stay where they were).
_HOST = store.HOST
_HOST_TAG = store.HOST_TAG
_arrays_sha256 = store.arrays_sha256
_shard_name = store.shard_name
_prepare_dir = store.prepare_dir
_run_one = execute.run_one
