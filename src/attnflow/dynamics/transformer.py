"""Transformer blocks as particle systems: several heads, feed-forward layers, both.

Tokens are the rows ``x_i`` of an ``(n, d)`` array; every family is a vector field
``dx/dt = F(x)`` on the seam of ``attnflow.dynamics.base``:

``MultiHeadAttention``  ``F(x)_i = sum_h sum_j P^h_ij V_h x_j``, ``P^h`` the kernel of
                        the logits ``beta <Q_h x_i, K_h x_j>`` (one mask for all heads).
``FeedForward``         ``F(x)_i = W2 act(W1 x_i + b1) + b2``, token by token.
``Block``               attention plus feed-forward: ``F = F_att + F_ff``; one layer of
                        the discrete transformer is the attention sub-step followed by the
                        feed-forward sub-step, ``y = x + dt F_att(x)``, ``x' = y + dt F_ff(y)``.

Rescaled frame. One value matrix no longer rescales the dynamics; these models carry a
rescaling matrix ``W`` (``z = e^{-tW} x``; for ``MultiHeadAttention`` the sum of the
``V_h`` unless given, for a ``Block`` its attention's), and the rescaled frame integrates
``dz/dt = e^{-tW} (F(x) - W x) = e^{-tW} F(x) - W z`` with ``x = e^{tW} z`` (the generic
path of ``attnflow.dynamics.frames.Rescaled``, standard coordinates). For one head and
``W = V`` this is ``sum_j P_ij V (z_j - z_i)``: the single-head frame.

``attention(x)`` of a multi-head model is one matrix per head, ``(h, n, n)``, and so is
``logits(x)``; ``Trajectory.attention(k)`` returns them per system (``(h, n, n)`` or
``(b, h, n, n)``). A feed-forward layer has no attention matrix.
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

from .. import _checks
from .._precision import einsum, mm
from . import kernels as _kernels
from .base import AbstractAttentionSystem, AbstractModel, family_class
from .kernels._tiling import prepared as _prepared
from .model import Attention, describe_kernel, kernel_and_mask, saved_kernel
from .propagator import FlowCache, Propagator

__all__ = ["MultiHeadAttention", "FeedForward", "Block", "ACTIVATIONS", "single_head"]

ACTIVATIONS = ("relu", "gelu", "tanh")


def _activation(name: str, u: Array) -> Array:
    if name == "relu":
        return jax.nn.relu(u)
    if name == "gelu":  # the exact (erf) GELU of BERT and its descendants
        return jax.nn.gelu(u, approximate=False)
    return jnp.tanh(u)


def _weights(name: str, A: Any, ndim: int, hint: str) -> np.ndarray:
    """A real, finite, non-empty array of ``ndim`` dimensions (ValueError naming it)."""
    arr = _checks.real_array(name, A, ndim=ndim, shape_hint=hint)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.float32)
    return arr


def _dtype(*arrays: np.ndarray) -> Any:
    return jax.dtypes.canonicalize_dtype(np.result_type(np.float32, *(a.dtype for a in arrays)))


def _cast(name: str, a: np.ndarray, dtype: Any) -> Array:
    with np.errstate(over="ignore"):
        out = jnp.asarray(a, dtype=dtype)
    if not bool(jnp.all(jnp.isfinite(out))):
        raise ValueError(
            f"{name} has entries beyond the {np.dtype(dtype).name} range; enable x64 "
            f"(jax.config.update('jax_enable_x64', True)) or rescale the weights."
        )
    return out


def _beta(beta: Any) -> float:
    try:
        b = float(np.asarray(beta))
    except Exception:
        raise ValueError(f"beta must be a positive finite number; got {beta!r}.") from None
    if np.ndim(beta) != 0 or np.iscomplexobj(beta) or not math.isfinite(b) or b <= 0:
        raise ValueError(f"beta must be a positive finite number; got {beta!r}.")
    return b


def _block(block: Any) -> int | None:
    if block is not None and (
        not isinstance(block, (int, np.integer)) or isinstance(block, bool) or block < 0
    ):
        raise ValueError(
            f"block must be None (automatic) or an integer >= 0 (0: dense); got {block!r}."
        )
    return None if block is None else int(block)


# ------------------------------------------------------------------- multi-head
class MultiHeadAttention(AbstractModel):
    """``h`` self-attention heads acting together: ``dx_i/dt = sum_h sum_j P^h_ij V_h x_j``.

    Args:
        Q, K: ``(h, p, d)`` query and key maps, one ``(p, d)`` matrix per head (a single
            head may be given as ``(p, d)``).
        V: ``(h, d, d)`` value matrices (for a trained layer, ``V_h = W_O[:, h] W_V[h]``,
            as ``attnflow.heads`` builds them).
        beta: inverse temperature of every head's logits; finite, > 0.
        kernel: a kernel object or one of ``attnflow.kernels.KERNELS`` (the same for
            every head).
        mask: ``None``, a mask object, ``"causal"`` or ``("window", w)``
            (``attnflow.masks.check_mask``), the same for every head.
        W: the ``(d, d)`` rescaling matrix of the rescaled frame ``z = e^{-tW} x``;
            default the sum of the ``V_h`` (no theorem singles out a better choice: with
            ``W = sum V_h`` a configuration where every head attends uniformly stands
            still in ``z``).
        kernel_params: the kernel's numeric parameters (``{"s": 2.0}`` for ``ssmax``).
        block: query rows per tile (``attnflow.kernels.attend``); ``None`` by size.

    With ``h = 1`` and ``W = V`` the model is ``Attention(Q[0], K[0], V[0])`` to rounding
    in both frames. The working precision is the promoted dtype of the weights.
    """

    Q: Array
    K: Array
    V: Array
    W_given: Array | None
    beta: Array
    flow: FlowCache
    kernel: _kernels.AbstractKernel
    mask: Any
    block: int | None = eqx.field(static=True)
    w_given: bool = eqx.field(static=True)
    family = "MultiHeadAttention"

    def __init__(
        self,
        Q,
        K,
        V,
        *,
        beta=1.0,
        kernel: Any = "softmax",
        mask=None,
        W=None,
        kernel_params=None,
        block: int | None = None,
    ):
        Va = _weights("V", V, 3, "(h, d, d)") if np.ndim(V) != 2 else None
        if Va is None:
            Va = _weights("V", V, 2, "(d, d)")[None]
        h, d = Va.shape[0], Va.shape[-1]
        if Va.shape[1] != d:
            raise ValueError(f"V must be (h, d, d) square value matrices; got shape {Va.shape}.")
        Qa = _weights("Q", Q, np.ndim(Q) if np.ndim(Q) in (2, 3) else 3, "(h, p, d)")
        Ka = _weights("K", K, np.ndim(K) if np.ndim(K) in (2, 3) else 3, "(h, p, d)")
        Qa = Qa[None] if Qa.ndim == 2 else Qa
        Ka = Ka[None] if Ka.ndim == 2 else Ka
        if Qa.shape != Ka.shape or Qa.shape[0] != h or Qa.shape[2] != d:
            raise ValueError(
                f"Q and K must both be (h, p, d) with h = {h} heads and d = {d} from V "
                f"(h, d, d); got Q {Qa.shape}, K {Ka.shape}, V {Va.shape}."
            )
        kobj, self.mask = kernel_and_mask(kernel, kernel_params, mask)
        if self.mask is not None and self.mask.heads not in (None, h):
            raise ValueError(
                f"mask has parameters for {self.mask.heads} heads; the model has {h}: "
                f"give one per head (or one for all)."
            )
        b = _beta(beta)
        self.block = _block(block)
        Wa = None if W is None else _weights("W", W, 2, "(d, d)")
        if Wa is not None and Wa.shape != (d, d):
            raise ValueError(f"W must be a (d, d) = ({d}, {d}) matrix; got shape {Wa.shape}.")
        arrays = (Qa, Ka, Va) if Wa is None else (Qa, Ka, Va, Wa)
        dtype = _dtype(*arrays)
        _checks.warn_float64_cast(*arrays, stacklevel=5)
        self.Q = _cast("Q", Qa, dtype)
        self.K = _cast("K", Ka, dtype)
        self.V = _cast("V", Va, dtype)
        self.beta = jnp.asarray(b, dtype)
        self.w_given = Wa is not None
        self.W_given = None if Wa is None else _cast("W", Wa, dtype)
        self.kernel = kobj.astype(dtype)
        self.flow = FlowCache(self.W)

    @property
    def W(self) -> Array:
        """The rescaling matrix: the ``W`` given, else the sum of the heads' value
        matrices (summed in float64 when they are concrete), derived from ``V`` at each
        use so that it never drifts from it."""
        if self.W_given is not None:
            return self.W_given
        if isinstance(self.V, jax_core.Tracer):
            return jnp.sum(self.V, axis=-3)
        return jnp.asarray(np.asarray(self.V, np.float64).sum(-3), self.V.dtype)

    @property
    def propagator(self) -> Propagator:  # pyright: ignore[reportIncompatibleVariableOverride]
        """``e^{tW}`` of the rescaling matrix ``W`` through its cached decomposition."""
        return Propagator(self.W, flow=self.flow)

    # ----------------------------------------------------------------- basic facts
    @property
    def stack_size(self) -> int | None:
        """The number of stacked models (``attnflow.stack``: ``V`` of shape
        ``(b, h, d, d)``), or ``None`` for one."""
        return self.V.shape[0] if self.V.ndim == 4 else None

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def dtype(self):
        return self.V.dtype

    @property
    def heads(self) -> int:
        """The number of heads ``h``."""
        return self.V.shape[0]

    @property
    def num_heads(self) -> int:
        return self.heads

    @property
    def kernel_params(self) -> dict:
        """The kernel's numeric parameters by name."""
        return self.kernel.params()

    def value_matrices(self) -> Float[Array, "h d d"]:
        """The heads' value matrices ``V_h``."""
        return self.V

    def head(self, h: int | None = None) -> Attention:
        """Head ``h`` alone, as an ``Attention`` (same beta, kernel, mask and tiling):
        its attention matrix is this model's ``attention(x)[h]``. ``h`` may be left out
        when there is one head."""
        if h is None:
            if self.heads != 1:
                raise ValueError(
                    f"the model has {self.heads} attention heads: pass head=0 ... "
                    f"{self.heads - 1} to choose one."
                )
            h = 0
        h = _checks.index("head", h, self.heads, what="heads")
        return Attention(
            self.Q[h],
            self.K[h],
            self.V[h],
            beta=float(self.beta),
            kernel=self.kernel,
            mask=None if self.mask is None else self.mask.head(h),
            block=self.block,
            rectangular=True,
        )

    # --------------------------------------------------------------- the field
    def _queries_keys(self, x: Array) -> tuple[Array, Array]:
        """Per-head queries and keys ``(h, n, p)`` of tokens ``x`` (the kernel's prep
        is applied by ``attend`` and ``logits``; ``prenorm``'s token norm here)."""
        x = self.kernel.prepare_tokens(x)
        return einsum("nd,hpd->hnp", x, self.Q), einsum("nd,hpd->hnp", x, self.K)

    def averaged(self, x: Float[Array, "n d"]) -> Float[Array, "h n d"]:
        """``P^h x`` for every head ``h``: the averaged tokens, before the value maps."""
        q, k = self._queries_keys(x)

        def one(qh, kh, mask):
            return _kernels.attend_with(
                self.kernel, qh, kh, self.beta, x, block=self.block, mask=mask
            )

        return jax.vmap(one, in_axes=(0, 0, self._mask_axis))(q, k, self.mask)

    @property
    def _mask_axis(self) -> Any:
        """``vmap``'s axis of the mask over the heads: 0 for per-head parameters."""
        return None if self.mask is None or self.mask.heads is None else 0

    def _value_sum(self, u: Array) -> Array:
        """``sum_h u_h V_h^T`` of per-head rows ``u`` ``(h, n, d)``."""
        return einsum("hnd,hed->ne", u, self.V)

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self._value_sum(self.averaged(x))

    def layer(self, x: Float[Array, "n d"], dt: Any) -> Float[Array, "n d"]:
        """``x + sum_h (dt P^h x) V_h^T``: one residual layer (``Attention``'s order of
        arithmetic)."""
        return x + self._value_sum(dt * self.averaged(x))

    def logits(self, x: Float[Array, "n d"]) -> Float[Array, "h n n"]:
        """The pre-kernel logits of every head, ``(h, n, n)`` (unmasked, without a
        mask's bias; turned by position under RoPE)."""
        q, k = self._queries_keys(x)

        def one(qh, kh, mask):
            return _kernels.logits(*_prepared(self.kernel, mask, qh, kh), self.beta)

        return jax.vmap(one, in_axes=(0, 0, self._mask_axis))(q, k, self.mask)

    def attention(self, x: Float[Array, "n d"]) -> Float[Array, "h n n"]:
        """The attention matrix of every head, ``(h, n, n)`` (masked)."""
        L = self.logits(x)
        if self.mask is not None:
            L = jax.vmap(lambda Lh, m: m.apply(Lh), in_axes=(0, self._mask_axis))(L, self.mask)
        return self.kernel.weights(L)

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        """The largest of the heads' bounds (``attnflow.kernels.log_logit_bound``)."""
        q, k = self._queries_keys(x)
        bounds = jax.vmap(lambda qh, kh: self.kernel.log_bound(qh, kh, self.beta))(q, k)
        return jnp.max(bounds)

    # ---------------------------------------------------------------- saved form
    def describe(self) -> dict:
        out = {
            "family": "MultiHeadAttention",
            "heads": self.heads,
            "beta": float(self.beta),
            **{k: v for k, v in describe_kernel(self.kernel, None).items()},
            "block": self.block,
            "mask": None if self.mask is None else self.mask.describe(),
            "W_given": self.w_given,
            "Q": np.asarray(self.Q).tolist(),
            "K": np.asarray(self.K).tolist(),
            "V": np.asarray(self.V).tolist(),
            "W": np.asarray(self.W).tolist(),
        }
        return out

    def arrays(self) -> dict:
        out = {"Q": self.Q, "K": self.K, "V": self.V, "W": self.W, "beta": self.beta}
        out.update({f"kernel_params.{k}": v for k, v in self.kernel_params.items()})
        return out

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> MultiHeadAttention:
        return cls(
            arrays["Q"],
            arrays["K"],
            arrays["V"],
            beta=arrays["beta"],
            kernel=saved_kernel(description, arrays),
            mask=description.get("mask"),
            W=arrays["W"] if description.get("W_given") else None,
            block=description.get("block"),
        )


