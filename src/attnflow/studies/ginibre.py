"""How generic is the hyperplane theorem? Sampling its hypotheses over real Ginibre matrices.

The hyperplane theorem of Geshkovski, Letrouit, Polyanskiy, Rigollet (2023) needs V's
eigenvalue of largest modulus to be real, positive and simple (``lambda_1 > |lambda_2|``)
-- the *spectral hypothesis* -- and ``<Q phi_1, K phi_1> > 0`` for its eigenvector
``phi_1``; a triple (Q, K, V) satisfying both is a *good triple*. ``ginibre_fraction``
estimates, for V a d x d real Ginibre matrix (iid N(0, 1) entries):

* the fraction satisfying the spectral hypothesis, with a 95% (or any level) Wilson or
  Clopper-Pearson interval -- exactly 1/2 at d = 1 and 1/(2 sqrt 2) at d = 2;
* the fraction of good triples with Q = K = I (equal to the former: ``<phi, phi> > 0``
  for every real eigenvector; computed, not assumed);
* the fraction of good triples with Q, K independent real Ginibre matrices too (half the
  former in expectation: ``Q phi`` and ``K phi`` are independent Gaussian vectors).

Decisions (per sample, ``a = tol * ||V||_F``, default ``tol = d * eps``, eps = 2**-52).
With lambda_1 an eigenvalue of largest modulus and ``m_1 >= m_2 >= m_3`` the sorted
moduli, the spectral hypothesis holds iff

    |Im lambda_1| <= a,   Re lambda_1 > a,   m_1 - m_2 > a.

LAPACK's ``geev`` returns real eigenvalues of a real matrix with imaginary part exactly 0
and complex ones in exact conjugate pairs of equal modulus, so a complex top eigenvalue
always fails the gap test; two eigenvalues closer than ``a`` (including a pair that
rounding split off the real axis) are not certified simple and fail too. ``geev`` is
backward stable (the eigenvalues are exact for ``V + E``, ``||E||_F`` a modest multiple
of ``eps ||V||_F``), so ``a`` is a scale-aware rounding threshold. A sample is
*borderline* if a margin is within ``1000 a`` of its threshold (for a real top:
``|lambda_1|`` or the gap ``m_1 - m_2``; for a complex top: ``|Im lambda_1|`` or the gap
``m_1 - m_3`` to the next eigenvalue): the estimate reports how many there are, so you
can see that the tolerance does not matter (there were none in any of our runs, d = 1 to
256, up to 100,000 samples per d). For good triples, ``phi_1`` (unit norm) comes from two steps
of inverse iteration with the shift ``lambda_1 (1 + sqrt(eps))``, accepted if its
residual is below ``1000 d eps ||V||_F`` (else ``numpy.linalg.eig``), and the triple is
good iff ``<Q phi, K phi> > tol * ||Q||_F ||K||_F``.

Random streams (split-independent): sample ``i``'s V is matrix ``i mod B`` of the block
``rng(seed, TAG, d, 0, i // B)`` (``B = block_size(d)``: 1024 matrices for small d, one
matrix from d = 256; ``numpy.random.Generator.standard_normal``, filled row-major), and
its Q, K are drawn (Q first) from substream ``i mod B`` of the block
``Substreams(seed, TAG, d, 1, i // B)`` (the PCG64 stream advanced by
``(i mod B) 2**64``), only for samples that satisfy the spectral hypothesis.
``ginibre_sample(d, i, seed=...)`` rebuilds any triple.

Throughput, and the choice of "devices". The cost is LAPACK ``dgeev`` (eigenvalues
only). The default backend is numpy: ``numpy.linalg.eigvals`` on stacked batches (one C
loop of ``geev`` calls, no Python per matrix), with drawing and bookkeeping vectorised;
per matrix it costs ``geev`` plus drawing the d^2 Gaussian entries (2-5% of ``geev``
from d = 64 on) plus 1-2%, and far less than a plain loop of ``numpy.linalg.eigvals``
at small d, where that loop is Python overhead. Every kernel call runs with one
OpenBLAS thread (``sweep.blas_threads(1)``: OpenBLAS's spinning threads made ``geev``
10-40 times slower on a busy machine, and one thread everywhere keeps the rounding
identical wherever a sample is computed). Parallelism is a pool of worker processes
(``workers``), one BLAS thread each. On this project's machine (JAX 0.10, 2 cores) the
forced host devices (``--xla_force_host_platform_device_count``) executed one after the
other, so JAX sharding gave no speed-up for this study, while processes use the cores;
and ``jnp.linalg.eigvals`` exists only on CPU anyway. ``backend="jax"``
(``jnp.linalg.eigvals`` sharded over all local JAX devices by ``sweep.map_devices``,
x64 required) is kept for machines where host devices do run concurrently; its
decisions agree with numpy's. BENCHMARKS.md has the measured ratios.

The per-sample work (the random streams, the decisions, the sweep kernel) is in
``_ginibre_kernel``; ``block_size``, ``ginibre_kernel`` and ``KERNEL_VERSION`` are
importable from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

from .. import _checks, _parallel
from .._stats import INTERVALS as INTERVALS
from .._stats import binomial_interval, check_level, interval_name
from . import sweep as _sweep
from ._ginibre_kernel import (
    EPS,
    KERNEL_VERSION,
    block_size,
    generate_QK,
    generate_V,
    ginibre_kernel,
)
from .sweep.store import present as _shards_present

__all__ = [
    "GinibreEstimate",
    "GinibreStudy",
    "Proportion",
    "binomial_interval",
    "block_size",
    "ginibre_curve",
    "ginibre_fraction",
    "ginibre_kernel",
    "ginibre_sample",
    "ginibre_sweep",
    "summarize",
]

PAPER_D, PAPER_FRACTION = 128, 0.14  # Geshkovski et al. 2023: "about 14%" at d = 128
BACKENDS = ("numpy", "jax")
AUTO_POOL_SECONDS = 20.0


# -------------------------------------------------------------------- results
@dataclasses.dataclass(frozen=True)
class Proportion:
    """``count`` successes in ``samples`` trials: ``fraction`` and its interval."""

    count: int
    samples: int
    fraction: float
    low: float
    high: float

    @classmethod
    def of(cls, count: int, samples: int, level: float, method: str) -> Proportion:
        low, high = binomial_interval(count, samples, level=level, method=method)
        return cls(int(count), int(samples), count / samples, low, high)


@dataclasses.dataclass(frozen=True)
class GinibreEstimate:
    """The estimate of ``ginibre_fraction``.

    Fields:
        d, samples, seed: the study (samples = number of Ginibre matrices V).
        count: samples satisfying the spectral hypothesis (lambda_1 real, > 0, simple).
        fraction, low, high: ``count / samples`` and its ``level`` interval (``interval``:
            "wilson" or "clopper-pearson").
        good_identity: ``Proportion`` of good triples with Q = K = I.
        good_ginibre: ``Proportion`` of good triples with Q, K real Ginibre as well.
        borderline: samples whose spectral decision lies within ``1000 * tol * ||V||_F``
            of flipping; ``borderline_ginibre``: same for the sign of <Q phi, K phi>.
        tol: the relative tolerance used (absolute ``tol * ||V||_F``).
        backend: "numpy" or "jax".
    """

    d: int
    samples: int
    seed: int
    count: int
    fraction: float
    low: float
    high: float
    level: float
    interval: str
    good_identity: Proportion
    good_ginibre: Proportion
    borderline: int
    borderline_ginibre: int
    tol: float
    backend: str

    def to_dict(self) -> dict:
        """Plain-JSON form with the same field names (nested dicts for proportions)."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        pct = f"{100 * self.level:g}%"
        return (
            f"d = {self.d:4d}  fraction = {self.fraction:.5f}  {pct} "
            f"[{self.low:.5f}, {self.high:.5f}]  ({self.count}/{self.samples}); "
            f"good triples Q=K=I {self.good_identity.fraction:.5f}, Q,K Ginibre "
            f"{self.good_ginibre.fraction:.5f} [{self.good_ginibre.low:.5f}, "
            f"{self.good_ginibre.high:.5f}]; borderline {self.borderline}"
        )


