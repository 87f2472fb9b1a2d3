"""Which geometry the tokens cluster to: predicted from V's spectrum, observed in a run.

``predict_regime(Q, K, V)`` decides, before any simulation, which theorem of Geshkovski,
Letrouit, Polyanskiy and Rigollet (2023) [E] applies, and returns its label:

=============  ==============================================================  ===========
label          hypotheses (checked in this order; the first that holds wins)   limit
=============  ==============================================================  ===========
"origin"       V = -c I (c > 0) and Q^T K = s I (s > 0)                         x_i -> 0
"polytope"     V = lambda I (lambda > 0) and sym(Q^T K) positive definite       z_i -> S
"hyperplanes"  lambda_1 real, > 0, simple and dominant (lambda_1 > |lambda_2|)  phi_1*(z_i)
               and <Q phi_1, K phi_1> > 0                                       -> {a, 0, b}
"subspace"     "paranormal": lambda_1 > 0 semisimple of multiplicity k >= 2,    F-part ->
               V = lambda_1 Id on F, |lambda| < lambda_1 on the complement G,   polytope
               and sym(Q^T K) positive definite                                boundary
"unclassified" anything else; the reason names the first hypothesis that fails
=============  ==============================================================  ===========

The more specific statement is preferred and the reason says so: V = lambda I is also
"paranormal" (F = R^d, G = {0}) but the polytope theorem says more; a paranormal V with a
one-dimensional F is the hyperplane case (whose Q, K condition is weaker). The
codimension-k conjecture (k eigenvalues of positive real part -> at most three parallel
affine subspaces of codimension k) is not a theorem: it may be mentioned in a reason,
never used as a label.

Tolerances (all relative, ``rtol = 1e-8`` by default; scale ``s = max(|lambda_1|,
||V||_2)`` for spectral decisions, ``||Q||_2 ||K||_2`` for the Q, K conditions):
realness ``|Im lambda| <= rtol s``; positivity ``lambda > rtol s``; dominance
``lambda_1 - |lambda_2| > rtol s``; eigenvalues within ``sqrt(rtol) s`` of lambda_1 form
its cluster (eigenvalues of a multiple root are only accurate to ``sqrt(eps)``);
semisimplicity: ``rank(V - lambda_1 I)`` at tolerance ``sqrt(rtol) s`` equals ``d - k``;
``V = c I``: ``||V - c I||_F <= rtol ||V||_F``; positive definiteness:
``lambda_min(sym(Q^T K)) > rtol ||Q|| ||K||``. A value inside a tolerance counts as
failing, and the hypothesis record says so.

``observe_limit(traj)`` measures the end of a trajectory against the conclusion of the
theorem that matches V's spectral structure (not the Q, K hypotheses: an observation
must be able to disagree with a prediction); see its docstring.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = [
    "Regime",
    "Observation",
    "Hypothesis",
    "SpectralStructure",
    "spectral_structure",
    "predict_regime",
    "observe_limit",
    "LABELS",
]

LABELS = ("polytope", "hyperplanes", "subspace", "origin", "unclassified")

THEOREMS = {
    "origin": "[E] V = -I with Q^T K = I: every token tends to 0 (one cluster at the origin)",
    "polytope": "[E] V = I_d with Q^T K positive definite: clustering to the boundary of a "
    "convex polytope (or 0)",
    "hyperplanes": "[E] simple, real, positive dominant eigenvalue with <Q phi_1, K phi_1> "
    "> 0: clustering to at most three parallel hyperplanes",
    "subspace": "[E] paranormal V with Q^T K positive definite: polytope in F times the "
    "free subspace G",
}


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of a theorem, decided numerically."""

    name: str
    holds: bool
    value: float | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class SpectralStructure:
    """The spectral facts of V that the theorems use.

    Attributes:
        eigenvalues: ``(d,)`` complex, sorted by decreasing modulus (ties: larger real
            part first).
        kind: ``"scalar-positive"`` (V = c I, c > 0), ``"scalar-negative"`` (c < 0),
            ``"simple"`` (lambda_1 real > 0, simple, dominant), ``"paranormal"``
            (lambda_1 real > 0, semisimple, multiplicity k >= 2, dominant),
            or ``"other"``.
        why: for ``"other"``, which spectral condition fails.
        lambda1: the leading eigenvalue (complex).
        F: ``(d, k)`` orthonormal basis of the leading eigenspace (kinds simple,
            paranormal, scalar-positive), else None.
        F_coords: ``(k, d)`` the linear map ``z -> coordinates of the F-part of z`` along
            the invariant complement G (for k = 1: ``phi_1* / phi_1*(phi_1)``), else None.
        phi1, phi1_left: right and left eigenvectors for a simple lambda_1 (left
            normalised so that ``phi1_left @ phi1 = 1``), else None.
        scalar: ``c`` when V = c I, else None.
        scale: ``max(|lambda_1|, ||V||_2)``.
    """

    eigenvalues: np.ndarray
    kind: str
    why: str
    lambda1: complex
    F: np.ndarray | None
    F_coords: np.ndarray | None
    phi1: np.ndarray | None
    phi1_left: np.ndarray | None
    scalar: float | None
    scale: float
    rho_G: float | None


