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
``"guarded"``
    The decomposition of a traced V (a model that is an argument of a function under
    ``jit``, ``vmap`` or ``grad``), computed where it is traced; the eigen formula where
    its basis is well conditioned, ``expm`` elsewhere (decided at run time).

Modal coordinates. For ``"eigh"`` and ``"eig"`` the propagator also holds the real modal
form ``V = T B T^{-1}``: ``T`` real, ``B`` block diagonal with a 1x1 block ``lambda`` per
real eigenvalue and a 2x2 block ``[[a, b], [-b, a]]`` per complex pair ``a +- ib``. In
modal coordinates ``w = T^{-1} z`` every function of ``V`` acts column by column, as
multiplication by ``f(mu)`` (``mu = a + ib``; see ``modal_scale``), so ``e^{tV}``,
``(I + dt V)^k`` and ``(I + dt V)^{-1} V`` are exact per mode and cost ``O(n d)`` on ``n``
tokens. ``simulate`` integrates the rescaled frame in these coordinates: a mode whose
coordinate diverges (a negative eigenvalue, in the rescaled frame) then never swamps the
rounding of another, as it would in the standard basis.

Contract: V lives once, on the model. The decomposition is a **cache** (``FlowCache``)
of the V it was computed from, never a second source of truth:

- ``Propagator(V, flow=cache)`` is a view: ``prop.V`` *is* the model's V, and every map
  of the standard frame reads it (``R = I + dt V``, the value factor).
- The cache is stored as integer bit patterns (``FlowCache``), so it is not an inexact
  leaf: ``eqx.filter_grad`` gives it no gradient and an optimiser (optax through
  ``eqx.apply_updates``) never moves it. It carries the bits of the V it was computed
  from (``key``); ``fresh`` rebuilds a cache whose key is not the model's V (after an
  optimiser step or ``eqx.tree_at``), on the host for a concrete V and where it is
  traced otherwise. ``solve`` and ``simulate`` call it at their door.
- The gradient reaches V: ``e^{tV}`` from the eigen formula has a custom derivative,
  the Frechet derivative ``S ((S^{-1} dV S) o Phi) S^{-1}`` with ``Phi`` the divided
  differences of ``e^{t lambda}`` (exact for every diagonalisable V, repeated
  eigenvalues included); ``expm`` is differentiated by JAX. Modal coordinates are
  built on the host from a concrete V and cannot be differentiated with respect to it:
  differentiating through them raises ``ValueError`` (use standard coordinates, the
  default of ``solve``).

The decomposition is computed in float64 with numpy whatever the working precision, then
cast.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._host import put
from .._precision import highest, mm

__all__ = ["Propagator", "FlowCache", "PROPAGATOR_METHODS", "condition_threshold", "fresh"]

PROPAGATOR_METHODS = ("auto", "eigh", "eig", "expm")


def condition_threshold(dtype) -> float:
    """Largest eigenvector-basis condition number for which ``"eig"`` is trusted."""
    return float(1.0 / np.sqrt(np.finfo(np.dtype(dtype)).eps))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax_core.Tracer)


def _complex_dtype(dtype):
    return jnp.complex128 if np.dtype(dtype) == np.float64 else jnp.complex64


# ------------------------------------------------------------------ bit patterns
_UINT = {4: (np.uint32, jnp.uint32), 8: (np.uint64, jnp.uint64)}
_FLOAT = {4: jnp.float32, 8: jnp.float64}


def _bits(a: Any, dtype: Any) -> Any:
    """``a`` (real or complex; complex gets a trailing axis (re, im)) cast to the real
    ``dtype`` and stored as unsigned integers of the same width: exact, not an inexact
    leaf. ``None`` stays ``None``."""
    if a is None:
        return None
    dtype = np.dtype(dtype)
    size = dtype.itemsize
    if _is_concrete(a):
        return put(_np_bits(a, dtype))
    if jnp.iscomplexobj(a):
        a = jnp.stack([jnp.real(a), jnp.imag(a)], axis=-1)
    return jax.lax.bitcast_convert_type(a.astype(dtype), _UINT[size][1])


def _np_bits(a: Any, dtype: Any) -> np.ndarray:
    """``_bits`` of a concrete array, in numpy (no JAX operation: exact under a trace)."""
    dtype = np.dtype(dtype)
    a = np.asarray(a)
    if np.iscomplexobj(a):
        a = np.stack([a.real, a.imag], axis=-1)
    return np.array(a.astype(dtype), order="C").view(_UINT[dtype.itemsize][0])


