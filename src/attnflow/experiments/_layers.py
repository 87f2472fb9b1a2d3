"""How many layers the tokens take to cluster: one definition for the transformer figures.

Not a figure script (the runner only runs ``fig_*.py``).

Definition (used in every sidecar that reports ``layers_to_cluster``): at each saved layer
``k`` the measured points are single-linkage clusters at ``tol * max |points_k|``
(``tol = 1e-2``, ``observe_limit``'s default): the levels ``phi_1*(z)`` when the rescaling
matrix W has a simple real leading eigenvalue (the hyperplane case), the F-parts when W is
paranormal (the subspace case; the G-part is free), else the rescaled tokens ``z`` (the
original tokens ``x`` for a run in the original frame). ``layers_to_cluster`` is the first
saved layer from which that count stays at its final value up to the end of the run
(``0``: it never changed; ``None`` when the final count is the number of tokens: nothing
clustered). It is a statement about the run's horizon only: a count that changes after
the last save is not seen. It is the ``residual_layers_to_settle`` of
``fig_rank_collapse`` (which counts the tokens z in the non-hyperplane cases).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOL = 1e-2


def cluster_counts(points: np.ndarray, tol: float = TOL) -> np.ndarray:
    """Single-linkage cluster count at ``tol * max|points_k|`` of each save ``points``
    ``(m, n, k)``."""
    from attnflow.analysis.observe import clusters

    counts = []
    for pk in points:
        scale = float(np.abs(pk).max()) if np.isfinite(pk).all() else np.inf
        if not np.isfinite(scale):
            counts.append(-1)  # overflowed save: no count
            continue
        counts.append(int(clusters(pk, tol * max(scale, 1e-300))[1].shape[0]))
    return np.asarray(counts)


def settle(counts: np.ndarray) -> tuple[int, int]:
    """``(final count, first save from which the count stays final)``."""
    final = int(counts[-1])
    changed = np.flatnonzero(counts != final)
    return final, int(changed[-1] + 1) if changed.size else 0


_STRUCTURE: dict[bytes, Any] = {}


def _structure(W: Any) -> Any:
    """``spectral_structure(W)``, remembered per matrix (a 384 x 384 W costs a second)."""
    from attnflow.analysis.regimes import spectral_structure

    W = np.ascontiguousarray(W, np.float64)
    key = W.tobytes() + str(W.shape).encode()
    if key not in _STRUCTURE:
        if len(_STRUCTURE) > 64:
            _STRUCTURE.clear()
        _STRUCTURE[key] = spectral_structure(W)
    return _STRUCTURE[key]


def _left(W: Any) -> np.ndarray | None:
    """W's left leading eigenvector when its leading eigenvalue is simple, else None."""
    return _structure(W).phi1_left


def measured(z: np.ndarray, W: Any) -> tuple[np.ndarray, str]:
    """The points whose clusters are counted: ``z @ phi_1*`` (``(m, n, 1)``) when W's
    leading eigenvalue is simple, the F-parts ``z @ F_coords^T`` when W is paranormal
    (the G-part is free, as ``observe_limit`` tests it), else ``z``; and what they are."""
    st = _structure(W)
    if st.phi1_left is not None:
        return z @ np.asarray(st.phi1_left)[:, None], "levels phi_1*(z)"
    if st.kind == "paranormal" and st.F_coords is not None:
        return z @ np.asarray(st.F_coords).T, "F-parts of z"
    return z, "tokens"


def layers_to_cluster(z: np.ndarray, W: Any, dt: float, ts: np.ndarray) -> dict[str, Any]:
    """The module's definition on saves ``z`` ``(m, n, d)`` at times ``ts`` (layers of
    step ``dt``): ``{"clusters", "layers_to_cluster", "of"}`` (``layers_to_cluster`` None
    when every token ends in a cluster of its own)."""
    pts, what = measured(np.asarray(z, np.float64), W)
    n_cl, k = settle(cluster_counts(pts))
    never = n_cl == pts.shape[1] and pts.shape[1] > 1  # every token its own cluster
    return {
        "clusters": n_cl,
        "layers_to_cluster": None if never else int(round(float(ts[k]) / dt)),
        "of": what,
    }
