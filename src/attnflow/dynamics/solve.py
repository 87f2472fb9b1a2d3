"""``solve``: the public compiled core. ``jax.jit``, ``jax.vmap`` and ``jax.grad``
(``eqx.filter_grad`` over a model) go through it.

``solve(model, x0, t1, ts=..., frame=..., solver=...)`` integrates one system of tokens
``x0`` ``(n, d)`` and returns a ``Solution`` (an equinox module): the saved times, the
states in the integrated frame (the tokens ``x`` in the original frame, ``z = e^{-tV} x``
in standard coordinates in the rescaled frame), a status code per solve and the solver's
step count. Nothing here converts to numpy, calls the host or checks values: ``simulate``
is the validating host driver (checks, batches, devices, progress, ``Trajectory``);
``solve`` is what a user differentiates or composes with other JAX code.

Solvers are objects: ``AdaptiveSolver(rtol, atol, max_steps, method)`` (diffrax's
``diffeqsolve`` with the overflow event of ``simulate``, differentiated by
``RecursiveCheckpointAdjoint``: exact discretise-then-optimise gradients of the steps
taken, also under ``vmap``) and ``LayerSolver(dt)`` (one residual layer per step, a
``lax.scan``: reverse-mode differentiable; a system whose logits would overflow stops
and keeps its last state, as in ``simulate``).

Gradients with respect to a model's weights flow through the leaves the solve reads: in
the original frame that is the whole model; the rescaled frame also reads the
propagator's precomputed ``e^{tV}`` data, which does not follow a change of ``V``, so
differentiate with respect to ``V`` in the original frame (or with respect to ``Q``,
``K`` and ``x0`` in either).
"""

from __future__ import annotations

from typing import Any, Protocol

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .base import AbstractModel
from .frames import make_frame
from .propagator import fresh
from .status import Status
from .terms import FlowTerm, layer_term

__all__ = ["solve", "Solution", "AdaptiveSolver", "LayerSolver", "adaptive_solve"]

# name -> diffrax solver class (adaptive, with an embedded error estimate); simulate's
# ``method`` names, "adaptive" being Tsit5
SOLVERS = {
    "adaptive": diffrax.Tsit5,
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "dopri8": diffrax.Dopri8,
    "bosh3": diffrax.Bosh3,
    "heun": diffrax.Heun,
}


# Logits are stopped this far (in log) below the largest finite float.
LOG_MARGIN = 4.0
# Step-size control: the classical I controller (diffrax's defaults pcoeff=0, icoeff=1;
# scipy's RK45 does the same). A PI controller (0.3, 0.3) took 9% fewer steps on the
# n = 1024, d = 64 benchmark, but made a batched solve and the same systems solved one
# by one take different steps (accept/reject decisions at an error ratio ~1 flip on
# the rounding of batched matmuls), so it is not the default.
PCOEFF, ICOEFF = 0.0, 1.0


def log_limit(dtype: Any) -> float:
    """The overflow guard's threshold: ``log(finfo(dtype).max) - LOG_MARGIN``."""
    # numpy's log in the dtype itself (float32: 84.72283935546875 - 4), as always
    return float(np.log(np.finfo(np.dtype(dtype)).max)) - LOG_MARGIN


def status_code(result: Any, y_stop: Array) -> Array:
    """The ``Status`` code of a diffrax solve: ok, overflow (the guard's event, finite
    state) or nonfinite (the event, non-finite state), max_steps, failed."""
    finite = jnp.all(jnp.isfinite(y_stop))
    return jnp.where(
        result == diffrax.RESULTS.successful,
        Status.OK.code,
        jnp.where(
            result == diffrax.RESULTS.event_occurred,
            jnp.where(finite, Status.OVERFLOW.code, Status.NONFINITE.code),
            jnp.where(
                result == diffrax.RESULTS.max_steps_reached,
                Status.MAX_STEPS.code,
                Status.FAILED.code,
            ),
        ),
    )


class AdaptiveSolver(eqx.Module):
    """An adaptive Runge-Kutta solve: ``method`` (a name of ``SOLVERS``: ``"tsit5"``,
    ``"dopri5"``, ``"dopri8"``, ``"bosh3"``, ``"heun"``; ``"adaptive"`` is Tsit5) with
    tolerances ``rtol``, ``atol`` and at most ``max_steps`` steps (``simulate``'s
    defaults)."""

    rtol: float = eqx.field(static=True, default=1e-6)
    atol: float = eqx.field(static=True, default=1e-9)
    max_steps: int = eqx.field(static=True, default=100_000)
    method: str = eqx.field(static=True, default="tsit5")

    def __check_init__(self):
        if self.method not in SOLVERS:
            raise ValueError(f"method must be one of {tuple(SOLVERS)}; got {self.method!r}.")
        if not (self.rtol > 0 and self.atol > 0):
            raise ValueError(f"rtol and atol must be > 0; got {self.rtol!r}, {self.atol!r}.")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1; got {self.max_steps!r}.")


