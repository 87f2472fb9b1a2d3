"""The frame contract (``AbstractFrame``), the frames whose state is the tokens, and
the normalisation every frame shares. See ``attnflow.dynamics.frames``."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ..base import AbstractModel

__all__ = [
    "AbstractFrame",
    "AbstractTokens",
    "Original",
    "Unskipped",
    "normalize_rows",
    "tangent",
    "FRAMES",
    "LAYERNORMS",
    "NGPT_ALPHA",
    "MIX_POST_FRACTION",
]

FRAMES = ("rescaled", "original", "sphere")
# Layer-norm placements of the discrete sphere frame (``simulate(..., layernorm=...)``).
LAYERNORMS = ("post", "pre", "peri", "ngpt", "mix", "scaled")
# The step multiplier of the nGPT-style update (Karagodin et al.'s simuformer: 0.2).
NGPT_ALPHA = 0.2
# Mix-LN (Li et al. 2024): post-LN on this fraction of the layers (the first), pre-LN after.
MIX_POST_FRACTION = 0.25


# ------------------------------------------------------------------------- frames
class AbstractFrame(eqx.Module):
    """The state a solver integrates, its rate of change and one layer of it.

    ``scale`` maps the state to the tokens at the current time and ``factor`` multiplies
    the averaged values. The time discretisation supplies both, through the frame's
    ``continuous_scale``/``continuous_factor`` (continuous time) and
    ``layer_scale``/``layer_factor`` (layers; the layer term builds ``R = I + dt V``, its
    powers and ``R^{-1} V``, and the frame says which of them it reads). They are ``None``
    in a frame whose state is the tokens. Every concrete frame is final."""

    model: eqx.AbstractVar[AbstractModel]
    name: ClassVar[str]
    # "standard" (the state is tokens of this frame) or "modal" (V's real modal basis)
    coords: ClassVar[str] = "standard"
    # Whether the layer loop carries the flow R^k = (I + dt V)^k for the Trajectory (the
    # map between the original and the rescaled frames); the sphere frame has none.
    tracks_flow: ClassVar[bool] = True
    # What the state is, for the Trajectory (facts, so that nothing below the door
    # compares frame names): the tokens x; the rescaled tokens z in standard
    # coordinates; modal coordinates w = T^{-1} z; a stream whose rows normalised are
    # the tokens on the unit sphere (there z = x).
    state_is_tokens: ClassVar[bool] = False
    state_is_rescaled: ClassVar[bool] = False
    modal: ClassVar[bool] = False
    on_sphere: ClassVar[bool] = False

    @property
    def post_normalised(self) -> bool:
        """Whether a layer is ``x <- N(x + dt F(x))`` on tokens of the unit sphere (the
        layers a noise object perturbs: ``attnflow.dynamics.noise``)."""
        return False

    def check_tokens(self, x0: Any) -> None:
        """Raise ``ValueError`` naming ``x0`` if the frame cannot start from these tokens
        (concrete arrays only); every token is admissible by default."""
        del x0

    def settings(self) -> dict:
        """The frame's own settings, recorded in ``traj.solver`` (none by default)."""
        return {}

    def initial_state(self, x0: Array) -> Array:
        """The state at ``t = 0`` from tokens ``x0`` (the frames coincide there)."""
        return x0

    def check_layer_step(self, dt: float, dtype: Any) -> None:
        """Raise ``ValueError`` naming ``dt`` if layers of step ``dt`` cannot run in this
        frame (in ``dtype``); every step can by default."""
        del dt, dtype

    def continuous_scale(self, t: Any) -> Any:
        """What maps the state to tokens at time ``t`` in continuous time."""
        del t

    def continuous_factor(self) -> Any:
        """What multiplies the averaged values in continuous time."""

    def layer_scale(self, term: Any, k: Any, Rk: Any) -> Any:
        """What maps the state to tokens after ``k`` layers of ``term`` (``Rk`` is the
        flow matrix the loop carries)."""
        del term, k, Rk

    def layer_factor(self, term: Any, R: Any) -> Any:
        """What multiplies the averaged values in one layer of ``term`` (``R = I + dt V``
        as the loop built it)."""
        del term, R

    @abc.abstractmethod
    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        """``dy/dt`` at the state ``y``."""

    @abc.abstractmethod
    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        """The state one layer of step ``dt`` later."""

    @abc.abstractmethod
    def log_bound(self, y: Array, scale: Any) -> Array:
        """Overflow guard: ``log`` of a bound of what the model exponentiates at ``y``."""


class AbstractTokens(AbstractFrame):
    """Frames whose state is the tokens themselves: the model's own field and logit
    bound; any model. Concrete: ``Original`` and ``Unskipped``."""

    model: eqx.AbstractVar[AbstractModel]
    name: ClassVar[str] = "original"
    state_is_tokens: ClassVar[bool] = True

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        del scale, factor
        return self.model.vector_field(y)

    def log_bound(self, y: Array, scale: Any) -> Array:
        del scale
        return self.model.log_logit_bound(y)


class Original(AbstractTokens):
    """The tokens, through the model's own layer."""

    model: AbstractModel

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        del scale, factor
        return self.model.layer(y, dt)


class Unskipped(AbstractTokens):
    """The tokens, through layers without the skip connection: ``x <- pure_layer(x)``
    (``x_i <- sum_j P_ij V x_j`` for one head); the step ``dt`` only counts layers."""

    model: AbstractModel

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        del scale, dt, factor
        return self.model.pure_layer(y)


def normalize_rows(u: Array) -> Array:
    """``u_i / |u_i|`` for every row (the projection ``N`` to the unit sphere); zero rows
    stay 0. Each row is first divided by its largest ``|entry|``, so the norm neither
    underflows nor overflows; a NaN or infinite row gives NaN. The result has norm 1 to
    rounding (a few ulps)."""
    a = jnp.max(jnp.abs(u), axis=-1, keepdims=True)
    zero = a == 0
    v = u / jnp.where(zero, 1.0, a)
    r = jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True))
    return jnp.where(zero, 0.0, v / jnp.where(zero, 1.0, r)).astype(u.dtype)


def tangent(x: Array, v: Array) -> Array:
    """``Proj_{x_i} v_i = v_i - <x_i, v_i> x_i`` row by row: the part of ``v_i`` tangent
    to the sphere at the unit token ``x_i``."""
    return v - jnp.sum(x * v, axis=-1, keepdims=True) * x