def summarize(
    arrays,
    *,
    d: int,
    seed: int,
    tol: float,
    backend: str = "numpy",
    level: float = 0.95,
    interval: str = "wilson",
) -> GinibreEstimate:
    """A ``GinibreEstimate`` from the per-sample arrays of ``ginibre_kernel``."""
    n = int(np.asarray(arrays["spectral"]).shape[0])
    interval = interval_name(interval)
    k = int(np.count_nonzero(arrays["spectral"]))
    low, high = binomial_interval(k, n, level=level, method=interval)
    return GinibreEstimate(
        d=int(d),
        samples=n,
        seed=int(seed),
        count=k,
        fraction=k / n,
        low=low,
        high=high,
        level=float(level),
        interval=interval,
        good_identity=Proportion.of(
            int(np.count_nonzero(arrays["good_identity"])), n, level, interval
        ),
        good_ginibre=Proportion.of(
            int(np.count_nonzero(arrays["good_ginibre"])), n, level, interval
        ),
        borderline=int(np.count_nonzero(arrays["borderline"])),
        borderline_ginibre=int(np.count_nonzero(arrays["borderline_ginibre"])),
        tol=float(tol),
        backend=str(backend),
    )


# -------------------------------------------------------------------- samples
def ginibre_sample(
    d: int, index: int, *, seed: int = 0
) -> tuple[Float[np.ndarray, "d d"], Float[np.ndarray, "d d"], Float[np.ndarray, "d d"]]:
    """The triple ``(V, Q, K)`` (each (d, d) float64) of sample ``index`` of the study
    with this ``d`` and ``seed``: exactly the matrices ``ginibre_fraction`` used."""
    d = _checks.integer("d", d, lo=1)
    index = _checks.integer("index", index, lo=0)
    seed = _checks.integer("seed", seed, lo=0)
    V = generate_V(seed, d, index, index + 1)[0]
    Q, K = generate_QK(seed, d, np.array([index]))
    return V, Q[0], K[0]


