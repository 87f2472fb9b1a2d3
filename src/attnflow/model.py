"""The self-attention head as a particle system, and its vector fields in both frames.

Tokens are the rows of an ``(n, d)`` array. With ``P = kernel(beta <Q x_i, K x_j>)``:

original frame   ``dx_i/dt = sum_j P_ij V x_j``
rescaled frame   ``dz_i/dt = sum_j P_ij(t) V (z_j - z_i)``, ``z_i = e^{-tV} x_i``, where
                 ``P(t)`` is evaluated at ``x = e^{tV} z``.

In matrix form (tokens as rows): ``dX = P X V^T`` and ``dZ = (P Z - Z) V^T``.
"""

from __future__ import annotations

import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from . import kernels as _kernels
from .propagator import Propagator

__all__ = ["Attention", "Dynamics"]


# Set once the float32 cast has been reported (the warning is given once per process).
_CAST_WARNED = False


def _warn_float64_cast(*inputs, stacklevel: int = 3) -> None:
    """Warn, once per process, when float64 user arrays are about to be cast to float32
    because JAX's x64 mode is off."""
    global _CAST_WARNED
    if _CAST_WARNED or jax.config.jax_enable_x64:
        return
    if any(getattr(a, "dtype", None) == np.float64 for a in inputs):
        _CAST_WARNED = True
        warnings.warn(
            "float64 input cast to float32 because JAX's x64 mode is off; enable it with "
            "jax.config.update('jax_enable_x64', True) or --x64",
            UserWarning, stacklevel=stacklevel,
        )


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _as_matrix(name: str, A, square: bool = True) -> Array:
    """Validate one weight matrix and return it as a JAX array (not yet cast)."""
    if isinstance(A, jax.core.Tracer):
        arr = A
    else:
        try:
            arr = np.asarray(A)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"{name} must be a (d, d) array of real numbers: {exc}") from None
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(
            f"{name} must be real; got a complex array. Pass the real matrix "
            f"(complex spectra are fine, complex entries are not)."
        )
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
            or arr.dtype == np.bool_):
        raise ValueError(f"{name} must be a real numeric array; got dtype {arr.dtype}.")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-d (d, d) matrix; got shape {tuple(arr.shape)}.")
    if square and arr.shape[0] != arr.shape[1]:
        hint = (" (a (p, d) head map needs rectangular=True)" if name in ("Q", "K") else "")
        raise ValueError(f"{name} must be square (d, d); got shape {tuple(arr.shape)}{hint}.")
    if min(arr.shape) < 1:
        raise ValueError(f"{name} must have d >= 1; got shape {tuple(arr.shape)}.")
    if _is_concrete(arr) and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries (NaN or inf); all entries must be finite.")
    return arr


def log_logit_bound(q: Array, k: Array, beta, *, kernel: str = "softmax",
                    kernel_params=None) -> Array:
    """``log(beta max_i |q_i| max_j |k_j|)`` for raw queries/keys ``(n, p)``; ``+inf``, never NaN.

    With ``kernel``, the bound of what that kernel actually exponentiates: the normalised
    queries and keys for ``qknorm`` (``log(beta p)``), times ``s log n`` for ``ssmax``,
    and so on (``attnflow.kernels.log_logit_bound``)."""
    return _kernels.log_logit_bound(q, k, beta, kernel=kernel, params=kernel_params)


