"""The Ginibre study's sweep kernel: the random streams of the samples and the decisions
made on each, for ``attnflow.studies.ginibre`` (whose module docstring defines every
decision and tolerance).

Contract: ``ginibre_kernel(config, start, stop, seed)`` returns, for the samples
``[start, stop)``, the per-sample arrays it documents; the numbers of a sample depend
only on ``(seed, d, index)`` and ``config``, never on how the range is split into calls,
batches, shards or processes. Sample ``i``'s V is matrix ``i mod B`` of the block
``rng(seed, TAG, d, 0, i // B)`` (``B = block_size(d)``), its Q, K come from substream
``i mod B`` of ``Substreams(seed, TAG, d, 1, i // B)`` (``generate_V``,
``generate_QK``). Every call runs with one OpenBLAS thread. ``KERNEL_VERSION`` names the
per-sample numbers: it is part of a sweep's identity and is bumped when they change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxtyping import Float, Shaped

from . import sweep as _sweep

TAG = 0x67696E69  # "gini": namespaces this study's random streams
KERNEL_VERSION = 1  # bump when the per-sample numbers change; part of a sweep's identity
BORDERLINE_FACTOR = 1000.0
EPS = float(np.finfo(np.float64).eps)
BATCH_ELEMS = 1 << 21  # matrix entries per internal batch: 16 MB of float64


# -------------------------------------------------------------------- samples
def block_size(d: int) -> int:
    """Samples per random stream of V: ``clip(2**16 // d**2, 1, 1024)`` (a power of 2
    for powers of 2; 1 from d = 256 on). Fixed forever: it defines the numbers."""
    return int(min(1024, max(1, 65536 // (d * d))))


def generate_V(seed: int, d: int, start: int, stop: int) -> np.ndarray:
    """V for the samples [start, stop): (stop - start, d, d) float64."""
    B = block_size(d)
    out = np.empty((stop - start, d, d))
    for blk in range(start // B, (stop - 1) // B + 1):
        lo = blk * B
        s, e = max(lo, start), min(lo + B, stop)
        g = _sweep.rng(seed, TAG, d, 0, blk)
        if s == lo:  # the block starts inside the range: draw straight into it
            g.standard_normal(out=out[s - start : e - start])
        else:  # skip the first s - lo matrices of the block
            out[s - start : e - start] = g.standard_normal((e - lo, d, d))[s - lo :]
    return out


def generate_QK(seed: int, d: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q, K (each (len(indices), d, d)) of the samples ``indices`` (sorted)."""
    B = block_size(d)
    p = len(indices)
    Q, K = np.empty((p, d, d)), np.empty((p, d, d))
    streams: _sweep.Substreams | None = None
    cur = -1
    for j, i in enumerate(indices):
        blk = int(i) // B
        if blk != cur:
            streams, cur = _sweep.Substreams(seed, TAG, d, 1, blk), blk
        assert streams is not None
        g = streams[int(i) - blk * B]
        Q[j] = g.standard_normal((d, d))
        K[j] = g.standard_normal((d, d))
    return Q, K


# --------------------------------------------------------------------- kernel
def frobenius_norms(M: np.ndarray) -> np.ndarray:
    """Frobenius norms of a stack (p, d, d) -> (p,), without temporaries."""
    return np.sqrt(np.einsum("pij,pij->p", M, M))


def jax_eigvals(V):
    """``jnp.linalg.eigvals`` (JAX imported on first use)."""
    import jax.numpy as jnp

    return jnp.linalg.eigvals(V)


def eigenvalues(V: np.ndarray, backend: str) -> np.ndarray:
    """Eigenvalues ``(p, d)`` complex128 of a stack ``(p, d, d)``, by ``backend``."""
    if backend == "jax":
        w = _sweep.map_devices(jax_eigvals, V)
    else:
        w = np.linalg.eigvals(V)
    return np.asarray(w).astype(np.complex128, copy=False)


