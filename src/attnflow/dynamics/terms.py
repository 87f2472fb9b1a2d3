"""Time discretisations and the terms that solvers integrate.

A **time discretisation** says how tokens are propagated between the frames:

``Continuous``   ``x = e^{tV} z``; the values are multiplied by ``V`` (an ODE solver
                 integrates the rate).
``Layers(dt)``   the discrete transformer, one residual layer per step:
                 ``x^k = R^k z^k`` with ``R = I + dt V``; the values are multiplied by
                 ``R^{-1} V``, so ``z^{k+1} = z^k + dt (P z^k - z^k) (R^{-1} V)^T`` is
                 exactly ``x^{k+1} = x^k + dt P x^k V^T`` rescaled.

A **term** is one frame in one time: what the solvers call, and nothing else.

``FlowTerm(frame)``          continuous time: ``field(t, y)`` and ``log_bound(t, y)``
                             (the adaptive solver and its overflow event).
``LayerTerm(frame, dt)``     residual layers; the one place where ``R = I + dt V``, its
                             powers and ``R^{-1} V`` are built.
``EulerTerm(frame, dt)``     forward Euler on the frame's ODE, ``y <- y + dt field(t_k, y)``
                             with ``t_k = k dt`` (the clustering paper's own scheme).

A layer-type term is used through ``setup()`` (its constants, built inside the compiled
loop), ``start(setup)`` (the clock after 0 layers: ``(k, R^k)``), ``step``,
``log_bound`` and ``tick``; ``carries_flow`` says whether ``R^k`` is carried as a matrix
(standard coordinates, a model with one value matrix), which the ``Trajectory`` then uses
to map between the frames. The frame picks what it reads (``layer_scale``,
``layer_factor``), the term computes it.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._host import put
from .._precision import einsum, mm
from .frames import AbstractFrame, normalize_rows, tangent
from .noise import brownian_tree, layer_times

__all__ = [
    "AbstractTime",
    "Continuous",
    "Layers",
    "FlowTerm",
    "LayerTerm",
    "EulerTerm",
    "NoisyTerm",
    "layer_term",
    "safe_matmul",
]


def safe_matmul(a: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``a @ M.T`` in float64 where a zero factor times an infinite one counts 0, and a
    sum of infinite terms of both signs takes the sign of their majority (+inf on a tie):
    never NaN from finite or infinite inputs."""
    # 0 * inf (invalid) is replaced just below; an overflow to inf is the intended
    # representation (the caller warns once, in its own words)
    with np.errstate(invalid="ignore", over="ignore"):
        terms = a[..., None, :] * M  # (..., d_out, d_in)
        zero = (a[..., None, :] == 0) | (M == 0)
        terms = np.where(zero, 0.0, terms)
        out = terms.sum(-1)
    nan = np.isnan(out)
    if nan.any():
        vote = np.sign(np.where(np.isinf(terms), np.sign(terms), 0.0).sum(-1))
        out = np.where(nan, np.where(vote < 0, -np.inf, np.inf), out)
    return out


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

    def maps(self, prop, ts: Array, to_x: Array | None) -> Array:
        """``(m, d, d)`` matrices M with ``x = z @ M.T`` at the saved times (standard
        coordinates): ``to_x``, the flow the layer loop carried, when given."""
        if to_x is None:
            raise ValueError(f"{type(self).__name__} needs the flow the layer loop carried.")
        return to_x

    # ------------------------------------------------- conversion between the frames
    def _modal_to_tokens(self, prop, ts, w, sign: int):
        """Modal rows ``w`` (b, m, n, d) -> tokens after the per-mode factors at each save."""
        re, im = self.multipliers(prop, ts, sign)  # (m, d) each
        scaled = prop.modal_scale(w, re[None, :, None, :], im[None, :, None, :])
        return prop.from_modal(scaled)

    def convert(self, prop, modal: bool, ts: Array, to_x: Array | None, y, to_original: bool):
        """The states ``y`` ``(b, m, n, d)`` saved at ``ts`` in the other frame: the
        rescaled states (in modal coordinates when ``modal``) as tokens when
        ``to_original``, else the tokens as rescaled states ``z``. ``to_x`` is the flow
        the layer loop carried (``None`` in continuous time and in modal coordinates)."""
        if modal:  # rescaled frame, state w = T^{-1} z
            return self._modal_to_tokens(prop, ts, y, +1) if to_original else prop.from_modal(y)
        if to_original:
            return einsum("bmnd,med->bmne", y, self.maps(prop, ts, to_x))
        # original frame -> rescaled
        if prop.has_modal:
            return self._modal_to_tokens(prop, ts, prop.to_modal(y), -1)
        if to_x is None:  # continuous: e^{-tV} directly, no inversion
            return einsum("bmnd,med->bmne", y, jax.vmap(prop)(-ts))
        sol = jnp.linalg.solve(self.maps(prop, ts, to_x)[None], jnp.swapaxes(y, -1, -2))
        return jnp.swapaxes(sol, -1, -2)

    def convert64(
        self, prop, modal: bool, ts, to_x, y: np.ndarray, to_original: bool
    ) -> np.ndarray:
        """``convert`` in float64 and overflow-safe: a zero coordinate times an
        overflowing factor is 0 (not NaN), magnitudes beyond float64 are +-inf. Used only
        for the saves where the fast conversion left the float range."""
        sign = 1 if to_original else -1
        y = np.asarray(y, np.float64)
        if modal and not to_original:
            return safe_matmul(y, np.asarray(prop.T, np.float64))
        if modal or prop.has_modal:
            T = np.asarray(prop.T, np.float64)
            w = y if modal else safe_matmul(y, np.asarray(prop.T_inv, np.float64))
            logr, theta = self.log_multipliers(prop, np.asarray(ts), sign)  # (m, d)
            partner = np.asarray(prop.partner)
            sgn = np.asarray(prop.sign, np.float64)
            logr, theta = logr[None, :, None, :], theta[None, :, None, :]
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                v = np.cos(theta) * w + sgn * np.sin(theta) * w[..., partner]
                scaled = np.sign(v) * np.exp(logr + np.log(np.abs(v)))
            return safe_matmul(scaled, T)
        if to_original and to_x is not None:
            M = np.asarray(to_x, np.float64)
        else:
            M = self.maps64(prop, np.asarray(ts), sign)
        return np.stack([safe_matmul(y[:, j], M[j]) for j in range(y.shape[1])], axis=1)