# ------------------------------------------------------------------ front end
def _seconds_per_matrix(d: int) -> float:
    """Rough single-core cost model of one sample (for shard sizes)."""
    return 1e-6 + 1e-7 * d * d + 2e-9 * d**3


def _auto_workers(workers: int | None, seconds: float) -> int:
    """``None`` -> one worker per available core if the work is estimated at more than
    ``AUTO_POOL_SECONDS`` of one core (a pool costs a few seconds to start), else 1."""
    if workers is not None:
        return workers
    return _parallel.resolve_workers(None) if seconds > AUTO_POOL_SECONDS else 1


def default_shard_size(d: int) -> int:
    """Samples per shard file: about 4 s of one core, a power of 2 in
    [block_size(d), 65536]. Recorded in each sweep's manifest."""
    target = 4.0 / _seconds_per_matrix(d)
    size = 2 ** int(round(math.log2(max(target, 1.0))))
    return int(min(65536, max(block_size(d), size)))


def _check_common(
    d: Any,
    samples: Any,
    seed: Any,
    level: Any,
    interval: Any,
    tol: Any,
    backend: Any,
    workers: Any,
) -> tuple[int, int, int, float, str, float, int | None]:
    d = _checks.integer("d", d, lo=1)
    samples = _checks.integer("samples", samples, lo=1)
    seed = _checks.integer("seed", seed, lo=0)
    level = check_level(level)
    interval = interval_name(interval)
    tol = (
        d * EPS
        if tol is None
        else _checks.number(
            "tol",
            tol,
            lo=0.0,
            hi=1e-2,
            lo_open=True,
            hi_open=True,
            what="a positive number below 1e-2 (a relative rounding tolerance, times ||V||_F; "
            "default d * eps)",
        )
    )
    backend = _checks.choice("backend", backend, BACKENDS)
    if backend == "jax":
        import jax

        if not jax.config.read("jax_enable_x64"):
            raise ValueError(
                "backend='jax' computes in float64 and needs "
                "jax.config.update('jax_enable_x64', True) (or the CLI's "
                "default); or use backend='numpy'."
            )
        if workers not in (1, None):
            raise ValueError(
                "backend='jax' shards over the local JAX devices; use "
                "workers=1 with it (workers > 1 is for backend='numpy')."
            )
        workers = 1
    if workers is not None:
        workers = _checks.integer("workers", workers, lo=1)
    return d, samples, seed, level, interval, tol, workers


