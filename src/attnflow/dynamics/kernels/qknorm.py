"""``QKNorm``: queries and keys RMS-normalised per token (over the head dimension ``p``:
``q / sqrt(mean(q^2))``, so ``|q| = sqrt(p)``) before the logits, then softmax. The
logits ``beta <q^, k^>`` lie in ``[-beta p, beta p]``: the spread is at most
``2 beta p`` whatever the tokens, so it never overflows."""

from __future__ import annotations

from typing import ClassVar

from jaxtyping import Array

from ._base import AbstractKernel
from .softmax import rms_normalize, softmax

__all__ = ["QKNorm"]


class QKNorm(AbstractKernel):
    """Softmax of ``beta <q^, k^>``, ``q^`` and ``k^`` RMS-normalised per token."""

    name: ClassVar[str] = "qknorm"
    summary: ClassVar[str] = "softmax of beta <q^, k^>, q^ and k^ RMS-normalised per token"

    def prepare(self, q: Array, k: Array) -> tuple[Array, Array]:
        return rms_normalize(q), rms_normalize(k)

    def weights(self, L: Array) -> Array:
        return softmax(L)
