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
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import kernels as _kernels

__all__ = ["AbstractModel", "AbstractAttentionSystem", "saved_kernel_params"]


class AbstractModel(eqx.Module):
    """A vector field on tokens ``x`` ``(n, d)``: ``dx/dt = vector_field(x)``.

    Subclasses implement ``d``, ``dtype``, ``vector_field`` and ``describe``; the rest has
    defaults. ``propagator`` is ``None`` unless the model supports the rescaled frame.
    """

    propagator: eqx.AbstractVar[Any]

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

    Subclasses implement the query/key maps, the weighting of values by the kernel
    (``weigh``, which may tile), the attention matrix and logits from queries and keys,
    the overflow bound, and the linear ``value_map``. ``kernel`` names the kernel and
    ``kernel_params`` holds its numeric parameters.
    """

    kernel: eqx.AbstractVar[str]
    kernel_params: eqx.AbstractVar[dict]
    beta: eqx.AbstractVar[Array]

    @abc.abstractmethod
    def query_key_maps(self) -> tuple[Array, Array]:
        """``(Q, K)``: queries ``x Q^T`` and keys ``x K^T`` of tokens ``x``."""

    @abc.abstractmethod
    def weigh(self, q: Array, k: Array, values: Array) -> Array:
        """``P(q, k) @ values``: attention weights of queries ``q`` on keys ``k`` applied
        to ``values`` ``(n, c)``, without forming ``P`` when ``n`` is large."""

    @abc.abstractmethod
    def weights(self, q: Array, k: Array) -> Array:
        """The attention matrix ``P(q, k)`` ``(n, n)``."""

    @abc.abstractmethod
    def logits_qk(self, q: Array, k: Array) -> Array:
        """The pre-kernel logits of queries ``q`` and keys ``k``, ``(n, n)``."""

    @abc.abstractmethod
    def log_bound(self, q: Array, k: Array) -> Array:
        """``log`` of a bound of what the kernel exponentiates (``+inf``, never NaN)."""

    @abc.abstractmethod
    def value_map(self, u: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The linear map of the averaged values: ``u V^T`` for one head."""

    # ------------------------------------------------------------- derived, final
    def queries_keys(self, x: Float[Array, "n d"]) -> tuple[Array, Array]:
        """Queries and keys of tokens ``x`` (original frame); for a kernel with a token
        normalisation (``prenorm``) of the normalised tokens."""
        Q, K = self.query_key_maps()
        x = _kernels.prepare_tokens(self.kernel, x)
        return x @ Q.T, x @ K.T

    def logits(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        """The pre-kernel logits of tokens ``x`` (original frame)."""
        return self.logits_qk(*self.queries_keys(x))

    def attention(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        """The attention matrix ``P`` of tokens ``x`` (original frame)."""
        return self.weights(*self.queries_keys(x))

    def attend(self, x: Float[Array, "n d"], values: Array) -> Array:
        """``P(x) @ values`` for tokens ``x`` (original frame)."""
        return self.weigh(*self.queries_keys(x), values)

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        return self.log_bound(*self.queries_keys(x))

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.value_map(self.attend(x, x))

    def layer(self, x: Float[Array, "n d"], dt: Any) -> Float[Array, "n d"]:
        """``x + value_map(dt P x)``: the step scales the averaged values before the
        value map (the order of the discrete transformer's arithmetic)."""
        return x + self.value_map(dt * self.attend(x, x))


def saved_kernel_params(arrays: dict[str, Any]) -> dict[str, Any]:
    """The kernel parameters among a saved model's arrays (``arrays()`` writes them as
    ``"kernel_params.<name>"``), by name, for ``from_saved``."""
    prefix = "kernel_params."
    return {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}