class Continuous(AbstractTime):
    """Continuous time: ``x = e^{tV} z``, values multiplied by V."""

    name: ClassVar[str] = "continuous"

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

    def maps(self, prop, ts: Array, to_x: Array | None = None) -> Array:
        """``(m, d, d)``: ``e^{tV}`` at the saved times (standard coordinates), or
        ``to_x`` when given."""
        return jax.vmap(prop)(ts) if to_x is None else to_x


class Layers(AbstractTime):
    """The discrete transformer: residual layers of step ``dt``, ``x^k = R^k z^k`` with
    ``R = I + dt V``; values multiplied by ``R^{-1} V`` in the rescaled frame.

    The layer loop carries ``R^k`` as a matrix in standard coordinates and computes
    ``R^{-1} V`` from ``R`` (``LayerTerm``); in modal coordinates both act mode by mode
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

    def flow64(self, V) -> np.ndarray:
        """``R = I + dt V`` in float64."""
        V = np.asarray(V, np.float64)
        return np.eye(V.shape[-1]) + self.dt * V

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
        R = self.flow64(prop.V)
        if sign < 0:
            R = np.linalg.inv(R)
        ks = np.round(np.asarray(ts, np.float64) / self.dt).astype(int)
        return np.stack([np.linalg.matrix_power(R, int(k)) for k in ks])


# -------------------------------------------------------------------------- terms
class FlowTerm(eqx.Module):
    """A frame in continuous time: the vector field an ODE solver integrates and the
    overflow guard of its event."""

    frame: AbstractFrame

    def field(self, t: Any, y: Array) -> Array:
        """``dy/dt`` at time ``t``."""
        fr = self.frame
        return fr.field(y, fr.continuous_scale(t), fr.continuous_factor())

    def log_bound(self, t: Any, y: Array) -> Array:
        """``log`` of a bound of what the model exponentiates at ``(t, y)``."""
        return self.frame.log_bound(y, self.frame.continuous_scale(t))


class _AbstractLayerTerm(eqx.Module):
    """What the layer loop calls: ``setup``, ``start``, ``step``, ``log_bound``,
    ``tick`` (see the module docstring)."""

    frame: eqx.AbstractVar[AbstractFrame]
    dt: eqx.AbstractVar[Array]
    carries_flow: eqx.AbstractVar[bool]

    def setup(self) -> tuple[Array, Any]:
        """``(R, factor)``: the one-layer flow matrix (``I`` when not carried) and the
        value factor; call inside the compiled loop."""
        V = self.frame.model.propagator.V if self.carries_flow else None
        eye = jnp.eye(self.frame.model.d, dtype=self.dt.dtype)
        R = eye if V is None else eye + self.dt * V
        return R, self.factor(R)

    @abc.abstractmethod
    def factor(self, R: Array) -> Any:
        """The value factor of a layer (``R`` as ``setup`` built it)."""

    def start(self, setup: tuple[Array, Any]) -> tuple[Array, Array]:
        """The clock after 0 layers: ``(k, R^k) = (0, I)``."""
        R, _ = setup
        return jnp.zeros((), jnp.int32), jnp.eye(R.shape[-1], dtype=R.dtype)

    def tick(self, setup: tuple[Array, Any], clock: tuple[Array, Array]) -> tuple[Array, Array]:
        """The clock one layer later: ``(k + 1, R R^k)`` (``R^k`` only when carried)."""
        k, Rk = clock
        return k + 1, (mm(setup[0], Rk) if self.carries_flow else Rk)

    @abc.abstractmethod
    def scale(self, clock: tuple[Array, Array]) -> Any:
        """What maps the state to tokens at the clock."""

    @abc.abstractmethod
    def step(self, setup: tuple[Array, Any], clock: tuple[Array, Array], y: Array) -> Array:
        """The state one layer later."""

    def log_bound(self, clock: tuple[Array, Array], y: Array) -> Array:
        """``log`` of a bound of what the model exponentiates at the clock's state."""
        return self.frame.log_bound(y, self.scale(clock))

    def system_start(self, key: Array) -> Any:
        """The state a system carries beside its tokens, from its key (none here; the
        noisy term carries its Brownian path)."""
        del key

    def guarded_step(
        self,
        setup: tuple[Array, Any],
        clock: tuple[Array, Array],
        y: Array,
        limit: float,
        carry: Any = None,
    ) -> tuple[Array, Array, Any]:
        """``(y', ok, carry')``: one layer, or ``y`` unchanged with ``ok`` false when the
        logits at ``y`` would pass ``limit`` (in log) or the new state is not finite;
        ``carry`` is the system's own state (``system_start``)."""
        ok = self.log_bound(clock, y) <= limit
        y_new, carry = self.carry_step(setup, clock, y, carry)
        ok = ok & jnp.all(jnp.isfinite(y_new))
        return jnp.where(ok, y_new, y), ok, carry

    def carry_step(
        self, setup: tuple[Array, Any], clock: tuple[Array, Array], y: Array, carry: Any
    ) -> tuple[Array, Any]:
        """``step`` with the system's own state (unchanged here)."""
        return self.step(setup, clock, y), carry


