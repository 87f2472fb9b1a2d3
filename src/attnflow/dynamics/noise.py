"""Noise objects: what a stochastic run adds to the deterministic layers on the sphere.

A noise object is a frozen record (its scale and the seed of its Brownian path) that
hands the fixed-step solvers the pieces of one stochastic step; the solvers and their one
layer loop (``attnflow.dynamics.solvers``) do the rest. Two are built:

``Noise(sigma, seed)``     random value matrices, common to all tokens: the stochastic
                           transformer of ``attnflow.dynamics.stochastic`` (its module
                           docstring derives the layers and the SDE).
``TokenNoise(D, seed)``    independent noise on every token, ``sqrt(2 D) dW_i``: the noisy
                           transformer whose mean field gains ``D`` times the
                           Laplace-Beltrami operator (``attnflow.predict_noise_threshold``).

Contract (``AbstractNoise``). With tokens ``x`` on ``S^{d-1}``, ``N(u) = u / |u|`` row by
row, ``Proj_x y = y - <x, y> x``, and ``dB`` the increment over a step of a standard
Brownian motion of shape ``brownian_shape(n, d)``:

``layer(model, x, dt, dB)``
    The stochastic post-layer-norm layer: ``N(x + dt F(x) + kick(model, x, dB))``.
``kick(model, x, dB)``
    The noise a step adds before projection or normalisation (an ``(n, d)`` array).
``ito(model, x)``
    ``c_i`` with the Ito correction ``-c_i x_i dt`` that keeps ``|x_i| = 1``: the SDE on
    the sphere is ``dx_i = Proj_{x_i}(F_i dt + kick_i) - c_i x_i dt``.
``check_model(model)``
    ``ValueError`` naming what the noise cannot drive.

Token noise in these terms: ``kick = sqrt(2 D) dB`` with ``dB`` of shape ``(n, d)``, and
``c = D (d - 1)``: ``sqrt(2 D) Proj_x dW`` read in Stratonovich is Brownian motion on the
sphere with generator ``D Delta_S``, whose Ito form has the drift ``-D (d - 1) x dt``.
The layer ``N(x + dt F + sqrt(2 D) dB)`` has the same limit: expanding
``N(x + u) = x + u - <x,u> x - <x,u> u - |u|^2 x / 2 + 3 <x,u>^2 x / 2 + O(|u|^3)`` with
``E[u u^T] = 2 D I dt`` gives ``(-2 - d + 3) D x dt = -D (d - 1) x dt``.

The path of system ``i`` of a batch is the ``diffrax.VirtualBrownianTree`` of key
``fold_in(PRNGKey(seed), i)`` on ``[0, t1]``, tolerance ``t1 2^-depth`` with
``depth = ceil(log2(t1 / dt)) + 1`` (``tree_depth``), read at the layer times ``t_k``
(``layer_times``); ``solve`` runs system 0.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import math
import numbers
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .. import _checks
from .._precision import mm
from .base import AbstractAttentionSystem, AbstractModel
from .frames import normalize_rows

__all__ = [
    "AbstractNoise",
    "Noise",
    "TokenNoise",
    "MAX_SEED",
    "tree_depth",
    "brownian_tolerance",
    "brownian_tree",
    "record",
    "check_noise",
    "layer_times",
    "value_noise_layer",
]

# seeds are what ``jax.random.PRNGKey`` takes with x64 on or off
MAX_SEED = 2**31 - 1


def tree_depth(t1: float, dt: float) -> int:
    """The depth of the Brownian tree of a run: ``ceil(log2(t1 / dt)) + 1``, so that its
    tolerance ``t1 2^-depth`` is at most ``dt / 2`` (at least 1)."""
    return max(1, math.ceil(math.log2(t1 / dt) - 1e-9) + 1)


def brownian_tolerance(t1: float, dt: float) -> float:
    """The Brownian tree's tolerance ``t1 2^-depth`` (``tree_depth``)."""
    return t1 * 2.0 ** -tree_depth(t1, dt)


def record(noise: AbstractNoise, t1: float, dt: float) -> dict:
    """What a run records of its noise: the noise's own settings and its path."""
    return {
        **noise.describe(),
        "brownian": f"diffrax.VirtualBrownianTree of shape {noise.shape_name}",
        "keys": "fold_in(PRNGKey(seed), system)",
        "depth": tree_depth(t1, dt),
        "tol": brownian_tolerance(t1, dt),
    }


