"""The model seam: what every model family implements, and nothing else.

``AbstractModel`` is a vector field on tokens, ``dx/dt = F(x)`` for the rows ``x`` of an
``(n, d)`` array. ``AbstractAttentionSystem`` is the attention family: queries and keys
are linear maps of the tokens, a kernel turns the logits into weights, the weights
average the values, and a linear map of the averaged values gives the field,

    ``F(x) = value_map(P(q, k) x)``,  ``q = x Q^T``, ``k = x K^T``.

Everything else (the frames, the layer loop, ``simulate``, ``Trajectory`` and the
analyses) is written against these methods, so a new family is one module that
subclasses one of these classes (equinox's abstract/final pattern: the abstract classes
declare, the final classes implement). See ``docs/architecture.md`` for a worked example.

A model whose field has one value matrix V also declares its ``propagator`` (``e^{tV}``
and V's real modal form): that is what the rescaled frame ``z = e^{-tV} x`` needs. Models
without one (``propagator = None``) run in the original frame only.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._precision import mm
from . import kernels as _kernels
from .kernels._tiling import prepared as _prepared

__all__ = [
    "AbstractModel",
    "AbstractAttentionSystem",
    "AbstractKernelAttention",
    "FAMILIES",
    "family_class",
    "saved_kernel_params",
]


# family name -> final model class: each final family declares ``family = "Name"`` (the
# name its saved runs carry) and is registered here when its class is defined.
FAMILIES: dict[str, type[AbstractModel]] = {}


def family_class(name: str) -> type[AbstractModel]:
    """The model class registered under ``name`` (``describe()["family"]``)."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown model family {name!r}; known: {sorted(FAMILIES)} (a family of one's "
            f"own is registered by its class attribute family = '...', once its module is "
            f"imported)."
        ) from None