def top_eigenvectors(V: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Unit eigenvectors (p, d) of V (p, d, d) for the real, simple eigenvalues lam (p,):
    two steps of inverse iteration with the shift ``lam (1 + sqrt(eps))`` (never exactly
    singular; each step shrinks the other components by ``sqrt(eps) lam / gap``),
    accepted if the residual ``||V x - lam x||`` is below ``1000 d eps ||V||_F``, else
    (rarely) taken from ``numpy.linalg.eig``."""
    p, d = V.shape[0], V.shape[1]
    if d == 1:
        return np.ones((p, 1))
    fro = frobenius_norms(V)
    A = V - (lam * (1.0 + math.sqrt(EPS)))[:, None, None] * np.eye(d)
    x0 = np.full((p, d, 1), 1.0 / math.sqrt(d))
    with np.errstate(all="ignore"):
        try:
            x = inverse_iteration(A, x0)
        except np.linalg.LinAlgError:  # one exactly singular matrix stops numpy's batch
            x = np.full((p, d), np.nan)
            for j in range(p):
                with np.errstate(all="ignore"):
                    try:
                        x[j] = inverse_iteration(A[j : j + 1], x0[j : j + 1])[0]
                    except np.linalg.LinAlgError:
                        pass
        res = np.linalg.norm(np.einsum("pij,pj->pi", V, x) - lam[:, None] * x, axis=1)
        ok = np.isfinite(res) & (res <= 1e3 * d * EPS * fro)
    for j in np.nonzero(~ok)[0]:
        w, vecs = np.linalg.eig(V[j])
        k = int(np.argmin(np.abs(w - lam[j])))
        v = np.real(vecs[:, k])
        x[j] = v / np.linalg.norm(v)
    return x


def inverse_iteration(A: np.ndarray, x: np.ndarray, steps: int = 2) -> np.ndarray:
    """``steps`` normalised solves ``x <- A^-1 x`` of a stack; returns ``(p, d)``."""
    for _ in range(steps):
        x = np.linalg.solve(A, x)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x[:, :, 0]


def analyse(
    V: Float[np.ndarray, "b d d"], start: int, seed: int, tol: float, backend: str
) -> dict[str, Shaped[np.ndarray, " b"]]:
    """The per-sample arrays of ``ginibre_kernel`` for the matrices ``V`` of the samples
    ``[start, start + b)``."""
    from ..analysis.regimes import leading_eigenvalue  # here: importing ginibre needs no JAX

    b, d = V.shape[0], V.shape[1]
    fro = frobenius_norms(V)
    # the one decision of the leading-eigenvalue hypothesis, at the rounding level: the
    # tolerance a = tol ||V||_F for realness, positivity, the gap and simplicity alike
    lead = leading_eigenvalue(eigenvalues(V, backend), fro, rtol=tol, cluster_rtol=tol)
    ms = np.abs(lead.eigenvalues)  # moduli, decreasing
    zeros = np.zeros(b)
    m1 = ms[:, 0]
    m2 = ms[:, 1] if d > 1 else zeros
    m3 = ms[:, 2] if d > 2 else zeros
    lam = lead.lambda1
    a = lead.tol
    wide = BORDERLINE_FACTOR * a
    real_top = lead.real
    spectral = lead.spectral
    borderline = np.where(
        real_top,
        (np.abs(np.real(lam)) <= wide) | (m1 - m2 <= wide),
        (np.abs(np.imag(lam)) <= wide) | (m1 - m3 <= wide),
    )
    qk = np.full(b, np.nan)
    good_id = np.zeros(b, dtype=bool)
    idx = np.nonzero(spectral)[0]
    if idx.size:
        phi = top_eigenvectors(V[idx], np.real(lam)[idx])
        good_id[idx] = np.einsum("pi,pi->p", phi, phi) > tol
        Q, K = generate_QK(seed, d, start + idx)
        qphi = np.einsum("pij,pj->pi", Q, phi)
        kphi = np.einsum("pij,pj->pi", K, phi)
        qk[idx] = np.einsum("pi,pi->p", qphi, kphi) / (frobenius_norms(Q) * frobenius_norms(K))
    with np.errstate(invalid="ignore"):
        good_gin = spectral & (qk > tol)
        border_gin = spectral & (np.abs(qk) <= BORDERLINE_FACTOR * tol)
    return {
        "lam1": lam,
        "mod2": m2,
        "mod3": m3,
        "fro": fro,
        "spectral": spectral,
        "borderline": borderline,
        "qk": qk,
        "good_identity": good_id,
        "good_ginibre": good_gin,
        "borderline_ginibre": border_gin,
    }


def ginibre_kernel(
    config: Mapping[str, Any], start: int, stop: int, seed: int
) -> dict[str, Shaped[np.ndarray, " samples"]]:
    """Sweep kernel: per-sample results for samples ``[start, stop)``.

    ``config``: ``{"d": int, "tol": float, "backend": "numpy" | "jax", "version": int}``.
    Returns arrays of leading size ``stop - start``: ``lam1`` (complex, the eigenvalue
    of largest modulus), ``mod2``, ``mod3`` (the next sorted moduli, 0 if d is too
    small), ``fro`` (||V||_F), ``spectral``, ``borderline`` (bool), ``qk``
    (<Q phi, K phi> / (||Q||_F ||K||_F), NaN where the spectral hypothesis fails),
    ``good_identity``, ``good_ginibre``, ``borderline_ginibre`` (bool). Runs with one
    OpenBLAS thread (``sweep.blas_threads(1)``).
    """
    d, tol, backend = int(config["d"]), float(config["tol"]), str(config["backend"])
    if int(config.get("version", KERNEL_VERSION)) != KERNEL_VERSION:
        raise ValueError(
            f"this sweep was made by ginibre kernel version "
            f"{config.get('version')}; this attnflow has version "
            f"{KERNEL_VERSION}. Use a new output directory."
        )
    step = max(block_size(d), (BATCH_ELEMS // (d * d)) // block_size(d) * block_size(d))
    parts = []
    s = start
    with _sweep.blas_threads(1):  # as in sweeps, also when called directly
        while s < stop:
            e = min(stop, (s // step + 1) * step)
            parts.append(analyse(generate_V(seed, d, s, e), s, seed, tol, backend))
            s = e
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