def brownian_tree(key: Array, t1: Array, tol: Array, shape: tuple[int, ...]) -> Any:
    """The standard Brownian motion of ``shape`` on ``[0, t1]`` of ``key`` (dtype of ``t1``)."""
    import diffrax  # on first use: importing attnflow does not import diffrax

    struct = jax.ShapeDtypeStruct(shape, t1.dtype)
    return diffrax.VirtualBrownianTree(jnp.zeros_like(t1), t1, tol, struct, key)


def layer_times(k: Array, n_layers: Array, t1: Array) -> Array:
    """The time ``t_k`` after ``k`` of ``n_layers`` steps on ``[0, t1]``: ``h = t1 /
    n_layers`` after one step, ``t1 (k / n_layers)`` after ``k``, ``t1`` after the last
    (the times of diffrax's ``ConstantStepSize`` with ``dt0 = h``)."""
    h = t1 / n_layers.astype(t1.dtype)
    ratio = k.astype(t1.dtype) / n_layers.astype(t1.dtype)
    t = jnp.where(k == 1, h, t1 * ratio)
    t = jnp.where(k == n_layers, t1, t)
    return jnp.where(k == 0, jnp.zeros_like(t1), t)


def check_noise(noise: Any) -> AbstractNoise | None:
    """``noise`` if it is ``None`` or a noise object, else ``ValueError`` naming it."""
    if noise is not None and not isinstance(noise, AbstractNoise):
        raise ValueError(
            f"noise must be a noise object of attnflow.dynamics (Noise(sigma, seed), "
            f"TokenNoise(D, seed)) or None; got {type(noise).__name__}."
        )
    return noise


def _seed(seed: Any) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise ValueError(
            f"seed must be an integer in [0, {MAX_SEED}]; got {seed!r} ({type(seed).__name__})."
        )
    return _checks.integer("seed", seed, lo=0, hi=MAX_SEED)


class AbstractNoise(abc.ABC):
    """What a fixed-step solver asks of a noise (see the module docstring). Concrete
    noises are frozen dataclasses with a field ``seed``."""

    seed: int  # declared by each concrete noise (a dataclass field there)
    name: ClassVar[str]
    # the field that scales the noise (``"sigma"``, ``"D"``): a traced value in the loop
    strength: ClassVar[str]
    shape_name: ClassVar[str]
    # whether the noise reads the attention average m = P x of an attention head (then
    # the engine keeps the head's own field, which computes it)
    reads_average: ClassVar[bool] = False

    def level(self) -> float:
        """The value of the field named by ``strength``."""
        return float(getattr(self, self.strength))

    def template(self) -> Self:
        """This noise with strength 1 and seed 0: what a compiled loop keeps as its static
        part, so that another strength or seed is another value (``with_strength``, keys
        passed in), not another program."""
        new = self.with_strength(1.0)
        object.__setattr__(new, "seed", 0)
        return new

    def with_strength(self, value: Any) -> Self:
        """A copy whose strength is ``value`` (inside a trace, a 0-d array), unchecked."""
        new = copy.copy(self)
        object.__setattr__(new, self.strength, value)
        return new

    def key(self, system: Any = 0) -> Array:
        """The key of system ``system``'s path (an integer, or an integer array inside
        ``jax.vmap``): ``fold_in(PRNGKey(seed), system)``."""
        return jax.random.fold_in(jax.random.PRNGKey(self.seed), system)

    @abc.abstractmethod
    def brownian_shape(self, n: int, d: int) -> tuple[int, ...]:
        """The shape of the standard Brownian motion that drives ``n`` tokens in ``R^d``."""

    @abc.abstractmethod
    def kick(self, model: Any, x: Array, dB: Array) -> Array:
        """The noise added by a step with Brownian increment ``dB``, ``(n, d)``."""

    @abc.abstractmethod
    def ito(self, model: Any, x: Array) -> Array:
        """``(n, 1)``: the coefficient ``c_i`` of the Ito correction ``-c_i x_i dt``."""

    def layer(self, model: Any, x: Array, dt: Any, dB: Array) -> Array:
        """One stochastic post-layer-norm layer: ``N(x + dt F(x) + kick(model, x, dB))``."""
        return normalize_rows(model.layer(x, dt) + self.kick(model, x, dB))

    def check_model(self, model: Any) -> None:
        """``ValueError`` naming what this noise cannot drive (default: nothing)."""
        del model

    def field_preference(self, field: str) -> str:
        """The sphere's field choice (``"auto"``, ``"circle"``, ``"dense"``) under this
        noise: ``"dense"`` when it reads the head's attention average, which the circle
        field does not form (``field="circle"`` is then a ``ValueError``)."""
        if not self.reads_average:
            return field
        if field == "circle":
            raise ValueError(
                f"field='circle' cannot serve {type(self).__name__}: it reads the head's "
                f"attention average, which the circle field does not form; leave "
                f"field='auto'."
            )
        return "dense"

    def _path(self, t1: Any, shape: tuple[int, ...], dt: Any, system: int, dtype: Any) -> Any:
        t1f = _checks.positive("t1", t1)
        dtf = _checks.positive("dt", dt)
        dtype = jnp.zeros((), dtype).dtype  # None: the default float
        tol = jnp.asarray(brownian_tolerance(t1f, dtf), dtype)
        return brownian_tree(self.key(system), jnp.asarray(t1f, dtype), tol, shape)

    @abc.abstractmethod
    def describe(self) -> dict:
        """What a saved run records of the noise (JSON-ready)."""