def _sorted_eigenvalues(V: np.ndarray) -> np.ndarray:
    w = np.linalg.eigvals(V).astype(np.complex128)
    order = np.lexsort((-w.real, -np.abs(w)))
    return w[order]


def _validate_matrix(name: str, A, d: int | None = None, rectangular: bool = False) -> np.ndarray:
    try:
        arr = np.asarray(A)
    except Exception as exc:
        raise ValueError(f"{name} must be a (d, d) real matrix: {exc}") from None
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real; got a complex array.")
    try:
        arr = arr.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real numeric (d, d) matrix.") from None
    if rectangular:
        if arr.ndim != 2 or min(arr.shape) < 1 or (d is not None and arr.shape[1] != d):
            raise ValueError(f"{name} must be a (p, {d}) matrix; got shape {arr.shape}.")
    else:
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 1:
            raise ValueError(f"{name} must be a square (d, d) matrix; got shape {arr.shape}.")
        if d is not None and arr.shape[0] != d:
            raise ValueError(f"{name} has shape {arr.shape}; Q, K and V must all be ({d}, {d}).")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries (NaN or inf).")
    return arr


def spectral_structure(V, *, rtol: float = 1e-8) -> SpectralStructure:
    """Classify V's spectrum as the clustering theorems need it (see module doc)."""
    V = _validate_matrix("V", V)
    d = V.shape[0]
    w = _sorted_eigenvalues(V)
    normV = float(np.linalg.norm(V, 2))
    lam1 = complex(w[0])
    scale = max(abs(lam1), normV, np.finfo(float).tiny)
    tol = rtol * scale
    base = dict(
        eigenvalues=w,
        lambda1=lam1,
        F=None,
        F_coords=None,
        phi1=None,
        phi1_left=None,
        scalar=None,
        scale=scale,
        rho_G=None,
    )
    c = float(np.trace(V)) / d
    if np.linalg.norm(V - c * np.eye(d)) <= rtol * max(np.linalg.norm(V), np.finfo(float).tiny):
        if c > tol:
            return SpectralStructure(
                kind="scalar-positive",
                why="",
                **{**base, "scalar": c, "F": np.eye(d), "F_coords": np.eye(d), "rho_G": 0.0},
            )
        if c < -tol:
            return SpectralStructure(kind="scalar-negative", why="", **{**base, "scalar": c})
        return SpectralStructure(kind="other", why="V = 0: nothing moves", **base)
    if abs(lam1.imag) > tol:
        return SpectralStructure(
            kind="other",
            why=f"the eigenvalue of largest modulus is complex "
            f"({lam1.real:.4g} {'+' if lam1.imag >= 0 else '-'} {abs(lam1.imag):.4g}i)",
            **base,
        )
    l1 = lam1.real
    if l1 <= tol:
        return SpectralStructure(
            kind="other",
            why=f"the eigenvalue of largest modulus is {'negative' if l1 < 0 else 'zero'} "
            f"({l1:.4g})",
            **base,
        )
    cluster_tol = math.sqrt(rtol) * scale
    in_cluster = np.abs(w - l1) <= cluster_tol
    k = int(in_cluster.sum())
    others = w[~in_cluster]
    rho_G = float(np.abs(others).max()) if others.size else 0.0
    if others.size and not (l1 - rho_G > tol):
        return SpectralStructure(
            kind="other",
            why=f"lambda_1 = {l1:.4g} does not dominate: another eigenvalue "
            f"has modulus {rho_G:.4g}",
            **{**base, "rho_G": rho_G},
        )
    A = V - l1 * np.eye(d)
    U, sv, Wt = np.linalg.svd(A)
    rank = int((sv > cluster_tol).sum())
    if d - rank != k:
        return SpectralStructure(
            kind="other",
            why=f"lambda_1 = {l1:.4g} has algebraic multiplicity {k} but "
            f"geometric multiplicity {d - rank}: V is not lambda_1 Id on its leading "
            f"eigenspace (a Jordan block)",
            **{**base, "rho_G": rho_G},
        )
    F = Wt[rank:].T  # (d, k) orthonormal basis of ker(V - l1 I)
    G = U[:, :rank]  # (d, d-k) orthonormal basis of range(V - l1 I) = G
    basis = np.concatenate([F, G], axis=1)
    coords = np.linalg.inv(basis)[:k]  # z -> F-coordinates along G
    if k == 1:
        phi1 = F[:, 0]
        # left eigenvector: the functional vanishing on G, normalised on phi1
        left = coords[0] / (coords[0] @ phi1)
        return SpectralStructure(
            kind="simple",
            why="",
            **{**base, "F": F, "F_coords": coords, "phi1": phi1, "phi1_left": left, "rho_G": rho_G},
        )
    return SpectralStructure(
        kind="paranormal", why="", **{**base, "F": F, "F_coords": coords, "rho_G": rho_G}
    )


