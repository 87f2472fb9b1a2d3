"""What the tokens reached at the end of a run, measured against the theorems.

``observe_limit(traj)`` tests the end of a trajectory against the conclusion of the
theorem that matches V's spectral structure (``attnflow.analysis.regimes``), not against
its Q, K hypotheses: an observation must be able to disagree with a prediction. See its
docstring for each test; the limit points are single-linkage clusters (connected
components of the graph "closer than the tolerance", ``scipy.sparse.csgraph``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxtyping import Float, Int
from scipy.sparse.csgraph import connected_components

from .. import _checks
from .regimes import Label, spectral_structure

if TYPE_CHECKING:
    from ..dynamics.trajectory import Trajectory

__all__ = ["Observation", "observe_limit"]


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the tokens reached at the end of a trajectory (``observe_limit``).

    Attributes:
        label: a ``Label`` (``NOT_CONVERGED`` when the tested quantity still moves).
        n_clusters: distinct limit points found (None where not meaningful).
        details: the measured geometry (see ``observe_limit``).
        reason: one sentence saying what was measured.
    """

    label: Label
    n_clusters: int | None
    details: dict[str, Any]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The observation as plain values (for JSON through ``io.serialize``)."""
        return {
            "label": self.label,
            "n_clusters": self.n_clusters,
            "details": self.details,
            "reason": self.reason,
        }


def clusters(
    points: Float[np.ndarray, "n k"], tol: float
) -> tuple[Int[np.ndarray, " n"], Float[np.ndarray, "c k"]]:
    """Single-linkage clusters at distance ``tol``: points closer than ``tol`` (Euclidean,
    ``<=``) are joined, and clusters are the connected components of that graph.

    Args:
        points: ``(n, k)`` points.
        tol: the linkage distance (>= 0).

    Returns:
        ``(labels, centres)``: ``labels`` ``(n,)`` the cluster of each point, numbered in
        the order of each cluster's first point; ``centres`` ``(c, k)`` their means.
    """
    D = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    c, labels = connected_components(D <= tol, directed=False)
    centres = np.stack([points[labels == j].mean(axis=0) for j in range(c)])
    return labels.astype(int), centres


def _boundary_distances(points: np.ndarray, tol: float) -> np.ndarray:
    """Distance of each point to the relative boundary of the convex hull of ``points``.

    0 for hull vertices and points on facets. Computed in the affine hull of the points
    (``scipy.spatial.ConvexHull`` in its dimension; polygons, segments and single points
    by hand).
    """
    c = points.mean(axis=0)
    X = points - c
    if X.shape[0] == 1:
        return np.zeros(1)
    _, s, Vt = np.linalg.svd(X, full_matrices=False)
    r = int((s > tol).sum())
    if r == 0:
        return np.zeros(points.shape[0])
    Y = X @ Vt[:r].T
    if r == 1:
        y = Y[:, 0]
        return np.minimum(np.abs(y - y.min()), np.abs(y.max() - y))
    if Y.shape[0] <= r:
        return np.zeros(points.shape[0])  # a simplex: every point is a vertex
    if r == 2:  # the plane: the hull's edges by hand (scipy.spatial costs 0.3 s to import)
        normals, offsets = _planar_hull_facets(Y)
    else:
        from scipy.spatial import ConvexHull

        eq = ConvexHull(Y).equations
        normals, offsets = eq[:, :-1], eq[:, -1]
    # facet equations: normal . y + offset <= 0 inside
    dist = -(Y @ normals.T + offsets)  # (n, facets) >= 0
    return np.maximum(dist.min(axis=1), 0.0)


def _planar_hull_facets(Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges of the convex hull of points ``Y`` ``(n, 2)`` (not all on a line), as
    ``scipy.spatial.ConvexHull.equations`` gives facets: unit outward normals ``(e, 2)``
    and offsets ``(e,)``, ``normal . y + offset <= 0`` inside. Andrew's monotone chain;
    points on an edge are not vertices."""
    P = np.unique(Y, axis=0)  # sorted by the first coordinate, then the second

    def chain(points: np.ndarray) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for p in points:
            while len(out) >= 2:
                (ax, ay), (bx, by) = out[-2], out[-1]
                if (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax) > 0:
                    break  # a left turn: keep b
                out.pop()
            out.append(p)
        return out

    lower, upper = chain(P), chain(P[::-1])
    V = np.array(lower[:-1] + upper[:-1])  # counter-clockwise
    E = np.roll(V, -1, axis=0) - V
    normals = np.stack([E[:, 1], -E[:, 0]], axis=1)  # each edge turned clockwise: outward
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    return normals, -np.sum(normals * V, axis=1)