def single_head(model: AbstractModel, head: int | None = None) -> AbstractAttentionSystem:
    """The one attention head of ``model`` that an analysis of attention matrices reads:
    ``model.head(head)`` (``ValueError`` naming the method when the model has none)."""
    return model.head(head)


# ------------------------------------------------------------------ feed-forward
class FeedForward(AbstractModel):
    """The token-wise field ``F(x)_i = W2 act(W1 x_i + b1) + b2`` of a feed-forward layer.

    Args:
        W1: ``(m, d)`` first linear map (``m`` hidden units), b1: ``(m,)``.
        W2: ``(d, m)`` second linear map, b2: ``(d,)``.
        activation: ``"relu"``, ``"gelu"`` (the exact erf form, as in BERT) or ``"tanh"``.

    Tokens do not interact: there is no attention matrix and no rescaled frame
    (``propagator`` is ``None``); in a ``Block`` it adds to an attention field.
    """

    W1: Array
    b1: Array
    W2: Array
    b2: Array
    propagator: None
    activation: str = eqx.field(static=True)
    family = "FeedForward"

    def __init__(self, W1, b1, W2, b2, *, activation: str = "relu"):
        W1a = _weights("W1", W1, 2, "(m, d)")
        W2a = _weights("W2", W2, 2, "(d, m)")
        b1a = _weights("b1", b1, 1, "(m,)")
        b2a = _weights("b2", b2, 1, "(d,)")
        m, d = W1a.shape
        if W2a.shape != (d, m) or b1a.shape != (m,) or b2a.shape != (d,):
            raise ValueError(
                f"feed-forward shapes must be W1 (m, d), b1 (m,), W2 (d, m), b2 (d,) with "
                f"m = {m}, d = {d} from W1; got W2 {W2a.shape}, b1 {b1a.shape}, b2 {b2a.shape}."
            )
        self.activation = _checks.choice("activation", activation, ACTIVATIONS)
        dtype = _dtype(W1a, b1a, W2a, b2a)
        _checks.warn_float64_cast(W1a, b1a, W2a, b2a, stacklevel=5)
        self.W1 = _cast("W1", W1a, dtype)
        self.b1 = _cast("b1", b1a, dtype)
        self.W2 = _cast("W2", W2a, dtype)
        self.b2 = _cast("b2", b2a, dtype)
        self.propagator = None

    @property
    def d(self) -> int:
        return self.W1.shape[1]

    @property
    def dtype(self):
        return self.W1.dtype

    def value_matrices(self) -> Float[Array, "0 d d"]:
        """No attention heads: an empty ``(0, d, d)`` stack."""
        return jnp.zeros((0, self.d, self.d), self.dtype)

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        lead = (1,) * (x.ndim - 1)  # explicit broadcasting of the biases over the tokens
        hidden = mm(x, self.W1.T) + jnp.reshape(self.b1, lead + self.b1.shape)
        return mm(_activation(self.activation, hidden), self.W2.T) + jnp.reshape(
            self.b2, lead + self.b2.shape
        )

    def attention(self, x: Float[Array, "n d"]) -> Array:
        """A feed-forward layer has no attention matrix: ``ValueError``."""
        raise ValueError(
            "a FeedForward layer has no attention matrix (tokens move one by one); put it "
            "in a Block with an attention model."
        )

    def describe(self) -> dict:
        return {
            "family": "FeedForward",
            "activation": self.activation,
            "hidden": int(self.W1.shape[0]),
            "W1": np.asarray(self.W1).tolist(),
            "b1": np.asarray(self.b1).tolist(),
            "W2": np.asarray(self.W2).tolist(),
            "b2": np.asarray(self.b2).tolist(),
        }

    def arrays(self) -> dict:
        return {"W1": self.W1, "b1": self.b1, "W2": self.W2, "b2": self.b2}

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> FeedForward:
        return cls(
            arrays["W1"],
            arrays["b1"],
            arrays["W2"],
            arrays["b2"],
            activation=description["activation"],
        )