class Attention(eqx.Module):
    """One self-attention head with weights fixed in time.

    Args:
        Q, K, V: query, key and value matrices, each ``(d, d)``, real and finite.
            With ``rectangular=True``, Q and K may be ``(p, d)`` (a head of size ``p``
            acting on tokens of dimension ``d``, as in a trained transformer); V stays
            ``(d, d)``. The logits ``<Q x_i, K x_j> = x_i^T Q^T K x_j`` then depend on
            ``Q^T K`` only (for the softmax kernel).
        beta: inverse temperature multiplying every logit ``<Q x_i, K x_j>``; finite, > 0.
        kernel: the attention kernel, one of ``attnflow.kernels.KERNELS``: ``"softmax"``,
            ``"qknorm"`` (queries and keys RMS-normalised per token, then softmax of
            ``beta <q^, k^>``), ``"ssmax"`` (``softmax(s log(n) L)``), ``"sigmoid"``
            (``sigmoid(L - log n)``, not row-stochastic: original frame only),
            ``"adaptive"`` (adaptive temperature); see ``attnflow.kernels``.
        kernel_params: the kernel's numeric parameters, a mapping over its defaults, e.g.
            ``{"s": 2.0}`` for ``"ssmax"`` (the only kernel with a parameter so far).
            Stored as array leaves of the working dtype: changing a value does not
            recompile a jitted function of the model.
        propagator: how ``e^{tV}`` is computed: ``"auto"`` (default), ``"eigh"``,
            ``"eig"`` or ``"expm"``; see ``attnflow.propagator``.
        rectangular: allow ``(p, d)`` query and key matrices (see above).
        block: query rows per tile in the vector field (``attnflow.kernels.attend``):
            ``None`` chooses by size (dense up to 2048 tokens, then tiles of ~4M logits,
            never the ``(n, n)`` matrix), ``0`` forces the dense path.

    The working precision is the promoted dtype of ``Q, K, V`` (integers become the
    default float): float64 inputs stay float64 when x64 is on, and become float32 when it
    is off. The spectral decomposition of ``V`` is computed once, here.

    Invalid input raises ``ValueError`` naming the argument, at construction.
    """

    Q: Array
    K: Array
    V: Array
    beta: Array
    propagator: Propagator
    kernel_params: dict
    kernel: str = eqx.field(static=True)
    block: int | None = eqx.field(static=True, default=None)

    def __init__(self, Q, K, V, *, beta=1.0, kernel: str = "softmax",
                 propagator: str = "auto", rectangular: bool = False,
                 block: int | None = None, kernel_params=None):
        Qa = _as_matrix("Q", Q, square=not rectangular)
        Ka = _as_matrix("K", K, square=not rectangular)
        Va = _as_matrix("V", V)
        shapes = {"Q": tuple(Qa.shape), "K": tuple(Ka.shape), "V": tuple(Va.shape)}
        if rectangular:
            d = Va.shape[0]
            if Qa.shape != Ka.shape or Qa.shape[1] != d:
                raise ValueError(
                    f"with rectangular=True, Q and K must both be (p, d) with d = {d} from "
                    f"V; got {shapes}."
                )
        elif len(set(shapes.values())) != 1:
            raise ValueError(
                f"Q, K and V must all have the same shape (d, d); got {shapes}. "
                f"The token dimension d is fixed by V (for heads with p x d query and key "
                f"maps pass rectangular=True)."
            )
        if not isinstance(kernel, str) or kernel not in _kernels.KERNELS:
            raise ValueError(f"kernel must be one of {_kernels.KERNELS}; got {kernel!r}.")
        if kernel_params is not None and not hasattr(kernel_params, "items"):
            raise ValueError(f"kernel_params must be a mapping such as {{'s': 2.0}}; "
                             f"got {kernel_params!r}.")
        kparams = _kernels.kernel_params(kernel, kernel_params)
        if _is_concrete(beta):
            try:
                b = float(np.asarray(beta))
            except Exception:
                raise ValueError(f"beta must be a positive finite number; got {beta!r}.") from None
            if np.ndim(beta) != 0 or np.iscomplexobj(beta):
                raise ValueError(f"beta must be a real scalar; got {beta!r}.")
            if not math.isfinite(b) or b <= 0:
                raise ValueError(f"beta must be a positive finite number; got {beta!r}.")
        dtype = jax.dtypes.canonicalize_dtype(
            np.result_type(np.float32, *(a.dtype for a in (Qa, Ka, Va)))
        )
        # 5: past equinox's module constructor, to the line that built the model
        _warn_float64_cast(Qa, Ka, Va, stacklevel=5)
        self.Q = jnp.asarray(Qa, dtype=dtype)
        self.K = jnp.asarray(Ka, dtype=dtype)
        self.V = jnp.asarray(Va, dtype=dtype)
        self.beta = jnp.asarray(beta, dtype=dtype)
        if block is not None and (not isinstance(block, (int, np.integer)) or block < 0):
            raise ValueError(f"block must be None (automatic) or an integer >= 0 (0: dense); "
                             f"got {block!r}.")
        self.kernel = kernel
        self.kernel_params = {name: jnp.asarray(v, dtype=dtype) for name, v in kparams.items()}
        self.block = None if block is None else int(block)
        self.propagator = Propagator(self.V, method=propagator)

    # ----------------------------------------------------------------- basic facts
    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def dtype(self):
        return self.V.dtype

    # -------------------------------------------------------- attention of a state
    def logits(self, x: Array) -> Array:
        """The pre-kernel logits ``beta <Q x_i, K x_j>`` for tokens ``x`` ``(n, d)`` (original
        frame) -> ``(n, n)``; for ``qknorm``, of the normalised queries and keys."""
        q, k = _kernels.prepare(self.kernel, x @ self.Q.T, x @ self.K.T)
        return _kernels.logits(q, k, self.beta)

    def attention(self, x: Array) -> Array:
        """The attention matrix ``P`` ``(n, n)`` of tokens ``x`` ``(n, d)`` (original frame)."""
        return _kernels.weights(self.kernel, self.logits(x), self.kernel_params)

    def log_logit_bound(self, x: Array) -> Array:
        """``log(beta max_i |Q x_i| max_j |K x_j|)``, an upper bound of ``log max |logit|``
        (of what the kernel exponentiates: see ``attnflow.kernels.log_logit_bound``).

        Cheap (``O(n d^2)``, no ``n x n`` matrix) and safe: computed from norms, so it is
        ``+inf`` rather than NaN when ``x`` has overflowed.
        """
        return log_logit_bound(x @ self.Q.T, x @ self.K.T, self.beta, kernel=self.kernel,
                               kernel_params=self.kernel_params)

    # ---------------------------------------------------------------- vector fields
    def attend(self, x: Array, values: Array) -> Array:
        """``P(x) @ values`` for tokens ``x`` ``(n, d)``, tiled for large n (see ``block``)."""
        return _kernels.attend(self.kernel, x @ self.Q.T, x @ self.K.T, self.beta, values,
                               block=self.block, params=self.kernel_params)

    def field_original(self, t, x: Array) -> Array:
        """``dx/dt = P X V^T`` for tokens ``x`` ``(n, d)``."""
        del t
        return self.attend(x, x) @ self.V.T

    def field_rescaled(self, t, z: Array) -> Array:
        """``dz/dt = (P(t) Z - Z) V^T`` with ``P(t)`` taken at ``x = z e^{tV}^T``."""
        x = self.propagator.apply(t, z)
        return (self.attend(x, z) - z) @ self.V.T

    def to_original(self, t, z: Array) -> Array:
        """``x = e^{tV} z`` for row tokens ``z`` ``(..., d)``."""
        return self.propagator.apply(t, z)

    def to_rescaled(self, t, x: Array) -> Array:
        """``z = e^{-tV} x`` for row tokens ``x`` ``(..., d)``."""
        return self.propagator.apply(-jnp.asarray(t), x)


