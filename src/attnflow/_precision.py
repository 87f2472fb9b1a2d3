"""Full float32 precision for every matrix product of the fields and the analyses.

XLA may run a float32 matmul at reduced precision when none is asked for: on recent
NVIDIA GPUs JAX's default is TF32 (a 10-bit mantissa, about 1e-3 relative error in a
logit), enough to move the clustering threshold and the regime labels. Every product
attnflow computes in JAX on a field's path (logits, ``P @ V``, the value map, the query
and key maps, the flow ``e^{tV}``) goes through ``mm`` or ``einsum`` here, which ask for
``jax.lax.Precision.HIGHEST``: visible in a traced program as
``precision=(Precision.HIGHEST, Precision.HIGHEST)`` on each ``dot_general``. On a CPU
float32 products are exact-to-rounding anyway (the request moves a number by at most a
few float32 roundings: a different blocking of the sum), and float64 is unaffected.

``highest()`` is the same request for code traced inside a block (``with highest():``),
for products written by other modules.

Private: below every layer, imports no attnflow module.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["HIGHEST", "mm", "einsum", "highest"]

HIGHEST = jax.lax.Precision.HIGHEST


def mm(a: Any, b: Any) -> Any:
    """``a @ b`` (``jnp.matmul``'s broadcasting) at full precision."""
    return jnp.matmul(a, b, precision=HIGHEST)


def einsum(subscripts: str, *operands: Any) -> Any:
    """``jnp.einsum`` at full precision."""
    return jnp.einsum(subscripts, *operands, precision=HIGHEST)


def highest() -> Any:
    """A context in which every matmul traced runs at full precision
    (``jax.default_matmul_precision("highest")``)."""
    return jax.default_matmul_precision("highest")
