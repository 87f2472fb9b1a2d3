"""``PreNorm``: softmax of ``beta <Q x^_i, K x^_j>`` with ``x^ = x / rms(x)`` per token
(``|x^| = sqrt(d)``) before the query and key maps (the dispersion paper's Prop. 3.1):
``|L_ij| <= beta d ||Q^T K||_2``. Rows sum to one; the rescaled frame runs in standard
coordinates (the norm is of ``x``)."""

from __future__ import annotations

from typing import ClassVar

from jaxtyping import Array

from ._base import AbstractKernel
from .softmax import rms_normalize, softmax

__all__ = ["PreNorm"]


class PreNorm(AbstractKernel):
    """Softmax of the logits of RMS-normalised tokens."""

    name: ClassVar[str] = "prenorm"
    summary: ClassVar[str] = "softmax of beta <Q x^_i, K x^_j>, x^ = x / rms(x) per token"
    normalizes_tokens: ClassVar[bool] = True

    def prepare_tokens(self, x: Array) -> Array:
        return rms_normalize(x)

    def weights(self, L: Array) -> Array:
        return softmax(L)
