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

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .base import AbstractAttentionSystem, AbstractModel

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
    "make_frame",
    "FRAMES",
    "LAYERNORMS",
    "NGPT_ALPHA",
    "MIX_POST_FRACTION",
    "mix_post_layers",
    "frame_maker",
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


def _rescalable(model: AbstractModel) -> Any:
    prop = getattr(model, "propagator", None)
    if prop is None:
        raise ValueError(
            f"the rescaled frame z = e^(-tV) x needs an attention system with one "
            f"value matrix V; {type(model).__name__} has none: use frame='original'."
        )
    return prop


def _row_stochastic(model: AbstractAttentionSystem) -> None:
    if not model.rows_sum_to_one:
        raise ValueError(
            f"{model.attention_kind} is not row-stochastic (its rows need not sum to "
            f"1), and the rescaled frame dz_i/dt = sum_j P_ij V (z_j - z_i) assumes "
            f"they do; use frame='original' with {model.attention_kind}."
        )


class AbstractRescaled(AbstractFrame):
    """``z = e^{-tV} x``: ``dz/dt = (P z - z) V^T`` with ``P`` taken at ``x = e^{tV} z``
    (the theory's frame, which replaces layer normalisation). Concrete: ``Rescaled``
    (standard coordinates), ``ModalRescaled`` (V's real modal coordinates) and
    ``GenericRescaled`` (any other model with a rescaling matrix)."""

    model: eqx.AbstractVar[AbstractModel]
    name: ClassVar[str] = "rescaled"

    def tokens(self, y: Array, scale: Any) -> Array:
        """The tokens ``x`` that the state ``y`` stands for: ``x = y M^T`` (``scale`` the
        ``(d, d)`` flow matrix ``M``)."""
        return y @ scale.T

    def check_layer_step(self, dt: float, dtype: Any) -> None:
        """``I + dt V`` must be invertible in ``dtype`` (the discrete rescaling
        ``z^k = (I + dt V)^{-k} x^k``)."""
        why = singular_layer_step(self.model.propagator.V, dt, dtype)
        if why is not None:
            raise ValueError(
                f"{why}: the discrete rescaling does not exist. Use frame='original' or another dt."
            )

    def continuous_scale(self, t: Any) -> Any:
        return self.model.propagator(t)

    def continuous_factor(self) -> Any:
        return self.model.propagator.V

    def layer_scale(self, term: Any, k: Any, Rk: Any) -> Any:
        del term, k
        return Rk

    def layer_factor(self, term: Any, R: Any) -> Any:
        return term.inverse_factor(R, self.model.propagator.V)


class Rescaled(AbstractRescaled):
    """The rescaled frame of an attention system with one value matrix, whose rows sum
    to one, in standard coordinates: the state is ``z``."""

    model: AbstractAttentionSystem  # pyright: ignore[reportIncompatibleVariableOverride]

    def __init__(self, model: AbstractAttentionSystem):
        _rescalable(model)
        _row_stochastic(model)
        self.model = model  # pyright: ignore[reportIncompatibleVariableOverride]

    def queries_keys(self, y: Array, scale: Any) -> tuple[Array, Array]:
        """Queries and keys of the tokens ``x`` that the state ``y`` stands for."""
        return self.model.queries_keys(self.tokens(y, scale))

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return u @ factor.T

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return y + (dt * u) @ factor.T

    def log_bound(self, y: Array, scale: Any) -> Array:
        """The model's logit bound, or ``log max |x|`` where larger: the tokens
        ``x = e^{tV} z`` leave the float range before the logits do when attention does
        not read them (Q = 0 or K = 0), and a solve would otherwise stall there on
        ``0 * inf``. A NaN token counts as beyond the range."""
        x = self.tokens(y, scale)
        return _with_size(self.model.log_bound(*self.model.queries_keys(x)), x)


class ModalRescaled(AbstractRescaled):
    """The rescaled frame in V's real modal coordinates (a diagonalisable V, tokens not
    normalised before Q and K): the state is ``w = T^{-1} z``, and every power of V acts
    mode by mode, exactly."""

    model: AbstractAttentionSystem  # pyright: ignore[reportIncompatibleVariableOverride]
    QT: Array  # Q T and K T: queries and keys straight from modal coordinates
    KT: Array
    coords: ClassVar[str] = "modal"

    def __init__(self, model: AbstractAttentionSystem):
        prop = _rescalable(model)
        _row_stochastic(model)
        if model.normalizes_tokens:
            raise ValueError(
                f"{model.attention_kind} normalises the tokens x before Q and K, which "
                f"modal coordinates do not hold: use coords='standard'."
            )
        if not prop.has_modal:
            raise ValueError("modal coordinates need a diagonalisable V (propagator eig/eigh).")
        self.model = model  # pyright: ignore[reportIncompatibleVariableOverride]
        Q, K = model.query_key_maps()
        self.QT = Q @ prop.T
        self.KT = K @ prop.T

    def initial_state(self, x0: Array) -> Array:
        return self.model.propagator.to_modal(x0)

    def tokens(self, y: Array, scale: Any) -> Array:
        """The modal coordinates ``T^{-1} x`` of the tokens that the state ``y`` stands
        for (``scale`` the per-mode factors (re, im))."""
        return self.model.propagator.modal_scale(y, *scale)

    def continuous_scale(self, t: Any) -> Any:
        return self.model.propagator.exp_multipliers(t)

    def continuous_factor(self) -> Any:
        prop = self.model.propagator
        return prop.mu_re, prop.mu_im

    def layer_scale(self, term: Any, k: Any, Rk: Any) -> Any:
        del Rk
        return term.power_multipliers(self.model.propagator, k)

    def layer_factor(self, term: Any, R: Any) -> Any:
        del R
        return term.modal_factor

    def queries_keys(self, y: Array, scale: Any) -> tuple[Array, Array]:
        """Queries and keys of the tokens ``x`` that the state ``y`` stands for."""
        x = self.tokens(y, scale)
        return x @ self.QT.T, x @ self.KT.T

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return self.model.propagator.modal_scale(u, *factor)

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return y + dt * self.model.propagator.modal_scale(u, *factor)

    def log_bound(self, y: Array, scale: Any) -> Array:
        """As ``Rescaled.log_bound``, from the modal state."""
        x = self.tokens(y, scale)
        return _with_size(self.model.log_bound(x @ self.QT.T, x @ self.KT.T), x)


