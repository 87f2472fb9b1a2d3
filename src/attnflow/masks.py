"""``attnflow.masks``: which logits a query row keeps (``Causal()``, ``Window(w)``, and
``AbstractMask`` for masks of one's own). See ``attnflow.dynamics.kernels.masks``."""

from .dynamics.kernels.masks import (
    AbstractMask,
    Causal,
    Window,
    apply_mask,
    check_mask,
    mask_keep,
)

__all__ = ["AbstractMask", "Causal", "Window", "check_mask", "mask_keep", "apply_mask"]
