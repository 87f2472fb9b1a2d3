"""A head's triple made small: ``reduced_triple`` maps ``(Q_h, K_h, V_h)`` of a trained
head (``attnflow.io.checkpoints.HeadWeights``) to an orthogonally equivalent
``(r + 1)``-dimensional triple, for ``attnflow.studies.heads``.

Contract: ``predict_regime`` of the reduced triple equals ``predict_regime`` of the
original one (its decisions are invariant under orthogonal changes of coordinates, and
one zero coordinate keeps V's eigenvalue 0 and the kernel of ``sym(Q^T K)``); the
original triple is returned when nothing is gained or ``V`` is not ``W_O_h @ W_V_h``.
Importable from ``attnflow.studies.heads``.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Float

from ..io.checkpoints import HeadWeights

__all__ = ["reduced_triple"]


def reduced_triple(
    head: HeadWeights,
) -> tuple[Float[np.ndarray, "p r"], Float[np.ndarray, "p r"], Float[np.ndarray, "r r"], int]:
    """A smaller triple, orthogonally equivalent to ``(Q_h, K_h, V_h)`` for every question
    ``predict_regime`` asks.

    Let ``U`` (``d x r``) be an orthonormal basis of ``range(W_O,h) + range(W_V,h^T) +
    range(Q_h^T) + range(K_h^T)`` (``r <= 4 d_h``) and ``O = [U, U_perp]``. In the
    coordinates ``x -> O^T x``, ``V_h`` becomes ``blockdiag(U^T V_h U, 0)`` and ``Q_h``,
    ``K_h`` become ``[Q_h U, 0]``, ``[K_h U, 0]``. ``predict_regime`` is invariant under
    orthogonal changes of coordinates (spectrum, ``||V||_2``, unit eigenvectors,
    ``<Q phi, K phi>``, the spectrum of ``sym(Q^T K)``), and one zero coordinate is kept so
    that ``V`` keeps its eigenvalue 0 and ``sym(Q^T K)`` its kernel (never positive
    definite, as in ``d``): the result is the same, from an ``(r + 1)``-dimensional
    problem instead of a ``d``-dimensional one (129 instead of 384 for MiniLM; the
    eigenvalues 0 lose multiplicity, nothing else changes).

    Returns:
        ``(Q', K', V', r + 1)``, or the original triple and ``d`` when nothing is gained
        or ``V`` is not ``W_O_h @ W_V_h``.
    """
    d, V = head.d, head.V
    A, B = head.W_O_h, head.W_V_h
    if (
        A.shape[0] != d
        or B.shape[1] != d
        or not np.allclose(A @ B, V, rtol=0, atol=1e-12 * max(np.abs(V).max(), 1e-300))
    ):
        return head.Q, head.K, V, d
    M = np.concatenate([A, B.T, head.Q.T, head.K.T], axis=1)
    U, sv, _ = np.linalg.svd(M, full_matrices=False)
    r = int((sv > max(M.shape) * np.finfo(float).eps * sv[0]).sum()) if sv[0] > 0 else 0
    if r + 1 >= d:
        return head.Q, head.K, V, d
    U = U[:, :r]
    Vr = np.zeros((r + 1, r + 1))
    Vr[:r, :r] = (U.T @ A) @ (B @ U)
    Qr = np.zeros((head.Q.shape[0], r + 1))
    Kr = np.zeros_like(Qr)
    Qr[:, :r], Kr[:, :r] = head.Q @ U, head.K @ U
    return Qr, Kr, Vr, r + 1