@dataclasses.dataclass(frozen=True)
class Regime:
    """A prediction of ``predict_regime``.

    Attributes:
        label: "polytope" | "hyperplanes" | "subspace" | "origin" | "unclassified".
        theorem: the result of [E] that applies, or None.
        eigenvalues: V's spectrum (complex), sorted by decreasing modulus.
        reason: one sentence: which hypotheses hold and which fails.
        hypotheses: every hypothesis that was decided, in order, with its value.
        structure: V's spectral structure (``SpectralStructure``).
        also: other theorems whose hypotheses also hold (less specific ones).
        rtol: the relative tolerance used.
    """

    label: str
    theorem: str | None
    eigenvalues: np.ndarray
    reason: str
    hypotheses: tuple
    structure: SpectralStructure
    also: tuple = ()
    rtol: float = 1e-8

    def to_dict(self) -> dict[str, Any]:
        s = self.structure
        return {
            "label": self.label,
            "theorem": self.theorem,
            "eigenvalues": self.eigenvalues,
            "reason": self.reason,
            "hypotheses": [dataclasses.asdict(h) for h in self.hypotheses],
            "also": list(self.also),
            "structure": s.kind,
            "lambda1": s.lambda1,
            "phi1": s.phi1,
            "phi1_left": s.phi1_left,
            "rtol": self.rtol,
        }


def _qk_facts(Q, K, rtol):
    M = Q.T @ K
    S = (M + M.T) / 2
    scale = max(float(np.linalg.norm(Q, 2) * np.linalg.norm(K, 2)), np.finfo(float).tiny)
    lmin = float(np.linalg.eigvalsh(S).min())
    pd = Hypothesis(
        "sym(Q^T K) positive definite",
        lmin > rtol * scale,
        lmin / scale,
        f"smallest eigenvalue of sym(Q^T K) = {lmin:.4g}",
    )
    return M, pd, scale