@dataclasses.dataclass(frozen=True)
class Noise(AbstractNoise):
    """Random value matrices, common to all tokens: a layer of step ``dt`` has the value
    matrix ``V + sigma dW / dt``, ``dW`` of entries of variance ``dt / d``
    (``attnflow.dynamics.stochastic``).

    Args:
        sigma: the scale; finite, ``>= 0``. ``0`` is the deterministic model.
        seed: the seed of the Brownian path, an integer in ``[0, MAX_SEED]``; system ``i``
            of a batch has the key ``fold_in(PRNGKey(seed), i)``.

    Invalid input raises ``ValueError`` naming the argument.

    Example:
        >>> Noise(0.5, seed=3)
        Noise(sigma=0.5, seed=3)
    """

    sigma: float
    seed: int = 0
    name: ClassVar[str] = "value"
    strength: ClassVar[str] = "sigma"
    shape_name: ClassVar[str] = "(d, d), W = B / sqrt(d)"
    reads_average: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _checks.number("sigma", self.sigma, lo=0.0))
        object.__setattr__(self, "seed", _seed(self.seed))

    def brownian_shape(self, n: int, d: int) -> tuple[int, ...]:
        del n
        return (d, d)

    def path(self, t1: float, d: int, dt: float, *, system: int = 0, dtype: Any = None) -> Any:
        """The standard ``(d, d)`` Brownian motion ``B`` of system ``system`` on
        ``[0, t1]`` for steps ``dt`` (``W = B / sqrt(d)``; see the module docstring).

        Example:
            >>> B = Noise(1.0, seed=0).path(1.0, 3, 0.125)
            >>> B.evaluate(0.0, 0.125).shape
            (3, 3)
        """
        d = _checks.integer("d", d, lo=1)
        return self._path(t1, (d, d), dt, system, dtype)

    def kick(self, model: Any, x: Array, dB: Array) -> Array:
        # sigma dW m_i with W = B / sqrt(d): an (n, d) x (d, d) product
        m = model.attend(x, x)
        return (self.sigma / math.sqrt(x.shape[-1])) * mm(m, dB.T)

    def ito(self, model: Any, x: Array) -> Array:
        d = x.shape[-1]
        m = model.attend(x, x)
        return ((d - 1) / (2 * d) * self.sigma**2) * jnp.sum(m * m, axis=-1, keepdims=True)

    def layer(self, model: Any, x: Array, dt: Any, dB: Array) -> Array:
        # W = B / sqrt(d), as the product with 1 / sqrt(d) (the layers' numbers before)
        return value_noise_layer(model, x, dt, self.sigma, dB * (1.0 / math.sqrt(x.shape[-1])))

    def check_model(self, model: Any) -> None:
        _one_head(model)

    def describe(self) -> dict:
        return {"kind": self.name, "sigma": self.sigma, "seed": self.seed}


