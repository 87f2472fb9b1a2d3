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

Modal coordinates. For ``"eigh"`` and ``"eig"`` the propagator also holds the real modal
form ``V = T B T^{-1}``: ``T`` real, ``B`` block diagonal with a 1x1 block ``lambda`` per
real eigenvalue and a 2x2 block ``[[a, b], [-b, a]]`` per complex pair ``a +- ib``. In
modal coordinates ``w = T^{-1} z`` every function of ``V`` acts column by column, as
multiplication by ``f(mu)`` (``mu = a + ib``; see ``modal_scale``), so ``e^{tV}``,
``(I + dt V)^k`` and ``(I + dt V)^{-1} V`` are exact per mode and cost ``O(n d)`` on ``n``
tokens. ``simulate`` integrates the rescaled frame in these coordinates: a mode whose
coordinate diverges (a negative eigenvalue, in the rescaled frame) then never swamps the
rounding of another, as it would in the standard basis.

The decomposition is computed in float64 with numpy whatever the working precision, then
cast; it only runs at construction time when V is a concrete array. When V is a tracer
(a model built inside ``jit`` or ``vmap``), ``"auto"`` becomes ``"guarded"``: both the
eigen formula and expm are evaluated and the well-conditioned one is selected at run
time.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

__all__ = ["Propagator", "PROPAGATOR_METHODS", "condition_threshold"]

PROPAGATOR_METHODS = ("auto", "eigh", "eig", "expm")


def condition_threshold(dtype) -> float:
    """Largest eigenvector-basis condition number for which ``"eig"`` is trusted."""
    return float(1.0 / np.sqrt(np.finfo(np.dtype(dtype)).eps))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax_core.Tracer)


def _complex_dtype(dtype):
    return jnp.complex128 if np.dtype(dtype) == np.float64 else jnp.complex64