class Dynamics(eqx.Module):
    """The vector field of one frame in the coordinates the solver integrates.

    ``coords="standard"``: the state is the tokens themselves (``x`` in the original
    frame, ``z`` in the rescaled frame). ``coords="modal"`` (rescaled frame, diagonalisable
    V): the state is ``w = T^{-1} z`` in the real modal basis of ``V`` (see
    ``attnflow.propagator``), where ``e^{tV}`` acts mode by mode:

        dw = modal(P w - w, mu),  P from q = modal(w, e^{t mu}) (Q T)^T, k likewise.

    Built once per solve; ``QT = Q T`` and ``KT = K T`` are precomputed here.
    """

    model: Attention
    QT: Array | None
    KT: Array | None
    frame: str = eqx.field(static=True)
    coords: str = eqx.field(static=True)

    def __init__(self, model: Attention, frame: str, coords: str | None = None):
        prop = model.propagator
        if coords is None:
            coords = "modal" if (frame == "rescaled" and prop.has_modal) else "standard"
        if coords == "modal" and not prop.has_modal:
            raise ValueError("modal coordinates need a diagonalisable V (propagator eig/eigh).")
        self.model = model
        self.frame = frame
        self.coords = coords
        if coords == "modal":
            self.QT = model.Q @ prop.T
            self.KT = model.K @ prop.T
        else:
            self.QT = self.KT = None

    # ------------------------------------------------------------ coordinates
    def state_from_tokens(self, x0: Array) -> Array:
        """Initial state from tokens at t = 0 (where x = z)."""
        return self.model.propagator.to_modal(x0) if self.coords == "modal" else x0

    def queries_keys(self, t, y: Array) -> tuple[Array, Array]:
        m = self.model
        if self.coords == "modal":
            we = m.propagator.modal_scale(y, *m.propagator.exp_multipliers(t))
            return we @ self.QT.T, we @ self.KT.T
        x = y if self.frame == "original" else m.propagator.apply(t, y)
        return x @ m.Q.T, x @ m.K.T

    def log_bound(self, t, y: Array) -> Array:
        q, k = self.queries_keys(t, y)
        m = self.model
        return log_logit_bound(q, k, m.beta, kernel=m.kernel, kernel_params=m.kernel_params)

    # ------------------------------------------------------------------ field
    def __call__(self, t, y: Array) -> Array:
        m = self.model
        q, k = self.queries_keys(t, y)
        Py = _kernels.attend(m.kernel, q, k, m.beta, y, block=m.block,
                             params=m.kernel_params)
        if self.frame == "original":
            return Py @ m.V.T
        if self.coords == "modal":
            prop = m.propagator
            return prop.modal_scale(Py - y, prop.mu_re, prop.mu_im)
        return (Py - y) @ m.V.T
