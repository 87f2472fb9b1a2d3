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
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .base import AbstractAttentionSystem, AbstractModel

__all__ = [
    "AbstractFrame",
    "Original",
    "Rescaled",
    "Unskipped",
    "Sphere",
    "normalize_rows",
    "make_frame",
    "FRAMES",
    "LAYERNORMS",
    "NGPT_ALPHA",
    "AbstractTime",
    "Continuous",
    "Layers",
]

FRAMES = ("rescaled", "original", "sphere")
# Layer-norm placements of the discrete sphere frame (``simulate(..., layernorm=...)``).
LAYERNORMS = ("post", "pre", "peri", "ngpt")
# The step multiplier of the nGPT-style update (Karagodin et al.'s simuformer: 0.2).
NGPT_ALPHA = 0.2


# ------------------------------------------------------------------------- frames
class AbstractFrame(eqx.Module):
    """The state a solver integrates, its rate of change and one layer of it.

    ``scale`` maps the state to the tokens at the current time and ``factor`` multiplies
    the averaged values; the time discretisation supplies both (``None`` in the original
    frame, where the state is the tokens)."""

    model: eqx.AbstractVar[AbstractModel]
    name: ClassVar[str]
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

    @property
    @abc.abstractmethod
    def coords(self) -> str:
        """``"standard"`` (the state is tokens of this frame) or ``"modal"``."""

    @abc.abstractmethod
    def initial_state(self, x0: Array) -> Array:
        """The state at ``t = 0`` from tokens ``x0`` (the frames coincide there)."""

    @abc.abstractmethod
    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        """``dy/dt`` at the state ``y``."""

    @abc.abstractmethod
    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        """The state one layer of step ``dt`` later."""

    @abc.abstractmethod
    def log_bound(self, y: Array, scale: Any) -> Array:
        """Overflow guard: ``log`` of a bound of what the model exponentiates at ``y``."""


class Original(AbstractFrame):
    """The tokens themselves: the model's own field and layer; any model."""

    model: AbstractModel
    name: ClassVar[str] = "original"

    @property
    def coords(self) -> str:
        return "standard"

    def initial_state(self, x0: Array) -> Array:
        return x0

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        del scale, factor
        return self.model.vector_field(y)

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        del scale, factor
        return self.model.layer(y, dt)

    def log_bound(self, y: Array, scale: Any) -> Array:
        del scale
        return self.model.log_logit_bound(y)