class AbstractModel(eqx.Module):
    """A vector field on tokens ``x`` ``(n, d)``: ``dx/dt = vector_field(x)``.

    Subclasses implement ``d``, ``dtype``, ``vector_field``, ``describe``, ``arrays`` and
    ``from_saved``; the rest has defaults. ``propagator`` is ``None`` unless the model
    supports the rescaled frame. A final family sets the class attribute ``family`` (its
    saved name), which registers it for ``Trajectory.load``.
    """

    propagator: eqx.AbstractVar[Any]
    family: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("family")
        if isinstance(name, str):
            FAMILIES[name] = cls

    @property
    def num_heads(self) -> int:
        """How many attention heads the model has (0: none)."""
        return 0

    @property
    def beyond_attention(self) -> str:
        """What the model adds to its heads' attention besides a feed-forward term (an
        output gate, say), for the analyses whose theorems assume nothing else; ``""``
        for nothing."""
        return ""

    @property
    def pure_attention(self) -> bool:
        """Whether the field is attention alone (no feed-forward term)."""
        return self.num_heads > 0

    def head(self, h: int | None = None) -> AbstractAttentionSystem:
        """Head ``h`` alone, as a one-head attention system; ``ValueError`` naming the
        method when the model cannot give one."""
        raise ValueError(
            f"{type(self).__name__} has no attention head (it does not implement head(h))."
        )

    def value_matrices(self) -> Array:
        """The value matrices of the heads, ``(h, d, d)``."""
        raise ValueError(
            f"{type(self).__name__} declares no value matrices (it does not implement "
            f"value_matrices())."
        )

    @property
    @abc.abstractmethod
    def d(self) -> int:
        """Token dimension."""

    @property
    @abc.abstractmethod
    def dtype(self) -> Any:
        """Working precision of the weights (and of the solve)."""

    @abc.abstractmethod
    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """``dx/dt`` in the original frame for tokens ``x``."""

    def layer(self, x: Float[Array, "n d"], dt: Any) -> Float[Array, "n d"]:
        """One residual layer of step ``dt``: ``x + dt F(x)`` (forward Euler)."""
        return x + dt * self.vector_field(x)

    @property
    def stack_size(self) -> int | None:
        """How many models this one holds along a leading batch axis of its weights
        (``attnflow.stack``), or ``None`` for one model. A family that supports stacked
        weights overrides this from its leaves' shapes; the default is ``None`` (no
        stacking: ``attnflow.stack`` refuses the family)."""
        return None

    def pure_layer(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """One layer without the skip connection: ``F(x)`` (``x_i <- sum_j P_ij V x_j``
        for one head), as in Dong et al.'s pure attention; ``simulate(...,
        residual=False)``."""
        return self.vector_field(x)

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        """An upper bound of ``log max |exponent|`` over what the model exponentiates at
        tokens ``x``, for the overflow guard; ``-inf`` when nothing is exponentiated."""
        del x
        return jnp.asarray(-jnp.inf, self.dtype)

    @abc.abstractmethod
    def describe(self) -> dict:
        """What a saved run records of the model: JSON-ready (weights as lists)."""

    @abc.abstractmethod
    def arrays(self) -> dict[str, Any]:
        """The model's arrays by name, saved bit for bit by ``Trajectory.save``; with
        ``describe()`` they rebuild the model through ``from_saved``."""

    @classmethod
    @abc.abstractmethod
    def from_saved(cls, description: dict, arrays: dict[str, Any]) -> AbstractModel:
        """Rebuild a model from ``describe()`` and ``arrays()`` (``Trajectory.load``)."""


class AbstractAttentionSystem(AbstractModel):
    """Tokens interacting through attention: ``F(x) = value_map(P x)``.

    Subclasses implement the query/key maps, the attention matrix and the logits from
    queries and keys, the overflow bound, the linear ``value_map`` and
    ``rows_sum_to_one``; ``weigh`` (``P @ values``, which may tile) defaults to the
    dense product. Nothing here names a kernel: a family may weigh the values any way it
    likes (``AbstractKernelAttention`` is the family of one kernel and one mask).

    What the analyses read, with defaults: ``attention``/``logits`` at a state,
    ``attention_argmax`` and ``attention_log_mass`` (rank and leaders),
    ``attention_rows`` (dispersion), ``num_heads``/``head(h)``/``value_matrices``
    (one head of several), ``value_matrix`` (the regime theorems), ``plain_softmax``
    (whether the theorems' kernel is the model's), ``attention_kind`` (messages).

    Declared facts, from which the analyses derive their numbers (they never inspect a
    family's or a kernel's methods): ``kept_keys(x, rows)`` (the keys each query row
    keeps: dispersion's per-row key count, spread and entropy; default every key, and a
    family that masks inside its own weights overrides it), ``bilinear_logits``
    (``logits_qk(q, k) = beta q k^T`` of the queries and keys themselves: the hardmax
    cells' Frank-Wolfe objective needs it; default False), ``positional`` (token
    positions enter the logits or their bias: RoPE, ALiBi; default False),
    ``rows_sum_to_one`` (abstract), ``normalizes_tokens`` and ``plain_softmax``.
    ``attnflow.testing.check_model`` holds every declared fact against the family's own
    numbers.
    """

    beta: eqx.AbstractVar[Array]

    @abc.abstractmethod
    def query_key_maps(self) -> tuple[Array, Array]:
        """``(Q, K)``: queries ``x Q^T`` and keys ``x K^T`` of tokens ``x``."""

    @abc.abstractmethod
    def weights(self, q: Array, k: Array) -> Array:
        """The attention matrix ``P(q, k)`` ``(n, m)``."""

    @abc.abstractmethod
    def logits_qk(self, q: Array, k: Array) -> Array:
        """The pre-kernel logits of queries ``q`` and keys ``k``, ``(n, m)``."""

    @abc.abstractmethod
    def log_bound(self, q: Array, k: Array) -> Array:
        """``log`` of a bound of what the weighting exponentiates (``+inf``, never NaN)."""

    @abc.abstractmethod
    def value_map(self, u: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The linear map of the averaged values: ``u V^T`` for one head."""

    @property
    @abc.abstractmethod
    def rows_sum_to_one(self) -> bool:
        """Whether every row of ``P`` sums to one (the rescaled frame needs it)."""

    def weigh(self, q: Array, k: Array, values: Array) -> Array:
        """``P(q, k) @ values``; default the dense product (families override to tile)."""
        return mm(self.weights(q, k), values)

    # ---------------------------------------------------------- facts, defaults
    @property
    def normalizes_tokens(self) -> bool:
        """Whether ``prepare_tokens`` rescales the tokens (the modal rescaled frame,
        whose coordinates are not the tokens', cannot serve such a model)."""
        return False

    @property
    def attention_kind(self) -> str:
        """What weighs the values, for messages (a kernel name, or the family's)."""
        return type(self).__name__

    def kept_keys(self, x: Float[Array, "n d"], rows: Array | None = None) -> Bool[Array, "r n"]:
        """Which keys each query row keeps at tokens ``x`` (original frame): boolean
        ``(len(rows), n)`` for the query indices ``rows`` (default all, ``(n, n)``).
        A key not kept weighs 0 whatever the logits; dispersion counts, spreads and
        normalises over the kept keys of each row. Default: every key. A family that
        masks inside its own weights overrides this (and must keep at least one key per
        row)."""
        n = x.shape[-2]
        r = n if rows is None else rows.shape[0]
        return jnp.ones((r, n), dtype=bool)

    @property
    def bilinear_logits(self) -> bool:
        """Whether ``logits_qk(q, k)`` is ``beta q k^T`` of the queries and keys
        ``queries_keys(x)`` themselves (no map of them, no turn by position), so that the
        logits of tokens are the bilinear form ``beta x_i^T Q^T K x_j`` (of
        ``prepare_tokens(x)``). Default False: a family declares it."""
        return False

    @property
    def positional(self) -> bool:
        """Whether token positions enter the logits or their bias (RoPE's turn,
        ALiBi's bias): then a logit is no function of the two tokens alone. Default
        False."""
        return False

    @property
    def plain_softmax(self) -> bool:
        """Whether ``P`` is plain unmasked softmax of the logits, the kernel the regime
        theorems are proved for."""
        return False

    def prepare_tokens(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The tokens as the query and key maps see them; default unchanged."""
        return x

    def value_matrix(self) -> Array | None:
        """The value matrix ``V`` ``(d, d)`` when ``value_map`` is ``u V^T``, else
        ``None``."""
        prop = self.propagator
        return None if prop is None else prop.V

    @property
    def num_heads(self) -> int:
        return 1

    def head(self, h: int | None = None) -> AbstractAttentionSystem:
        """Head ``h`` alone: the model itself (one head)."""
        if h not in (None, 0):
            raise ValueError(f"head must be None or 0 for a one-head model; got {h!r}.")
        return self

    def value_matrices(self) -> Array:
        V = self.value_matrix()
        if V is None:
            raise ValueError(f"{type(self).__name__} has no value matrix (value_matrix() is None).")
        return V[None]

    # ------------------------------------------------------------- derived, final
    def queries_keys(self, x: Float[Array, "n d"]) -> tuple[Array, Array]:
        """Queries and keys of tokens ``x`` (original frame), of ``prepare_tokens(x)``."""
        Q, K = self.query_key_maps()
        x = self.prepare_tokens(x)
        return mm(x, Q.T), mm(x, K.T)

    def logits(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        """The pre-kernel logits of tokens ``x`` (original frame)."""
        return self.logits_qk(*self.queries_keys(x))

    def attention(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        """The attention matrix ``P`` of tokens ``x`` (original frame)."""
        return self.weights(*self.queries_keys(x))

    def attend(self, x: Float[Array, "n d"], values: Array) -> Array:
        """``P(x) @ values`` for tokens ``x`` (original frame)."""
        return self.weigh(*self.queries_keys(x), values)

    def attention_argmax(self, x: Float[Array, "n d"], P: Array) -> Array:
        """Per row, the key of the largest weight of ``P = attention(x)``."""
        del x
        return jnp.argmax(P, axis=-1)

    def attention_log_mass(self, x: Float[Array, "n d"], P: Array, keep: Array) -> Array:
        """``log sum_{j in keep} P_ij`` per row; default ``log`` of the sum of ``P``
        (kernels with an exact form stay finite far below underflow)."""
        del x
        return jnp.log(jnp.sum(jnp.where(keep, P, 0.0), axis=-1))

    @property
    def rowwise(self) -> bool:
        """Whether row ``i`` of ``P`` depends on query ``i`` alone (then an analysis may
        compute the rows in tiles); default ``False``."""
        return False

    def attention_rows(self, q: Array, k: Array, rows: Array) -> tuple[Array, Array, Any]:
        """``(P[rows], L[rows], keep)`` of the queries ``q`` and keys ``k`` of every token
        (``queries_keys``), for query indices ``rows``: the weights, the logits and which
        logits are kept (``None``: all). Default: from the full matrices."""
        return self.weights(q, k)[rows], self.logits_qk(q, k)[rows], None

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        return self.log_bound(*self.queries_keys(x))

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.value_map(self.attend(x, x))

    def layer(self, x: Float[Array, "n d"], dt: Any) -> Float[Array, "n d"]:
        """``x + value_map(dt P x)``: the step scales the averaged values before the
        value map (the order of the discrete transformer's arithmetic)."""
        return x + self.value_map(dt * self.attend(x, x))


class AbstractKernelAttention(AbstractAttentionSystem):
    """An attention system whose weights are one kernel of the logits
    ``beta <q_i, k_j>``, under one mask: ``P = kernel(mask(beta q k^T))``.

    Subclasses hold ``kernel`` (an ``attnflow.kernels.AbstractKernel``), ``mask`` (an
    ``attnflow.masks`` object or ``None``) and ``block`` (query rows per tile); every
    weighting method is implemented here from the kernel.
    """

    kernel: eqx.AbstractVar[_kernels.AbstractKernel]
    mask: eqx.AbstractVar[Any]
    block: eqx.AbstractVar[int | None]

    @property
    def kernel_params(self) -> dict[str, Array]:
        """The kernel's numeric parameters by name."""
        return self.kernel.params()

    @property
    def rows_sum_to_one(self) -> bool:
        return self.kernel.row_stochastic

    @property
    def normalizes_tokens(self) -> bool:
        return self.kernel.normalizes_tokens

    @property
    def attention_kind(self) -> str:
        if self.mask is None:
            return f"kernel {self.kernel.name!r}"
        return f"kernel {self.kernel.name!r} under the mask {self.mask.describe()!r:.60}"

    @property
    def plain_softmax(self) -> bool:
        return type(self.kernel) is _kernels.Softmax and self.mask is None

    def kept_keys(self, x: Float[Array, "n d"], rows: Array | None = None) -> Bool[Array, "r n"]:
        """The mask's ``keep`` (every key without a mask), and ``j <= i`` under a kernel
        that is causal itself (``selective``)."""
        n = x.shape[-2]
        rows = jnp.arange(n) if rows is None else jnp.asarray(rows)
        cols = jnp.arange(n)
        keep = (
            jnp.ones((rows.shape[0], n), dtype=bool)
            if self.mask is None
            else self.mask.keep(rows, cols)
        )
        if self.kernel.causal:
            keep = keep & (cols[None, :] <= rows[:, None])
        return keep

    @property
    def bilinear_logits(self) -> bool:
        """The kernel's fact (``AbstractKernel.bilinear_logits``: it weighs the logits of
        the queries and keys themselves), and no mask that turns them by position."""
        return self.kernel.bilinear_logits and not self.positional

    @property
    def positional(self) -> bool:
        """The mask's fact (``AbstractMask.positional``: ALiBi, RoPE)."""
        return self.mask is not None and bool(self.mask.positional)

    def prepare_tokens(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.kernel.prepare_tokens(x)

    def logits_qk(self, q: Array, k: Array) -> Array:
        """The pre-kernel logits ``beta <q_i, k_j>`` of the prepared (and, under RoPE,
        turned) queries and keys, unmasked and without a mask's bias."""
        return _kernels.logits(*_prepared(self.kernel, self.mask, q, k), self.beta)

    def _masked_logits(self, q: Array, k: Array) -> Array:
        L = self.logits_qk(q, k)
        return L if self.mask is None else self.mask.apply(L)

    def weights(self, q: Array, k: Array) -> Array:
        return self.kernel.weights(self._masked_logits(q, k))

    def log_bound(self, q: Array, k: Array) -> Array:
        """``log(beta max_i |q_i| max_j |k_j|)`` enlarged by the kernel's gain: a bound of
        the log of what the kernel exponentiates (``AbstractKernel.log_bound``)."""
        return self.kernel.log_bound(q, k, self.beta)

    def weigh(self, q: Array, k: Array, values: Array) -> Array:
        """``P(q, k) @ values``, tiled for large n (see ``block``)."""
        return _kernels.attend_with(
            self.kernel, q, k, self.beta, values, block=self.block, mask=self.mask
        )

    @property
    def rowwise(self) -> bool:
        return self.kernel.rowwise

    def attention_rows(self, q: Array, k: Array, rows: Array) -> tuple[Array, Array, Any]:
        """The rows ``rows`` alone for a row-wise kernel (``O(len(rows) m)`` memory; the
        mask's kept logits returned beside the logits, which carry the mask's bias); the
        full matrices otherwise."""
        if not self.kernel.rowwise:
            L = self._masked_logits(q, k)
            return self.kernel.weights(L)[rows], L[rows], None
        q, k = _prepared(self.kernel, self.mask, q, k)
        L = _kernels.logits(q[rows], k, self.beta)
        if self.mask is None:
            return self.kernel.weights(L), L, None
        cols = jnp.arange(k.shape[0])
        L = self.mask.add_bias(L, rows, cols)
        keep = self.mask.keep(rows, cols)
        return self.kernel.weights(jnp.where(keep, L, -jnp.inf)), L, keep

    def attention_argmax(self, x: Float[Array, "n d"], P: Array) -> Array:
        return self.kernel.argmax(self._masked_logits(*self.queries_keys(x)), P)

    def attention_log_mass(self, x: Float[Array, "n d"], P: Array, keep: Array) -> Array:
        exact = self.kernel.log_mass(self._masked_logits(*self.queries_keys(x)), keep)
        return super().attention_log_mass(x, P, keep) if exact is None else exact


def saved_kernel_params(arrays: dict[str, Any]) -> dict[str, Any]:
    """The kernel parameters among a saved model's arrays (``arrays()`` writes them as
    ``"kernel_params.<name>"``), by name, for ``from_saved``."""
    prefix = "kernel_params."
    return {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}