class GenericRescaled(AbstractRescaled):
    """The rescaled frame of any other model with a ``propagator`` (a rescaling matrix
    ``W``: multi-head attention, a transformer block), in standard coordinates: from
    ``dx/dt = F(x)`` and ``x = e^{tW} z``, ``dz/dt = e^{-tW} (F(x) - W x)
    = e^{-tW} F(x) - W z``; one layer ``x' = layer(x)`` is ``z' = R^{-(k+1)} x'`` with
    ``R = I + dt W`` and ``R^{-1} = I - dt R^{-1} W``."""

    model: AbstractModel

    def __init__(self, model: AbstractModel):
        _rescalable(model)
        self.model = model

    def _pull_back(self, u: Array, scale: Array) -> Array:
        """Rows ``u`` mapped by ``scale^{-1}`` (``u scale^{-T}``)."""
        return jnp.linalg.solve(scale, u.T).T

    def field(self, y: Array, scale: Any, factor: Any) -> Array:  # scale e^{tW}, factor W
        return self._pull_back(self.model.vector_field(y @ scale.T), scale) - y @ factor.T

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        x = y @ scale.T  # scale R^k, factor R^{-1} W
        u = y + self._pull_back(self.model.layer(x, dt) - x, scale)  # R^{-k} x^{k+1}
        return u - dt * (u @ factor.T)  # R^{-1} = I - dt R^{-1} W

    def log_bound(self, y: Array, scale: Any) -> Array:
        """As ``Rescaled.log_bound``, with the model's own logit bound."""
        x = self.tokens(y, scale)
        return _with_size(self.model.log_logit_bound(x), x)


def _with_size(bound: Array, x: Array) -> Array:
    """``bound``, or ``log max |x|`` where larger (a NaN token counts as beyond range)."""
    size = jnp.max(jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x)))
    return jnp.maximum(bound, jnp.log(size))


def singular_layer_step(V: Any, dt: float, dtype: Any) -> str | None:
    """Why layers of step ``dt`` have no discrete rescaling ``z^k = R^{-k} x^k``:
    ``R = I + dt V`` (each of a stack of ``V``) is singular in ``dtype``; else None."""
    V = np.asarray(V, np.float64)
    R = np.eye(V.shape[-1]) + dt * V
    if np.max(np.linalg.cond(R)) > 1.0 / np.finfo(np.dtype(dtype)).eps:
        return f"I + dt V is singular for dt = {dt} (V has an eigenvalue near {-1 / dt:g})"
    return None


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
        if self.layernorm == "mix":
            out["post_layers"] = self.post_layers
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
        tangent = g - jnp.sum(x * g, axis=-1, keepdims=True) * x
        return jnp.linalg.norm(y, axis=-1, keepdims=True) * tangent

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        del factor
        ln = self.layernorm
        if not self.residual:
            return normalize_rows(self.model.pure_layer(y))
        if ln == "post":
            return normalize_rows(self.model.layer(y, dt))
        if ln == "pre":
            return y + dt * self.model.vector_field(normalize_rows(y))
        if ln == "peri":
            return y + dt * normalize_rows(self.model.vector_field(normalize_rows(y)))
        if ln == "ngpt":
            return normalize_rows(
                y + (NGPT_ALPHA * dt) * normalize_rows(self.model.vector_field(y))
            )
        k = jnp.asarray(0 if scale is None else scale)
        if ln == "mix":
            return jax.lax.cond(
                k < self.post_layers,
                lambda u: normalize_rows(self.model.layer(u, dt)),
                lambda u: u + dt * self.model.vector_field(normalize_rows(u)),
                y,
            )
        # scaled: the normalised stream divided by sqrt(depth), depth k + 1
        depth = (k + 1).astype(y.dtype)
        return y + dt * self.model.vector_field(normalize_rows(y) / jnp.sqrt(depth))

    def log_bound(self, y: Array, scale: Any) -> Array:
        del scale
        return self.model.log_logit_bound(normalize_rows(y))


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
    frame: str, layernorm: str, *, t1: Any, dt: Any, residual: bool
) -> Callable[[AbstractModel], AbstractFrame]:
    """What ``simulate`` builds its frame with, for one model or each of a stack: the
    frame ``frame`` (``Unskipped`` for ``residual=False`` in the original frame), with
    Mix-LN's post-LN layers counted from ``t1 / dt`` (which the caller checks)."""
    post = mix_post_layers(t1, dt) if layernorm == "mix" else 0

    def make(m: AbstractModel) -> AbstractFrame:
        if not residual and frame == "original":
            return Unskipped(m)
        return make_frame(frame, m, layernorm=layernorm, post_layers=post, residual=residual)

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
    prop = _rescalable(model)
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