class Rescaled(AbstractFrame):
    """``z = e^{-tV} x``: ``dz/dt = (P z - z) V^T`` with ``P`` taken at ``x = e^{tV} z``;
    in standard coordinates or V's real modal coordinates (``w = T^{-1} z``, a
    diagonalisable V). Needs an attention system with one value matrix (a
    ``propagator``).

    Any other model with a ``propagator`` (a rescaling matrix ``W``: multi-head attention,
    a transformer block) takes the generic path, in standard coordinates: from
    ``dx/dt = F(x)`` and ``x = e^{tW} z``, ``dz/dt = e^{-tW} (F(x) - W x)
    = e^{-tW} F(x) - W z``; one layer ``x' = layer(x)`` is ``z' = R^{-(k+1)} x'`` with
    ``R = I + dt W`` and ``R^{-1} = I - dt R^{-1} W``."""

    model: AbstractModel  # pyright: ignore[reportIncompatibleVariableOverride]
    QT: Array | None  # Q T and K T: queries and keys straight from modal coordinates
    KT: Array | None
    _coords: str = eqx.field(static=True)
    generic: bool = eqx.field(static=True)
    name: ClassVar[str] = "rescaled"

    def __init__(self, model: AbstractModel, coords: str | None = None):
        prop = getattr(model, "propagator", None)
        if prop is None:
            raise ValueError(
                f"the rescaled frame z = e^(-tV) x needs an attention system with one "
                f"value matrix V; {type(model).__name__} has none: use frame='original'."
            )
        self.generic = not isinstance(model, AbstractAttentionSystem)
        if self.generic:
            if coords == "modal":
                raise ValueError(
                    f"{type(model).__name__} runs the rescaled frame in standard "
                    f"coordinates only (coords='standard')."
                )
            self.model = model  # pyright: ignore[reportIncompatibleVariableOverride]
            self._coords = "standard"
            self.QT = self.KT = None
            return
        assert isinstance(model, AbstractAttentionSystem)
        if not model.rows_sum_to_one:
            raise ValueError(
                f"{model.attention_kind} is not row-stochastic (its rows need not sum to "
                f"1), and the rescaled frame dz_i/dt = sum_j P_ij V (z_j - z_i) assumes "
                f"they do; use frame='original' with {model.attention_kind}."
            )
        token_prep = model.normalizes_tokens
        if coords is None:
            coords = "modal" if prop.has_modal and not token_prep else "standard"
        if coords == "modal" and token_prep:
            raise ValueError(
                f"{model.attention_kind} normalises the tokens x before Q and K, which "
                f"modal coordinates do not hold: use coords='standard'."
            )
        if coords == "modal" and not prop.has_modal:
            raise ValueError("modal coordinates need a diagonalisable V (propagator eig/eigh).")
        self.model = model  # pyright: ignore[reportIncompatibleVariableOverride]
        self._coords = coords
        if coords == "modal":
            Q, K = model.query_key_maps()
            self.QT = Q @ prop.T
            self.KT = K @ prop.T
        else:
            self.QT = self.KT = None

    @property
    def coords(self) -> str:
        return self._coords

    def initial_state(self, x0: Array) -> Array:
        return self.model.propagator.to_modal(x0) if self._coords == "modal" else x0

    def tokens(self, y: Array, scale: Any) -> Array:
        """The tokens ``x`` that the state ``y`` stands for: in standard coordinates
        ``x = y M^T`` (``scale`` the ``(d, d)`` flow matrix ``M``), in modal coordinates
        their modal coordinates ``T^{-1} x`` (``scale`` the per-mode factors (re, im))."""
        if self._coords == "modal":
            return self.model.propagator.modal_scale(y, *scale)
        return y @ scale.T

    def queries_keys(self, y: Array, scale: Any) -> tuple[Array, Array]:
        """Queries and keys of the tokens ``x`` that the state ``y`` stands for."""
        assert isinstance(self.model, AbstractAttentionSystem)
        x = self.tokens(y, scale)
        if self._coords == "modal":
            assert self.QT is not None and self.KT is not None
            return x @ self.QT.T, x @ self.KT.T
        return self.model.queries_keys(x)

    def _increment(self, y: Array, scale: Any) -> Array:
        assert isinstance(self.model, AbstractAttentionSystem)
        return self.model.weigh(*self.queries_keys(y, scale), y) - y

    def _pull_back(self, u: Array, scale: Array) -> Array:
        """Rows ``u`` mapped by ``scale^{-1}`` (``u scale^{-T}``)."""
        return jnp.linalg.solve(scale, u.T).T

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        if self.generic:  # scale = e^{tW}, factor = W
            return self._pull_back(self.model.vector_field(y @ scale.T), scale) - y @ factor.T
        u = self._increment(y, scale)
        if self._coords == "modal":
            return self.model.propagator.modal_scale(u, *factor)
        return u @ factor.T

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        if self.generic:  # scale = R^k, factor = R^{-1} W
            x = y @ scale.T
            u = y + self._pull_back(self.model.layer(x, dt) - x, scale)  # R^{-k} x^{k+1}
            return u - dt * (u @ factor.T)  # R^{-1} = I - dt R^{-1} W
        u = self._increment(y, scale)
        if self._coords == "modal":
            return y + dt * self.model.propagator.modal_scale(u, *factor)
        return y + (dt * u) @ factor.T

    def log_bound(self, y: Array, scale: Any) -> Array:
        """The model's logit bound, or ``log max |x|`` where larger: the tokens
        ``x = e^{tV} z`` leave the float range before the logits do when attention does
        not read them (Q = 0 or K = 0), and a solve would otherwise stall there on
        ``0 * inf``. A NaN token counts as beyond the range."""
        x = self.tokens(y, scale)
        if self.generic:
            bound = self.model.log_logit_bound(x)
        else:
            assert isinstance(self.model, AbstractAttentionSystem)
            if self._coords == "modal":
                assert self.QT is not None and self.KT is not None
                q, k = x @ self.QT.T, x @ self.KT.T
            else:
                q, k = self.model.queries_keys(x)
            bound = self.model.log_bound(q, k)
        size = jnp.max(jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x)))
        return jnp.maximum(bound, jnp.log(size))