# ------------------------------------------------------------------------ block


class Block(AbstractModel):
    """A transformer block: ``F(x) = F_att(x) + F_ff(x)``.

    Args:
        attention: any attention model with at least one head and no feed-forward term
            (``num_heads >= 1``, ``pure_attention``): an ``Attention``, an
            ``IsotropicAttention``, a ``MultiHeadAttention`` or a family of one's own.
        feedforward: a ``FeedForward`` of the same ``d`` and working precision, or
            ``None`` (the block is then its attention).

    One layer (``method="euler"``) is the attention sub-step, then the feed-forward
    sub-step on its result: ``y = attention.layer(x, dt)``, ``x' = y + dt F_ff(y)``, as in
    a residual block (layer normalisation aside). Without the skip connection
    (``residual=False``) a layer is ``F_ff(F_att(x))``. The rescaled frame uses the
    attention's rescaling matrix (``V``, or ``MultiHeadAttention.W``).
    """

    attn: AbstractModel
    ffn: FeedForward | None
    family = "Block"

    def __init__(self, attention, feedforward=None):
        if (
            not isinstance(attention, AbstractModel)
            or attention.num_heads < 1
            or not attention.pure_attention
        ):
            raise ValueError(
                f"attention must be an attention model (num_heads >= 1 and pure_attention: "
                f"an attnflow.Attention, MultiHeadAttention or a family of one's own); got "
                f"{type(attention).__name__}."
            )
        if attention.stack_size is not None:
            raise ValueError(
                f"attention is stacked ({attention.stack_size} models along a leading axis); "
                f"a Block holds one attention model: build one Block per model, or run the "
                f"stacked attention alone."
            )
        if feedforward is not None:
            if not isinstance(feedforward, FeedForward):
                raise ValueError(
                    f"feedforward must be an attnflow.FeedForward or None; "
                    f"got {type(feedforward).__name__}."
                )
            if feedforward.d != attention.d:
                raise ValueError(
                    f"feedforward acts on d = {feedforward.d} but the attention on "
                    f"d = {attention.d}; they must match."
                )
            if feedforward.dtype != attention.dtype:
                raise ValueError(
                    f"feedforward is {np.dtype(feedforward.dtype).name} but the attention "
                    f"{np.dtype(attention.dtype).name}; build both in the same precision."
                )
        self.attn = attention
        self.ffn = feedforward

    @property
    def propagator(self) -> Any:  # pyright: ignore[reportIncompatibleVariableOverride]
        """The attention's propagator (its rescaling matrix), read through it."""
        return self.attn.propagator

    @property
    def d(self) -> int:
        return self.attn.d

    @property
    def dtype(self):
        return self.attn.dtype

    @property
    def mask(self) -> Any:
        """The attention's mask."""
        return getattr(self.attn, "mask", None)

    @property
    def num_heads(self) -> int:
        return self.attn.num_heads

    @property
    def pure_attention(self) -> bool:
        return self.ffn is None

    def head(self, h: int | None = None) -> AbstractAttentionSystem:
        """Head ``h`` of the attention (a feed-forward term does not change the
        attention matrices)."""
        return self.attn.head(h)

    def value_matrices(self) -> Float[Array, "h d d"]:
        """The attention's value matrices, ``(h, d, d)`` (``(1, d, d)`` for one head)."""
        return self.attn.value_matrices()

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        out = self.attn.vector_field(x)
        return out if self.ffn is None else out + self.ffn.vector_field(x)

    def layer(self, x: Float[Array, "n d"], dt: Any) -> Float[Array, "n d"]:
        """The attention sub-step, then the feed-forward sub-step on its result."""
        y = self.attn.layer(x, dt)
        return y if self.ffn is None else self.ffn.layer(y, dt)

    def pure_layer(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """``F_ff(F_att(x))``: both sub-layers without their skip connections."""
        y = self.attn.pure_layer(x)
        return y if self.ffn is None else self.ffn.pure_layer(y)

    def attention(self, x: Float[Array, "n d"]) -> Array:
        """The attention's matrix (``(n, n)``) or matrices (``(h, n, n)``)."""
        return self.attn.attention(x)  # pyright: ignore[reportAttributeAccessIssue]

    def logits(self, x: Float[Array, "n d"]) -> Array:
        """The attention's pre-kernel logits."""
        return self.attn.logits(x)  # pyright: ignore[reportAttributeAccessIssue]

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        return self.attn.log_logit_bound(x)

    def describe(self) -> dict:
        return {
            "family": "Block",
            "attention": self.attn.describe(),
            "feedforward": None if self.ffn is None else self.ffn.describe(),
        }

    def arrays(self) -> dict:
        out = {f"attention.{k}": v for k, v in self.attn.arrays().items()}
        if self.ffn is not None:
            out.update({f"feedforward.{k}": v for k, v in self.ffn.arrays().items()})
        return out

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> Block:
        def part(prefix: str) -> dict:
            return {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}

        att = description["attention"]
        family = family_class(att.get("family", ""))
        attention = family.from_saved(att, part("attention."))
        ff = description.get("feedforward")
        feedforward = None if ff is None else FeedForward.from_saved(ff, part("feedforward."))
        return cls(attention, feedforward)
