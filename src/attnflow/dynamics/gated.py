"""``GatedAttention``: one attention head with a sigmoid gate on its output (gated
attention, Qiu et al. 2025, position G1).

Contract. ``F(x)_i = g(x_i) * sum_j P_ij V x_j`` with ``g(x_i) = sigmoid(Wg x_i + bg)``,
computed from the token itself (the normalised hidden state the queries, keys and values
are made from): element-wise with ``Wg`` of shape ``(d, d)`` (one gate per output
channel), head-wise with ``Wg`` of shape ``(1, d)`` (one scalar per token). The gate acts
after the attention: ``P`` is the head's own (``attention``, ``head()``: the analyses of
the attention matrix serve the gated model unchanged), and ``gate(x)`` reports the gate
values. A gate in ``(0, 1)`` depends on the query alone, so unlike a softmax weight it
does not spread over the keys as their number grows. The gate breaks the rescaling
``z = e^{-tV} x``: the model runs in the original frame and on the sphere only, and no
regime theorem covers it (``predict_regime`` says so, naming the gate).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _checks
from .._precision import mm
from .base import AbstractAttentionSystem, AbstractModel, family_class

__all__ = ["GatedAttention"]


def _checked(name: str, value: Any, ndim: int, hint: str) -> Any:
    """A real, finite array of ``ndim`` dimensions (``_checks.real_array``); traced
    values pass unchecked."""
    if isinstance(value, jax_core.Tracer):
        return value
    return _checks.real_array(name, value, ndim=ndim, shape_hint=hint)


class GatedAttention(AbstractModel):
    """One head ``attention`` whose output is multiplied by ``sigmoid(x Wg^T + bg)``.

    Args:
        attention: a one-head attention model (``Attention``, ``IsotropicAttention`` or
            a family of one's own with ``num_heads == 1``).
        Wg: the gate's weights: ``(d, d)`` element-wise or ``(1, d)`` head-wise.
        bg: the gate's bias, ``(d,)`` or ``(1,)`` (default zeros: every gate 1/2 at 0).

    Examples:
        >>> import numpy as np, attnflow as af
        >>> head = af.Attention(np.eye(2), np.eye(2), np.eye(2))
        >>> gated = af.GatedAttention(head, np.zeros((1, 2)), [2.0])
        >>> round(float(gated.gate(np.ones((3, 2)))[0, 0]), 4)  # sigmoid(2)
        0.8808
    """

    attn: AbstractAttentionSystem
    Wg: Array
    bg: Array
    propagator: None
    family: ClassVar[str] = "GatedAttention"

    def __init__(self, attention: Any, Wg: Any, bg: Any = None):
        if not isinstance(attention, AbstractAttentionSystem) or attention.num_heads != 1:
            raise ValueError(
                f"attention must be a one-head attention model (an attnflow.Attention or "
                f"IsotropicAttention, or a family with num_heads == 1); got "
                f"{type(attention).__name__}. Gates of several heads are not built."
            )
        d = attention.d
        W = _checked("Wg", Wg, 2, f"(({d}, {d}) or (1, {d}))")
        if np.shape(W)[1] != d or np.shape(W)[0] not in (1, d):
            raise ValueError(
                f"Wg must be ({d}, {d}) (element-wise gates) or (1, {d}) (one head-wise gate "
                f"per token); got shape {np.shape(W)}."
            )
        rows = int(np.shape(W)[0])
        b = _checked("bg", np.zeros(rows) if bg is None else bg, 1, f"(({rows},))")
        if np.shape(b) != (rows,):
            raise ValueError(f"bg must have shape ({rows},) to match Wg; got {np.shape(b)}.")
        self.attn = attention
        self.Wg = jnp.asarray(W, attention.dtype)
        self.bg = jnp.asarray(b, attention.dtype)
        self.propagator = None

    @property
    def kind(self) -> str:
        """``"element"`` (one gate per channel) or ``"head"`` (one per token)."""
        return "head" if self.Wg.shape[0] == 1 and self.d > 1 else "element"

    @property
    def d(self) -> int:
        return self.attn.d

    @property
    def dtype(self) -> Any:
        return self.attn.dtype

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def beyond_attention(self) -> str:
        return f"a sigmoid output gate ({self.kind}-wise)"

    def head(self, h: int | None = None) -> AbstractAttentionSystem:
        """The head (the gate does not change its attention matrix)."""
        return self.attn.head(h)

    def value_matrices(self) -> Float[Array, "1 d d"]:
        return self.attn.value_matrices()

    def gate(self, x: Float[Array, "n d"]) -> Float[Array, "n g"]:
        """The gate values ``sigmoid(x Wg^T + bg)``, ``(n, d)`` or ``(n, 1)``."""
        return jax.nn.sigmoid(mm(x, self.Wg.T) + self.bg[None])

    def attention(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        return self.attn.attention(x)

    def logits(self, x: Float[Array, "n d"]) -> Float[Array, "n n"]:
        return self.attn.logits(x)

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.gate(x) * self.attn.vector_field(x)

    def layer(self, x: Float[Array, "n d"], dt: Any) -> Float[Array, "n d"]:
        """``x + g(x) * value_map(dt P x)`` (the head's order of arithmetic, gated)."""
        return x + self.gate(x) * self.attn.value_map(dt * self.attn.attend(x, x))

    def pure_layer(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.gate(x) * self.attn.pure_layer(x)

    def log_logit_bound(self, x: Float[Array, "n d"]) -> Float[Array, ""]:
        return self.attn.log_logit_bound(x)

    def describe(self) -> dict:
        return {"family": "GatedAttention", "kind": self.kind, "attention": self.attn.describe()}

    def arrays(self) -> dict[str, Any]:
        out = {f"attention.{k}": v for k, v in self.attn.arrays().items()}
        out.update(Wg=self.Wg, bg=self.bg)
        return out

    @classmethod
    def from_saved(cls, description: dict, arrays: dict[str, Any]) -> GatedAttention:
        att = description["attention"]
        part = {
            k.removeprefix("attention."): v for k, v in arrays.items() if k.startswith("attention.")
        }
        attention = family_class(att.get("family", "")).from_saved(att, part)
        return cls(attention, arrays["Wg"], arrays["bg"])
