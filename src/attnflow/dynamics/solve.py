"""``solve``: the public compiled core, and the one compiled path of the package.
``jax.jit``, ``jax.vmap`` and ``jax.grad`` (``eqx.filter_grad`` over a model) go through
it; ``simulate`` is the host driver over the same frame and solver objects.

``solve(model, x0, t1, ts=..., frame=..., solver=...)`` integrates one system of tokens
``x0`` ``(n, d)`` in any frame (``"original"``, ``"rescaled"`` in standard coordinates,
``"sphere"`` with any layer-norm placement) with any solver object
(``AdaptiveSolver``, ``LayerSolver``, ``EulerODESolver``, ``EulerMaruyamaSolver``:
``attnflow.dynamics.solvers``), with or without noise (``attnflow.dynamics.noise``)
and returns a ``Solution`` (an equinox module): the saved times, the states in the
integrated frame (the tokens ``x`` in the original frame, ``z = e^{-tV} x`` in the
rescaled frame, the state whose rows normalised are the tokens on the sphere), a status
code and the solver's step counts. Nothing here converts to numpy or calls the host
(beyond the checks of the door): ``solve`` is what a user differentiates or composes with
other JAX code.

Gradients with respect to every array leaf of the model (Q, K, V, beta, kernel
parameters) and to ``x0`` are exact discretise-then-optimise gradients of the steps taken,
in every frame: the door rebuilds a stale propagator cache from the model's own V
(``propagator.fresh``), and ``e^{tV}`` carries its Frechet derivative.
"""

from __future__ import annotations

import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _checks
from ._inputs import check_ts
from .base import AbstractModel
from .fields import choose_field
from .frames import FRAMES, LAYERNORMS, frame_maker
from .noise import AbstractNoise, check_noise
from .propagator import fresh
from .solvers import (
    ICOEFF,
    PCOEFF,
    SOLVERS,
    AbstractSolver,
    AdaptiveSolver,
    EulerMaruyamaSolver,
    EulerODESolver,
    LayerSolver,
    Solution,
    adaptive_solve,
    log_limit,
    status_code,
)

__all__ = [
    "solve",
    "Solution",
    "AbstractSolver",
    "AdaptiveSolver",
    "LayerSolver",
    "EulerODESolver",
    "EulerMaruyamaSolver",
    "adaptive_solve",
    "log_limit",
    "status_code",
    "SOLVERS",
    "PCOEFF",
    "ICOEFF",
]