def _unbits(b: Any, complex_: bool = False) -> Any:
    """The array that ``_bits`` stored (``complex_``: from its trailing (re, im) axis)."""
    if b is None:
        return None
    # a concrete b, on one device or replicated, is read on the host: no compiled
    # program of its own (a b split over devices is cast where it is)
    if _is_concrete(b) and (not isinstance(b, jax.Array) or b.sharding.is_fully_replicated):
        size = np.dtype(b.dtype).itemsize
        h = np.ascontiguousarray(np.asarray(b))
        # (re, im) side by side are the complex number's own bytes
        f = (
            h.view({4: np.complex64, 8: np.complex128}[size])[..., 0]
            if complex_
            else h.view(np.dtype(_FLOAT[size]))
        )
        # where b is, if it was placed there (a model on a device, or replicated)
        placed = isinstance(b, jax.Array) and b.committed
        return jax.device_put(f, b.sharding) if placed else jax.device_put(f)
    f = jax.lax.bitcast_convert_type(b, _FLOAT[np.dtype(b.dtype).itemsize])
    return jax.lax.complex(f[..., 0], f[..., 1]) if complex_ else f


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


def _decompose(Vn: np.ndarray, method: str, dtype: Any) -> dict:
    """The decomposition of one concrete ``(d, d)`` matrix in float64 (see the module
    docstring): a dict of numpy arrays and the method actually used."""
    out: dict[str, Any] = dict(T=None, T_inv=None, mu_re=None, mu_im=None, partner=None, sign=None)
    if method == "auto":
        method = "eigh" if np.array_equal(Vn, Vn.T) else "eig"
        auto = True
    else:
        auto = False
    if method == "eigh":
        if not np.array_equal(Vn, Vn.T):
            raise ValueError("propagator='eigh' needs an exactly symmetric V; use 'auto'.")
        w, S = np.linalg.eigh(Vn)
        d = len(w)
        out.update(evals=w.astype(np.complex128), evecs=S, evecs_inv=S.T, cond=1.0)
        out.update(T=S, T_inv=S.T, mu_re=w, mu_im=np.zeros(d), partner=np.arange(d))
        out.update(sign=np.zeros(d), method="eigh", complex_evecs=False)
        return out
    w, S = np.linalg.eig(Vn)
    # numpy returns real arrays when every eigenvalue is real; the cache is complex
    w, S = w.astype(np.complex128), S.astype(np.complex128)
    with np.errstate(all="ignore"):
        cond = float(np.linalg.cond(S))
    if not np.isfinite(cond):
        cond = float("inf")
    if not cond < condition_threshold(dtype) and method != "expm":
        if not auto:  # a defective V has no eigenbasis: e^{tV} would be wrong
            raise ValueError(
                f"propagator='eig' needs a diagonalisable V with a well-conditioned "
                f"eigenvector basis; this V's basis has condition number {cond:.3g} (>= "
                f"{condition_threshold(dtype):.3g}: V is defective, such as a Jordan "
                f"block, or nearly so). Use propagator='expm' (exact for every V) or 'auto'."
            )
        method = "expm"
    S_inv = np.linalg.inv(S) if cond < float("inf") else np.full_like(S, np.nan)
    out.update(evals=w, evecs=S, evecs_inv=S_inv, cond=cond, complex_evecs=True)
    if method == "eig":
        modal = _real_modal_form(w, S)
        if modal is None:
            if auto:
                method = "expm"
        else:
            T, T_inv, mu_re, mu_im, partner, sign = modal
            out.update(T=T, T_inv=T_inv, mu_re=mu_re, mu_im=mu_im, partner=partner, sign=sign)
    out["method"] = method
    return out


