"""A trained attention head with its architecture: ``TrainedHead``, the ``HeadWeights``
of ``attnflow.io.checkpoints`` (same convention: ``Q_h, K_h`` ``(d_h, d)``, ``V_h =
W_O[:, r_h] W_V[r_g]``, ``beta``) plus what the layout adds (``attnflow.io.layouts``):
causality, the key/value group of grouped-query attention, the rotary base, the learned
QK-norm gains and the layers that share the weights.

``TrainedHead.attention()`` is the head as an ``attnflow.Attention``: mask ``Causal()``
for a decoder, ``RoPE(rope_theta, Causal())`` with rotary positions, kernel
``QKNorm(q_norm, k_norm)`` (RMS-normalised queries and keys times the learned gains,
then the rotation, in Qwen3's order; without ``rms_norm_eps``) for a per-head QK norm.
``logit_bound()`` is the bound of ``|logit|`` that a QK norm implies.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxtyping import Float

from .checkpoints import HeadWeights

if TYPE_CHECKING:
    from ..dynamics.model import Attention

__all__ = ["TrainedHead"]


@dataclasses.dataclass(frozen=True, eq=False)
class TrainedHead(HeadWeights):
    """A ``HeadWeights`` with what its architecture adds (``attnflow.io.layouts``).

    Attributes:
        layout: ``"bert"``, ``"albert"``, ``"gpt2"`` or ``"llama"``; model_type: from
            ``config.json``.
        causal: token ``i`` attends to ``j <= i`` only (GPT-2, Llama).
        kv_head, num_kv_heads: the key/value group this query head reads, and their
            number (grouped-query attention when ``num_kv_heads < num_heads``).
        rope_theta: the rotary base (``None``: no rotary positions); rope_scaling: the
            config's ``rope_scaling`` when it changes the frequencies (``attention()``
            then asks for a mask).
        q_norm, k_norm: ``(d_h,)`` learned RMSNorm gains of this head's queries and keys
            (rows ordered as ``Q`` and ``K``), or ``None``; qk_norm_scope: ``"head"``
            (normalised per head, Qwen3) or ``"layer"`` (over all heads at once, OLMo-2);
            qk_norm_width: the widths normalised together, ``(queries, keys)``;
            norm_eps: the RMSNorm epsilon.
        shared_layers: the layers that apply these weights (ALBERT shares them).
    """

    layout: str = "bert"
    model_type: str = ""
    causal: bool = False
    kv_head: int | None = None
    num_kv_heads: int | None = None
    rope_theta: float | None = None
    rope_scaling: dict | None = None
    q_norm: Float[np.ndarray, " d_h"] | None = None
    k_norm: Float[np.ndarray, " d_h"] | None = None
    qk_norm_scope: str | None = None
    qk_norm_width: tuple[int, int] | None = None
    norm_eps: float | None = None
    shared_layers: tuple[int, ...] = ()

    def logit_bound(self) -> float | None:
        """``B`` with ``|beta <q, k>| <= B`` for every pair of tokens, which the QK norm
        implies (``None`` without one): the RMS-normalised slices have norms at most
        ``sqrt(w_q)`` and ``sqrt(w_k)`` (``w = d_h`` per head; the widths normalised
        together over a layer), so ``B = beta sqrt(w_q w_k) max|g_q| max|g_k|`` and the
        logits of a row spread over at most ``2 B`` (rotations change no norm). Per
        head this is ``attnflow.kernels.qknorm_logit_bound``."""
        if self.q_norm is None or self.k_norm is None or self.qk_norm_width is None:
            return None
        wq, wk = self.qk_norm_width
        gq, gk = float(np.abs(self.q_norm).max()), float(np.abs(self.k_norm).max())
        return float(self.beta) * math.sqrt(wq * wk) * gq * gk

    def attention_parts(self, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments ``attention()`` passes to ``attnflow.Attention`` beside
        the triple: ``kwargs`` completed with the layout's ``mask`` (``None``,
        ``Causal()``, ``RoPE(rope_theta, Causal())``) and, for a per-head QK norm, its
        ``kernel``; ``mask`` and ``kernel`` given here replace the layout's. The heads
        study builds each head's attention on its reduced triple from these.

        Raises:
            ValueError: with ``rope_scaling`` (the package's RoPE has the plain
                frequencies: pass ``mask=``), or a QK norm over all heads of a layer
                (not one head's: pass ``kernel=``, e.g. ``kernels.QKNorm(q_norm,
                k_norm)`` as a per-head approximation).
        """
        from ..dynamics.kernels.masks import Causal, RoPE
        from ..dynamics.kernels.qknorm import QKNorm

        if "mask" not in kwargs:
            base = Causal() if self.causal else None
            if self.rope_theta is not None:
                if self.rope_scaling is not None:
                    raise ValueError(
                        f"head {self.layer}.{self.head} has rope_scaling "
                        f"{self.rope_scaling!r}: attnflow.masks.RoPE has the plain "
                        f"frequencies; pass mask= (e.g. RoPE(rope_theta, Causal())) to "
                        f"accept them."
                    )
                base = RoPE(self.rope_theta, base)
            kwargs["mask"] = base
        if "kernel" not in kwargs and self.q_norm is not None:
            if self.qk_norm_scope != "head":
                raise ValueError(
                    f"head {self.layer}.{self.head}: the QK norm of this "
                    f"{self.model_type or self.layout} model normalises all heads of a "
                    f"layer together, which no one head computes; pass kernel= (e.g. "
                    f"attnflow.kernels.QKNorm(head.q_norm, head.k_norm) per head)."
                )
            kwargs["kernel"] = QKNorm(wq=self.q_norm, wk=self.k_norm)
        return kwargs

    def attention(self, **kwargs: Any) -> Attention:
        """The head as ``attnflow.Attention(Q, K, V, beta=beta, rectangular=True,
        mask=..., kernel=...)``; ``mask`` and ``kernel`` given here replace the layout's
        (``attention_parts``).

        Raises:
            ValueError: as ``attention_parts``.
        """
        from ..dynamics.model import Attention

        parts = self.attention_parts(**kwargs)
        return Attention(self.Q, self.K, self.V, beta=self.beta, rectangular=True, **parts)

    def describe(self) -> str:
        """One line: layout, causality, groups, positions, QK norm."""
        bits = [self.model_type or self.layout]
        if self.causal:
            bits.append("causal")
        if self.num_kv_heads is not None:
            bits.append(f"{self.num_kv_heads} key/value heads (query head -> {self.kv_head})")
        if self.rope_theta is not None:
            bits.append(f"RoPE base {self.rope_theta:g}" + (" scaled" if self.rope_scaling else ""))
        if self.q_norm is not None:
            bits.append(f"QK norm per {self.qk_norm_scope}, |logit| <= {self.logit_bound():.4g}")
        if len(self.shared_layers) > 1:
            bits.append(f"shared by layers {list(self.shared_layers)}")
        return ", ".join(bits)