def predict_regime(Q, K=None, V=None, *, rtol: float = 1e-8) -> Regime:
    """Predict the limit geometry from ``(Q, K, V)`` (or an ``Attention``), before simulating.

    Args:
        Q, K, V: ``(d, d)`` real matrices (Q and K may be ``(p, d)``: a head of size p);
            or pass one ``attnflow.Attention`` as ``Q``.
        rtol: relative tolerance of every numerical decision (see module doc).

    Returns:
        A ``Regime``. "unclassified" means no proved theorem covers the triple; its
        reason names the failing hypothesis.
    """
    from ..dynamics.model import Attention

    rect = False
    if isinstance(Q, Attention):
        if K is not None or V is not None:
            raise ValueError("pass either an Attention or Q, K, V, not both.")
        model = Q
        Q, K, V = (np.asarray(a, np.float64) for a in (model.Q, model.K, model.V))
        rect = Q.shape[0] != Q.shape[1]
    elif K is None or V is None:
        raise ValueError("predict_regime needs Q, K and V (or one Attention).")
    if not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise ValueError(f"rtol must be a number in (0, 1); got {rtol!r}.")
    V = _validate_matrix("V", V)
    d = V.shape[0]
    rect = rect or np.ndim(Q) == 2 and np.shape(Q)[0] != np.shape(Q)[1]
    Q = _validate_matrix("Q", Q, d, rectangular=rect)
    K = _validate_matrix("K", K, d, rectangular=rect)
    if Q.shape != K.shape:
        raise ValueError(f"Q and K must have the same shape; got {Q.shape} and {K.shape}.")
    st = spectral_structure(V, rtol=rtol)
    w = st.eigenvalues
    M, pd, qk_scale = _qk_facts(Q, K, rtol)
    hyps: list[Hypothesis] = []

    def result(label, reason, also=()):
        return Regime(
            label=label,
            theorem=THEOREMS.get(label),
            eigenvalues=w,
            reason=reason,
            hypotheses=tuple(hyps),
            structure=st,
            also=tuple(also),
            rtol=rtol,
        )

    if st.kind == "scalar-negative":
        c = st.scalar
        hyps.append(Hypothesis("V = -c I, c > 0", True, c))
        s = float(np.trace(M)) / d
        is_id = (
            np.linalg.norm(M - s * np.eye(d)) <= rtol * max(np.linalg.norm(M), 1e-300)
            and s > rtol * qk_scale
        )
        hyps.append(Hypothesis("Q^T K = s I, s > 0", bool(is_id), s))
        if is_id:
            return result(
                "origin",
                f"V = {c:.4g} I and Q^T K = {s:.4g} I: every token tends "
                f"to the origin in the original frame (the theorem is stated for "
                f"V = -I, Q^T K = I; positive scalings of time and of the "
                f"temperature reduce to it).",
            )
        return result(
            "unclassified",
            f"V = {c:.4g} I but Q^T K is not a positive multiple "
            f"of the identity, which the origin theorem assumes.",
        )
    if st.kind == "scalar-positive":
        c = st.scalar
        hyps.append(Hypothesis("V = lambda I, lambda > 0", True, c))
        hyps.append(pd)
        if pd.holds:
            also = ["subspace (paranormal with F = R^d, G = {0})"]
            extra = ""
            if d == 1:
                also.append("hyperplanes (d = 1)")
                extra = (
                    " In d = 1 this is also the hyperplane case, and the attention "
                    "matrix tends to a Boolean matrix with the extreme tokens as leaders."
                )
            return result(
                "polytope",
                f"V = {c:.4g} I with sym(Q^T K) positive definite: the "
                f"polytope theorem applies (more specific than the paranormal one)." + extra,
                also,
            )
        why = (
            f"V = {c:.4g} I but sym(Q^T K) is not positive definite (smallest eigenvalue "
            f"{pd.value * qk_scale:.4g}), which the polytope theorem needs"
        )
        if d == 1:
            return result("unclassified", why + "; in d = 1 <Q phi_1, K phi_1> = QK <= 0 too.")
        return result(
            "unclassified",
            why + f"; lambda_1 has multiplicity {d}, so the "
            f"hyperplane theorem (simple lambda_1) does not apply either.",
        )
    # general V
    l1 = st.lambda1
    real = abs(l1.imag) <= rtol * st.scale
    hyps.append(Hypothesis("lambda_1 real", real, float(l1.imag)))
    if st.kind == "other":
        if real:
            hyps.append(Hypothesis("lambda_1 > 0", l1.real > rtol * st.scale, float(l1.real)))
        conj = _conjecture_note(w, st.scale, rtol)
        return result("unclassified", f"No theorem applies: {st.why}.{conj}")
    hyps.append(Hypothesis("lambda_1 > 0", True, float(l1.real)))
    hyps.append(Hypothesis("lambda_1 dominant (> |lambda_2|)", True, float(l1.real - st.rho_G)))
    if st.kind == "simple":
        hyps.append(Hypothesis("lambda_1 simple", True, 1.0))
        phi = st.phi1
        val = float((Q @ phi) @ (K @ phi))
        ok = val > rtol * qk_scale
        hyps.append(Hypothesis("<Q phi_1, K phi_1> > 0", ok, val))
        if ok:
            also = []
            if pd.holds:
                also.append("subspace (paranormal with dim F = 1)")
            return result(
                "hyperplanes",
                f"lambda_1 = {l1.real:.4g} is real, positive, simple "
                f"and dominant (|lambda_2| = {st.rho_G:.4g}) and <Q phi_1, K phi_1> = "
                f"{val:.4g} > 0: the tokens approach at most three parallel "
                f"hyperplanes phi_1*(x) in {{a, 0, b}}."
                + _conjecture_note(w, st.scale, rtol, sharpen=True),
                also,
            )
        conj = _conjecture_note(w, st.scale, rtol)
        return result(
            "unclassified",
            f"lambda_1 = {l1.real:.4g} is simple and dominant but "
            f"<Q phi_1, K phi_1> = {val:.4g} <= 0, which the hyperplane theorem needs "
            f"(and Q^T K is then not positive definite, so the paranormal one "
            f"fails too).{conj}",
        )
    # paranormal
    k = st.F.shape[1]
    hyps.append(
        Hypothesis(
            "lambda_1 simple",
            False,
            float(k),
            f"multiplicity {k}, semisimple (V = lambda_1 Id on F)",
        )
    )
    hyps.append(
        Hypothesis(
            "paranormal split",
            True,
            float(k),
            f"dim F = {k}, spectral radius on G = {st.rho_G:.4g} < {l1.real:.4g}",
        )
    )
    hyps.append(pd)
    if pd.holds:
        return result(
            "subspace",
            f"V is paranormal: lambda_1 = {l1.real:.4g} with dim F = {k}, "
            f"V = lambda_1 Id on F, spectral radius {st.rho_G:.4g} on G, and sym(Q^T K) "
            f"is positive definite: the F-part goes to the boundary of a polytope in "
            f"F (or 0), the G-part is free.",
        )
    return result(
        "unclassified",
        f"V is paranormal (dim F = {k}) but sym(Q^T K) is not "
        f"positive definite (smallest eigenvalue {pd.value * qk_scale:.4g}), and "
        f"lambda_1 is not simple, so neither theorem applies.",
    )