def _real_modal_form(w: np.ndarray, S: np.ndarray):
    """Real modal basis from a complex eigendecomposition, or None if pairs don't match.

    Returns ``(T, T_inv, mu_re, mu_im, partner, sign)``: for a complex pair
    ``lambda = a + ib`` with eigenvector ``u + i v`` the columns ``u, v`` of ``T`` carry the
    block ``[[a, b], [-b, a]]``; ``partner`` links the two columns, ``sign`` is ``+1`` on the
    first and ``-1`` on the second, ``0`` for a real eigenvalue.
    """
    d = len(w)
    T = np.zeros((d, d))
    mu_re, mu_im = np.zeros(d), np.zeros(d)
    partner, sign = np.arange(d), np.zeros(d)
    k = 0
    while k < d:
        if w[k].imag == 0.0:
            T[:, k] = np.real(S[:, k])
            mu_re[k] = w[k].real
            k += 1
            continue
        if k + 1 >= d or not np.isclose(w[k + 1], np.conj(w[k]), rtol=1e-10, atol=0):
            return None
        T[:, k], T[:, k + 1] = np.real(S[:, k]), np.imag(S[:, k])
        mu_re[k] = mu_re[k + 1] = w[k].real
        mu_im[k] = mu_im[k + 1] = w[k].imag
        partner[k], partner[k + 1] = k + 1, k
        sign[k], sign[k + 1] = 1.0, -1.0
        k += 2
    with np.errstate(all="ignore"):
        cond = np.linalg.cond(T)
    if not np.isfinite(cond):
        return None
    return T, np.linalg.inv(T), mu_re, mu_im, partner, sign


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
    T: Array | None
    T_inv: Array | None
    mu_re: Array | None
    mu_im: Array | None
    partner: Array | None
    sign: Array | None
    method: str = eqx.field(static=True)
    # An array leaf, not a static field: a static float would recompile every solve
    # for every new V.
    basis_condition: np.ndarray

    def __init__(self, V, method: str = "auto"):
        if method not in PROPAGATOR_METHODS:
            raise ValueError(f"propagator must be one of {PROPAGATOR_METHODS}; got {method!r}.")
        dtype = jnp.result_type(V)
        cdtype = _complex_dtype(dtype)
        self.V = V
        self.T = self.T_inv = self.mu_re = self.mu_im = self.partner = self.sign = None
        if _is_concrete(V):
            Vn = np.asarray(V, dtype=np.float64)
            if method == "auto":
                method = "eigh" if np.array_equal(Vn, Vn.T) else "eig"
                auto = True
            else:
                auto = False
            if method == "eigh":
                if not np.array_equal(Vn, Vn.T):
                    raise ValueError("propagator='eigh' needs an exactly symmetric V; use 'auto'.")
                w, S = np.linalg.eigh(Vn)
                self.evals = jnp.asarray(w.astype(np.complex128), dtype=cdtype)
                self.evecs = jnp.asarray(S, dtype=dtype)
                self.evecs_inv = jnp.asarray(S.T, dtype=dtype)
                self.basis_condition = np.asarray(1.0)
                self._set_modal(
                    S, S.T, w, np.zeros_like(w), np.arange(len(w)), np.zeros_like(w), dtype
                )
            else:
                w, S = np.linalg.eig(Vn)
                with np.errstate(all="ignore"):
                    cond = float(np.linalg.cond(S))
                if not np.isfinite(cond):
                    cond = float("inf")
                if not cond < condition_threshold(dtype) and method != "expm":
                    if not auto:  # a defective V has no eigenbasis: e^{tV} would be wrong
                        raise ValueError(
                            f"propagator='eig' needs a diagonalisable V with a "
                            f"well-conditioned eigenvector basis; this V's basis has "
                            f"condition number {cond:.3g} (>= "
                            f"{condition_threshold(dtype):.3g}: V is defective, such as a "
                            f"Jordan block, or nearly so). Use propagator='expm' (exact for "
                            f"every V) or 'auto'."
                        )
                    method = "expm"
                if cond < float("inf"):
                    S_inv = np.linalg.inv(S)
                else:
                    S_inv = np.full_like(S, np.nan)
                self.evals = jnp.asarray(w, dtype=cdtype)
                self.evecs = jnp.asarray(S, dtype=cdtype)
                self.evecs_inv = jnp.asarray(S_inv, dtype=cdtype)
                self.basis_condition = np.asarray(cond)
                if method == "eig":
                    modal = _real_modal_form(w, S)
                    if modal is None:
                        if auto:
                            method = "expm"
                    else:
                        self._set_modal(*modal, dtype=dtype)
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
            self.basis_condition = np.asarray(float("nan"))
        self.method = method

    def _set_modal(self, T, T_inv, mu_re, mu_im, partner, sign, dtype):
        self.T = jnp.asarray(T, dtype=dtype)
        self.T_inv = jnp.asarray(T_inv, dtype=dtype)
        self.mu_re = jnp.asarray(mu_re, dtype=dtype)
        self.mu_im = jnp.asarray(mu_im, dtype=dtype)
        self.partner = jnp.asarray(partner, dtype=jnp.int32)
        self.sign = jnp.asarray(sign, dtype=dtype)

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    # ------------------------------------------------------------ modal coordinates
    @property
    def has_modal(self) -> bool:
        """Whether the real modal form (and modal coordinates) is available."""
        return self.T is not None and self.method in ("eigh", "eig")

    def to_modal(self, z: Array) -> Array:
        """Row tokens ``z`` ``(..., d)`` -> modal coordinates ``w = z T^{-T}``."""
        assert self.T_inv is not None, "no modal form: check has_modal first"
        return z @ self.T_inv.T

    def from_modal(self, w: Array) -> Array:
        """Modal coordinates ``w`` ``(..., d)`` -> row tokens ``z = w T^T``."""
        assert self.T is not None, "no modal form: check has_modal first"
        return w @ self.T.T

    def modal_scale(self, u: Array, re: Array, im: Array) -> Array:
        """Apply ``f(B)`` to modal rows ``u`` ``(..., d)``, given ``f(mu) = re + i im``.

        Column ``k`` becomes ``re_k u_k + sign_k im_k u_{partner(k)}``: a scaling for a
        real eigenvalue, a scaled rotation within the two columns of a complex pair.
        A symmetric V (``"eigh"``, a static fact of the propagator) has no pairs: the
        rotation part, a gather over the columns, is skipped.
        """
        lead = (1,) * (u.ndim - re.ndim)  # explicit broadcasting over the rows
        re = jnp.reshape(re, lead + re.shape)
        if self.method == "eigh":
            return re * u
        assert self.sign is not None and self.partner is not None
        rot = jnp.reshape(self.sign, (1,) * (im.ndim - 1) + self.sign.shape) * im
        rot = jnp.reshape(rot, (1,) * (u.ndim - rot.ndim) + rot.shape)
        return re * u + rot * jnp.take(u, self.partner, axis=-1)

    def exp_multipliers(self, t) -> tuple[Array, Array]:
        """``e^{t mu}`` per modal column, as ``(re, im)``; ``t`` a scalar."""
        mu_re, mu_im = self._mu()
        t = jnp.asarray(t, dtype=mu_re.dtype)
        r = jnp.exp(t * mu_re)
        return r * jnp.cos(t * mu_im), r * jnp.sin(t * mu_im)

    def _mu(self) -> tuple[Array, Array]:
        """The modal spectrum ``(mu_re, mu_im)``; only with a modal form."""
        assert self.mu_re is not None and self.mu_im is not None, "no modal form"
        return self.mu_re, self.mu_im

    def power_multipliers(self, k, dt) -> tuple[Array, Array]:
        """``(1 + dt mu)^k`` per modal column, as ``(re, im)``: the discrete flow ``R^k``."""
        mu_re, mu_im = self._mu()
        dtype = mu_re.dtype
        a = 1.0 + dt * mu_re
        b = dt * mu_im
        k = jnp.asarray(k, dtype=dtype)
        logr = 0.5 * jnp.log(a * a + b * b)
        theta = jnp.arctan2(b, a)
        r = jnp.exp(k * logr)
        return r * jnp.cos(k * theta), r * jnp.sin(k * theta)

    def _eigen(self, t) -> Array:
        dtype = self.V.dtype
        t = jnp.asarray(t, dtype=dtype)
        if self.method == "eigh":
            scale = jnp.exp(t * jnp.real(self.evals))
            return (self.evecs * scale[None, :]) @ self.evecs_inv
        scale = jnp.exp(t.astype(self.evals.dtype) * self.evals)
        return jnp.real((self.evecs * scale[None, :]) @ self.evecs_inv).astype(dtype)

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
