"""Field backends the engine chooses from declared facts: the exact O(n K) field of a
rotation-invariant head on the circle (``circle``); every other head keeps the model's
own dense or tiled field (``attnflow.kernels.attend``)."""

from .circle import CircleAttention, choose_field, circle_modes

__all__ = ["CircleAttention", "choose_field", "circle_modes"]
