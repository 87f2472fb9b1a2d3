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

The records (``Label``, ``Hypothesis``, ``LeadingEigenvalue``, ``SpectralStructure``,
``Regime``) are defined in ``_regime_types``, ``sort_spectrum`` and the scale-safe
helpers in ``_spectra``; every name above is importable from here.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Complex, Float

from .. import _checks
from ._regime_types import Hypothesis, Label, LeadingEigenvalue, Regime, SpectralStructure
from ._spectra import (
    TINY,
    balanced,
    conjecture_note,
    qk_facts,
    real_matrix,
    sort_spectrum,
    sorted_spectrum,
    spectrum_text,
    unscale,
)

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


# ---------------------------------------------------------------- the one decision
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
    w, mod = sorted_spectrum(eigenvalues)
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


# -------------------------------------------------------------- spectral structure


def spectral_structure(V: Float[npt.ArrayLike, "d d"], *, rtol: float = 1e-8) -> SpectralStructure:
    """Classify V's spectrum as the clustering theorems need it (see the module doc).

    Args:
        V: ``(d, d)`` real matrix.
        rtol: relative tolerance in (0, 1).

    Returns:
        A ``SpectralStructure``.
    """
    V = real_matrix("V", V)
    rtol = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    d = V.shape[0]
    w = sort_spectrum(np.linalg.eigvals(V))
    normV = float(np.linalg.norm(V, 2))
    lam1 = complex(w[0])
    scale = max(abs(lam1), normV, TINY)
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
    Vs, e = balanced(V)
    cs = float(np.trace(Vs)) / d
    if np.linalg.norm(Vs - cs * np.eye(d)) <= rtol * max(float(np.linalg.norm(Vs)), TINY):
        c = unscale(cs, e)
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
        # the sign convention: the entry of largest modulus (the first on ties) is > 0,
        # so phi1, phi1_left and the levels read from them do not depend on the sign
        # LAPACK's SVD happens to return
        top = int(np.argmax(np.abs(phi1)))
        if phi1[top] < 0:
            phi1 = -phi1
            coords = coords.copy()
            coords[0] = -coords[0]
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

    Example:
        >>> import numpy as np, attnflow as af
        >>> str(af.predict_regime(np.eye(2), np.eye(2), np.eye(2)).label)
        'polytope'
        >>> str(af.predict_regime(np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"]).label)
        'hyperplanes'
    """
    _checks.refuse_mean_field(Q, "predict_regime", "Its modes: predict_metastable.")
    # a model exists only once the seam is imported: matrices need neither JAX nor it
    base = sys.modules.get("attnflow.dynamics.base")
    rect = False
    if base is not None and isinstance(Q, base.AbstractModel):
        if K is not None or V is not None:
            raise ValueError("pass either a model or Q, K, V, not both.")
        rtol = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        model = Q
        if model.stack_size is not None:
            raise ValueError(
                f"model is stacked ({model.stack_size} weight triples, attnflow.stack): "
                "predict each one, predict_regime(attnflow.unstack(model, i))."
            )
        if not (model.num_heads == 1 and model.pure_attention) or model.beyond_attention:
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
    V = real_matrix("V", V)
    d = V.shape[0]
    rect = rect or np.ndim(Q) == 2 and np.shape(Q)[0] != np.shape(Q)[1]
    Q = real_matrix("Q", Q, d, rectangular=rect)
    K = real_matrix("K", K, d, rectangular=rect)
    if Q.shape != K.shape:
        raise ValueError(f"Q and K must have the same shape; got {Q.shape} and {K.shape}.")
    st = spectral_structure(V, rtol=rtol)
    w = st.eigenvalues
    qk = qk_facts(Q, K, rtol)
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
        s = unscale(s_scaled, qk.shift)
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
    pd_min = unscale((pd.value or 0.0) * qk_scale, qk.shift)
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
        conj = conjecture_note(w, st.scale, rtol)
        return result(Label.UNCLASSIFIED, f"No theorem applies: {st.why}.{conj}")
    rho_G = float(st.rho_G or 0.0)
    hyps.append(Hypothesis("lambda_1 > 0", True, float(l1.real)))
    hyps.append(Hypothesis("lambda_1 dominant (> |lambda_2|)", True, float(l1.real - rho_G)))
    if st.kind == "simple" and st.phi1 is not None:
        hyps.append(Hypothesis("lambda_1 simple", True, 1.0))
        phi = st.phi1
        val_scaled = float((qk.Q @ phi) @ (qk.K @ phi))
        ok = val_scaled > rtol * qk_scale
        val = unscale(val_scaled, qk.shift)
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
                + conjecture_note(w, st.scale, rtol, sharpen=True),
                also,
            )
        conj = conjecture_note(w, st.scale, rtol)
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


def _not_softmax(head: Any, V: np.ndarray, rtol: float) -> Regime:
    """One head whose weights are not plain unmasked softmax: unclassified, naming what
    the head computes instead."""
    return not_softmax_regime(head, spectral_structure(V, rtol=rtol), rtol)


def not_softmax_regime(head: Any, st: Any, rtol: float) -> Regime:
    """The regime of one head whose weights are not plain unmasked, position-free softmax
    (``plain_softmax`` False), given the spectral structure ``st`` of its V: unclassified,
    the reason naming what the head computes (its ``attention_kind``, and ``positional``
    when positions enter its logits). The heads study gives the same answer from its
    reduced triple."""
    what = head.attention_kind
    if head.positional:
        what += ", with token positions in its logits"
    return Regime(
        label=Label.UNCLASSIFIED,
        theorem=None,
        eigenvalues=st.eigenvalues,
        reason=(
            f"{what}: no theorem of [E] covers this attention (the four regimes are "
            f"proved for unmasked, position-free softmax attention; the theorem assumes "
            f"it). Spectrum of V: {spectrum_text(st.eigenvalues)} (spectral structure "
            f"{st.kind!r})."
        ),
        hypotheses=(Hypothesis("unmasked, position-free softmax attention", False),),
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
        parts.append(f"head {i}: {spectrum_text(w)}")
    what = []
    extra = model.beyond_attention
    if h > 1:
        what.append(f"{h} heads")
    if h == 0:
        what.append("a feed-forward layer alone (no attention)")
    elif ff:
        what.append("a feed-forward term")
    if extra:
        what.append(extra)
    hyps = (
        Hypothesis("one attention head", h == 1, float(h)),
        Hypothesis("no feed-forward term", not (ff or h == 0)),
    ) + ((Hypothesis(f"nothing beyond the attention (here {extra})", False),) if extra else ())
    reason = (
        f"{' and '.join(what)}: no theorem of [E] covers this model (the four regimes are "
        f"proved for one head of pure self-attention)."
    )
    if h > 0:
        reason += (
            f" Spectra per head: {'; '.join(parts)}. Summed V: {spectrum_text(st.eigenvalues)} "
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