def _observe_sphere(traj: Trajectory, rel: float, move_tol: float) -> Observation:
    """One run on the sphere: the theorems' labels do not apply; clusters and motion only."""
    x = np.asarray(traj.x, np.float64)
    ts = np.asarray(traj.ts, np.float64)
    if x.shape[0] < 2:
        raise ValueError("observe_limit needs at least two saved times (pass ts=...).")
    dt_last = max(float(ts[-1] - ts[-2]), 1e-300)
    moving = float(np.abs(x[-1] - x[-2]).max() / dt_last)  # unit tokens: relative already
    labels, centres = clusters(x[-1], rel)
    details = {
        "t_final": float(ts[-1]),
        "status": traj.status,
        "structure": "sphere",
        "tol": rel,
        "moving": moving,
        "limit_points": centres,
        "cluster_of": labels,
    }
    why = (
        "tokens on the sphere (layer normalisation in place of e^(-tV)): the theorems' "
        "labels (polytope, hyperplanes, subspace, origin) are about the rescaled frame and "
        "do not apply here"
    )
    if moving > move_tol:
        return Observation(
            Label.NOT_CONVERGED,
            None,
            details,
            f"{why}; the tokens still move (rate {moving:.3g} > {move_tol}).",
        )
    return Observation(
        Label.UNCLASSIFIED,
        len(centres),
        details,
        f"{why}; {len(centres)} cluster(s) at distance {rel:g} "
        "(attnflow.analysis.count_clusters counts them by inner product).",
    )