class LayerTerm(_AbstractLayerTerm):
    """Residual layers of step ``dt`` in a frame (``Layers(dt)``): the frame's ``step``
    with ``R^k`` (a matrix or per-mode powers) and ``R^{-1} V`` as the frame asks.

    ``modal_factor`` is the per-mode ``R^{-1} V`` of a modal frame, computed in float64
    when the term is built (``Layers.modal_factor``); ``None`` otherwise."""

    frame: AbstractFrame
    dt: Array
    modal_factor: Any
    carries_flow: bool = eqx.field(static=True)

    def factor(self, R: Array) -> Any:
        return self.frame.layer_factor(self, R)

    def inverse_factor(self, R: Array, V: Array) -> Array:
        """``R^{-1} V`` (``= V R^{-1}``: they commute)."""
        return jnp.linalg.solve(R, V)

    def power_multipliers(self, prop: Any, k: Array) -> tuple[Array, Array]:
        """Per-mode ``(1 + dt mu)^k`` as ``(re, im)``."""
        return prop.power_multipliers(k, self.dt)

    def scale(self, clock: tuple[Array, Array]) -> Any:
        k, Rk = clock
        return self.frame.layer_scale(self, k, Rk)

    def step(self, setup: tuple[Array, Any], clock: tuple[Array, Array], y: Array) -> Array:
        return self.frame.step(y, self.scale(clock), self.dt, setup[1])


