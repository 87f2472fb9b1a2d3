"""Frames and time discretisations: the one vector field of the code base.

A **frame** says what state the solver holds and how attention acts on it:

``Original``   the tokens ``x``: ``dx/dt = value_map(P(x) x)``.
``Rescaled``   ``z = e^{-tV} x``: ``dz/dt = (P(x) z - z) V^T`` with ``x = e^{tV} z`` (the
               theory's frame, which replaces layer normalisation). In V's real modal
               basis (``coords="modal"``, a diagonalisable V) the state is
               ``w = T^{-1} z`` and every power of V acts mode by mode, exactly.
``Sphere``     tokens on the unit sphere (real layer normalisation):
               ``dx_i/dt = Proj_{x_i}(F(x)_i)``, ``Proj_x y = y - <x, y> x``; as layers,
               the layer-norm placements ``"post"``, ``"pre"``, ``"peri"``, ``"ngpt"``
               (see ``Sphere``).

A **time discretisation** says how tokens are propagated between the frames and what
multiplies the averaged values:

``Continuous``       ``x = e^{tV} z``; the values are multiplied by ``V`` (an ODE solver
                     integrates the rate).
``Layers(dt)``       the discrete transformer, one residual layer per step:
                     ``x^k = R^k z^k`` with ``R = I + dt V``; the values are multiplied by
                     ``R^{-1} V``, so ``z^{k+1} = z^k + dt (P z^k - z^k) (R^{-1} V)^T``
                     is exactly ``x^{k+1} = x^k + dt P x^k V^T`` rescaled.

A frame evaluates ``field(y, scale, factor)`` (the rate an ODE solver integrates) and
``step(y, scale, dt, factor)`` (one layer), where ``scale`` maps the state to tokens at
the current time and ``factor`` multiplies the values; the time discretisation supplies
both. In the original frame both are the model's own (``vector_field``, ``layer``), so
any model family runs there; the rescaled frame needs an attention system with one
value matrix. The adaptive solve, the layer loop and the ``Trajectory`` share these
objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import AbstractAttentionSystem, AbstractModel
from ._base import (
    FRAMES,
    LAYERNORMS,
    MIX_POST_FRACTION,
    NGPT_ALPHA,
    AbstractFrame,
    AbstractTokens,
    Original,
    Unskipped,
    normalize_rows,
    tangent,
)
from .rescaled import (
    AbstractRescaled,
    GenericRescaled,
    ModalRescaled,
    Rescaled,
    rescalable,
    singular_layer_step,
)
from .sphere import Sphere

__all__ = [
    "AbstractFrame",
    "AbstractTokens",
    "Original",
    "AbstractRescaled",
    "Rescaled",
    "ModalRescaled",
    "GenericRescaled",
    "Unskipped",
    "Sphere",
    "normalize_rows",
    "tangent",
    "make_frame",
    "FRAMES",
    "LAYERNORMS",
    "NGPT_ALPHA",
    "MIX_POST_FRACTION",
    "mix_post_layers",
    "frame_maker",
    "singular_layer_step",
]


def mix_post_layers(t1: Any, dt: Any) -> int:
    """Mix-LN's post-LN layers of a run of ``t1 / dt`` layers: the first
    ``MIX_POST_FRACTION`` of them, rounded (0 when ``dt`` is missing or not positive,
    which the caller refuses)."""
    try:
        layers = float(t1) / float(dt)
    except (TypeError, ValueError, ZeroDivisionError):
        return 0  # the arguments' own checks name what is wrong
    return int(round(MIX_POST_FRACTION * round(layers))) if np.isfinite(layers) else 0


def frame_maker(
    frame: str, layernorm: str, *, t1: Any, dt: Any, residual: bool, coords: str | None = None
) -> Callable[[AbstractModel], AbstractFrame]:
    """What ``simulate`` builds its frame with, for one model or each of a stack: the
    frame ``frame`` (``Unskipped`` for ``residual=False`` in the original frame), with
    Mix-LN's post-LN layers counted from ``t1 / dt`` (which the caller checks)."""
    post = mix_post_layers(t1, dt) if layernorm == "mix" else 0

    def make(m: AbstractModel) -> AbstractFrame:
        if not residual and frame == "original":
            return Unskipped(m)
        return make_frame(
            frame, m, coords, layernorm=layernorm, post_layers=post, residual=residual
        )

    return make


def make_frame(
    name: str,
    model: AbstractModel,
    coords: str | None = None,
    layernorm: str = "post",
    *,
    post_layers: int = 0,
    residual: bool = True,
) -> AbstractFrame:
    """The frame called ``name`` for ``model``: ``"original"``, ``"sphere"`` (with its
    ``layernorm`` placement for layers) or ``"rescaled"``, whose class follows from the
    model and ``coords``: ``ModalRescaled`` by default when V is diagonalisable and the
    tokens are not normalised before Q and K (``coords="modal"`` asks for it,
    ``"standard"`` refuses it), ``Rescaled`` otherwise, ``GenericRescaled`` for a model
    that is not one attention system (multi-head attention, a block; standard only)."""
    if coords not in (None, "standard", "modal"):
        raise ValueError(f"coords must be 'standard', 'modal' or None; got {coords!r}.")
    if name == "original":
        return Original(model)
    if name == "sphere":
        return Sphere(model, layernorm, post_layers=post_layers, residual=residual)
    if name != "rescaled":
        raise ValueError(f"frame must be one of {FRAMES}; got {name!r}.")
    prop = rescalable(model)
    if not isinstance(model, AbstractAttentionSystem):
        if coords == "modal":
            raise ValueError(
                f"{type(model).__name__} runs the rescaled frame in standard "
                f"coordinates only (coords='standard')."
            )
        return GenericRescaled(model)
    if coords is None:
        coords = "modal" if prop.has_modal and not model.normalizes_tokens else "standard"
    return ModalRescaled(model) if coords == "modal" else Rescaled(model)
