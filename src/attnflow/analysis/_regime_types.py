"""The records of a regime prediction: the ``Label`` vocabulary, one decided
``Hypothesis``, the hypotheses on the leading eigenvalue (``LeadingEigenvalue``), V's
``SpectralStructure`` and the ``Regime`` that ``predict_regime`` returns.

Contract: plain frozen dataclasses and a string enum, no computation; the decisions that
fill them are ``attnflow.analysis.regimes``' (``leading_eigenvalue``,
``spectral_structure``, ``predict_regime``), whose module docstring defines every
tolerance. All of them are importable from ``attnflow.analysis.regimes``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np
from jaxtyping import Bool, Complex, Float, Int

__all__ = ["Label", "Hypothesis", "LeadingEigenvalue", "SpectralStructure", "Regime"]


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
            normalised so that ``phi1_left @ phi1 = 1``; the sign chosen so that the
            entry of ``phi1`` of largest modulus, the first on ties, is positive), else
            None.
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