class LayerSolver(eqx.Module):
    """Residual layers of step ``dt`` (forward Euler in the original frame; the exactly
    rescaled layers ``z^k = (I + dt V)^{-k} x^k`` in the rescaled frame)."""

    dt: float = eqx.field(static=True, default=0.1)

    def __check_init__(self):
        if not self.dt > 0:
            raise ValueError(f"dt must be > 0; got {self.dt!r}.")


class Solution(eqx.Module):
    """The result of ``solve``.

    Attributes:
        ts: ``(m,)`` the saved times.
        ys: ``(m, n, d)`` the states at ``ts`` in the integrated frame (after a stop,
            the saves past it hold the last state reached for layers, and diffrax's
            fill value ``inf`` for the adaptive solver).
        status: ``()`` int, the code of ``attnflow.Status`` (0 ok).
        t_stop: ``()`` the time where the solve stopped (``t1`` when it succeeded).
        y_stop: ``(n, d)`` the state there.
        num_steps: ``()`` int, the steps (layers) taken.
        num_accepted_steps, num_rejected_steps: ``()`` int, the steps accepted and
            rejected by the step-size controller (layers: all accepted).
    """

    ts: Float[Array, " m"]
    ys: Float[Array, "m n d"]
    status: Int[Array, ""]
    t_stop: Float[Array, ""]
    y_stop: Float[Array, "n d"]
    num_steps: Int[Array, ""]
    num_accepted_steps: Int[Array, ""]
    num_rejected_steps: Int[Array, ""]

    @property
    def ok(self) -> Array:
        """Whether the solve reached ``t1`` (status ok)."""
        return self.status == Status.OK.code


class ContinuousTerm(Protocol):
    """What ``adaptive_solve`` integrates: a field and the overflow guard's log bound
    (``FlowTerm`` for tokens, ``CircleMeanField`` for a density)."""

    def field(self, t: Any, y: Array) -> Array: ...

    def log_bound(self, t: Any, y: Array) -> Array: ...


def adaptive_solve(
    term: ContinuousTerm,
    y0: Array,
    ts: Array,
    t1: Any,
    rtol: Any,
    atol: Any,
    *,
    method: str,
    max_steps: int,
    progress: bool = False,
) -> Solution:
    """One adaptive solve of ``term`` from ``y0`` (``(n, d)``): diffrax's ``diffeqsolve``
    with the overflow event, two save streams (the times ``ts`` and the state where the
    solve stopped), ``throw=False`` and ``RecursiveCheckpointAdjoint``. ``simulate``
    vmaps it over a batch; ``solve`` calls it for one system. ``rtol`` and ``atol`` may
    be traced."""
    limit = log_limit(y0.dtype)

    def overflow(t, y, args, **kwargs):
        return (term.log_bound(t, y) > limit) | ~jnp.all(jnp.isfinite(y))

    # The term is closed over rather than passed as ``args``: diffrax warns about
    # complex leaves in ``args`` (the propagator holds complex eigenvectors).
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: term.field(t, y)),
        SOLVERS[method](),
        t0=jnp.zeros((), ts.dtype),
        t1=t1,
        dt0=None,
        y0=y0,
        saveat=diffrax.SaveAt(subs=(diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True))),
        stepsize_controller=diffrax.PIDController(
            rtol=rtol, atol=atol, pcoeff=PCOEFF, icoeff=ICOEFF
        ),
        event=diffrax.Event(overflow),
        max_steps=max_steps,
        throw=False,
        progress_meter=diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter(),
        adjoint=diffrax.RecursiveCheckpointAdjoint(),
    )
    assert sol.ts is not None and sol.ys is not None  # both save streams were asked for
    (ts_saved, ts_stop), (ys, ys_stop) = sol.ts, sol.ys
    code = status_code(sol.result, ys_stop[0])
    return Solution(
        ts=ts_saved,
        ys=ys,
        status=jnp.asarray(code, jnp.int32),
        t_stop=ts_stop[0],
        y_stop=ys_stop[0],
        num_steps=jnp.asarray(sol.stats["num_steps"], jnp.int32),
        num_accepted_steps=jnp.asarray(sol.stats["num_accepted_steps"], jnp.int32),
        num_rejected_steps=jnp.asarray(sol.stats["num_rejected_steps"], jnp.int32),
    )


