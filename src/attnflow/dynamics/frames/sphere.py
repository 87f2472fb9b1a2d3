"""Tokens on the unit sphere: the ``Sphere`` frame and its layer-norm placements (a
table of one layer each)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ..base import AbstractModel
from ._base import LAYERNORMS, NGPT_ALPHA, AbstractFrame, normalize_rows, tangent

__all__ = ["Sphere"]


class Sphere(AbstractFrame):
    """Tokens on the unit sphere ``S^{d-1}``: layer normalisation, for any model.

    With ``F`` the model's field (``F(x)_i = sum_j P_ij V x_j`` for one head, any kernel)
    and ``N(u) = u / |u|`` row-wise (``normalize_rows``):

    Continuous time (adaptive solvers, ``euler-ode``):
        ``dx_i/dt = Proj_{x_i}(F(x)_i)``, ``Proj_x y = y - <x, y> x``. The solver holds
        ``y`` with ``x = N(y)`` and integrates ``dy_i/dt = |y_i| Proj_{x_i}(F(x)_i)``.
        This field is orthogonal to ``y_i``, so ``|y_i| = 1`` is conserved exactly by
        the ODE, and whatever the norm, ``N(y)`` solves the sphere ODE exactly (the
        factor ``|y_i|`` undoes the ``1/|y_i|`` of ``d N(y)/dt``). The solver's local
        errors only move ``|y_i|`` off 1 (by about its tolerance), which changes
        nothing: the tokens ``x = N(y)`` are on the sphere to rounding at every step.

    Layers (``method="euler"``), one per step ``dt``, by ``layernorm``:
        ``"post"``  ``x <- N(x + dt F(x))``: normalise after the residual update (the
                    authors' phase-diagram scheme); the state is on the sphere.
        ``"pre"``   ``y <- y + dt F(N(y))``: the attention reads the normalised stream,
                    the residual stream ``y`` is free; the tokens are ``x = N(y)``.
        ``"peri"``  ``y <- y + dt N(F(N(y)))``: input and output of the attention
                    normalised; the tokens are ``x = N(y)``.
        ``"ngpt"``  ``x <- N(x + alpha dt N(F(x)))`` with ``alpha = NGPT_ALPHA = 0.2``
                    (the nGPT-style update of Karagodin et al.'s simuformer); the
                    state is on the sphere.
        ``"mix"``   Mix-LN (Li et al. 2024): ``"post"`` on layers ``k < post_layers``,
                    ``"pre"`` after (``simulate`` takes ``post_layers`` =
                    ``MIX_POST_FRACTION = 0.25`` of its layers, rounded).
        ``"scaled"`` LayerNorm scaling (Sun et al. 2025, "The curse of depth"): layer
                    ``k = 0, 1, ...`` is ``y <- y + dt F(N(y) / sqrt(k + 1))``, pre-LN
                    with the normalised stream divided by the square root of its depth.

    ``residual=False`` (``"post"`` only): ``x <- N(P(x))`` with ``P`` the model's layer
    without the skip connection (``x_i <- N(sum_j P_ij V x_j)`` for one head), the pure
    attention with layer norm of Wu et al. (2024).

    The depth-dependent placements read the layer index ``k`` (``layer_scale``); the
    others ignore it. A zero attention output has ``N(0) = 0``. The tokens of every mode
    are ``N(state)`` (``Trajectory.x``); the sphere frame is its own rescaled frame
    (``traj.z = traj.x``).
    """

    model: AbstractModel
    layernorm: str = eqx.field(static=True)
    post_layers: int = eqx.field(static=True)
    residual: bool = eqx.field(static=True)
    name: ClassVar[str] = "sphere"
    tracks_flow: ClassVar[bool] = False
    on_sphere: ClassVar[bool] = True

    def __init__(
        self,
        model: AbstractModel,
        layernorm: str = "post",
        *,
        post_layers: int = 0,
        residual: bool = True,
    ):
        if layernorm not in LAYERNORMS:
            raise ValueError(f"layernorm must be one of {LAYERNORMS}; got {layernorm!r}.")
        if not residual and layernorm != "post":
            raise ValueError(
                f"residual=False normalises the pure attention layer, x <- N(P(x)) (the "
                f"'post' placement); layernorm={layernorm!r} places the norm around a "
                f"residual update: use layernorm='post' or residual=True."
            )
        self.model = model
        self.layernorm = layernorm
        self.post_layers = int(post_layers)
        self.residual = bool(residual)

    @property
    def post_normalised(self) -> bool:
        return self.residual and _PLACEMENTS[self.layernorm] is _post

    def check_tokens(self, x0: Any) -> None:
        # on the device for a jax.Array (one boolean comes back), else in numpy. A token
        # whose every entry is subnormal counts as zero: XLA flushes subnormal numbers to
        # zero, so its normalisation would be 0 (decided here, where numpy keeps them).
        xp = jnp if isinstance(x0, jax.Array) else np
        dtype = np.dtype(self.model.dtype)  # the working precision, where XLA computes
        zero = xp.max(xp.abs(x0), axis=-1) < np.finfo(dtype).tiny
        if bool(xp.any(zero)):
            where = np.argwhere(np.asarray(zero))[0].tolist()
            raise ValueError(
                f"x0 has a zero or subnormal token (row {tuple(where)}; every entry below "
                f"{np.finfo(dtype).tiny:.3g} in {np.dtype(dtype).name}, which XLA flushes to "
                f"zero): the sphere frame puts every token on the unit sphere, x_i / |x_i|, "
                f"which a zero row does not have; give nonzero tokens (a common scale "
                f"factor changes nothing on the sphere)."
            )

    def settings(self) -> dict:
        out: dict = {"layernorm": self.layernorm}
        out.update({key: getattr(self, key) for key in _PLACEMENT_SETTINGS[self.layernorm]})
        return out

    def layer_scale(self, term: Any, k: Any, Rk: Any) -> Any:
        del term, Rk
        return k  # the layer index, which the depth-dependent placements read

    def initial_state(self, x0: Array) -> Array:
        return normalize_rows(x0)

    def tokens(self, y: Array) -> Array:
        """The tokens on the sphere that the state ``y`` stands for: ``N(y)``."""
        return normalize_rows(y)

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        del scale, factor
        x = normalize_rows(y)
        g = self.model.vector_field(x)
        return jnp.linalg.norm(y, axis=-1, keepdims=True) * tangent(x, g)

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        del factor
        place = _pure_post if not self.residual else _PLACEMENTS[self.layernorm]
        return place(self, y, dt, jnp.asarray(0 if scale is None else scale))

    def log_bound(self, y: Array, scale: Any) -> Array:
        del scale
        return self.model.log_logit_bound(normalize_rows(y))


# ------------------------------------------------------ layer-norm placements
# One layer of the discrete sphere frame per placement: (frame, state y, step dt, layer
# index k) -> the next state. ``N`` is ``normalize_rows``, ``F`` the model's field.
def _post(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    return normalize_rows(fr.model.layer(y, dt))  # x <- N(x + dt F(x))


def _pre(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    return y + dt * fr.model.vector_field(normalize_rows(y))  # y <- y + dt F(N(y))


def _peri(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    return y + dt * normalize_rows(fr.model.vector_field(normalize_rows(y)))


def _ngpt(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    return normalize_rows(y + (NGPT_ALPHA * dt) * normalize_rows(fr.model.vector_field(y)))


def _mix(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    # post-LN on the first ``post_layers`` layers, pre-LN after
    return jax.lax.cond(
        k < fr.post_layers, lambda u: _post(fr, u, dt, k), lambda u: _pre(fr, u, dt, k), y
    )


def _scaled(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    # the normalised stream divided by sqrt(depth), depth k + 1
    depth = (k + 1).astype(y.dtype)
    return y + dt * fr.model.vector_field(normalize_rows(y) / jnp.sqrt(depth))


def _pure_post(fr: Sphere, y: Array, dt: Any, k: Array) -> Array:
    return normalize_rows(fr.model.pure_layer(y))  # residual=False: x <- N(P(x))


_PLACEMENTS: dict[str, Callable[[Sphere, Array, Any, Array], Array]] = {
    "post": _post,
    "pre": _pre,
    "peri": _peri,
    "ngpt": _ngpt,
    "mix": _mix,
    "scaled": _scaled,
}
# the frame's own settings each placement records (``Sphere.settings``)
_PLACEMENT_SETTINGS: dict[str, tuple[str, ...]] = {name: () for name in _PLACEMENTS}
_PLACEMENT_SETTINGS["mix"] = ("post_layers",)
assert tuple(_PLACEMENTS) == LAYERNORMS
