"""The geometry the drawings and the movies of ``attnflow.plotting`` are computed from,
in numpy and scipy only (no matplotlib): convex-hull vertices of planar points, the
section of a hyperplane with a box, the padded bounding box of points, and the camera
that sees parallel planes edge-on.

Contract: pure functions of arrays, returning numpy arrays or floats; degenerate input
(fewer points than a hull needs, a hyperplane that misses the box) gives the documented
fallback, never an exception from Qhull. Every name is importable from
``attnflow.plotting`` and ``attnflow.plotting.draw``.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
from jaxtyping import Float, Int

__all__ = ["hull_vertices", "box_section", "data_box", "edge_on_view"]


def hull_vertices(points: Float[npt.ArrayLike, "k 2"]) -> Int[np.ndarray, " h"]:
    """Indices of the convex-hull vertices of planar points.

    Args:
        points: the points.

    Returns:
        The vertices' indices, counter-clockwise. For degenerate points all indices
        (fewer than 3 points) or the two extreme points (collinear ones).
    """
    pts = np.asarray(points, dtype=np.float64)
    k = pts.shape[0]
    if k <= 2:
        return np.arange(k)
    from scipy.spatial import ConvexHull, QhullError

    try:
        return ConvexHull(pts).vertices
    except (QhullError, ValueError):
        c = pts - pts.mean(axis=0)
        u = np.linalg.svd(c, full_matrices=False)[2][0]
        s = c @ u
        return np.array([int(np.argmin(s)), int(np.argmax(s))])


def box_section(
    phi: Float[npt.ArrayLike, " d"],
    c: float,
    lo: Float[npt.ArrayLike, " d"],
    hi: Float[npt.ArrayLike, " d"],
) -> Float[np.ndarray, "k d"] | None:
    """The section of the hyperplane ``{z : phi . z = c}`` with the box ``[lo, hi]``.

    Args:
        phi: normal of the hyperplane, d = 2 or 3.
        c: its level.
        lo: the box's lower corner.
        hi: the box's upper corner.

    Returns:
        d = 2: the two end points of a segment; d = 3: the vertices of a convex polygon,
        in order around it. ``None`` if the hyperplane misses the box.
    """
    phi = np.asarray(phi, dtype=np.float64)
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    d = phi.shape[0]
    corners = np.array(list(itertools.product(*zip(lo, hi))))
    pts = []
    for i, j in itertools.combinations(range(len(corners)), 2):
        a, b = corners[i], corners[j]
        if np.count_nonzero(a != b) != 1:
            continue
        fa, fb = phi @ a - c, phi @ b - c
        if fa == fb:
            continue
        s = fa / (fa - fb)
        if 0.0 <= s <= 1.0:
            pts.append(a + s * (b - a))
    if len(pts) < 2:
        return None
    pts = np.unique(np.round(np.array(pts), 12), axis=0)
    if len(pts) < 2:
        return None
    if d == 2:
        u = np.array([-phi[1], phi[0]])
        s = pts @ u
        return pts[[int(np.argmin(s)), int(np.argmax(s))]]
    # order the polygon's vertices by angle in the plane
    m = pts.mean(axis=0)
    n = phi / np.linalg.norm(phi)
    e1 = np.linalg.svd(np.eye(3) - np.outer(n, n))[0][:, 0]
    e2 = np.cross(n, e1)
    ang = np.arctan2((pts - m) @ e2, (pts - m) @ e1)
    return pts[np.argsort(ang)]


def data_box(
    z: Float[npt.ArrayLike, "*points d"], pad: float = 0.06
) -> tuple[Float[np.ndarray, " d"], Float[np.ndarray, " d"]]:
    """The padded bounding box of the finite points of ``z``.

    Args:
        z: points (any leading shape).
        pad: margin on each side, as a fraction of the box's extent along that axis.

    Returns:
        ``(lo, hi)``, the box's corners.
    """
    pts = np.asarray(z).reshape(-1, np.asarray(z).shape[-1])
    pts = pts[np.all(np.isfinite(pts), axis=1)]
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    span = np.maximum(hi - lo, 1e-12)
    return lo - pad * span, hi + pad * span


def edge_on_view(
    phi: Float[npt.ArrayLike, " 3"], lo: Float[npt.ArrayLike, " 3"], hi: Float[npt.ArrayLike, " 3"]
) -> tuple[float, float]:
    """The camera that sees the planes ``{phi . z = c}`` edge-on (as lines).

    Args:
        phi: normal of the planes.
        lo: lower corner of the drawn box (matplotlib normalises the box to a cube).
        hi: its upper corner.

    Returns:
        ``(elev, azim)`` of a horizontal camera, in degrees.
    """
    span = np.maximum(np.asarray(hi) - np.asarray(lo), 1e-12)
    p = np.asarray(phi, dtype=np.float64) * span  # the normal in normalised coordinates
    v = np.cross(p, [0.0, 0.0, 1.0])
    if np.linalg.norm(v) < 1e-12 * np.linalg.norm(p):
        return 0.0, -60.0
    return 0.0, float(np.degrees(np.arctan2(v[1], v[0])))
