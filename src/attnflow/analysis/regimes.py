"""Which geometry the tokens cluster to, predicted from V's spectrum before any simulation.

``predict_regime(Q, K, V)`` decides which theorem of Geshkovski, Letrouit, Polyanskiy and
Rigollet (2023) [E] applies, and returns its ``Label``:

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
``|lambda_1| - |lambda_2| > rtol s``; eigenvalues within ``sqrt(rtol) s`` of lambda_1 form
its cluster (eigenvalues of a multiple root are only accurate to ``sqrt(eps)``);
semisimplicity: ``rank(V - lambda_1 I)`` at tolerance ``sqrt(rtol) s`` equals ``d - k``;
``V = c I``: ``||V - c I||_F <= rtol ||V||_F``; positive definiteness:
``lambda_min(sym(Q^T K)) > rtol ||Q|| ||K||``. A value inside a tolerance counts as
failing, and the hypothesis record says so. Every comparison is scale-invariant and
overflow-safe: a matrix whose largest entry lies outside ``[2^-400, 2^400]`` is first
scaled by a power of two (exactly), so that no norm overflows or underflows.

The leading-eigenvalue hypothesis (lambda_1 real, positive, simple and dominant) is
decided by one function, ``leading_eigenvalue``, for one spectrum or a stack of them: the
same decision in ``predict_regime``, in the heads study (``attnflow.studies.heads``) and,
with its own rounding tolerance, in the Ginibre study (``attnflow.studies.ginibre``).

``observe_limit`` (``attnflow.analysis.observe``) measures the end of a trajectory
against the conclusion of the theorem that matches V's spectral structure.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Bool, Complex, Float, Int

from .. import _checks

__all__ = [
    "Label",
    "LABELS",
    "Regime",
    "Hypothesis",
    "SpectralStructure",
    "LeadingEigenvalue",
    "leading_eigenvalue",
    "sort_spectrum",
    "spectral_structure",
    "predict_regime",
]


class Label(enum.StrEnum):
    """The geometry of a limit: predicted (``predict_regime``) or observed
    (``observe_limit``; only an observation is ever ``NOT_CONVERGED``).

    Members are strings (``Label.POLYTOPE == "polytope"``): they compare equal to the
    plain names, format as them and are written to JSON as them."""

    POLYTOPE = "polytope"
    HYPERPLANES = "hyperplanes"
    SUBSPACE = "subspace"
    ORIGIN = "origin"
    UNCLASSIFIED = "unclassified"
    NOT_CONVERGED = "not-converged"


#: The labels a prediction can take, in the order of the module table's theorems.
LABELS: tuple[Label, ...] = (
    Label.POLYTOPE,
    Label.HYPERPLANES,
    Label.SUBSPACE,
    Label.ORIGIN,
    Label.UNCLASSIFIED,
)

THEOREMS = {
    Label.ORIGIN: "[E] V = -I with Q^T K = I: every token tends to 0 (one cluster at the origin)",
    Label.POLYTOPE: "[E] V = I_d with Q^T K positive definite: clustering to the boundary "
    "of a convex polytope (or 0)",
    Label.HYPERPLANES: "[E] simple, real, positive dominant eigenvalue with <Q phi_1, K "
    "phi_1> > 0: clustering to at most three parallel hyperplanes",
    Label.SUBSPACE: "[E] paranormal V with Q^T K positive definite: polytope in F times the "
    "free subspace G",
}

# Largest entries inside this range are used as they are; outside it a matrix is scaled
# by a power of two first (exact), so that squares and products of entries stay finite
# and normal (the range of LAPACK's own scaling, with room for d^2 terms).
_SAFE_EXPONENT = 400
_TINY = float(np.finfo(np.float64).tiny)


# ---------------------------------------------------------------- the one decision
def sort_spectrum(eigenvalues: Complex[npt.ArrayLike, "*b d"]) -> Complex[np.ndarray, "*b d"]:
    """Eigenvalues sorted by decreasing modulus, ties broken by larger real part first
    (a stable sort: an exact tie of both, such as a conjugate pair, keeps its order).

    Args:
        eigenvalues: ``(..., d)`` one spectrum or a stack.

    Returns:
        ``(..., d)`` complex128, sorted along the last axis.
    """
    return _sorted(eigenvalues)[0]


def _sorted(eigenvalues: Any) -> tuple[np.ndarray, np.ndarray]:
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


@dataclasses.dataclass(frozen=True)
class LeadingEigenvalue:
    """The hypotheses on the leading eigenvalue lambda_1 of V, for one spectrum (0-d
    fields) or a stack (fields of the stack's shape ``...``).

    Attributes:
        eigenvalues: ``(..., d)`` complex, sorted as ``sort_spectrum`` sorts.
        lambda1: ``(...)`` complex: the first of them (largest modulus).
        lambda2_abs: ``(...)`` the largest modulus outside lambda_1's cluster (0 when
            there is none); for a complex lambda_1 this is its conjugate's.
        multiplicity: ``(...)`` how many eigenvalues lie in lambda_1's cluster (itself
            included): within ``cluster_rtol * scale`` of lambda_1 (of its real part
            when it counts as real).
        tol: ``(...)`` the absolute tolerance ``rtol * scale`` of the four decisions.
        real: ``|Im lambda_1| <= tol``.
        positive: real and ``Re lambda_1 > tol``.
        simple: ``multiplicity == 1``.
        dominant: ``|lambda_1| - lambda2_abs > tol``.
    """

    eigenvalues: Complex[np.ndarray, "*b d"]
    lambda1: Complex[np.ndarray, "*b"]
    lambda2_abs: Float[np.ndarray, "*b"]
    multiplicity: Int[np.ndarray, "*b"]
    tol: Float[np.ndarray, "*b"]
    real: Bool[np.ndarray, "*b"]
    positive: Bool[np.ndarray, "*b"]
    simple: Bool[np.ndarray, "*b"]
    dominant: Bool[np.ndarray, "*b"]

    @property
    def spectral(self) -> Bool[np.ndarray, "*b"]:
        """The spectral hypothesis of the hyperplane theorem: lambda_1 real, positive,
        simple and dominant."""
        return self.real & self.positive & self.simple & self.dominant


def leading_eigenvalue(
    eigenvalues: Complex[npt.ArrayLike, "*b d"],
    scale: Float[npt.ArrayLike, "*b"],
    *,
    rtol: float,
    cluster_rtol: float | None = None,
) -> LeadingEigenvalue:
    """Decide the hypotheses on the leading eigenvalue, for one spectrum or a stack.

    The one place where "lambda_1 is real, positive, simple and dominant" is decided:
    ``spectral_structure`` / ``predict_regime``, the heads study and the Ginibre study all
    call it, each with its scale and tolerances.

    Args:
        eigenvalues: ``(..., d)`` eigenvalues of V (any order; sorted here).
        scale: ``(...)`` the absolute scale of the decisions (``predict_regime``:
            ``max(|lambda_1|, ||V||_2)``; the Ginibre study: ``||V||_F``).
        rtol: relative tolerance of realness, positivity and dominance.
        cluster_rtol: relative distance within which an eigenvalue counts as equal to
            lambda_1 (not simple). Default ``sqrt(rtol)``: the eigenvalues of a multiple
            root are only accurate to the square root of the rounding. The Ginibre study,
            a certificate at the rounding level, passes ``rtol`` itself.

    Returns:
        A ``LeadingEigenvalue`` (``.spectral``: all four hold).
    """
    w, mod = _sorted(eigenvalues)
    s = np.asarray(scale, np.float64)
    tol = rtol * s
    ctol = (math.sqrt(rtol) if cluster_rtol is None else float(cluster_rtol)) * s
    lam = w[..., 0]
    real = np.abs(np.imag(lam)) <= tol
    positive = real & (np.real(lam) > tol)
    centre = np.where(real, np.real(lam), lam)
    in_cluster = np.abs(w - centre[..., None]) <= ctol[..., None]
    in_cluster[..., 0] = True
    k = in_cluster.sum(axis=-1)
    rho = np.max(np.where(in_cluster, 0.0, mod), axis=-1)
    return LeadingEigenvalue(
        eigenvalues=w,
        lambda1=lam,
        lambda2_abs=rho,
        multiplicity=k,
        tol=tol,
        real=real,
        positive=positive,
        simple=k == 1,
        dominant=mod[..., 0] - rho > tol,
    )


# ------------------------------------------------------------------------ checks
def _matrix(name: str, A: Any, d: int | None = None, rectangular: bool = False) -> np.ndarray:
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


def _balanced(A: np.ndarray) -> tuple[np.ndarray, int]:
    """``(A 2^-e, e)``: ``A`` itself (``e = 0``) when its largest ``|entry|`` lies in
    ``[2^-400, 2^400]``, else scaled by a power of two (exactly) to largest entry in
    ``[1/2, 1)``. Norms and products of the result neither overflow nor underflow."""
    amax = float(np.max(np.abs(A)))
    if amax == 0.0 or 2.0**-_SAFE_EXPONENT <= amax <= 2.0**_SAFE_EXPONENT:
        return A, 0
    e = math.frexp(amax)[1]
    return np.ldexp(A, -e), e


def _unscale(x: float, e: int) -> float:
    """``x 2^e`` (``+-inf`` past the float range)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(x, e))