class FlowCache(eqx.Module):
    """The spectral decomposition of a matrix ``V`` as a cache of ``V``: every array is
    stored as integer bit patterns (``_bits``), so the cache is not an inexact leaf (no
    gradient, no optimiser update), and ``key`` holds the bits of the V it was built
    from. Read it through ``Propagator(V, flow=cache)``; ``fresh_for(V)`` returns it
    unchanged when it was built from this V and rebuilds it otherwise."""

    key: Array
    evals: Array
    evecs: Array
    evecs_inv: Array
    T: Array | None
    T_inv: Array | None
    mu_re: Array | None
    mu_im: Array | None
    partner: Array | None
    sign: Array | None
    cond: Array
    good: Array | None  # "guarded": whether the traced basis is well conditioned
    method: str = eqx.field(static=True)
    requested: str = eqx.field(static=True)
    complex_evecs: bool = eqx.field(static=True)

    def __init__(self, V: Any, method: str = "auto"):
        if method not in PROPAGATOR_METHODS:
            raise ValueError(f"propagator must be one of {PROPAGATOR_METHODS}; got {method!r}.")
        dtype = jnp.result_type(V)
        self.requested = method
        self.key = _bits(V, dtype)
        if _is_concrete(V):
            Vn = np.asarray(V, dtype=np.float64)
            if Vn.ndim == 3:  # stacked matrices, one decomposition each
                parts = [_decompose(v, method, dtype) for v in Vn]
                methods = {p["method"] for p in parts}
                if len(methods) != 1:
                    raise ValueError(
                        f"the stacked value matrices need different propagators "
                        f"({sorted(methods)}); build them with propagator='expm'."
                    )
                got = {
                    k: (None if parts[0][k] is None else np.stack([p[k] for p in parts]))
                    for k in parts[0]
                    if k not in ("method", "complex_evecs")
                }
                got.update(method=parts[0]["method"], complex_evecs=parts[0]["complex_evecs"])
            else:
                got = _decompose(Vn, method, dtype)
            self.method = str(got["method"])
            self.complex_evecs = bool(got["complex_evecs"])
            self.evals = _bits(got["evals"], dtype)
            self.evecs = _bits(got["evecs"], dtype)
            self.evecs_inv = _bits(got["evecs_inv"], dtype)
            has_modal = got["T"] is not None and self.method in ("eigh", "eig")
            for name in ("T", "T_inv", "mu_re", "mu_im", "sign"):
                setattr(self, name, _bits(got[name], dtype) if has_modal else None)
            self.partner = put(got["partner"], np.int32) if has_modal else None
            self.cond = _bits(np.asarray(got["cond"], np.float64), dtype)
            self.good = None
            return
        # A traced V: decomposed where it is traced, without a derivative of its own
        # (the flow's derivative is the Frechet rule of ``_eigen_flow``).
        self.complex_evecs = method != "eigh"
        self.T = self.T_inv = self.mu_re = self.mu_im = self.partner = self.sign = None
        Vs = jax.lax.stop_gradient(V)
        if method == "eigh":
            w, S = jnp.linalg.eigh(Vs)
            self.evals, self.evecs, self.evecs_inv = (
                _bits(w.astype(_complex_dtype(dtype)), dtype),
                _bits(S, dtype),
                _bits(jnp.swapaxes(S, -1, -2), dtype),
            )
            self.method = "eigh"
            self.good = None
        else:
            w, S = jnp.linalg.eig(Vs)
            cond = jnp.linalg.cond(S)
            good = jnp.isfinite(cond) & (cond < condition_threshold(dtype))
            eye = jnp.eye(S.shape[-1], dtype=S.dtype)
            # an ill-conditioned basis is replaced by I, so that the branch not taken
            # stays finite (its zero cotangent times inf would be NaN)
            S = jnp.where(good[..., None, None], S, eye)
            S_inv = jnp.linalg.inv(S)
            w = jnp.where(good[..., None], w, 0.0)
            self.evals, self.evecs, self.evecs_inv = (_bits(a, dtype) for a in (w, S, S_inv))
            self.method = "expm" if method == "expm" else "guarded"
            self.good = good
        self.cond = _bits(jnp.zeros(jnp.shape(V)[:-2], dtype), dtype)

    def built_from(self, V: Any) -> bool:
        """Whether this cache was built from exactly this concrete ``V`` (host check)."""
        key = np.asarray(self.key)
        mine = _np_bits(V, jnp.result_type(V))
        return key.shape == mine.shape and bool(np.array_equal(key, mine))

    def fresh_for(self, V: Any) -> FlowCache:
        """This cache if it was built from ``V``, else a new one (on the host for a
        concrete V, with the method first asked for; where it is traced otherwise)."""
        if _is_concrete(V) and _is_concrete(self.key):
            return self if self.built_from(V) else FlowCache(V, self.requested)
        return FlowCache(V, self.requested)


