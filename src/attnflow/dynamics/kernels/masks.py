"""Masks: which logits a query row keeps. A dropped logit is ``-inf`` before the kernel
(weight 0 under every kernel that takes a mask).

``AbstractMask`` is an equinox module with ``keep(rows, cols)`` (boolean, for query rows
``rows`` and key columns ``cols``, token indices) and ``describe()`` (the saved form).
Every mask here keeps the diagonal, so no row is empty. ``check_mask`` accepts the
objects and the older spellings (``"causal"``, ``("window", w)``); room is left for
additive positional biases (a mask with ``bias(rows, cols)``).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool

__all__ = ["AbstractMask", "Causal", "Window", "check_mask", "mask_keep", "apply_mask"]


class AbstractMask(eqx.Module):
    """What a mask subclasses: ``keep(rows, cols)`` and ``describe()``."""

    name: ClassVar[str]

    @abc.abstractmethod
    def keep(self, rows: Array, cols: Array) -> Bool[Array, "r m"]:
        """Which logits of query rows ``rows`` on key columns ``cols`` are kept."""

    @abc.abstractmethod
    def describe(self) -> list:
        """The saved form (JSON-ready), read back by ``check_mask``."""

    def apply(self, L: Array, row0: Any = 0) -> Array:
        """Logits ``L`` ``(r, m)`` of query rows ``row0 ..`` with the dropped entries
        ``-inf``."""
        keep = self.keep(row0 + jnp.arange(L.shape[-2]), jnp.arange(L.shape[-1]))
        return jnp.where(keep, L, -jnp.inf)


class Causal(AbstractMask):
    """``P_ij = 0`` for ``j > i``: token ``i`` sees itself and the tokens before it."""

    name: ClassVar[str] = "causal"

    def keep(self, rows: Array, cols: Array) -> Array:
        return cols[None, :] <= rows[:, None]

    def describe(self) -> list:
        return ["causal"]


class Window(AbstractMask):
    """``P_ij = 0`` unless ``|i - j| <= w`` (a whole number ``w >= 0``)."""

    w: int = eqx.field(static=True)
    name: ClassVar[str] = "window"

    def __init__(self, w: int):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)) or w < 0:
            raise ValueError(
                f"mask=('window', w) needs a whole number w >= 0 (the largest |i - j| "
                f"attended); got w = {w!r}."
            )
        self.w = int(w)

    def keep(self, rows: Array, cols: Array) -> Array:
        return jnp.abs(rows[:, None] - cols[None, :]) <= self.w

    def describe(self) -> list:
        return ["window", self.w]


def check_mask(mask: Any) -> AbstractMask | None:
    """The mask argument of an attention model, checked and normalised to an object.

    ``None`` (every token sees every token), ``"causal"`` or ``Causal()``,
    ``("window", w)`` or ``Window(w)`` (an integer ``w >= 0``), or any ``AbstractMask``.
    ``ValueError`` naming ``mask`` otherwise."""
    if mask is None or isinstance(mask, AbstractMask):
        return mask
    if isinstance(mask, str):
        if mask == "causal":
            return Causal()
    elif isinstance(mask, (tuple, list)) and len(mask) >= 1 and isinstance(mask[0], str):
        if tuple(mask) == ("causal",):
            return Causal()
        if mask[0] == "window" and len(mask) == 2:
            return Window(mask[1])
    raise ValueError(
        f"mask must be None, 'causal' or ('window', w) with an integer w >= 0 (or an "
        f"attnflow.masks object); got {mask!r}."
    )


def mask_keep(mask: Any, rows: Array, cols: Array) -> Array | None:
    """Boolean ``(len(rows), len(cols))``: which logits the mask keeps; ``None`` when it
    keeps all."""
    m = check_mask(mask)
    return None if m is None else m.keep(rows, cols)


def apply_mask(L: Array, mask: Any, row0: Any = 0) -> Array:
    """Logits ``L`` ``(r, m)`` of query rows ``row0 .. row0 + r - 1`` with the entries the
    mask drops set to ``-inf``. ``mask=None`` returns ``L`` itself, untouched."""
    m = check_mask(mask)
    return L if m is None else m.apply(L, row0)