def _conjecture_note(w, scale, rtol, sharpen: bool = False) -> str:
    pos = int((w.real > rtol * scale).sum())
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


# =========================================================================== observe
@dataclasses.dataclass(frozen=True)
class Observation:
    """What the tokens reached at the end of a trajectory (``observe_limit``).

    Attributes:
        label: "polytope" | "hyperplanes" | "subspace" | "origin" | "unclassified" |
            "not-converged".
        n_clusters: distinct limit points found (None where not meaningful).
        details: the measured geometry (see ``observe_limit``).
        reason: one sentence saying what was measured.
    """

    label: str
    n_clusters: int | None
    details: dict
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "n_clusters": self.n_clusters,
            "details": self.details,
            "reason": self.reason,
        }


def _clusters(points: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Single-linkage clusters at distance ``tol``: (labels (n,), centers (c, dim))."""
    n = points.shape[0]
    labels = -np.ones(n, dtype=int)
    D = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    c = 0
    for i in range(n):
        if labels[i] >= 0:
            continue
        stack = [i]
        labels[i] = c
        while stack:
            j = stack.pop()
            for k in np.flatnonzero((D[j] <= tol) & (labels < 0)):
                labels[k] = c
                stack.append(k)
        c += 1
    centers = np.stack([points[labels == j].mean(axis=0) for j in range(c)])
    return labels, centers


def _boundary_distances(points: np.ndarray, tol: float) -> np.ndarray:
    """Distance of each point to the relative boundary of the convex hull of ``points``.

    0 for hull vertices and points on facets. Computed in the affine hull of the points
    (``scipy.spatial.ConvexHull`` in its dimension; segments and single points by hand).
    """
    c = points.mean(axis=0)
    X = points - c
    if X.shape[0] == 1:
        return np.zeros(1)
    U, s, Vt = np.linalg.svd(X, full_matrices=False)
    r = int((s > tol).sum())
    if r == 0:
        return np.zeros(points.shape[0])
    Y = X @ Vt[:r].T
    if r == 1:
        y = Y[:, 0]
        return np.minimum(np.abs(y - y.min()), np.abs(y.max() - y))
    if Y.shape[0] <= r:
        return np.zeros(points.shape[0])  # a simplex: every point is a vertex
    from scipy.spatial import ConvexHull

    hull = ConvexHull(Y)
    # facet equations: normal . y + offset <= 0 inside
    dist = -(Y @ hull.equations[:, :-1].T + hull.equations[:, -1])  # (n, facets) >= 0
    return np.maximum(dist.min(axis=1), 0.0)


def observe_limit(
    traj,
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

    Args:
        traj: a ``Trajectory`` (one system; for a batch pass ``system=i``).
        tol: clustering tolerance relative to the scale of the measured quantity (its
            largest modulus at the end); default ``1e-2``.
        move_tol: relative change per unit time below which a quantity counts as settled.
        origin_tol: relative radius below which the original frame counts as collapsed.
        system: index into a batched trajectory.
    """
    if traj.batched:
        if system is None:
            raise ValueError("traj is a batch: pass system=i to observe one system.")
        z = np.asarray(traj.z[system], np.float64)
        x = np.asarray(traj.x[system], np.float64)
        keep = np.asarray(traj.reached[system])
        z, x = z[keep], x[keep]
        ts = np.asarray(traj.ts, np.float64)[keep]
    else:
        z = np.asarray(traj.z, np.float64)
        x = np.asarray(traj.x, np.float64)
        ts = np.asarray(traj.ts, np.float64)
    if z.shape[0] < 2:
        raise ValueError("observe_limit needs at least two saved times (pass ts=...).")

    def functionals(P):
        """``z @ P.T`` from the solver's own coordinates (``Trajectory.project``): in
        modal coordinates a diverging mode that P annihilates adds no rounding."""
        if traj.batched:
            return np.asarray(traj.project(P, system=system), np.float64)[keep]
        return np.asarray(traj.project(P), np.float64)

    rel = 1e-2 if tol is None else float(tol)
    if not rel > 0:
        raise ValueError(f"tol must be positive; got {tol!r}.")
    model = traj.model
    V = np.asarray(model.V, np.float64)
    M = np.asarray(model.Q, np.float64).T @ np.asarray(model.K, np.float64)
    st = spectral_structure(V)
    dt_last = ts[-1] - ts[-2]
    base = {"t_final": float(ts[-1]), "status": traj.status, "structure": st.kind, "tol": rel}

    def moving(q):  # relative change per unit time between the last two saves
        scale = max(np.abs(q[-1]).max(), np.abs(q[-2]).max(), 1e-300)
        return float(np.abs(q[-1] - q[-2]).max() / scale / max(dt_last, 1e-300))

    # ---- origin
    radius = np.linalg.norm(x, axis=-1).max(axis=-1)
    half = radius[len(radius) // 2 :]
    collapsed = radius[-1] <= origin_tol * radius[0] and np.all(np.diff(half) <= 1e-12 * radius[0])
    if collapsed:
        return Observation(
            "origin",
            1,
            {**base, "radius": radius[-1], "radius0": radius[0], "ratio": radius[-1] / radius[0]},
            f"the original-frame radius fell from {radius[0]:.4g} to "
            f"{radius[-1]:.4g} and keeps decreasing: one cluster at 0.",
        )
    if st.kind == "scalar-negative":
        return Observation(
            "not-converged",
            None,
            {**base, "radius": radius[-1], "radius0": radius[0]},
            f"V = -cI but the radius is still {radius[-1] / radius[0]:.3g} of "
            f"its start (the spread decays only like t^(-1/2)).",
        )
    if st.kind in ("scalar-positive", "paranormal"):
        q = z if st.kind == "scalar-positive" else functionals(st.F_coords)
        label = "polytope" if st.kind == "scalar-positive" else "subspace"
        mv = moving(q)
        pts = q[-1]
        scale = max(np.abs(pts).max(), 1e-300)
        labels, centers = _clusters(pts, rel * scale)
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
            quad = np.einsum("ci,ij,cj->c", centers, M, centers)
            best = (centers @ M @ centers.T).max(axis=1)
            details["S_gap"] = (best - quad) / max(scale**2 * np.linalg.norm(M, 2), 1e-300)
        if mv > move_tol:
            return Observation(
                "not-converged",
                None,
                details,
                f"the {'tokens' if label == 'polytope' else 'F-parts'} still "
                f"move (relative rate {mv:.3g} > {move_tol}).",
            )
        if ok_pts.all():
            return Observation(
                label,
                len(centers),
                details,
                f"{len(centers)} limit point(s), each on the boundary of their "
                f"hull or at 0" + (" (F-part; G free)." if label == "subspace" else "."),
            )
        return Observation(
            "unclassified",
            len(centers),
            details,
            f"{int((~ok_pts).sum())} of {len(centers)} limit points lie inside "
            f"their hull, away from 0.",
        )
    if st.kind == "simple":
        phi = functionals(st.phi1_left[None, :])[..., 0]
        mv = moving(phi[:, :, None])
        lv = phi[-1]
        a, b = float(lv.min()), float(lv.max())
        scale = max(abs(a), abs(b), 1e-300)
        labels, centers = _clusters(lv[:, None], rel * scale)
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
                "not-converged",
                None,
                details,
                f"phi_1*(z_i) still move (relative rate {mv:.3g} > {move_tol}).",
            )
        if len(levels) <= 3 and np.all(dist <= rel):
            return Observation(
                "hyperplanes",
                len(levels),
                details,
                f"phi_1*(z_i) settled on {len(levels)} level(s) "
                f"{np.array2string(levels, precision=4)} within {{a, 0, b}}.",
            )
        return Observation(
            "unclassified",
            len(levels),
            details,
            f"phi_1*(z_i) settled on {len(levels)} levels, not within "
            f"{{a, 0, b}} (a = {a:.4g}, b = {b:.4g}).",
        )
    # no theorem-shaped geometry to test
    mv = moving(z)
    scale = max(np.abs(z[-1]).max(), 1e-300)
    labels, centers = _clusters(z[-1], rel * scale)
    details = {**base, "moving": mv, "n_points": len(centers), "why": st.why}
    if mv > move_tol:
        return Observation(
            "not-converged",
            None,
            details,
            f"no theorem applies ({st.why}) and the tokens still move.",
        )
    return Observation(
        "unclassified",
        len(centers),
        details,
        f"no theorem applies ({st.why}); the tokens settled on {len(centers)} point(s).",
    )