def observe_limit(
    traj: Trajectory,
    *,
    tol: float | None = None,
    move_tol: float = 1e-3,
    origin_tol: float = 0.2,
    system: int | None = None,
) -> Observation:
    """Measure the limit geometry at the end of a trajectory.

    The test is the conclusion of the theorem matching V's spectral structure
    (``spectral_structure``); the Q, K hypotheses are not assumed, so an observation can
    disagree with ``predict_regime``:

    - original frame collapsing: ``max_i |x_i(T)| <= origin_tol * max_i |x_i(0)|`` with
      the radius decreasing over the last half of the saves -> "origin" (one cluster).
    - V = c I, c > 0 -> the tokens ``z_i`` (rescaled frame) must have stopped moving; the
      distinct limit points (single-linkage clusters at ``tol``) must each lie on the
      boundary of their convex hull or at 0 -> "polytope". Details: limit points, their
      distances to the hull boundary and to 0, and the theorem's exact set condition
      ``c^T M c = max_s c^T M s`` (``M = Q^T K``) per limit point.
    - lambda_1 simple -> the levels ``phi_1*(z_i)`` must have stopped moving and take at
      most three values, each within ``tol`` of ``a = min``, ``b = max`` or 0 ->
      "hyperplanes". Details: the levels, a, b, the distance of each level to {a, 0, b}.
    - paranormal -> the F-parts (coordinates along G, in an orthonormal basis of F) must
      have stopped moving and their limit points lie on the relative boundary of their
      hull or at 0 -> "subspace"; the G-part is not tested (it is free).
    - anything else, or a failed test: "not-converged" if the tested quantity still moves
      (relative change per unit time above ``move_tol`` between the last two saves),
      else "unclassified" with what failed in ``reason``.

    On the sphere (``frame="sphere"``, layer normalisation) no theorem of the rescaled
    frame applies: the label is "not-converged" while the tokens move, else
    "unclassified", with the single-linkage clusters of the unit tokens as ``n_clusters``
    and a reason that says so (``details["structure"]`` is ``"sphere"``).

    For a ``MultiHeadAttention`` or a ``Block`` the structure tested is that of the
    rescaling matrix W of the rescaled frame (``z = e^{-tW} x``; by default the sum of the
    heads' V), which no theorem covers: the observation is then a measurement only, and
    the polytope's set condition (one ``Q^T K``) is not reported.

    Args:
        traj: an ``attnflow.Trajectory`` (one system; for a batch pass ``system=i``).
        tol: clustering tolerance relative to the scale of the measured quantity (its
            largest modulus at the end); default ``1e-2``.
        move_tol: relative change per unit time below which a quantity counts as settled.
        origin_tol: relative radius below which the original frame counts as collapsed.
        system: index into a batched trajectory.

    Returns:
        An ``Observation``.

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)
        >>> model = af.Attention(np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"])
        >>> x0 = np.random.default_rng(0).uniform(-5, 5, (20, 2))
        >>> traj = af.simulate(model, x0, 10.0, ts=np.linspace(0, 10, 101))
        >>> str(af.observe_limit(traj).label)  # the theorem's three hyperplanes
        'hyperplanes'
    """
    from ..dynamics.trajectory import Trajectory as _Trajectory

    if not isinstance(traj, _Trajectory):
        raise ValueError(
            f"traj must be an attnflow.Trajectory (from attnflow.simulate); got "
            f"{type(traj).__name__}. To predict from matrices use predict_regime."
        )
    rel = 1e-2 if tol is None else _checks.positive("tol", tol)
    move_tol = _checks.positive("move_tol", move_tol)
    origin_tol = _checks.positive("origin_tol", origin_tol)
    if traj.batched and system is None:
        raise ValueError("traj is a batch: pass system=i to observe one system.")
    if traj.batched and (traj.stacked or traj.frame == "sphere"):
        # system i as a run of its own (with its own model i when the weights were
        # stacked): the saves it reached
        traj = traj.system(_checks.index("system", system, len(traj.statuses), what="systems"))
        system = None
    if traj.frame == "sphere":
        if system is not None:
            _checks.index("system", system, 1, what="system (the trajectory is not a batch)")
        return _observe_sphere(traj, rel, move_tol)
    if traj.model.propagator is None:
        raise ValueError(
            f"observe_limit reads the limit in the rescaled frame z = e^(-tV) x; "
            f"{type(traj.model).__name__} declares no propagator (propagator is None), so "
            f"it has no such frame."
        )
    if traj.batched:
        assert system is not None
        system = _checks.index("system", system, len(traj.statuses), what="systems")
        z = np.asarray(traj.z[system], np.float64)
        x = np.asarray(traj.x[system], np.float64)
        keep = np.asarray(traj.reached[system])
        z, x = z[keep], x[keep]
        ts = np.asarray(traj.ts, np.float64)[keep]
    else:
        if system is not None:
            _checks.index("system", system, 1, what="system (the trajectory is not a batch)")
        keep = None
        z = np.asarray(traj.z, np.float64)
        x = np.asarray(traj.x, np.float64)
        ts = np.asarray(traj.ts, np.float64)
    if z.shape[0] < 2:
        raise ValueError("observe_limit needs at least two saved times (pass ts=...).")

    def functionals(P: np.ndarray) -> np.ndarray:
        """``z @ P.T`` from the solver's own coordinates (``Trajectory.project``): in
        modal coordinates a diverging mode that P annihilates adds no rounding."""
        if traj.batched:
            return np.asarray(traj.project(P, system=system), np.float64)[keep]
        return np.asarray(traj.project(P), np.float64)

    model = traj.model
    from ..dynamics.base import AbstractAttentionSystem

    if isinstance(model, AbstractAttentionSystem):
        # one head: its own query and key maps (any family, through the seam)
        V = np.asarray(model.propagator.V, np.float64)
        Qm, Km = (np.asarray(a, np.float64) for a in model.query_key_maps())
        M = Qm.T @ Km
    else:
        # other families (several heads, a feed-forward term): the conclusion tested is
        # that of the rescaling matrix W's structure, z = e^{-tW} x; no single Q^T K
        M = None
        V = np.asarray(model.propagator.V, np.float64)
    st = spectral_structure(V)
    dt_last = ts[-1] - ts[-2]
    base = {"t_final": float(ts[-1]), "status": traj.status, "structure": st.kind, "tol": rel}

    def moving(q: np.ndarray) -> float:  # relative change per unit time, last two saves
        scale = max(np.abs(q[-1]).max(), np.abs(q[-2]).max(), 1e-300)
        return float(np.abs(q[-1] - q[-2]).max() / scale / max(dt_last, 1e-300))

    # ---- origin
    radius = np.linalg.norm(x, axis=-1).max(axis=-1)
    half = radius[len(radius) // 2 :]
    collapsed = radius[-1] <= origin_tol * radius[0] and np.all(np.diff(half) <= 1e-12 * radius[0])
    if collapsed:
        return Observation(
            Label.ORIGIN,
            1,
            {**base, "radius": radius[-1], "radius0": radius[0], "ratio": radius[-1] / radius[0]},
            f"the original-frame radius fell from {radius[0]:.4g} to "
            f"{radius[-1]:.4g} and keeps decreasing: one cluster at 0.",
        )
    if st.kind == "scalar-negative":
        return Observation(
            Label.NOT_CONVERGED,
            None,
            {**base, "radius": radius[-1], "radius0": radius[0]},
            f"V = -cI but the radius is still {radius[-1] / radius[0]:.3g} of "
            f"its start (the spread decays only like t^(-1/2)).",
        )
    if st.kind in ("scalar-positive", "paranormal") and st.F_coords is not None:
        q = z if st.kind == "scalar-positive" else functionals(st.F_coords)
        label = Label.POLYTOPE if st.kind == "scalar-positive" else Label.SUBSPACE
        mv = moving(q)
        pts = q[-1]
        scale = max(np.abs(pts).max(), 1e-300)
        labels, centers = clusters(pts, rel * scale)
        bd = _boundary_distances(centers, rel * scale)
        at0 = np.linalg.norm(centers, axis=-1)
        ok_pts = (bd <= rel * scale) | (at0 <= rel * scale)
        details = {
            **base,
            "moving": mv,
            "limit_points": centers,
            "cluster_of": labels,
            "boundary_distance": bd / scale,
            "distance_to_0": at0 / scale,
            "on_boundary_or_0": ok_pts,
        }
        if st.kind == "scalar-positive":
            if M is not None:
                quad = np.einsum("ci,ij,cj->c", centers, M, centers)
                best = (centers @ M @ centers.T).max(axis=1)
                details["S_gap"] = (best - quad) / max(scale**2 * np.linalg.norm(M, 2), 1e-300)
        if mv > move_tol:
            return Observation(
                Label.NOT_CONVERGED,
                None,
                details,
                f"the {'tokens' if label == Label.POLYTOPE else 'F-parts'} still "
                f"move (relative rate {mv:.3g} > {move_tol}).",
            )
        if ok_pts.all():
            return Observation(
                label,
                len(centers),
                details,
                f"{len(centers)} limit point(s), each on the boundary of their "
                f"hull or at 0" + (" (F-part; G free)." if label == Label.SUBSPACE else "."),
            )
        return Observation(
            Label.UNCLASSIFIED,
            len(centers),
            details,
            f"{int((~ok_pts).sum())} of {len(centers)} limit points lie inside "
            f"their hull, away from 0.",
        )
    if st.kind == "simple" and st.phi1_left is not None:
        phi = functionals(st.phi1_left[None, :])[..., 0]
        mv = moving(phi[:, :, None])
        lv = phi[-1]
        a, b = float(lv.min()), float(lv.max())
        scale = max(abs(a), abs(b), 1e-300)
        labels, centers = clusters(lv[:, None], rel * scale)
        levels = np.sort(centers[:, 0])
        targets = np.array([a, 0.0, b])
        dist = np.abs(levels[:, None] - targets[None, :]).min(axis=1) / scale
        details = {
            **base,
            "moving": mv,
            "levels": levels,
            "a": a,
            "b": b,
            "level_distance": dist,
            "phi1_left": st.phi1_left,
            "counts": np.bincount(labels),
        }
        if mv > move_tol:
            return Observation(
                Label.NOT_CONVERGED,
                None,
                details,
                f"phi_1*(z_i) still move (relative rate {mv:.3g} > {move_tol}).",
            )
        if len(levels) <= 3 and np.all(dist <= rel):
            return Observation(
                Label.HYPERPLANES,
                len(levels),
                details,
                f"phi_1*(z_i) settled on {len(levels)} level(s) "
                f"{np.array2string(levels, precision=4)} within {{a, 0, b}}.",
            )
        return Observation(
            Label.UNCLASSIFIED,
            len(levels),
            details,
            f"phi_1*(z_i) settled on {len(levels)} levels, not within "
            f"{{a, 0, b}} (a = {a:.4g}, b = {b:.4g}).",
        )
    # no theorem-shaped geometry to test
    mv = moving(z)
    scale = max(np.abs(z[-1]).max(), 1e-300)
    labels, centers = clusters(z[-1], rel * scale)
    details = {**base, "moving": mv, "n_points": len(centers), "why": st.why}
    if mv > move_tol:
        return Observation(
            Label.NOT_CONVERGED,
            None,
            details,
            f"no theorem applies ({st.why}) and the tokens still move.",
        )
    return Observation(
        Label.UNCLASSIFIED,
        len(centers),
        details,
        f"no theorem applies ({st.why}); the tokens settled on {len(centers)} point(s).",
    )