def _phi(t: Array, lam: Array) -> Array:
    """``Phi_ij``, the divided difference of ``f(l) = e^{t l}`` at ``lam_i, lam_j``:
    ``(f(lam_i) - f(lam_j)) / (lam_i - lam_j)``, and ``t f(lam_i)`` where they meet
    (a series near the diagonal, exact to rounding)."""
    li, lj = lam[:, None], lam[None, :]
    z = t * (li - lj)
    ej = jnp.exp(t * lj)
    ei = jnp.exp(t * li)
    small = jnp.abs(z) < 0.1
    zs = jnp.where(small, z, 0.0)
    # phi_1(z) = (e^z - 1) / z = sum_k z^k / (k + 1)!, to z^7 (|z| < 0.1: below 1e-16)
    series = jnp.zeros_like(zs)
    for k in range(8, -1, -1):
        series = series * zs + 1.0 / math.factorial(k + 1)
    diff = jnp.where(small, 1.0, li - lj)
    return jnp.where(small, t * ej * series, (ei - ej) / diff)


def _eigen_value(t, evals, evecs, evecs_inv, real_dtype):
    scale = jnp.exp(t.astype(evals.dtype) * evals)
    if not jnp.iscomplexobj(evecs):  # real eigenvectors: real values (what a cast keeps)
        scale = jnp.real(scale)
    out = mm(evecs * scale[None, :].astype(evecs.dtype), evecs_inv)
    return jnp.real(out).astype(real_dtype)


@jax.custom_jvp
def _eigen_flow(V, t, evals, evecs, evecs_inv):
    """``e^{tV}`` from the decomposition of ``V`` (its values only: the derivative in V
    is the Frechet rule below, whatever the decomposition's own dependence on V)."""
    return _eigen_value(t, evals, evecs, evecs_inv, V.dtype)


@_eigen_flow.defjvp
def _eigen_flow_jvp(primals, tangents):
    V, t, evals, evecs, evecs_inv = primals
    dV, dt = tangents[0], tangents[1]
    E = _eigen_value(t, evals, evecs, evecs_inv, V.dtype)
    ctype = jnp.result_type(evecs.dtype, evals.dtype)
    C = mm(mm(evecs_inv.astype(ctype), dV.astype(ctype)), evecs.astype(ctype))
    phi = _phi(t.astype(ctype), evals.astype(ctype))
    dE = jnp.real(mm(mm(evecs.astype(ctype), C * phi), evecs_inv.astype(ctype))).astype(V.dtype)
    return E, dE + dt.astype(V.dtype) * mm(V, E)


@jax.custom_jvp
def _modal_leaf(V, a):
    """A modal array of the cache as a function of ``V``: its value, and a derivative
    that refuses by name (modal coordinates are built on the host)."""
    del V
    return a


@_modal_leaf.defjvp
def _modal_leaf_jvp(primals, tangents):
    raise ValueError(
        "modal coordinates (coords='modal') are built on the host from a concrete V and "
        "cannot be differentiated with respect to V; differentiate in standard "
        "coordinates (coords='standard', the default of attnflow.solve)."
    )


