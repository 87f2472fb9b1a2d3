"""The exact field of a rotation-invariant head on the circle, in O(n K).

Contract. Tokens on the unit circle, ``x_j = (cos t_j, sin t_j)``, and one head whose
logits ``beta <Q x_i, K x_j> = beta x_i^T A x_j`` have ``A = Q^T K = a I + b J`` (``J`` the
rotation by a right angle: ``A`` commutes with rotations, as for ``Q = K = I``). The
logit is then ``c cos(t_i - t_j - phi)``, ``c = beta sqrt(a^2 + b^2)``,
``phi = atan2(b, a)``, and with the Fourier series

    e^{c (cos u - 1)} = sum_k a_k e^{i k u},    a_k = I_k(c) e^{-c}

(``I_k`` the modified Bessel functions) both sums of the field reduce to the moments
``C_k = sum_j e^{-i k t_j}``. With ``w_i = e^{i (t_i - phi)}``:

    D_i = sum_j e^{c (cos(t_i - t_j - phi) - 1)}            = sum_k a_k w_i^k C_k
    N_i = sum_j e^{c (cos(t_i - t_j - phi) - 1)} e^{i t_j}  = sum_k a_k w_i^k C_{k-1}

(``N_i`` a complex number standing for a vector of the plane). Softmax: the attention
average is ``m_i = N_i / D_i``; unnormalised attention (USA): ``m_i = e^{c - shift} N_i / n``;
the field is ``F_i = V m_i`` for any ``V``. A causal mask replaces ``C_k`` by its prefix
sums over ``j <= i``. The cost is ``O(n K)`` per evaluation, the memory ``O(n)`` (the modes
are a ``lax.scan``; no ``(n, n)`` or ``(n, K)`` array).

Modes and error. ``|k| <= K``, ``K`` the first mode with ``a_{K+1} / a_0`` below the
working precision's ``eps`` (``circle_modes``; about ``9 sqrt(c) + 6`` in float64): the
truncation changes ``D_i`` and ``N_i`` by less than ``eps`` relative. The coefficients are
the FFT of the sampled kernel at ``M >= 2K + 2`` points (aliasing below ``a_{K+2}``), so
they are differentiable in ``c``: the field is differentiable in beta, V and the tokens
angles (along the circle), and in Q and K through the rotation-invariant part of
``Q^T K`` (the engine takes it for concrete weights only, so a gradient in the weights of
a traced model runs through the dense field). The
sums are formed from terms as large as ``n a_0``, so their absolute rounding error is about
``eps n``; ``D_i`` is at least the row's own term ``e^{c (cos phi - 1)}``, so the relative
error of ``m_i`` is at most about ``eps n e^{c (1 - cos phi)}``. ``choose_field`` takes
this field only where that bound is below ``1e-9`` (float64 at large n): elsewhere, and
for every other head, the model's own dense or tiled field runs.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..._precision import mm
from ..base import AbstractModel
from ..isotropic import IsotropicAttention
from ..kernels.masks import Causal
from ..kernels.softmax import Softmax
from ..kernels.usa import USA
from ..model import Attention

__all__ = ["CircleAttention", "choose_field", "circle_modes", "MIN_TOKENS", "MAX_ERROR"]

# Below this many tokens the dense field is as fast and exact to rounding.
MIN_TOKENS = 1024
# The largest predicted relative error of the attention average (see the module docstring).
MAX_ERROR = 1e-9
# The kernels with an exponential of the logit: softmax normalises it, USA does not.
_NORMALISED = {Softmax: True, USA: False}


def circle_modes(c: float, dtype: Any = np.float64) -> int:
    """``K``: the first mode whose coefficient ``a_{K+1} = I_{K+1}(c) e^{-c}`` is below
    ``eps a_0`` in ``dtype`` (at least 1)."""
    from scipy.special import ive

    eps = float(np.finfo(np.dtype(dtype)).eps)
    a0 = float(ive(0, c))
    k = 1
    while k < 100_000 and float(ive(k + 1, c)) >= eps * a0:
        k += 1
    return k


def _coefficients(c: Array, K: int, dtype: Any) -> Array:
    """``a_0, ..., a_K`` of ``e^{c (cos u - 1)}``: the FFT of the kernel sampled at
    ``M = 2K + 2`` (or more) equispaced points; differentiable in ``c``."""
    M = 2 * K + 2
    M = 1 << (M - 1).bit_length()  # a power of two
    theta = 2 * jnp.pi * jnp.arange(M, dtype=dtype) / M
    f = jnp.exp(c * (jnp.cos(theta) - 1.0))
    return (jnp.real(jnp.fft.fft(f)) / M)[: K + 1].astype(dtype)


class CircleAttention(AbstractModel):
    """A one-head ``Attention`` (or ``IsotropicAttention``) on the unit circle whose field
    is computed by the O(n K) Fourier moments (see the module docstring); every other
    method is the head's own.
    Built by the engine (``choose_field``), not by hand."""

    inner: Attention | IsotropicAttention
    modes: int = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    normalised: bool = eqx.field(static=True)

    def __init__(
        self, inner: Attention | IsotropicAttention, modes: int, causal: bool, normalised: bool
    ):
        self.inner = inner
        self.modes = int(modes)
        self.causal = bool(causal)
        self.normalised = bool(normalised)

    @property
    def propagator(self) -> Any:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.propagator

    @property
    def d(self) -> int:
        return 2

    @property
    def dtype(self) -> Any:
        return self.inner.dtype

    @property
    def num_heads(self) -> int:
        return 1

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        return self.inner.log_logit_bound(x)

    def _rotation(self) -> tuple[Array, Array]:
        """``(c, phi)`` of the head's logits ``c cos(t_i - t_j - phi)``."""
        Q, K = self.inner.query_key_maps()
        A = mm(Q.T, K)
        a = 0.5 * (A[0, 0] + A[1, 1])
        b = 0.5 * (A[1, 0] - A[0, 1])
        return self.inner.beta * jnp.sqrt(a * a + b * b), jnp.arctan2(b, a)

    def average(self, x: Float[Array, "n 2"]) -> Float[Array, "n 2"]:
        """The attention average ``m_i = sum_j P_ij x_j`` of unit tokens ``x``."""
        dtype = x.dtype
        ctype = jnp.complex128 if dtype == jnp.float64 else jnp.complex64
        n = x.shape[0]
        c, phi = self._rotation()
        a = _coefficients(c, self.modes + 1, dtype)  # a_0 .. a_{K+1}
        t = jnp.arctan2(x[:, 1], x[:, 0])
        z = jnp.exp(jnp.asarray(-1j, ctype) * t.astype(ctype))  # e^{-i t_j}
        w = jnp.exp(jnp.asarray(1j, ctype) * (t - phi).astype(ctype))  # e^{i (t_i - phi)}

        def moment(p):  # C_k (or its prefix sums) of the powers p = z^k
            return jnp.cumsum(p) if self.causal else jnp.sum(p)

        K = self.modes
        # D_i = a_0 C_0 + 2 Re sum_{k>=1} a_k w^k C_k,
        # N_i = sum_{k=-K}^{K} a_k w^k C_{k-1} = a_0 C_{-1} + sum_{k>=1} a_k (w^k C_{k-1}
        #       + w^{-k} C_{-k-1}), with C_{-m} = conj(C_m)
        ones = jnp.ones((n,), ctype)
        C0 = moment(ones)
        C1 = moment(z)

        ac = a.astype(ctype)

        def body(carry, k):
            zk, wk, Cprev, Ck, D, N = carry  # z^k, w^k, C_{k-1}, C_k at mode k
            zn = zk * z  # z^{k+1}
            Cnext = moment(zn)  # C_{k+1}
            D = D + 2.0 * a[k] * jnp.real(wk * Ck)
            N = N + ac[k] * (wk * Cprev + jnp.conj(wk) * jnp.conj(Cnext))
            return (zn, wk * w, Ck, Cnext, D, N), None

        D0 = jnp.broadcast_to(a[0] * jnp.real(C0), (n,))
        N0 = jnp.broadcast_to(ac[0] * jnp.conj(C1), (n,))
        init = (z, w, C0, C1, D0.astype(dtype), N0)
        (_, _, _, _, D, N), _ = jax.lax.scan(body, init, jnp.arange(1, K + 1))
        if self.normalised:
            m = N / D.astype(ctype)
        else:
            shift = self.inner.kernel.params()["shift"]
            # USA: e^{L - shift} / n (masked keys count in n)
            m = (jnp.exp(c - shift) / n).astype(ctype) * N
        return jnp.stack([jnp.real(m), jnp.imag(m)], axis=-1).astype(dtype)

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.inner.value_map(self.average(x))

    def describe(self) -> dict:
        return self.inner.describe()

    def arrays(self) -> dict[str, Any]:
        return self.inner.arrays()

    @classmethod
    def from_saved(cls, description: dict, arrays: dict[str, Any]) -> AbstractModel:
        return Attention.from_saved(description, arrays)


