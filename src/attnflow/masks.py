"""``attnflow.masks``: which logits a query row keeps and how positions enter them
(``Causal()``, ``Window(w)``, ``ALiBi(slopes)``, ``RoPE(base)``, ``SinkWindow(sinks, w)``,
``Graph(adjacency)`` for any directed graph, and ``AbstractMask`` for masks of one's
own; ``quasi_strongly_connected`` and ``random_qsc_graph`` for graphs). See
``attnflow.dynamics.kernels.masks``."""

from .dynamics.kernels.masks import (
    AbstractMask,
    ALiBi,
    Causal,
    Graph,
    RoPE,
    SinkWindow,
    Window,
    alibi_slopes,
    apply_mask,
    check_mask,
    mask_keep,
    quasi_strongly_connected,
    random_qsc_graph,
)

__all__ = [
    "AbstractMask",
    "Causal",
    "Window",
    "ALiBi",
    "RoPE",
    "SinkWindow",
    "Graph",
    "alibi_slopes",
    "quasi_strongly_connected",
    "random_qsc_graph",
    "check_mask",
    "mask_keep",
    "apply_mask",
]