class Propagator(eqx.Module):
    """``e^{tV}`` for a real ``(d, d)`` matrix ``V``, from its cached decomposition.

    Build it with ``Propagator(V, method="auto")``, or as a view of a model's own V and
    cache, ``Propagator(V, flow=cache)`` (what the families' ``propagator`` returns);
    call ``prop(t)`` for the ``(d, d)`` matrix ``e^{tV}`` (``t`` a scalar,
    differentiable in ``t`` and ``V``, jit-able) or ``prop.apply(t, z)`` to map row
    tokens ``z`` of shape ``(..., d)`` to ``z @ e^{tV}.T``.

    Attributes:
        V: the matrix, ``(d, d)`` (the model's own leaf).
        flow: the ``FlowCache`` of V's decomposition.
        evals: its eigenvalues, ``(d,)`` complex (in the order of ``evecs``).
        evecs: eigenvector basis ``S``, ``(d, d)``; real for ``"eigh"``.
        evecs_inv: ``S^{-1}``.
        method: ``"eigh"``, ``"eig"``, ``"expm"`` or ``"guarded"`` (see module doc).
        basis_condition: ``cond(S)`` (1.0 for ``"eigh"``; ``inf`` for a defective V).
    """

    V: Array
    flow: FlowCache

    def __init__(self, V, method: str = "auto", *, flow: FlowCache | None = None):
        self.V = V
        self.flow = FlowCache(V, method) if flow is None else flow

    # ------------------------------------------------------------- the cache, read
    @property
    def method(self) -> str:
        return self.flow.method

    @property
    def evals(self) -> Array:
        return _unbits(self.flow.evals, True)

    @property
    def evecs(self) -> Array:
        return _unbits(self.flow.evecs, self.flow.complex_evecs)

    @property
    def evecs_inv(self) -> Array:
        return _unbits(self.flow.evecs_inv, self.flow.complex_evecs)

    def _modal(self, name: str) -> Any:
        a = _unbits(getattr(self.flow, name))
        if a is None or _is_concrete(self.V):  # a concrete V is not differentiated
            return a
        return _modal_leaf(self.V, a)

    @property
    def T(self) -> Array | None:
        return self._modal("T")

    @property
    def T_inv(self) -> Array | None:
        return self._modal("T_inv")

    @property
    def mu_re(self) -> Array | None:
        return self._modal("mu_re")

    @property
    def mu_im(self) -> Array | None:
        return self._modal("mu_im")

    @property
    def sign(self) -> Array | None:
        return self._modal("sign")

    @property
    def partner(self) -> Array | None:
        return self.flow.partner

    @property
    def basis_condition(self) -> np.ndarray:
        return np.asarray(_unbits(self.flow.cond))

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    # ------------------------------------------------------------ modal coordinates
    @property
    def has_modal(self) -> bool:
        """Whether the real modal form (and modal coordinates) is available."""
        return self.flow.T is not None and self.method in ("eigh", "eig")

    def to_modal(self, z: Array) -> Array:
        """Row tokens ``z`` ``(..., d)`` -> modal coordinates ``w = z T^{-T}``."""
        T_inv = self.T_inv
        assert T_inv is not None, "no modal form: check has_modal first"
        return mm(z, T_inv.T)

    def from_modal(self, w: Array) -> Array:
        """Modal coordinates ``w`` ``(..., d)`` -> row tokens ``z = w T^T``."""
        T = self.T
        assert T is not None, "no modal form: check has_modal first"
        return mm(w, T.T)

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
        sign, partner = self.sign, self.partner
        assert sign is not None and partner is not None
        rot = jnp.reshape(sign, (1,) * (im.ndim - 1) + sign.shape) * im
        rot = jnp.reshape(rot, (1,) * (u.ndim - rot.ndim) + rot.shape)
        return re * u + rot * jnp.take(u, partner, axis=-1)

    def exp_multipliers(self, t) -> tuple[Array, Array]:
        """``e^{t mu}`` per modal column, as ``(re, im)``; ``t`` a scalar."""
        mu_re, mu_im = self._mu()
        t = jnp.asarray(t, dtype=mu_re.dtype)
        r = jnp.exp(t * mu_re)
        return r * jnp.cos(t * mu_im), r * jnp.sin(t * mu_im)

    def _mu(self) -> tuple[Array, Array]:
        """The modal spectrum ``(mu_re, mu_im)``; only with a modal form."""
        mu_re, mu_im = self.mu_re, self.mu_im
        assert mu_re is not None and mu_im is not None, "no modal form"
        return mu_re, mu_im

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

    # -------------------------------------------------------------------- the flow
    def _eigen(self, t) -> Array:
        t = jnp.asarray(t, dtype=self.V.dtype)
        return _eigen_flow(self.V, t, self.evals, self.evecs, self.evecs_inv)

    def _expm(self, t) -> Array:
        t = jnp.asarray(t, dtype=self.V.dtype)
        with highest():  # expm's own products
            return jax.scipy.linalg.expm(t * self.V)

    def __call__(self, t) -> Array:
        """``e^{tV}`` as a real ``(d, d)`` matrix, for a scalar time ``t``."""
        if self.method in ("eigh", "eig"):
            return self._eigen(t)
        if self.method == "expm":
            return self._expm(t)
        # "guarded": decided at run time from the traced eigenvector basis.
        good = self.flow.good
        assert good is not None
        return jax.lax.cond(good, lambda s: self._eigen(s), lambda s: self._expm(s), t)

    def apply(self, t, z: Array) -> Array:
        """Map row tokens ``z`` of shape ``(..., d)`` to ``z @ e^{tV}.T``."""
        return mm(z, self(t).T)


def fresh(model: Any) -> Any:
    """``model`` with its propagator's cache built from the model's own matrix: the same
    object when it already was (checked on the host for a concrete V), a copy with the
    cache rebuilt otherwise (on the host, or where V is traced). ``solve`` and
    ``simulate`` call it before anything reads the cache, so that a model moved by an
    optimiser or by ``eqx.tree_at`` stays consistent with itself."""
    prop = model.propagator
    if not isinstance(prop, Propagator):
        return model
    old = prop.flow
    new = old.fresh_for(prop.V)
    if new is old:
        return model
    return jax.tree_util.tree_map(
        lambda node: new if node is old else node, model, is_leaf=lambda node: node is old
    )