def _make_sweep(
    d: int, samples: int, seed: int, tol: float, backend: str, shard_size: int | None
) -> _sweep.Sweep:
    return _sweep.Sweep(
        name="ginibre",
        kernel=ginibre_kernel,
        config={"d": d, "tol": tol, "backend": backend, "version": KERNEL_VERSION},
        size=samples,
        seed=seed,
        shard_size=default_shard_size(d) if shard_size is None else shard_size,
        align=block_size(d),
        unit="matrix",
    )


def ginibre_sweep(
    d: int,
    samples: int,
    *,
    seed: int = 0,
    tol: float | None = None,
    backend: str = "numpy",
    shard_size: int | None = None,
) -> _sweep.Sweep:
    """The ``Sweep`` behind ``ginibre_fraction`` (for ``sweep.run`` / ``sweep.merge``)."""
    d, samples, seed, _, _, tol, _ = _check_common(
        d, samples, seed, 0.95, "wilson", tol, backend, 1
    )
    return _make_sweep(d, samples, seed, tol, backend, shard_size)


def ginibre_fraction(
    d: int,
    samples: int,
    *,
    seed: int = 0,
    level: float = 0.95,
    interval: str = "wilson",
    tol: float | None = None,
    workers: int | None = 1,
    backend: str = "numpy",
    out: str | Path | None = None,
    shard_size: int | None = None,
    progress: bool = False,
) -> GinibreEstimate:
    """Fraction of d x d real Ginibre matrices satisfying the spectral hypothesis of the
    hyperplane theorem (lambda_1 real, positive, simple), with a confidence interval, and
    the fractions of good triples (see the module docstring for the exact decisions).

    Arguments:
        d: the dimension, >= 1.
        samples: the number of matrices, >= 1.
        seed: integer >= 0; the same seed gives the same numbers however the work is
            split (workers, shards, devices, resumption).
        level: confidence level of the intervals, in (0, 1).
        interval: "wilson" (default) or "clopper-pearson" (exact, conservative).
        tol: relative tolerance (times ||V||_F) of the decisions; default ``d * eps``.
        workers: worker processes (1: this process; None: one per available core when
            the work is estimated above ~20 s of one core, else 1). A pool is started on
            first use and reused; call it from under ``if __name__ == "__main__":`` in
            scripts (processes are spawned). The numbers do not depend on it.
        backend: "numpy" (LAPACK via numpy; default) or "jax" (``jnp.linalg.eigvals``
            sharded over the local JAX devices; needs x64).
        out: a directory: run as a resumable on-disk sweep there (shards skipped if
            present; see ``attnflow.sweep``) and merge; None computes in memory.
        shard_size: samples per shard file (default ``default_shard_size(d)``).
        progress: show a progress bar on stderr.

    Returns a ``GinibreEstimate`` (``.fraction, .low, .high, .samples``, ...).
    """
    d, samples, seed, level, interval, tol, workers = _check_common(
        d, samples, seed, level, interval, tol, backend, workers
    )
    sw = _make_sweep(d, samples, seed, tol, backend, shard_size)
    workers = _auto_workers(workers, samples * _seconds_per_matrix(d))
    if out is None:
        data = _sweep.compute(sw, workers=workers, progress=progress)
    else:
        _sweep.run(sw, out, workers=workers, progress=progress)
        data = _sweep.merge(out, expect=sw)
    return summarize(
        data.arrays, d=d, seed=seed, tol=tol, backend=backend, level=level, interval=interval
    )


@dataclasses.dataclass
class GinibreStudy:
    """Result of ``ginibre_curve``: ``results`` (one ``GinibreEstimate`` per d, once the
    sweep is complete; empty otherwise), ``runs`` (a ``sweep.RunReport`` dict per d when
    computed on disk), ``complete``, and the parameters."""

    d: list[int]
    samples: int
    seed: int
    results: list[GinibreEstimate]
    runs: list[dict] | None
    complete: bool
    out: str | None
    shard: str | None

    def to_dict(self) -> dict:
        return {
            "d": self.d,
            "samples": self.samples,
            "seed": self.seed,
            "results": [r.to_dict() for r in self.results],
            "runs": self.runs,
            "complete": self.complete,
            "out": self.out,
            "shard": self.shard,
        }


def _subdir(out: Path, d: int) -> Path:
    return out / f"d{d:05d}"


