"""Scale-safe numerics of the spectral decisions of ``attnflow.analysis.regimes``.

Contract: ``real_matrix`` checks a matrix argument (a ``ValueError`` naming it) and
returns it as float64; ``balanced`` scales a matrix whose largest entry lies outside
``[2^-400, 2^400]`` by a power of two (exact), so that no norm or product of entries
overflows or underflows, and ``unscale`` undoes it on a number; ``sort_spectrum`` sorts
eigenvalues by decreasing modulus, ties broken by larger real part first (stable);
``qk_facts`` decides whether ``sym(Q^T K)`` is positive definite at the tolerance
``rtol ||Q||_2 ||K||_2``; ``spectrum_text`` and ``conjecture_note`` write the parts of
a reason that list a spectrum or mention the codimension-k conjecture.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Complex

from .. import _checks
from ._regime_types import Hypothesis

# Largest entries inside this range are used as they are; outside it a matrix is scaled
# by a power of two first (exact), so that squares and products of entries stay finite
# and normal (the range of LAPACK's own scaling, with room for d^2 terms).
SAFE_EXPONENT = 400
TINY = float(np.finfo(np.float64).tiny)


def sort_spectrum(eigenvalues: Complex[npt.ArrayLike, "*b d"]) -> Complex[np.ndarray, "*b d"]:
    """Eigenvalues sorted by decreasing modulus, ties broken by larger real part first
    (a stable sort: an exact tie of both, such as a conjugate pair, keeps its order).

    Args:
        eigenvalues: ``(..., d)`` one spectrum or a stack.

    Returns:
        ``(..., d)`` complex128, sorted along the last axis.
    """
    return sorted_spectrum(eigenvalues)[0]


def sorted_spectrum(eigenvalues: Any) -> tuple[np.ndarray, np.ndarray]:
    """``sort_spectrum`` and the sorted moduli. A stable sort by modulus, then (rows with
    equal moduli of different real parts only: rare, a conjugate pair is an exact tie of
    both) the two-key sort."""
    w = np.asarray(eigenvalues).astype(np.complex128, copy=False)
    mod = np.abs(w)
    order = np.argsort(-mod, axis=-1, kind="stable")
    ws = np.take_along_axis(w, order, axis=-1)
    ms = np.take_along_axis(mod, order, axis=-1)
    tie = (ms[..., 1:] == ms[..., :-1]) & (ws.real[..., 1:] != ws.real[..., :-1])
    redo = np.any(tie, axis=-1)
    if np.any(redo):
        order = np.lexsort((-w[redo].real, -mod[redo]), axis=-1)
        ws[redo] = np.take_along_axis(w[redo], order, axis=-1)
        ms[redo] = np.take_along_axis(mod[redo], order, axis=-1)
    return ws, ms


# ------------------------------------------------------------------------ checks
def real_matrix(name: str, A: Any, d: int | None = None, rectangular: bool = False) -> np.ndarray:
    """A finite real matrix as float64: ``(d, d)``, or ``(p, d)`` when ``rectangular``."""
    hint = f"(p, {d})" if rectangular else "(d, d)"
    arr = _checks.real_array(name, A, ndim=2, shape_hint=hint).astype(np.float64)
    if rectangular:
        if d is not None and arr.shape[1] != d:
            raise ValueError(f"{name} must be a (p, {d}) matrix; got shape {arr.shape}.")
    else:
        if arr.shape[0] != arr.shape[1]:
            raise ValueError(f"{name} must be a square (d, d) matrix; got shape {arr.shape}.")
        if d is not None and arr.shape[0] != d:
            raise ValueError(f"{name} has shape {arr.shape}; Q, K and V must all be ({d}, {d}).")
    return arr


def balanced(A: np.ndarray) -> tuple[np.ndarray, int]:
    """``(A 2^-e, e)``: ``A`` itself (``e = 0``) when its largest ``|entry|`` lies in
    ``[2^-400, 2^400]``, else scaled by a power of two (exactly) to largest entry in
    ``[1/2, 1)``. Norms and products of the result neither overflow nor underflow."""
    amax = float(np.max(np.abs(A)))
    if amax == 0.0 or 2.0**-SAFE_EXPONENT <= amax <= 2.0**SAFE_EXPONENT:
        return A, 0
    e = math.frexp(amax)[1]
    return np.ldexp(A, -e), e


def unscale(x: float, e: int) -> float:
    """``x 2^e`` (``+-inf`` past the float range)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(x, e))


@dataclasses.dataclass(frozen=True)
class QKFacts:
    """Q, K scaled by ``2^-shift`` (``balanced``) and what the theorems ask of them."""

    Q: np.ndarray
    K: np.ndarray
    M: np.ndarray  # Q^T K of the scaled matrices
    pd: Hypothesis
    scale: float  # ||Q||_2 ||K||_2 of the scaled matrices
    shift: int  # the unscaled Q^T K is M 2^shift


def qk_facts(Q: np.ndarray, K: np.ndarray, rtol: float) -> QKFacts:
    """Q and K balanced, ``Q^T K`` and the positive-definiteness of its symmetric part."""
    Qs, eq = balanced(Q)
    Ks, ek = balanced(K)
    M = Qs.T @ Ks
    S = (M + M.T) / 2
    scale = max(float(np.linalg.norm(Qs, 2) * np.linalg.norm(Ks, 2)), TINY)
    lmin = float(np.linalg.eigvalsh(S).min())
    pd = Hypothesis(
        "sym(Q^T K) positive definite",
        lmin > rtol * scale,
        lmin / scale,
        f"smallest eigenvalue of sym(Q^T K) = {unscale(lmin, eq + ek):.4g}",
    )
    return QKFacts(Qs, Ks, M, pd, scale, eq + ek)


def spectrum_text(w: np.ndarray) -> str:
    """A spectrum as ``[a+bi, ...]`` (4 significant digits), for reasons."""
    return "[" + ", ".join(f"{complex(v).real:.4g}{complex(v).imag:+.4g}i" for v in w) + "]"


def conjecture_note(w: np.ndarray, scale: float, rtol: float, sharpen: bool = False) -> str:
    """The reason's note on the codimension-k conjecture, when at least two eigenvalues
    have positive real part (else the empty string)."""
    pos = int((np.real(w) > rtol * scale).sum())
    if pos >= 2 and sharpen:
        return (
            f" ({pos} eigenvalues have positive real part: the unproved codimension-k "
            f"conjecture would sharpen this to at most three parallel affine subspaces "
            f"of codimension {pos}.)"
        )
    if pos >= 2:
        return (
            f" ({pos} eigenvalues have positive real part; the unproved codimension-k "
            f"conjecture would predict at most three parallel affine subspaces of "
            f"codimension {pos}.)"
        )
    return ""