# -------------------------------------------------------------- spectral structure
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
        rho_G: the spectral radius outside lambda_1's cluster, where decided.
        leading: the four hypotheses on lambda_1 (``leading_eigenvalue``), decided for
            every V (also when ``kind`` stops earlier).
    """

    eigenvalues: Complex[np.ndarray, " d"]
    kind: str
    why: str
    lambda1: complex
    F: Float[np.ndarray, "d k"] | None
    F_coords: Float[np.ndarray, "k d"] | None
    phi1: Float[np.ndarray, " d"] | None
    phi1_left: Float[np.ndarray, " d"] | None
    scalar: float | None
    scale: float
    rho_G: float | None
    leading: LeadingEigenvalue


def spectral_structure(V: Float[npt.ArrayLike, "d d"], *, rtol: float = 1e-8) -> SpectralStructure:
    """Classify V's spectrum as the clustering theorems need it (see the module doc).

    Args:
        V: ``(d, d)`` real matrix.
        rtol: relative tolerance in (0, 1).

    Returns:
        A ``SpectralStructure``.
    """
    V = _matrix("V", V)
    rtol = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    d = V.shape[0]
    w = sort_spectrum(np.linalg.eigvals(V))
    normV = float(np.linalg.norm(V, 2))
    lam1 = complex(w[0])
    scale = max(abs(lam1), normV, _TINY)
    lead = leading_eigenvalue(w, scale, rtol=rtol)
    tol = rtol * scale
    base: dict[str, Any] = dict(
        eigenvalues=w,
        lambda1=lam1,
        F=None,
        F_coords=None,
        phi1=None,
        phi1_left=None,
        scalar=None,
        scale=scale,
        rho_G=None,
        leading=lead,
    )
    Vs, e = _balanced(V)
    cs = float(np.trace(Vs)) / d
    if np.linalg.norm(Vs - cs * np.eye(d)) <= rtol * max(float(np.linalg.norm(Vs)), _TINY):
        c = _unscale(cs, e)
        if c > tol:
            return SpectralStructure(
                kind="scalar-positive",
                why="",
                **{**base, "scalar": c, "F": np.eye(d), "F_coords": np.eye(d), "rho_G": 0.0},
            )
        if c < -tol:
            return SpectralStructure(kind="scalar-negative", why="", **{**base, "scalar": c})
        return SpectralStructure(kind="other", why="V = 0: nothing moves", **base)
    if not lead.real:
        return SpectralStructure(
            kind="other",
            why=f"the eigenvalue of largest modulus is complex "
            f"({lam1.real:.4g} {'+' if lam1.imag >= 0 else '-'} {abs(lam1.imag):.4g}i)",
            **base,
        )
    l1 = lam1.real
    if not lead.positive:
        return SpectralStructure(
            kind="other",
            why=f"the eigenvalue of largest modulus is {'negative' if l1 < 0 else 'zero'} "
            f"({l1:.4g})",
            **base,
        )
    k = int(lead.multiplicity)
    rho_G = float(lead.lambda2_abs)
    if k < d and not lead.dominant:
        return SpectralStructure(
            kind="other",
            why=f"lambda_1 = {l1:.4g} does not dominate: another eigenvalue "
            f"has modulus {rho_G:.4g}",
            **{**base, "rho_G": rho_G},
        )
    cluster_tol = math.sqrt(rtol) * scale
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


# ---------------------------------------------------------------------- prediction
@dataclasses.dataclass(frozen=True)
class Regime:
    """A prediction of ``predict_regime``.

    Attributes:
        label: a ``Label`` other than ``NOT_CONVERGED``.
        theorem: the result of [E] that applies, or None.
        eigenvalues: V's spectrum (complex), sorted by decreasing modulus.
        reason: one sentence: which hypotheses hold and which fails.
        hypotheses: every hypothesis that was decided, in order, with its value.
        structure: V's spectral structure (``SpectralStructure``).
        also: other theorems whose hypotheses also hold (less specific ones).
        rtol: the relative tolerance used.
    """

    label: Label
    theorem: str | None
    eigenvalues: Complex[np.ndarray, " d"]
    reason: str
    hypotheses: tuple[Hypothesis, ...]
    structure: SpectralStructure
    also: tuple[str, ...] = ()
    rtol: float = 1e-8

    def to_dict(self) -> dict[str, Any]:
        """The prediction as plain values (for JSON through ``io.serialize``)."""
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


@dataclasses.dataclass(frozen=True)
class _QKFacts:
    """Q, K scaled by ``2^-shift`` (``_balanced``) and what the theorems ask of them."""

    Q: np.ndarray
    K: np.ndarray
    M: np.ndarray  # Q^T K of the scaled matrices
    pd: Hypothesis
    scale: float  # ||Q||_2 ||K||_2 of the scaled matrices
    shift: int  # the unscaled Q^T K is M 2^shift


def _qk_facts(Q: np.ndarray, K: np.ndarray, rtol: float) -> _QKFacts:
    Qs, eq = _balanced(Q)
    Ks, ek = _balanced(K)
    M = Qs.T @ Ks
    S = (M + M.T) / 2
    scale = max(float(np.linalg.norm(Qs, 2) * np.linalg.norm(Ks, 2)), _TINY)
    lmin = float(np.linalg.eigvalsh(S).min())
    pd = Hypothesis(
        "sym(Q^T K) positive definite",
        lmin > rtol * scale,
        lmin / scale,
        f"smallest eigenvalue of sym(Q^T K) = {_unscale(lmin, eq + ek):.4g}",
    )
    return _QKFacts(Qs, Ks, M, pd, scale, eq + ek)


def predict_regime(
    Q: Any,
    K: Float[npt.ArrayLike, "p d"] | None = None,
    V: Float[npt.ArrayLike, "d d"] | None = None,
    *,
    rtol: float = 1e-8,
) -> Regime:
    """Predict the limit geometry from ``(Q, K, V)`` (or an ``Attention``), before simulating.

    Args:
        Q: ``(d, d)`` real matrix (or ``(p, d)``: a head of size p); or one
            ``attnflow.Attention``, with K and V left out; or a ``MultiHeadAttention``,
            ``FeedForward`` or ``Block``: no theorem covers several heads or a
            feed-forward term, so those are "unclassified" with a reason that reports
            every head's spectrum and that of the summed V (one head and no
            feed-forward term is predicted as that head).
        K: ``(d, d)`` (or ``(p, d)`` like Q).
        V: ``(d, d)`` real matrix.
        rtol: relative tolerance of every numerical decision (see module doc), in (0, 1).

    Returns:
        A ``Regime``. ``Label.UNCLASSIFIED`` means no proved theorem covers the triple;
        its reason names the failing hypothesis.
    """
    # a model exists only once the seam is imported: matrices need neither JAX nor it
    base = sys.modules.get("attnflow.dynamics.base")
    rect = False
    if base is not None and isinstance(Q, base.AbstractModel):
        if K is not None or V is not None:
            raise ValueError("pass either a model or Q, K, V, not both.")
        rtol = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        model = Q
        if not (model.num_heads == 1 and model.pure_attention):
            return _predict_family(model, rtol)
        one = model.head()
        V = one.value_matrix()
        if V is None:
            raise ValueError(
                f"predict_regime needs the value matrix of {type(one).__name__}'s head "
                f"(value_matrix() returns None): the theorems are about P x V^T."
            )
        if not one.plain_softmax:
            return _not_softmax(one, np.asarray(V, np.float64), rtol)
        Q, K = (np.asarray(a, np.float64) for a in one.query_key_maps())
        V = np.asarray(V, np.float64)
        rect = Q.shape[0] != Q.shape[1]
    elif K is None or V is None:
        raise ValueError("predict_regime needs Q, K and V (or one Attention).")
    rtol = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    V = _matrix("V", V)
    d = V.shape[0]
    rect = rect or np.ndim(Q) == 2 and np.shape(Q)[0] != np.shape(Q)[1]
    Q = _matrix("Q", Q, d, rectangular=rect)
    K = _matrix("K", K, d, rectangular=rect)
    if Q.shape != K.shape:
        raise ValueError(f"Q and K must have the same shape; got {Q.shape} and {K.shape}.")
    st = spectral_structure(V, rtol=rtol)
    w = st.eigenvalues
    qk = _qk_facts(Q, K, rtol)
    pd, qk_scale = qk.pd, qk.scale
    hyps: list[Hypothesis] = []

    def result(label: Label, reason: str, also: Any = ()) -> Regime:
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
        M = qk.M
        s_scaled = float(np.trace(M)) / d
        is_id = (
            np.linalg.norm(M - s_scaled * np.eye(d)) <= rtol * max(np.linalg.norm(M), 1e-300)
            and s_scaled > rtol * qk_scale
        )
        s = _unscale(s_scaled, qk.shift)
        hyps.append(Hypothesis("Q^T K = s I, s > 0", bool(is_id), s))
        if is_id:
            return result(
                Label.ORIGIN,
                f"V = {c:.4g} I and Q^T K = {s:.4g} I: every token tends "
                f"to the origin in the original frame (the theorem is stated for "
                f"V = -I, Q^T K = I; positive scalings of time and of the "
                f"temperature reduce to it).",
            )
        return result(
            Label.UNCLASSIFIED,
            f"V = {c:.4g} I but Q^T K is not a positive multiple "
            f"of the identity, which the origin theorem assumes.",
        )
    pd_min = _unscale((pd.value or 0.0) * qk_scale, qk.shift)
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
                Label.POLYTOPE,
                f"V = {c:.4g} I with sym(Q^T K) positive definite: the "
                f"polytope theorem applies (more specific than the paranormal one)." + extra,
                also,
            )
        why = (
            f"V = {c:.4g} I but sym(Q^T K) is not positive definite (smallest eigenvalue "
            f"{pd_min:.4g}), which the polytope theorem needs"
        )
        if d == 1:
            return result(Label.UNCLASSIFIED, why + "; in d = 1 <Q phi_1, K phi_1> = QK <= 0 too.")
        return result(
            Label.UNCLASSIFIED,
            why + f"; lambda_1 has multiplicity {d}, so the "
            f"hyperplane theorem (simple lambda_1) does not apply either.",
        )
    # general V
    l1 = st.lambda1
    lead = st.leading
    real = bool(lead.real)
    hyps.append(Hypothesis("lambda_1 real", real, float(l1.imag)))
    if st.kind == "other":
        if real:
            hyps.append(Hypothesis("lambda_1 > 0", bool(lead.positive), float(l1.real)))
        conj = _conjecture_note(w, st.scale, rtol)
        return result(Label.UNCLASSIFIED, f"No theorem applies: {st.why}.{conj}")
    rho_G = float(st.rho_G or 0.0)
    hyps.append(Hypothesis("lambda_1 > 0", True, float(l1.real)))
    hyps.append(Hypothesis("lambda_1 dominant (> |lambda_2|)", True, float(l1.real - rho_G)))
    if st.kind == "simple" and st.phi1 is not None:
        hyps.append(Hypothesis("lambda_1 simple", True, 1.0))
        phi = st.phi1
        val_scaled = float((qk.Q @ phi) @ (qk.K @ phi))
        ok = val_scaled > rtol * qk_scale
        val = _unscale(val_scaled, qk.shift)
        hyps.append(Hypothesis("<Q phi_1, K phi_1> > 0", ok, val))
        if ok:
            also = []
            if pd.holds:
                also.append("subspace (paranormal with dim F = 1)")
            return result(
                Label.HYPERPLANES,
                f"lambda_1 = {l1.real:.4g} is real, positive, simple "
                f"and dominant (|lambda_2| = {rho_G:.4g}) and <Q phi_1, K phi_1> = "
                f"{val:.4g} > 0: the tokens approach at most three parallel "
                f"hyperplanes phi_1*(x) in {{a, 0, b}}."
                + _conjecture_note(w, st.scale, rtol, sharpen=True),
                also,
            )
        conj = _conjecture_note(w, st.scale, rtol)
        return result(
            Label.UNCLASSIFIED,
            f"lambda_1 = {l1.real:.4g} is simple and dominant but "
            f"<Q phi_1, K phi_1> = {val:.4g} <= 0, which the hyperplane theorem needs "
            f"(and Q^T K is then not positive definite, so the paranormal one "
            f"fails too).{conj}",
        )
    # paranormal
    k = 0 if st.F is None else st.F.shape[1]
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
            f"dim F = {k}, spectral radius on G = {rho_G:.4g} < {l1.real:.4g}",
        )
    )
    hyps.append(pd)
    if pd.holds:
        return result(
            Label.SUBSPACE,
            f"V is paranormal: lambda_1 = {l1.real:.4g} with dim F = {k}, "
            f"V = lambda_1 Id on F, spectral radius {rho_G:.4g} on G, and sym(Q^T K) "
            f"is positive definite: the F-part goes to the boundary of a polytope in "
            f"F (or 0), the G-part is free.",
        )
    return result(
        Label.UNCLASSIFIED,
        f"V is paranormal (dim F = {k}) but sym(Q^T K) is not "
        f"positive definite (smallest eigenvalue {pd_min:.4g}), and "
        f"lambda_1 is not simple, so neither theorem applies.",
    )


def _spectrum_text(w: np.ndarray) -> str:
    return "[" + ", ".join(f"{complex(v).real:.4g}{complex(v).imag:+.4g}i" for v in w) + "]"


def _not_softmax(head: Any, V: np.ndarray, rtol: float) -> Regime:
    """One head whose weights are not plain unmasked softmax: unclassified, naming what
    the head computes instead."""
    st = spectral_structure(V, rtol=rtol)
    masked = getattr(head, "mask", None) is not None
    what = head.attention_kind + (" under a mask" if masked else "")
    return Regime(
        label=Label.UNCLASSIFIED,
        theorem=None,
        eigenvalues=st.eigenvalues,
        reason=(
            f"{what}: no theorem of [E] covers this attention (the four regimes are "
            f"proved for unmasked softmax attention). Spectrum of V: "
            f"{_spectrum_text(st.eigenvalues)} (spectral structure {st.kind!r})."
        ),
        hypotheses=(Hypothesis("unmasked softmax attention", False),),
        structure=st,
        rtol=rtol,
    )


def _predict_family(model: Any, rtol: float) -> Regime:
    """``predict_regime`` of a model with several heads, a feed-forward term or no
    attention: unclassified, with every head's spectrum (``value_matrices``)."""
    d = model.d
    h_declared = model.num_heads
    Vs = (
        np.asarray(model.value_matrices(), np.float64).reshape(-1, d, d)
        if h_declared
        else np.zeros((0, d, d))
    )
    ff = not model.pure_attention
    h = Vs.shape[0]
    summed = Vs.sum(0)
    st = spectral_structure(summed, rtol=rtol)
    parts = []
    for i, Vh in enumerate(Vs):
        w = sort_spectrum(np.linalg.eigvals(Vh))
        parts.append(f"head {i}: {_spectrum_text(w)}")
    what = []
    if h > 1:
        what.append(f"{h} heads")
    if h == 0:
        what.append("a feed-forward layer alone (no attention)")
    elif ff:
        what.append("a feed-forward term")
    hyps = (
        Hypothesis("one attention head", h == 1, float(h)),
        Hypothesis("no feed-forward term", not (ff or h == 0)),
    )
    reason = (
        f"{' and '.join(what)}: no theorem of [E] covers this model (the four regimes are "
        f"proved for one head of pure self-attention)."
    )
    if h > 0:
        reason += (
            f" Spectra per head: {'; '.join(parts)}. Summed V: {_spectrum_text(st.eigenvalues)} "
            f"(spectral structure {st.kind!r})."
        )
    return Regime(
        label=Label.UNCLASSIFIED,
        theorem=None,
        eigenvalues=st.eigenvalues,
        reason=reason,
        hypotheses=hyps,
        structure=st,
        rtol=rtol,
    )


def _conjecture_note(w: np.ndarray, scale: float, rtol: float, sharpen: bool = False) -> str:
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