def ginibre_curve(
    ds: Sequence[int],
    samples: int,
    *,
    seed: int = 0,
    level: float = 0.95,
    interval: str = "wilson",
    tol: float | None = None,
    workers: int | None = 1,
    backend: str = "numpy",
    out: str | Path | None = None,
    shard: str | tuple[int, int] | None = None,
    merge_only: bool = False,
    progress: bool = False,
) -> GinibreStudy:
    """``ginibre_fraction`` for every d in ``ds``, optionally as a job-array sweep.

    ``out``: the sweep directory (one subdirectory ``dNNNNN`` per d); needed with
    ``shard`` ("i/N": this job runs the i-th of N contiguous slices of the list of all
    shards of all the d, each shard costing about 4 s of one core) and
    ``merge_only`` (combine what the jobs wrote, compute nothing). Results are filled in
    when every shard of every d is on disk. Other arguments as in ``ginibre_fraction``.
    """
    dims = [_checks.integer("d", x, lo=1) for x in ([ds] if np.ndim(ds) == 0 else ds)]
    if not dims:
        raise ValueError("d must list at least one dimension (e.g. 2,4,8).")
    if len(set(dims)) != len(dims):
        raise ValueError(f"d lists a dimension twice ({dims}); list each once.")
    shard_t = _sweep.parse_shard(shard)
    if (shard_t is not None or merge_only) and out is None:
        raise ValueError("shard and merge need an output directory (out / --out).")
    checked = [
        _check_common(x, samples, seed, level, interval, tol, backend, workers) for x in dims
    ]
    samples, seed, level, interval, workers = (
        checked[0][1],
        checked[0][2],
        checked[0][3],
        checked[0][4],
        checked[0][6],
    )
    shard_txt = None if shard_t is None else f"{shard_t[0]}/{shard_t[1]}"
    workers = _auto_workers(
        workers,
        samples * sum(map(_seconds_per_matrix, dims)) / (1 if shard_t is None else shard_t[1]),
    )
    if out is None:
        res = [
            ginibre_fraction(
                x,
                samples,
                seed=seed,
                level=level,
                interval=interval,
                tol=tol,
                workers=workers,
                backend=backend,
                progress=progress,
            )
            for x in dims
        ]
        return GinibreStudy(dims, samples, seed, res, None, True, None, None)
    out = Path(out)
    sweeps = [_make_sweep(c[0], samples, seed, c[5], backend, None) for c in checked]
    # every folder is checked before any d is computed (not d = 2's result, then an error)
    for x, sw in zip(dims, sweeps):
        if merge_only:
            _sweep.read_manifest(_subdir(out, x))
        else:
            _sweep.check_dir(sw, _subdir(out, x))
    runs = []
    if not merge_only:
        # Job i of N takes the i-th contiguous slice of all the shards of all the d
        # together (shards cost about the same, see default_shard_size).
        every = [(j, k) for j, sw in enumerate(sweeps) for k in range(sw.n_shards)]
        mine = [every[m] for m in _sweep.shard_slice(len(every), shard_t)]
        for j, (x, sw) in enumerate(zip(dims, sweeps)):
            rep = _sweep.run(
                sw,
                _subdir(out, x),
                shards=[k for jj, k in mine if jj == j],
                workers=workers,
                progress=progress,
            )
            runs.append({"d": x, **rep.to_dict()})
    complete = all(_is_complete(_subdir(out, x), sw) for x, sw in zip(dims, sweeps))
    results = []
    if complete or merge_only:
        for c, sw in zip(checked, sweeps):
            data = _sweep.merge(_subdir(out, c[0]), expect=sw)  # raises if incomplete
            results.append(
                summarize(
                    data.arrays,
                    d=c[0],
                    seed=seed,
                    tol=c[5],
                    backend=backend,
                    level=level,
                    interval=interval,
                )
            )
        complete = True
    return GinibreStudy(dims, samples, seed, results, runs or None, complete, str(out), shard_txt)


def _is_complete(path: Path, sw: _sweep.Sweep) -> bool:
    if not (path / _sweep.MANIFEST).is_file():
        return False
    present = _shards_present(path)
    return all(sw.shard_range(k) in present for k in range(sw.n_shards))