@dataclasses.dataclass(frozen=True)
class TokenNoise(AbstractNoise):
    """Independent noise on every token: ``sqrt(2 D) Proj_{x_i} dW_i`` on the sphere, the
    noisy transformer whose mean-field equation gains ``D Delta_S mu`` (see
    ``attnflow.predict_noise_threshold`` for the critical ``D`` of the uniform state).

    Args:
        D: the diffusion coefficient; finite, ``>= 0``. ``0`` is the deterministic model.
        seed: the seed of the Brownian paths, an integer in ``[0, MAX_SEED]``; system
            ``i`` of a batch has the key ``fold_in(PRNGKey(seed), i)`` (one ``(n, d)``
            Brownian motion per system: one independent path per token).

    Any model with a field on the sphere takes it (one head, several, a block).

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> from attnflow.dynamics import TokenNoise
        >>> jax.config.update("jax_enable_x64", True)
        >>> model = af.IsotropicAttention(2, beta=1.0)
        >>> x0 = np.random.default_rng(0).normal(size=(16, 2))
        >>> noise = TokenNoise(0.2, seed=0)
        >>> traj = af.simulate(model, x0, 1.0, frame="sphere", method="euler", dt=0.125,
        ...                    noise=noise)
        >>> recorded = traj.solver["noise"]
        >>> recorded["D"], traj.x.shape
        (0.2, (2, 16, 2))
    """

    D: float
    seed: int = 0
    name: ClassVar[str] = "token"
    strength: ClassVar[str] = "D"
    shape_name: ClassVar[str] = "(n, d), one path per token"

    def __post_init__(self) -> None:
        object.__setattr__(self, "D", _checks.number("D", self.D, lo=0.0))
        object.__setattr__(self, "seed", _seed(self.seed))

    def brownian_shape(self, n: int, d: int) -> tuple[int, ...]:
        return (n, d)

    def path(
        self, t1: float, n: int, d: int, dt: float, *, system: int = 0, dtype: Any = None
    ) -> Any:
        """The standard ``(n, d)`` Brownian motion of system ``system`` on ``[0, t1]`` for
        steps ``dt``: row ``i`` drives token ``i``.

        Example:
            >>> B = TokenNoise(0.1, seed=0).path(1.0, 5, 3, 0.125)
            >>> B.evaluate(0.0, 0.125).shape
            (5, 3)
        """
        n = _checks.integer("n", n, lo=1)
        d = _checks.integer("d", d, lo=1)
        return self._path(t1, (n, d), dt, system, dtype)

    def kick(self, model: Any, x: Array, dB: Array) -> Array:
        del model
        return jnp.sqrt(2.0 * self.D) * dB

    def ito(self, model: Any, x: Array) -> Array:
        del model
        return jnp.full(x.shape[:-1] + (1,), self.D * (x.shape[-1] - 1), x.dtype)

    def describe(self) -> dict:
        return {"kind": self.name, "D": self.D, "seed": self.seed}


def value_noise_layer(model: Any, x: Array, dt: Any, sigma: Any, dW: Array) -> Array:
    """``N(x_i + dt F_i + sigma dW m_i)`` for one head, ``m = model.attend(x, x)`` computed
    once for the field and the noise, ``dW`` the increment of ``W = B / sqrt(d)``."""
    m = model.attend(x, x)
    return normalize_rows(x + model.value_map(dt * m) + sigma * mm(m, dW.T))


def _one_head(model: Any) -> None:
    """``ValueError`` unless ``model`` is one attention head with one value matrix (what
    random value matrices perturb)."""
    if not isinstance(model, AbstractAttentionSystem) or model.num_heads != 1:
        heads = model.num_heads if isinstance(model, AbstractModel) else 0
        parts = [f"{heads} head{'s' if heads != 1 else ''}"]
        if isinstance(model, AbstractModel):
            if heads >= 1 and not model.pure_attention:
                parts.append("a feed-forward term")
            if model.beyond_attention:
                parts.append(model.beyond_attention)
        hint = "; model.head(h) is head h alone" if heads >= 1 else ""
        raise ValueError(
            f"model must be one attention head with a value matrix (attnflow.Attention, "
            f"IsotropicAttention) for Noise, random value matrices V + sigma dW / dt of one "
            f"head; got {type(model).__name__} ({', '.join(parts)}){hint}. TokenNoise "
            f"drives any model."
        )
    if model.value_matrix() is None:
        raise ValueError(
            f"model ({type(model).__name__}) has no value matrix (value_matrix() is "
            f"None): Noise is a random value matrix, V + sigma dW / dt; TokenNoise drives "
            f"any model."
        )