class Unskipped(Original):
    """The tokens, through layers without the skip connection: ``x <- pure_layer(x)``
    (``x_i <- sum_j P_ij V x_j`` for one head); the step ``dt`` only counts layers."""

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

    A zero attention output has ``N(0) = 0``. The tokens of every mode are ``N(state)``
    (``Trajectory.x``); the sphere frame is its own rescaled frame (``traj.z = traj.x``).
    """

    model: AbstractModel
    layernorm: str = eqx.field(static=True)
    name: ClassVar[str] = "sphere"
    tracks_flow: ClassVar[bool] = False

    def __init__(self, model: AbstractModel, layernorm: str = "post"):
        if layernorm not in LAYERNORMS:
            raise ValueError(f"layernorm must be one of {LAYERNORMS}; got {layernorm!r}.")
        self.model = model
        self.layernorm = layernorm

    @property
    def coords(self) -> str:
        return "standard"

    def check_tokens(self, x0: Any) -> None:
        # on the device for a jax.Array (one boolean comes back), else in numpy
        xp = jnp if isinstance(x0, jax.Array) else np
        zero = xp.max(xp.abs(x0), axis=-1) == 0
        if bool(xp.any(zero)):
            where = np.argwhere(np.asarray(zero))[0].tolist()
            raise ValueError(
                f"x0 has a zero token (row {tuple(where)}): the sphere frame puts every "
                f"token on the unit sphere, x_i / |x_i|, which a zero row does not have; "
                f"give nonzero tokens."
            )

    def settings(self) -> dict:
        return {"layernorm": self.layernorm}

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
        del scale, factor
        if self.layernorm == "post":
            return normalize_rows(self.model.layer(y, dt))
        if self.layernorm == "pre":
            return y + dt * self.model.vector_field(normalize_rows(y))
        if self.layernorm == "peri":
            return y + dt * normalize_rows(self.model.vector_field(normalize_rows(y)))
        # ngpt
        return normalize_rows(y + (NGPT_ALPHA * dt) * normalize_rows(self.model.vector_field(y)))

    def log_bound(self, y: Array, scale: Any) -> Array:
        del scale
        return self.model.log_logit_bound(normalize_rows(y))


def make_frame(
    name: str, model: AbstractModel, coords: str | None = None, layernorm: str = "post"
) -> AbstractFrame:
    """The frame called ``name`` (``"rescaled"``, ``"original"`` or ``"sphere"``, with its
    ``layernorm`` placement for layers) for ``model``."""
    if name == "original":
        return Original(model)
    if name == "rescaled":
        return Rescaled(model, coords)
    if name == "sphere":
        return Sphere(model, layernorm)
    raise ValueError(f"frame must be one of {FRAMES}; got {name!r}.")


# ----------------------------------------------------------- time discretisations
class AbstractTime(eqx.Module):
    """How tokens are propagated between the frames, and what multiplies the values."""

    name: ClassVar[str]

    @abc.abstractmethod
    def multipliers(self, prop, ts: Array, sign: int) -> tuple[Array, Array]:
        """Per-mode factors ``(re, im)`` of the flow (``sign=+1``) or its inverse at the
        saved times ``ts``, ``(m, d)`` each."""

    @abc.abstractmethod
    def log_multipliers(self, prop, ts, sign: int) -> tuple[np.ndarray, np.ndarray]:
        """The same factors as ``(log r, theta)`` in float64 (``r e^{i theta}``): the
        overflow-safe form used where the factors leave the float range."""

    @abc.abstractmethod
    def maps64(self, prop, ts, sign: int) -> np.ndarray:
        """The flow (or its inverse) as ``(m, d, d)`` float64 matrices."""


class Continuous(AbstractTime):
    """Continuous time: ``x = e^{tV} z``, values multiplied by V."""

    name: ClassVar[str] = "continuous"

    def scale(self, frame: AbstractFrame, t: Any) -> Any:
        if frame.name == "original" or not frame.tracks_flow:
            return None
        prop = frame.model.propagator
        return prop.exp_multipliers(t) if frame.coords == "modal" else prop(t)

    def factor(self, frame: AbstractFrame) -> Any:
        if frame.name == "original" or not frame.tracks_flow:
            return None
        prop = frame.model.propagator
        if frame.coords == "modal":
            return prop.mu_re, prop.mu_im
        return prop.V

    def field(self, frame: AbstractFrame, t: Any, y: Array) -> Array:
        """``dy/dt`` at time ``t``: the vector field an ODE solver integrates."""
        return frame.field(y, self.scale(frame, t), self.factor(frame))

    def log_bound(self, frame: AbstractFrame, t: Any, y: Array) -> Array:
        return frame.log_bound(y, self.scale(frame, t))

    def multipliers(self, prop, ts: Array, sign: int) -> tuple[Array, Array]:
        return jax.vmap(lambda t: prop.exp_multipliers(sign * t))(ts)

    def log_multipliers(self, prop, ts, sign: int) -> tuple[np.ndarray, np.ndarray]:
        t = sign * np.asarray(ts, np.float64)[:, None]
        return (t * np.asarray(prop.mu_re, np.float64), t * np.asarray(prop.mu_im, np.float64))

    def maps64(self, prop, ts, sign: int) -> np.ndarray:
        """``e^{+-tV}`` at the saved times in float64 (overflow-safe conversions)."""
        from scipy.linalg import expm

        V = np.asarray(prop.V, np.float64)
        return np.stack([expm(sign * float(t) * V) for t in np.asarray(ts)])

    def maps(self, prop, ts: Array) -> Array:
        """``(m, d, d)``: ``e^{tV}`` at the saved times (standard coordinates)."""
        return jax.vmap(prop)(ts)


class Layers(AbstractTime):
    """The discrete transformer: residual layers of step ``dt``, ``x^k = R^k z^k`` with
    ``R = I + dt V``; values multiplied by ``R^{-1} V`` in the rescaled frame.

    The layer loop carries ``R^k`` as a matrix in standard coordinates and computes
    ``R^{-1} V`` from ``R``; in modal coordinates both act mode by mode
    (``power_multipliers`` and ``modal_factor``)."""

    dt: float = eqx.field(static=True)
    name: ClassVar[str] = "layers"

    def modal_factor(self, prop, dtype) -> tuple[Array, Array]:
        """Per-mode ``mu / (1 + dt mu)`` as ``(re, im)``: ``R^{-1} V`` in modal
        coordinates, computed in float64 (exact to rounding) and cast to ``dtype``."""
        mu = np.asarray(prop.mu_re, np.float64) + 1j * np.asarray(prop.mu_im, np.float64)
        c = mu / (1.0 + self.dt * mu)
        re, im = (jnp.asarray(v, dtype) for v in (c.real, c.imag))
        return re, im

    def multipliers(self, prop, ts: Array, sign: int) -> tuple[Array, Array]:
        k = jnp.round(ts / self.dt)
        return jax.vmap(lambda kk: prop.power_multipliers(sign * kk, self.dt))(k)

    def log_multipliers(self, prop, ts, sign: int) -> tuple[np.ndarray, np.ndarray]:
        k = sign * np.round(np.asarray(ts, np.float64) / self.dt)[:, None]
        a = 1.0 + self.dt * np.asarray(prop.mu_re, np.float64)
        b = self.dt * np.asarray(prop.mu_im, np.float64)
        return k * 0.5 * np.log(a * a + b * b), k * np.arctan2(b, a)

    def maps64(self, prop, ts, sign: int) -> np.ndarray:
        """``R^{+-k}`` at the saved times in float64 (overflow-safe conversions)."""
        R = np.eye(prop.d) + self.dt * np.asarray(prop.V, np.float64)
        if sign < 0:
            R = np.linalg.inv(R)
        ks = np.round(np.asarray(ts, np.float64) / self.dt).astype(int)
        return np.stack([np.linalg.matrix_power(R, int(k)) for k in ks])