def _layers(frame, y0, ts, t1: float, solver: LayerSolver) -> Solution:
    """All layers in one ``lax.scan`` (reverse-mode differentiable), through the term."""
    dt = solver.dt
    n_layers = round(t1 / dt)
    term = layer_term(frame, dt, y0.dtype)
    setup = term.setup()
    limit = log_limit(y0.dtype)

    def body(carry, _):
        y, clock, k, stopped = carry
        y_new, ok = term.guarded_step(setup, clock, y, limit)
        ok = ok & ~stopped
        y = jnp.where(ok, y_new, y)
        return (y, term.tick(setup, clock), k + ok.astype(jnp.int32), stopped | ~ok), y

    init = (y0, term.start(setup), jnp.zeros((), jnp.int32), jnp.zeros((), bool))
    (y_end, _, k_end, stopped), ys = jax.lax.scan(body, init, None, length=n_layers)
    ys = jnp.concatenate([y0[None], ys], axis=0)  # the state after k layers, k = 0..L
    layer_of = jnp.clip(jnp.round(ts / dt).astype(jnp.int32), 0, n_layers)
    code = jnp.where(stopped, Status.OVERFLOW.code, Status.OK.code)
    zero = jnp.zeros((), jnp.int32)
    return Solution(
        ts=ts,
        ys=ys[layer_of],
        status=jnp.asarray(code, jnp.int32),
        t_stop=k_end.astype(y0.dtype) * term.dt,
        y_stop=y_end,
        num_steps=k_end,
        num_accepted_steps=k_end,
        num_rejected_steps=zero,
    )


def solve(
    model: AbstractModel,
    x0: Float[Array, "n d"],
    t1: float,
    *,
    ts: Float[Array, " m"] | None = None,
    frame: str = "rescaled",
    solver: AdaptiveSolver | LayerSolver | None = None,
) -> Solution:
    """Integrate one system of tokens ``x0`` from 0 to ``t1``: jittable, vmappable and
    differentiable.

    Args:
        model: any model (``frame="rescaled"`` needs an attention system whose rows sum
            to one, with a propagator).
        x0: ``(n, d)`` tokens (a JAX array; traced values are fine).
        t1: the final time, a Python number (it fixes the number of layers).
        ts: the saved times ``(m,)``, default ``[t1]``.
        frame: ``"original"`` (the tokens ``x``) or ``"rescaled"`` (``z = e^{-tV} x``,
            standard coordinates).
        solver: an ``AdaptiveSolver`` (default) or a ``LayerSolver``.

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
    """
    if frame not in ("original", "rescaled"):
        raise ValueError(f"frame must be 'original' or 'rescaled'; got {frame!r}.")
    solver = AdaptiveSolver() if solver is None else solver
    if not isinstance(solver, (AdaptiveSolver, LayerSolver)):
        raise ValueError(
            f"solver must be an attnflow.AdaptiveSolver or attnflow.LayerSolver; got "
            f"{type(solver).__name__}."
        )
    model = fresh(model)
    x0 = jnp.asarray(x0, model.dtype)
    if x0.ndim != 2 or x0.shape[-1] != model.d:
        raise ValueError(
            f"x0 must be one system of tokens (n, {model.d}); got shape {x0.shape} (vmap "
            f"solve for a batch)."
        )
    fr = make_frame(frame, model, "standard" if frame == "rescaled" else None)
    ts_a = jnp.asarray([t1] if ts is None else ts, x0.dtype)
    if ts_a.ndim != 1:
        raise ValueError(f"ts must be a 1-d array of times; got shape {ts_a.shape}.")
    y0 = fr.initial_state(x0)
    if isinstance(solver, LayerSolver):
        n = t1 / solver.dt
        if abs(n - round(n)) > 1e-9 * max(1.0, n):
            raise ValueError(f"t1 = {t1} must be a whole number of layers of dt = {solver.dt}.")
        return _layers(fr, y0, ts_a, float(t1), solver)
    return adaptive_solve(
        FlowTerm(fr),
        y0,
        ts_a,
        jnp.asarray(t1, x0.dtype),
        solver.rtol,
        solver.atol,
        method=solver.method,
        max_steps=solver.max_steps,
    )