def _concrete(*arrays: Any) -> bool:
    return not any(isinstance(a, jax_core.Tracer) for a in arrays)


def choose_field(model: AbstractModel, n: int, *, prefer: str = "auto") -> tuple[Any, dict]:
    """The model the sphere frame should evaluate for ``n`` tokens in the plane, and the
    record of the choice (``{"field": "circle", "modes": K, "error_bound": ...}`` or
    ``{"field": "dense"}``; the model's own field tiles past 2048 tokens).

    ``prefer``: ``"auto"`` takes the circle field when it applies and its error bound is
    below ``MAX_ERROR`` at ``n >= MIN_TOKENS``; ``"circle"`` asks for it (``ValueError``
    naming the fact that fails); ``"dense"`` keeps the model's own field."""
    if prefer not in ("auto", "circle", "dense"):
        raise ValueError(f"field must be 'auto', 'circle' or 'dense'; got {prefer!r}.")
    dense = {"field": "dense"}
    if prefer == "dense":
        return model, dense
    why = _why_not(model)
    if why is None:
        assert isinstance(model, (Attention, IsotropicAttention))
        Q, K = (np.asarray(m, np.float64) for m in model.query_key_maps())
        A = Q.T @ K
        a, b = 0.5 * (A[0, 0] + A[1, 1]), 0.5 * (A[1, 0] - A[0, 1])
        c = float(model.beta) * math.hypot(a, b)
        phi = math.atan2(b, a)
        modes = circle_modes(c, model.dtype)
        eps = float(np.finfo(np.dtype(model.dtype)).eps)
        bound = eps * n * math.exp(c * (1.0 - math.cos(phi)))
        if prefer == "circle" or (n >= MIN_TOKENS and bound <= MAX_ERROR):
            fast = CircleAttention(
                model, modes, model.mask is not None, _NORMALISED[type(model.kernel)]
            )
            return fast, {"field": "circle", "modes": modes, "error_bound": bound}
        return model, dense
    if prefer == "circle":
        raise ValueError(f"field='circle' does not apply: {why}.")
    return model, dense


