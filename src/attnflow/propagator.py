"""The linear flow e^{tV} of the value matrix, from one spectral decomposition.

The rescaled frame needs ``e^{tV}`` at every time the solver asks for. Computing a
matrix exponential inside the vector field would cost a Pade approximant and several
squarings per evaluation, so the decomposition ``V = S diag(lambda) S^{-1}`` is computed
once, when the model is built, and then

    e^{tV} = S diag(e^{t lambda}) S^{-1}

costs one scaling and one product. Which decomposition is used (``method``):

``"eigh"``
    V exactly symmetric: ``S`` is real orthogonal, the formula is exact to rounding.
``"eig"``
    V diagonalisable with a well-conditioned eigenvector basis (non-normal matrices and
    complex spectra included). Rounding in the formula is amplified by ``cond(S)``, so
    this is used only when ``cond(S) < 1 / sqrt(eps)`` for the working precision
    (6.7e7 in float64, 2.9e3 in float32): the error stays below ``sqrt(eps)`` relative.
``"expm"``
    The safe fallback, chosen automatically for defective V (a Jordan block has no
    eigenvector basis) and for badly conditioned bases: ``jax.scipy.linalg.expm`` of
    ``tV`` (Pade with scaling and squaring) at each call. Slower, always right.

The decomposition is computed in float64 with numpy whatever the working precision, then
cast; it only runs at construction time when V is a concrete array. When V is a tracer
(a model built inside ``jit`` or ``vmap``), ``"auto"`` becomes ``"guarded"``: both the
eigen formula and expm are evaluated and the well-conditioned one is selected at run
time.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

__all__ = ["Propagator", "PROPAGATOR_METHODS", "condition_threshold"]

PROPAGATOR_METHODS = ("auto", "eigh", "eig", "expm")


def condition_threshold(dtype) -> float:
    """Largest eigenvector-basis condition number for which ``"eig"`` is trusted."""
    return float(1.0 / np.sqrt(np.finfo(np.dtype(dtype)).eps))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _complex_dtype(dtype):
    return jnp.complex128 if np.dtype(dtype) == np.float64 else jnp.complex64


class Propagator(eqx.Module):
    """``e^{tV}`` for a fixed real ``(d, d)`` matrix ``V``.

    Build it with ``Propagator(V, method="auto")``; call ``prop(t)`` for the ``(d, d)``
    matrix ``e^{tV}`` (``t`` a scalar, differentiable and jit-able) or
    ``prop.apply(t, z)`` to map row tokens ``z`` of shape ``(..., d)`` to
    ``z @ e^{tV}.T``.

    Attributes:
        V: the matrix, ``(d, d)``.
        evals: its eigenvalues, ``(d,)`` complex (in the order of ``evecs``).
        evecs: eigenvector basis ``S``, ``(d, d)``; real for ``"eigh"``.
        evecs_inv: ``S^{-1}``.
        method: ``"eigh"``, ``"eig"``, ``"expm"`` or ``"guarded"`` (see module doc).
        basis_condition: ``cond(S)`` (1.0 for ``"eigh"``; ``inf`` for a defective V).
    """

    V: Array
    evals: Array
    evecs: Array
    evecs_inv: Array
    method: str = eqx.field(static=True)
    basis_condition: float = eqx.field(static=True)

    def __init__(self, V, method: str = "auto"):
        if method not in PROPAGATOR_METHODS:
            raise ValueError(
                f"propagator must be one of {PROPAGATOR_METHODS}; got {method!r}."
            )
        dtype = jnp.result_type(V)
        cdtype = _complex_dtype(dtype)
        self.V = V
        if _is_concrete(V):
            Vn = np.asarray(V, dtype=np.float64)
            if method == "auto":
                method = "eigh" if np.array_equal(Vn, Vn.T) else "eig"
                auto = True
            else:
                auto = False
            if method == "eigh":
                if not np.array_equal(Vn, Vn.T):
                    raise ValueError(
                        "propagator='eigh' needs an exactly symmetric V; use 'auto'."
                    )
                w, S = np.linalg.eigh(Vn)
                self.evals = jnp.asarray(w.astype(np.complex128), dtype=cdtype)
                self.evecs = jnp.asarray(S, dtype=dtype)
                self.evecs_inv = jnp.asarray(S.T, dtype=dtype)
                self.basis_condition = 1.0
            else:
                w, S = np.linalg.eig(Vn)
                with np.errstate(all="ignore"):
                    cond = float(np.linalg.cond(S))
                if not np.isfinite(cond):
                    cond = float("inf")
                if auto and not cond < condition_threshold(dtype):
                    method = "expm"
                if cond < float("inf"):
                    S_inv = np.linalg.inv(S)
                else:
                    S_inv = np.full_like(S, np.nan)
                self.evals = jnp.asarray(w, dtype=cdtype)
                self.evecs = jnp.asarray(S, dtype=cdtype)
                self.evecs_inv = jnp.asarray(S_inv, dtype=cdtype)
                self.basis_condition = cond
        else:
            if method == "auto":
                method = "guarded"
            if method == "eigh":
                w, S = jnp.linalg.eigh(V)
                self.evals = w.astype(cdtype)
                self.evecs = S
                self.evecs_inv = S.T
            else:
                w, S = jnp.linalg.eig(V)
                self.evals = w.astype(cdtype)
                self.evecs = S.astype(cdtype)
                self.evecs_inv = jnp.linalg.inv(S).astype(cdtype)
            self.basis_condition = float("nan")
        self.method = method

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    def _eigen(self, t) -> Array:
        dtype = self.V.dtype
        t = jnp.asarray(t, dtype=dtype)
        if self.method == "eigh":
            scale = jnp.exp(t * jnp.real(self.evals))
            return (self.evecs * scale) @ self.evecs_inv
        scale = jnp.exp(t.astype(self.evals.dtype) * self.evals)
        return jnp.real((self.evecs * scale) @ self.evecs_inv).astype(dtype)

    def _expm(self, t) -> Array:
        t = jnp.asarray(t, dtype=self.V.dtype)
        return jax.scipy.linalg.expm(t * self.V)

    def __call__(self, t) -> Array:
        """``e^{tV}`` as a real ``(d, d)`` matrix, for a scalar time ``t``."""
        if self.method in ("eigh", "eig"):
            return self._eigen(t)
        if self.method == "expm":
            return self._expm(t)
        # "guarded": decided at run time from the traced eigenvector basis.
        cond = jnp.linalg.cond(self.evecs)
        good = jnp.isfinite(cond) & (cond < condition_threshold(self.V.dtype))
        return jnp.where(good, self._eigen(t), self._expm(t))

    def apply(self, t, z: Array) -> Array:
        """Map row tokens ``z`` of shape ``(..., d)`` to ``z @ e^{tV}.T``."""
        return z @ self(t).T
