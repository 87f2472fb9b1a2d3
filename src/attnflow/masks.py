"""``attnflow.masks``: which logits a query row keeps and how positions enter them
(``Causal()``, ``Window(w)``, ``ALiBi(slopes)``, ``RoPE(base)``, ``SinkWindow(sinks, w)``,
and ``AbstractMask`` for masks of one's own). See ``attnflow.dynamics.kernels.masks``."""

from .dynamics.kernels.masks import (
    AbstractMask,
    ALiBi,
    Causal,
    RoPE,
    SinkWindow,
    Window,
    alibi_slopes,
    apply_mask,
    check_mask,
    mask_keep,
)

__all__ = [
    "AbstractMask",
    "Causal",
    "Window",
    "ALiBi",
    "RoPE",
    "SinkWindow",
    "alibi_slopes",
    "check_mask",
    "mask_keep",
    "apply_mask",
]