class EulerTerm(_AbstractLayerTerm):
    """Forward Euler of step ``dt`` on the frame's ODE: ``y <- y + dt field(t_k, y)``
    with the continuous-time scale at ``t_k = k dt``; no flow matrix is carried."""

    frame: AbstractFrame
    dt: Array
    carries_flow: bool = eqx.field(static=True, default=False)

    def factor(self, R: Array) -> Any:
        del R
        return self.frame.continuous_factor()

    def scale(self, clock: tuple[Array, Array]) -> Any:
        k, _ = clock
        return self.frame.continuous_scale(jnp.asarray(k, self.dt.dtype) * self.dt)

    def step(self, setup: tuple[Array, Any], clock: tuple[Array, Array], y: Array) -> Array:
        return y + self.dt * self.frame.field(y, self.scale(clock), setup[1])


class NoisyTerm(_AbstractLayerTerm):
    """A layer-type term of the sphere frame driven by a noise object
    (``attnflow.dynamics.noise``): each system carries its key and ``B(t_k)``, the
    standard Brownian motion at the current layer time, and a step reads
    ``dB = B(t_{k+1}) - B(t_k)`` (one descent of the tree per step).

    ``ode=False`` (``LayerSolver``): the stochastic post-layer-norm layer
    ``noise.layer(model, x, dt, dB)``. ``ode=True`` (``EulerMaruyamaSolver``): one
    Euler-Maruyama step of the Ito SDE on the free state ``y`` (tokens ``x = N(y)``),
    ``y <- y + dt (field(y) - |y| c x) + |y| Proj_x(kick(x, dB))``, the field the
    sphere frame's ``|y| Proj_x F(x)``; then ``N(y_{k+1})`` is the Euler-Maruyama step of
    the tokens projected back to the sphere."""

    frame: AbstractFrame
    dt: Array
    base: Any  # the deterministic LayerTerm or EulerTerm of ``frame``, step ``dt``
    noise: Any = eqx.field(static=True)  # the noise's template(): strength 1, seed 0
    level: Array  # the noise's strength (sigma, D): a new value is not a new program
    t1: Array
    n_layers: Array
    tol: Array
    shape: tuple[int, ...] = eqx.field(static=True)
    ode: bool = eqx.field(static=True)
    carries_flow: bool = eqx.field(static=True)

    def setup(self) -> tuple[Array, Any]:
        return self.base.setup()

    def factor(self, R: Array) -> Any:
        return self.base.factor(R)

    def scale(self, clock: tuple[Array, Array]) -> Any:
        return self.base.scale(clock)

    def step(self, setup: tuple[Array, Any], clock: tuple[Array, Array], y: Array) -> Array:
        raise TypeError("a noisy step reads the system's Brownian path: call carry_step")

    def system_start(self, key: Array) -> Any:
        return key, jnp.zeros(self.shape, self.t1.dtype)

    def carry_step(
        self, setup: tuple[Array, Any], clock: tuple[Array, Array], y: Array, carry: Any
    ) -> tuple[Array, Any]:
        key, B_k = carry
        k = clock[0]
        path = brownian_tree(key, self.t1, self.tol, self.shape)
        B_next = path.evaluate(layer_times(k + 1, self.n_layers, self.t1))
        dB = B_next - B_k
        model = self.frame.model
        noise = self.noise.with_strength(self.level)
        if not self.ode:
            return noise.layer(model, y, self.dt, dB), (key, B_next)
        r = jnp.linalg.norm(y, axis=-1, keepdims=True)
        x = normalize_rows(y)
        drift = self.frame.field(y, None, None) - r * noise.ito(model, x) * x
        kick = r * tangent(x, noise.kick(model, x, dB))
        return y + self.dt * drift + kick, (key, B_next)


def layer_term(frame: AbstractFrame, dt: float, dtype: Any, *, ode: bool = False) -> Any:
    """The layer-type term of ``frame`` with step ``dt`` in ``dtype``: ``EulerTerm`` with
    ``ode`` (``method="euler-ode"``), else ``LayerTerm``. Works for a frame whose leaves
    are stacked (one model per system): the per-mode factors broadcast over the stack."""
    dt_a = put(dt, dtype)
    if ode:
        return EulerTerm(frame=frame, dt=dt_a)
    prop = frame.model.propagator
    modal = Layers(dt).modal_factor(prop, dtype) if frame.modal else None
    carries = frame.tracks_flow and not frame.modal and prop is not None
    return LayerTerm(frame=frame, dt=dt_a, modal_factor=modal, carries_flow=carries)