def solve(
    model: AbstractModel,
    x0: Float[Array, "n d"],
    t1: float,
    *,
    ts: Float[Array, " m"] | None = None,
    frame: str = "rescaled",
    solver: AbstractSolver | None = None,
    layernorm: str | None = None,
    residual: bool = True,
    field: str = "auto",
    noise: AbstractNoise | None = None,
) -> Solution:
    """Integrate one system of tokens ``x0`` from 0 to ``t1``: jittable, vmappable and
    differentiable.

    Args:
        model: any model (``frame="rescaled"`` needs an attention system whose rows sum
            to one, with a propagator).
        x0: ``(n, d)`` tokens (a JAX array; traced values are fine).
        t1: the final time, a Python number (it fixes the number of layers).
        ts: the saved times ``(m,)``, default ``[t1]``.
        frame: ``"original"`` (the tokens ``x``), ``"rescaled"`` (``z = e^{-tV} x``,
            standard coordinates) or ``"sphere"`` (tokens on the unit sphere; the state
            ``y`` with tokens ``y / |y|``; see ``attnflow.dynamics.frames.Sphere``).
        solver: an ``AdaptiveSolver`` (default), a ``LayerSolver`` (residual layers) or
            an ``EulerODESolver`` (forward Euler on the frame's ODE).
        layernorm: with ``frame="sphere"`` and a ``LayerSolver``, where the layers
            normalise: ``"post"`` (default), ``"pre"``, ``"peri"``, ``"ngpt"``, ``"mix"``,
            ``"scaled"`` (``simulate``'s placements).
        residual: ``False`` drops the skip connection of the layers (``LayerSolver``,
            original or sphere frame).
        field: on the sphere in the plane, ``"auto"`` (the exact O(n K) circle field
            where it applies and is accurate, ``attnflow.dynamics.fields.circle``),
            ``"circle"`` or ``"dense"``; as ``simulate``'s.
        noise: a noise object (``attnflow.dynamics.Noise``, ``TokenNoise``) on the
            sphere, with a ``LayerSolver`` (the stochastic post-layer-norm layers) or an
            ``EulerMaruyamaSolver`` (the SDE); the path is system 0's of the noise's seed
            (``noise.key(0)``), the path ``simulate`` gives the first system of a batch.

    Returns:
        A ``Solution``; its ``status`` is a code of ``attnflow.Status`` (no exception is
        raised inside a compiled solve).

    Examples:
        >>> import jax, jax.numpy as jnp, attnflow as af
        >>> m = af.Attention(jnp.eye(2), jnp.eye(2), -jnp.eye(2))
        >>> x0 = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
        >>> final = jax.jit(lambda x: af.solve(m, x, 1.0, frame="original").ys[-1])
        >>> final(x0).shape
        (3, 2)
        >>> sphere = af.solve(m, x0, 1.0, frame="sphere", solver=af.LayerSolver(0.25))
        >>> sphere.ys.shape
        (1, 3, 2)
        >>> noisy = af.solve(m, x0, 1.0, frame="sphere", solver=af.LayerSolver(0.25),
        ...                  noise=af.dynamics.TokenNoise(0.1, seed=0))
        >>> noisy.ys.shape
        (1, 3, 2)
    """
    _checks.choice("frame", frame, FRAMES)
    solver = AdaptiveSolver() if solver is None else solver
    if not isinstance(solver, AbstractSolver):
        raise ValueError(
            f"solver must be an attnflow solver object (AdaptiveSolver, LayerSolver, "
            f"EulerODESolver, EulerMaruyamaSolver); got {type(solver).__name__}."
        )
    if layernorm is not None:
        _checks.choice("layernorm", layernorm, LAYERNORMS)
        if frame != "sphere" or not isinstance(solver, LayerSolver):
            raise ValueError(
                f"layernorm={layernorm!r} places the layer normalisation of the discrete "
                f"sphere frame: it needs frame='sphere' and a LayerSolver; got "
                f"frame={frame!r}, solver={type(solver).__name__}."
            )
    if not residual and (not isinstance(solver, LayerSolver) or frame == "rescaled"):
        raise ValueError(
            f"residual=False (layers without the skip connection) needs a LayerSolver and "
            f"frame='original' or 'sphere'; got frame={frame!r}, "
            f"solver={type(solver).__name__}."
        )
    t1f = _checks.positive("t1", t1)  # a Python number: it fixes the number of layers
    noise = check_noise(noise)
    model = fresh(model)
    x0 = jnp.asarray(x0, model.dtype)
    if x0.ndim != 2 or x0.shape[-1] != model.d:
        raise ValueError(
            f"x0 must be one system of tokens (n, {model.d}); got shape {x0.shape} (vmap "
            f"solve for a batch)."
        )
    # the rescaled frame in standard coordinates: differentiable in V
    make = frame_maker(
        frame,
        layernorm or "post",
        t1=t1f,
        dt=solver.step_size,
        residual=residual,
        coords="standard",
    )
    fr = make(model)
    if frame == "sphere":
        _checks.choice("field", field, ("auto", "circle", "dense"))
        if noise is not None:
            field = noise.field_preference(field)
        fast, _ = choose_field(model, int(x0.shape[-2]), prefer=field)
        if fast is not model:
            fr = make(fast)
    elif field != "auto":
        _checks.choice("field", field, ("auto", "dense"))
    if ts is not None and not isinstance(ts, jax_core.Tracer):
        # concrete times are checked here, by name; traced ones turn a solve that cannot
        # honour them into Status.FAILED
        solver.plan(t1f, check_ts(ts, t1f))
    elif ts is None:
        solver.plan(t1f, np.array([t1f]))
    ts_a = jnp.asarray([t1f] if ts is None else ts, x0.dtype)
    if ts_a.ndim != 1:
        raise ValueError(f"ts must be a 1-d array of times; got shape {ts_a.shape}.")
    solver.check_frame(fr, model.dtype)
    solver.check_noise(noise, fr)
    return solver.integrate(fr, fr.initial_state(x0), ts_a, t1f, noise=noise)