def _why_not(model: AbstractModel) -> str | None:
    """Why the circle field does not serve ``model``, or None when it does."""
    if not isinstance(model, (Attention, IsotropicAttention)):
        return f"{type(model).__name__} is not one attnflow.Attention (or IsotropicAttention) head"
    if model.stack_size is not None:
        return "the weights are stacked"
    if model.d != 2:
        return f"the tokens live in d = {model.d}, not on the circle (d = 2)"
    if type(model.kernel) not in _NORMALISED:
        return f"the kernel {model.kernel.name!r} is not softmax or usa"
    if model.mask is not None and not isinstance(model.mask, Causal):
        return f"the mask {model.mask.describe()!r} is not None or causal"
    Q, K = model.query_key_maps()
    if not _concrete(Q, K, model.beta) or Q.shape != (2, 2):
        return "the query and key maps are traced or not 2 x 2"
    if model.kernel.normalizes_tokens:
        return "the kernel normalises the tokens"
    A = np.asarray(Q, np.float64).T @ np.asarray(K, np.float64)
    a, b = 0.5 * (A[0, 0] + A[1, 1]), 0.5 * (A[1, 0] - A[0, 1])
    rot = np.array([[a, -b], [b, a]])
    eps = float(np.finfo(np.dtype(model.dtype)).eps)
    if np.max(np.abs(A - rot)) > 8 * eps * max(1.0, float(np.max(np.abs(A)))):
        return "Q^T K does not commute with rotations (it is not a I + b J)"
    return None
