"""Integrate the particle system: the validating host driver (``solve`` is the compiled
core beside it; the two share the solver table, the status mapping and the guard).

``simulate`` validates its input in Python, then runs one compiled solve for the whole
batch: ``jax.vmap`` of ``diffrax.diffeqsolve`` for the adaptive methods (every system
chooses its own steps), or a fixed-step loop for the discrete transformer
(``method="euler"``, one step per layer).

Failures never raise inside the solve. Each system gets a status code:

``ok``         reached ``t1``.
``overflow``   the logits were about to leave the floating-point range (the bound
               ``beta max|Q x| max|K x|`` passed ``finfo.max * e^-4``); in the rescaled
               frame they grow like ``e^{2 Re(lambda_max) t}``. Use x64 or a smaller t1.
``max_steps``  the adaptive solver used ``max_steps`` steps before ``t1``.
``nonfinite``  a non-finite state appeared (it should not: this is reported, not hidden).
``failed``     any other solver failure.

The states saved before the failure are kept, and the state where the solve stopped is
kept too (see ``Trajectory``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .. import _checks
from . import _devices
from .base import AbstractModel
from .frames import (
    FRAMES,
    LAYERNORMS,
    AbstractFrame,
    AbstractTime,
    Continuous,
    Layers,
    Unskipped,
    make_frame,
)
from .solve import ICOEFF, PCOEFF, SOLVERS, status_code
from .solve import log_limit as _log_limit
from .trajectory import Status, Trajectory

__all__ = ["simulate", "SOLVERS"]

_FIXED = ("euler", "euler-ode")


# --------------------------------------------------------------------------- checks
# diffrax counts steps in 32-bit integers.
MAX_STEPS_LIMIT = 2**31 - 1


def _check_x0(model: AbstractModel, x0) -> np.ndarray | Array:
    shape = f"(n, {model.d}) or (b, n, {model.d})"
    if isinstance(x0, jax_core.Tracer):
        arr = x0
        if arr.ndim not in (2, 3):
            raise ValueError(f"x0 must have shape {shape}; got shape {tuple(arr.shape)}.")
    elif isinstance(x0, jax.Array):
        # used where it is (sharded or not): shapes and dtype read, finiteness checked on
        # the device; only one boolean comes back to the host
        arr = x0
        if arr.ndim not in (2, 3):
            raise ValueError(
                f"x0 must have 2 or 3 dimensions {shape}; got shape {tuple(arr.shape)}."
            )
        if jnp.issubdtype(arr.dtype, jnp.complexfloating):
            raise ValueError("x0 must be real; got a complex array.")
        if arr.dtype == jnp.bool_ or not (
            jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
        ):
            raise ValueError(f"x0 must hold real numbers {shape}; got dtype {arr.dtype}.")
        if any(s < 1 for s in arr.shape):
            raise ValueError(f"x0 must not be empty {shape}; got shape {tuple(arr.shape)}.")
        if not bool(_all_finite(arr)):
            raise ValueError("x0 has non-finite entries (NaN or inf); all entries must be finite.")
    else:
        arr = _checks.real_array("x0", x0, ndim=(2, 3), shape_hint=shape)
        if arr.dtype == np.bool_:
            raise ValueError("x0 must hold real numbers; got a boolean array.")
    if arr.shape[-1] != model.d:
        raise ValueError(
            f"x0 has token dimension {arr.shape[-1]} but the model has d = {model.d}; "
            f"x0 must be {shape}."
        )
    return arr


@jax.jit
def _all_finite(a):
    return jnp.all(jnp.isfinite(a))


def _check_ts(ts, t1: float) -> np.ndarray:
    if ts is None:
        return np.array([0.0, t1])
    arr = _checks.real_array("ts", ts, ndim=1, shape_hint="(a 1-d array of times)")
    arr = arr.astype(np.float64)
    if np.any(np.diff(arr) < 0):
        raise ValueError("ts must be sorted in increasing order.")
    tol = 1e-12 * max(1.0, t1)
    if arr[0] < -tol or arr[-1] > t1 + tol:
        raise ValueError(f"ts must lie within [0, t1] = [0, {t1}]; got [{arr[0]}, {arr[-1]}].")
    return np.clip(arr, 0.0, t1)


def _check_tolerances(rtol, atol) -> tuple[float, float]:
    r = _checks.number("rtol", rtol, lo=0.0, hi=1.0, hi_open=True)
    a = _checks.number("atol", atol, lo=0.0)
    if r == 0.0 and a == 0.0:
        raise ValueError(
            "rtol and atol are both 0: no step would ever be accepted; give "
            "rtol > 0 (e.g. 1e-6) or atol > 0."
        )
    return r, a


# --------------------------------------------------------------------- adaptive path


@eqx.filter_jit
def _solve_adaptive(
    frame: AbstractFrame, y0, ts, t1, rtol, atol, *, solver_name, max_steps, progress
):
    # The frame is closed over rather than passed as ``args``: diffrax warns about
    # complex leaves in ``args`` (the propagator holds complex eigenvectors).
    time = Continuous()
    term = diffrax.ODETerm(lambda t, y, args: time.field(frame, t, y))
    solver = SOLVERS[solver_name]()
    log_limit = _log_limit(y0.dtype)

    def overflow(t, y, args, **kwargs):
        return (time.log_bound(frame, t, y) > log_limit) | ~jnp.all(jnp.isfinite(y))

    event = diffrax.Event(overflow)
    controller = diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=PCOEFF, icoeff=ICOEFF)
    meter = diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter()
    # Two save streams: the requested times, and the state where the solve stopped.
    saveat = diffrax.SaveAt(subs=(diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)))

    def one(y):
        sol = diffrax.diffeqsolve(
            term,
            solver,
            t0=jnp.zeros((), ts.dtype),
            t1=t1,
            dt0=None,
            y0=y,
            args=None,
            saveat=saveat,
            stepsize_controller=controller,
            event=event,
            max_steps=max_steps,
            throw=False,
            progress_meter=meter,
        )
        res = sol.result
        assert sol.ts is not None and sol.ys is not None  # both save streams were asked for
        (ts_saved, ts_stop), (ys, ys_stop) = sol.ts, sol.ys
        t_stop, y_stop = ts_stop[0], ys_stop[0]
        code = status_code(res, y_stop)
        stats = {
            "num_steps": sol.stats["num_steps"],
            "num_accepted_steps": sol.stats["num_accepted_steps"],
            "num_rejected_steps": sol.stats["num_rejected_steps"],
        }
        return ys, ts_saved, t_stop, y_stop, code, stats

    if y0.shape[0] == 1:
        # One system: no vmap. Batching diffrax's loops costs ~40% more trace and
        # compile time, which dominates a first small simulate.
        return jax.tree_util.tree_map(lambda a: a[None], one(y0[0]))
    return jax.vmap(one)(y0)


# ------------------------------------------------------------------ fixed-step path
def _solve_euler(
    frame: AbstractFrame,
    y0,
    dt,
    n_layers: int,
    save_layers: np.ndarray,
    *,
    progress,
    ode: bool = False,
):
    bar = None
    callback: Callable[[Any], None] | None = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_layers, unit="layer", desc="attnflow euler")

        def _advance(k) -> None:
            bar.n = int(k)
            bar.refresh()

        callback = _advance

    # Per-mode factors of the discrete rescaled update, (I + dt B)^{-1} B, exact.
    factor = None
    if ode:  # forward Euler on the frame's ODE: the continuous-time scale and factor
        factor = Continuous().factor(frame)
    elif frame.coords == "modal":
        factor = Layers(dt).modal_factor(frame.model.propagator, y0.dtype)
    try:
        out = _euler_loop(
            frame,
            y0,
            jnp.asarray(dt, y0.dtype),
            jnp.asarray(save_layers, jnp.int32),
            factor,
            log_limit=_log_limit(y0.dtype),
            progress_every=max(1, n_layers // 100) if progress else 0,
            callback=callback,
            ode=ode,
        )
        jax.block_until_ready(out)
    finally:
        if bar is not None:
            bar.n = n_layers
            bar.close()
    return out


@eqx.filter_jit
def _euler_loop(
    frame: AbstractFrame,
    y0,
    dt,
    save_layers,
    factor,
    *,
    log_limit,
    progress_every,
    callback,
    ode=False,
):
    """One layer per step (``frame.step``) for a batch ``y0`` ``(b, n, d)``.

    Original frame: the model's own layer (``x <- x + dt P x V^T`` for one head).
    Rescaled frame, with ``R = I + dt V``: ``z <- z + dt (P z - z) (R^{-1} V)^T``, ``P``
    taken at ``x = R^k z``; in modal coordinates ``R^k`` and ``R^{-1} V`` act mode by
    mode (exact), otherwise ``R^k`` is carried as a matrix product. A system whose logits
    would leave the float range stops (its state is frozen) and is flagged.

    ``ode=True`` (``method="euler-ode"``): forward Euler on the frame's ODE,
    ``y <- y + dt field(y)`` with the continuous-time scale at ``t_k = k dt`` and factor
    (``Continuous``): ``z <- z + dt (P(e^{t_k V} z) z - z) V^T`` in the rescaled frame.
    """
    # R^k is carried as a matrix in standard coordinates (it maps z^k to x^k, for the
    # Trajectory), whenever the model has one value matrix V.
    prop = frame.model.propagator
    carried = frame.tracks_flow and frame.coords == "standard" and prop is not None and not ode
    d = y0.shape[-1]
    eye = jnp.eye(d, dtype=y0.dtype)
    R = eye
    if carried:
        assert prop is not None
        R = eye + dt * prop.V
        if frame.name == "rescaled":
            factor = jnp.linalg.solve(R, prop.V)  # R^{-1} V (= V R^{-1}: they commute)

    def scale_at(k, Rk):
        if frame.name == "original" or not frame.tracks_flow:
            return None
        if ode:
            return Continuous().scale(frame, jnp.asarray(k, y0.dtype) * dt)
        if frame.coords == "modal":
            return frame.model.propagator.power_multipliers(k, dt)
        return Rk

    def step_one(y, k, Rk):
        scale = scale_at(k, Rk)
        ok = frame.log_bound(y, scale) <= log_limit
        if ode:
            y_new = y + dt * frame.field(y, scale, factor)
        else:
            y_new = frame.step(y, scale, dt, factor)
        ok = ok & jnp.all(jnp.isfinite(y_new))
        return jnp.where(ok, y_new, y), ok

    step_batch = jax.vmap(step_one, in_axes=(0, None, None))

    def body(state):
        y, Rk, k, stopped, k_stop = state
        y_new, ok = step_batch(y, k, Rk)
        newly = ~stopped & ~ok
        k_stop = jnp.where(newly, k, k_stop)
        stopped = stopped | ~ok
        y = jnp.where(stopped[:, None, None], y, y_new)
        if callback is not None:
            jax.lax.cond(
                (k + 1) % progress_every == 0,
                lambda: jax.debug.callback(callback, k + 1),
                lambda: None,
            )
        Rk = R @ Rk if carried else Rk
        return y, Rk, k + 1, stopped, k_stop

    def advance(state, target):
        state = jax.lax.while_loop(lambda s: (s[2] < target) & ~jnp.all(s[3]), body, state)
        y, Rk, k, stopped, _ = state
        return state, (y, Rk, ~stopped)

    b = y0.shape[0]
    init = (y0, eye, jnp.zeros((), jnp.int32), jnp.zeros((b,), bool), jnp.full((b,), -1, jnp.int32))
    final, (ys, Rks, reached) = jax.lax.scan(advance, init, save_layers)
    y_end, _, k_end, stopped, k_stop = final
    k_stop = jnp.where(stopped, k_stop, k_end)
    # ys: (m, b, n, d) -> (b, m, n, d)
    return jnp.swapaxes(ys, 0, 1), Rks, jnp.swapaxes(reached, 0, 1), y_end, k_stop, stopped


# ------------------------------------------------- devices and stacked weights
# Wrappers around the two solves above, which run unchanged: for stacked weights they
# are vmapped over the frame's leaves (system i with model i); with devices, the batch
# (and the stacked leaves) are sharded over a mesh and each device runs its own loop.
def _adaptive_rows(frame, y0, ts, t1, rtol, atol, *, stacked, chunk=None, **kw) -> tuple[Any, Any]:
    """The adaptive solve of a batch ``y0``, system i with model i when ``stacked``;
    with ``chunk``, as consecutive chunks of ``chunk`` systems (``lax.map``), each with
    its own loop, so that a chunk pays for its own slowest system only."""
    b = y0.shape[0]
    if chunk is not None and chunk < b:
        nc = -(-b // chunk)

        def cut(a):  # (b, ...) -> (nc, chunk, ...), padded with copies of the last row
            a = jnp.concatenate([a, jnp.repeat(a[-1:], nc * chunk - b, axis=0)], axis=0)
            return a.reshape(nc, chunk, *a.shape[1:])

        def glue(a):
            return a.reshape(nc * chunk, *a.shape[2:])[:b]

        dyn, static = eqx.partition(frame, eqx.is_array)
        if not stacked:  # one frame for every chunk
            dyn = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (nc, *a.shape)), dyn)
        else:
            dyn = jax.tree_util.tree_map(cut, dyn)

        def run(c):
            fr = eqx.combine(c[0], static)
            if stacked:
                return _adaptive_rows(fr, c[1], ts, t1, rtol, atol, stacked=True, **kw)[0]
            return _solve_adaptive(fr, c[1], ts, t1, rtol, atol, **kw)

        return jax.tree_util.tree_map(glue, jax.lax.map(run, (dyn, cut(y0)))), ()
    if stacked:

        def one(fr, y):
            return _solve_adaptive(fr, y[None], ts, t1, rtol, atol, **kw)

        out = eqx.filter_vmap(one)(frame, y0)
        out = jax.tree_util.tree_map(lambda a: a[:, 0], out)
    else:
        out = _solve_adaptive(frame, y0, ts, t1, rtol, atol, **kw)
    return out, ()


def _euler_rows(
    frame_factor, y0, dt, save_layers, *, stacked: bool, ode: bool, log_limit: float
) -> tuple[Any, Any]:
    frame, factor = frame_factor
    opts: dict[str, Any] = dict(log_limit=log_limit, progress_every=0, callback=None, ode=ode)
    if stacked:

        def one(fr, f, y):
            return _euler_loop(fr, y[None], dt, save_layers, f, **opts)

        ys, Rks, reached, y_end, k_stop, stopped = eqx.filter_vmap(one)(frame, factor, y0)
        # Rks: (b, m, d, d), one flow per model
        rows = (ys[:, 0], reached[:, 0], y_end[:, 0], k_stop[:, 0], stopped[:, 0])
        return (*rows, Rks), ()
    ys, Rks, reached, y_end, k_stop, stopped = _euler_loop(
        frame, y0, dt, save_layers, factor, **opts
    )
    # one R^k per device: the device whose loop ran furthest carries every save's
    return (ys, reached, y_end, k_stop, stopped), (Rks[None], jnp.max(k_stop)[None])


_adaptive_stacked = eqx.filter_jit(_adaptive_rows)
_euler_stacked = eqx.filter_jit(_euler_rows)


def _euler_factor(frame, dt, dtype, ode):
    """The value factor of the layer loop, as ``_solve_euler`` computes it."""
    if ode:
        return Continuous().factor(frame)
    if frame.coords == "modal":
        return Layers(dt).modal_factor(frame.model.propagator, dtype)
    return None


def _solve_euler_scaled(frame, y0, dt, save_layers, *, devices, stacked, ode):
    """``_solve_euler`` for stacked weights and/or on several devices (no progress
    bar). Returns the same six outputs; ``Rks`` is ``(b, m, d, d)`` when stacked."""
    factor = _euler_factor(frame, dt, y0.dtype, ode)
    args = (jnp.asarray(dt, y0.dtype), jnp.asarray(save_layers, jnp.int32))
    kw: dict[str, Any] = dict(stacked=stacked, ode=ode, log_limit=_log_limit(y0.dtype))
    rows: Any
    per_device: Any
    if devices is None:
        rows, per_device = _euler_stacked((frame, factor), y0, *args, **kw)
    else:
        rows, per_device = _devices.run_sharded(
            _euler_rows, devices, (frame, factor), y0, *args, batched_frame=stacked, **kw
        )
    if stacked:
        ys, reached, y_end, k_stop, stopped, Rks = rows
    else:
        ys, reached, y_end, k_stop, stopped = rows
        Rks_dev, k_far = per_device
        Rks = Rks_dev[int(np.argmax(np.asarray(k_far)))]
    return ys, Rks, reached, y_end, k_stop, stopped


def _balanced_order(cost, n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """A permutation (with repeats, for padding) that sorts the systems by ``cost`` and
    deals them round-robin to ``n_devices`` equal contiguous blocks, and the position of
    each system in it (to put the results back in the given order)."""
    order = np.argsort(np.asarray(cost, np.float64), kind="stable")
    b = len(order)
    per = -(-b // n_devices)
    blocks = []
    for j in range(n_devices):
        blk = order[j::n_devices]
        if len(blk) == 0:
            blk = order[-1:]
        blocks.append(np.concatenate([blk, np.repeat(blk[-1:], per - len(blk))]))
    perm = np.concatenate(blocks)
    where = np.empty(b, np.int64)
    where[perm[::-1]] = np.arange(len(perm))[::-1]  # first occurrence of each system
    return perm, where


def _solve_adaptive_scaled(frame, y0, *args, devices, stacked, chunk=None, cost=None, **kw) -> Any:
    """``_solve_adaptive`` for stacked weights, on several devices, in chunks, and/or
    with the systems ordered by a cost estimate (results in the given order)."""
    where = None
    if cost is not None:
        perm, where = _balanced_order(cost, 1 if devices is None else len(devices))
        take = jnp.asarray(perm)
        y0 = y0[take]
        if stacked:
            dyn, static = eqx.partition(frame, eqx.is_array)
            frame = eqx.combine(jax.tree_util.tree_map(lambda a: a[take], dyn), static)
    rows: Any
    if devices is None:
        rows, _ = _adaptive_stacked(frame, y0, *args, stacked=stacked, chunk=chunk, **kw)
    else:
        rows, _ = _devices.run_sharded(
            _adaptive_rows,
            devices,
            frame,
            y0,
            *args,
            batched_frame=stacked,
            stacked=stacked,
            chunk=chunk,
            **kw,
        )
    if where is not None:
        back = jnp.asarray(where)
        rows = jax.tree_util.tree_map(lambda a: a[back], rows)
    return rows


# ------------------------------------------------------------------------- public
def simulate(
    model: AbstractModel,
    x0: Float[ArrayLike, "*b n d"],
    t1: float,
    *,
    ts: Float[ArrayLike, " m"] | None = None,
    frame: str = "rescaled",
    method: str = "adaptive",
    dt: float | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 100_000,
    progress: bool = False,
    residual: bool = True,
    devices: Sequence[Any] | str | None = None,
    shard: str = "batch",
    chunk: int | None = None,
    cost: Float[ArrayLike, " b"] | None = None,
    layernorm: str | None = None,
) -> Trajectory:
    """Integrate the self-attention particle system from ``x0`` to time ``t1``.

    Args:
        model: an ``attnflow.Attention`` (any ``attnflow.dynamics.base.AbstractModel``;
            the rescaled frame needs an attention system with one value matrix).
        x0: initial tokens, ``(n, d)``, or a batch ``(b, n, d)`` of independent systems.
            Cast to the model's working precision.
        t1: final time (> 0). For ``method="euler"`` a whole number of layers ``dt``.
        ts: sorted times in ``[0, t1]`` at which to save the state; default ``[0, t1]``.
            For ``"euler"`` they must be multiples of ``dt`` (layer indices).
        frame: ``"rescaled"`` integrates ``z = e^{-tV} x``; ``"original"`` integrates ``x``;
            ``"sphere"`` puts the tokens on the unit sphere (every row of ``x0`` is
            divided by its norm; a zero row is a ``ValueError``) and integrates
            ``dx_i/dt = Proj_{x_i}(F(x)_i)``, ``Proj_x y = y - <x, y> x``, for any model
            and kernel, or its layer-norm layers (``layernorm``); ``traj.x`` (and
            ``traj.z``, the same array) are the tokens on the sphere. See
            ``attnflow.dynamics.frames.Sphere``.
        method: ``"adaptive"`` (Tsit5 with an I step-size controller, ``PCOEFF`` and
            ``ICOEFF``; also ``"tsit5"``, ``"dopri5"``, ``"dopri8"``, ``"bosh3"``,
            ``"heun"``) or ``"euler"``: the discrete-time transformer, one forward-Euler
            step of size ``dt`` per layer, with the exact discrete rescaling
            ``z^k = (I + dt V)^{-k} x^k`` in the rescaled frame; or ``"euler-ode"``:
            forward Euler on the ODE of the chosen frame with step ``dt``, in the
            rescaled frame ``z_i <- z_i + dt sum_j P_ij(e^{t_k V} z) V (z_j - z_i)`` (the
            clustering paper's own scheme), in the original frame ``x <- x + dt F(x)``
            (``method="euler"`` to rounding for one head).
        dt: layer step for ``"euler"`` and ``"euler-ode"`` (required there, ignored
            otherwise).
        rtol, atol: tolerances of the adaptive step-size controller.
        max_steps: step budget of the adaptive solver, per system.
        progress: show a progress bar.
        residual: ``False`` drops the skip connection (``method="euler"``, original frame
            only): each of the ``t1 / dt`` layers maps ``x <- model.pure_layer(x)``,
            ``x_i <- sum_j P_ij V x_j`` for one head. ``traj.z`` is then not defined.
        devices: ``None`` (one device, the default), ``"all"`` (``jax.local_devices()``)
            or a list of JAX devices: the batch axis is sharded over a 1-D mesh of these
            devices (``jax.shard_map``), padded to a multiple of their number by
            repeating the first system; each device runs its own adaptive loop. Results
            equal the one-device run to rounding. No progress bar on this path.
        shard: ``"batch"`` (default): shard the systems of a batch. ``"tokens"``: one
            system whose query rows are sharded over ``devices`` (keys and values
            gathered on every device): memory per device ``O(n d + block n)``.
        chunk: adaptive methods, a batch: run the systems as consecutive chunks of
            ``chunk`` systems, each chunk with its own adaptive loop (under ``vmap`` every
            system of a loop pays for the slowest one), per device with ``devices``.
            ``None``: one loop for the whole batch (per device).
        cost: adaptive methods, a batch: an estimate ``(b,)`` of each system's cost
            (for example ``traj.stats["num_steps"]`` of an earlier run, or of a run at
            loose tolerances); the systems are sorted by it (and dealt evenly to the
            devices) before chunking, so that each chunk holds systems of similar cost.
            Results are returned in the given order.
        layernorm: where the layers of ``frame="sphere"``, ``method="euler"`` normalise
            (``N(u) = u / |u|`` per token, ``F`` the model's field; default ``"post"``):
            ``"post"`` ``x <- N(x + dt F(x))`` (the authors' phase-diagram scheme),
            ``"pre"`` ``y <- y + dt F(N(y))`` (the residual stream ``y`` is free, the
            tokens are ``N(y)``), ``"peri"`` ``y <- y + dt N(F(N(y)))``, ``"ngpt"``
            ``x <- N(x + 0.2 dt N(F(x)))``. Only with ``frame="sphere"`` and
            ``method="euler"``.

    A stacked model (``attnflow.stack(models)``, or ``Attention`` with weights of shape
    ``(b, d, d)``) pairs system ``i`` of ``x0`` ``(b, n, d)`` with model ``i`` (an
    ``(n, d)`` ``x0`` is shared by all ``b``); the result is a batch, and
    ``traj.system(i)`` is system ``i`` with its own model.

    Returns:
        A ``Trajectory``. The solve never raises on failure: see ``traj.status`` and
        ``traj.raise_for_status()``.
    """
    if not isinstance(model, AbstractModel):
        raise ValueError(
            f"model must be an attnflow model such as attnflow.Attention; "
            f"got {type(model).__name__}."
        )
    _checks.choice("frame", frame, FRAMES)
    _checks.choice("method", method, (*SOLVERS, *_FIXED))
    if not isinstance(residual, (bool, np.bool_)):
        raise ValueError(f"residual must be True or False; got {residual!r}.")
    if layernorm is not None:
        _checks.choice("layernorm", layernorm, LAYERNORMS)
        if frame != "sphere" or method != "euler":
            raise ValueError(
                f"layernorm={layernorm!r} places the layer normalisation of the "
                f"discrete sphere frame: it needs frame='sphere' and method='euler'; "
                f"got frame={frame!r}, method={method!r}."
            )
    ln = "post" if layernorm is None else layernorm
    if not residual:
        if method != "euler" or frame != "original":
            raise ValueError(
                f"residual=False (layers without the skip connection) needs "
                f"method='euler' and frame='original'; got method={method!r}, "
                f"frame={frame!r}."
            )
        fr: AbstractFrame = Unskipped(model)
    else:
        # checks that the model supports the frame
        fr = make_frame(frame, model, layernorm=ln)
    # every argument is checked before any work (and before the metadata is built)
    devs = _devices.resolve_devices(devices)
    _checks.choice("shard", shard, _devices.SHARDS)
    size = model.stack_size
    stacked = size is not None
    if stacked:  # system i with model i: the frame holds one model per system
        fr = eqx.filter_vmap(
            lambda m: make_frame(frame, m, layernorm=ln) if residual else Unskipped(m)
        )(model)
    x0 = _check_x0(model, x0)
    if stacked:
        if x0.ndim == 2:
            x0 = jnp.broadcast_to(jnp.asarray(x0), (size, *x0.shape))
        elif x0.shape[0] != size:
            raise ValueError(
                f"x0 holds {x0.shape[0]} systems but the model stacks {size} models; give "
                f"x0 of shape ({size}, n, d) (system i runs with model i) or (n, d) (one "
                f"start for all)."
            )
    if shard == "tokens" and (devs is None or stacked or x0.ndim != 2):
        raise ValueError(
            "shard='tokens' shards the tokens of one system: give devices (a list or "
            "'all'), one unstacked model and x0 of shape (n, d); for a batch use "
            "shard='batch'."
        )
    if shard == "tokens":
        assert devs is not None
        sharded_model = _devices.TokenSharded(model, devs)
        fr = (
            make_frame(frame, sharded_model, layernorm=ln) if residual else Unskipped(sharded_model)
        )
    # the devices that the batch is sharded over (the tokens' devices are in the model)
    solve_devs = devs if shard == "batch" else None
    if not isinstance(x0, jax_core.Tracer):
        fr.check_tokens(x0)
    batched = x0.ndim == 3
    if chunk is not None:
        chunk = _checks.integer("chunk", chunk, lo=1)
    if cost is not None:
        cost = _checks.real_array("cost", cost, ndim=1, shape_hint="(b,)")
        if not batched or cost.shape[0] != x0.shape[0]:
            raise ValueError(
                f"cost must hold one number per system of the batch, shape "
                f"({x0.shape[0] if batched else 'b'},); got shape {cost.shape}"
                f"{'' if batched else ' for one system'}."
            )
    if (chunk is not None or cost is not None) and method in _FIXED:
        raise ValueError(
            f"chunk and cost order the adaptive solves of a batch; method={method!r} takes "
            f"the same layers for every system (leave them None)."
        )
    t1f = _checks.positive("t1", t1)
    ts_np = _check_ts(ts, t1f)
    if method not in _FIXED:
        rtol, atol = _check_tolerances(rtol, atol)
        max_steps = _checks.integer("max_steps", max_steps, lo=1, hi=MAX_STEPS_LIMIT)
    dtype = model.dtype
    _checks.warn_float64_cast(x0)
    x0j = jnp.asarray(x0, dtype=dtype)
    if not batched:
        x0j = x0j[None]
    # At t = 0 both frames coincide: z(0) = x(0).
    if stacked:
        y0 = eqx.filter_vmap(lambda f, x: f.initial_state(x))(fr, x0j)
    else:
        y0 = fr.initial_state(x0j)

    if method in _FIXED:
        if dt is None:
            raise ValueError(f"dt is required for method={method!r}: the layer step, e.g. dt=0.1.")
        dtf = _checks.positive("dt", dt)
        ode = method == "euler-ode"
        discretisation: AbstractTime = Continuous() if ode else Layers(dtf)
        n_layers = int(round(t1f / dtf))
        if n_layers < 1 or abs(n_layers * dtf - t1f) > 1e-9 * max(1.0, t1f):
            raise ValueError(
                f"t1 = {t1f} is not a whole number of layers of dt = {dtf}; choose t1 = k * dt."
            )
        save_layers = np.rint(ts_np / dtf).astype(np.int64)
        if np.any(np.abs(save_layers * dtf - ts_np) > 1e-9 * max(1.0, t1f)):
            raise ValueError(f"ts must be multiples of dt = {dtf} for method={method!r}.")
        if frame == "rescaled" and not ode:
            R = np.eye(model.d) + dtf * np.asarray(model.propagator.V, np.float64)
            if np.max(np.linalg.cond(R)) > 1.0 / np.finfo(np.dtype(dtype)).eps:
                raise ValueError(
                    f"I + dt V is singular for dt = {dtf} (V has an eigenvalue near "
                    f"{-1 / dtf:g}): the discrete rescaling does not exist. Use "
                    f"frame='original' or another dt."
                )
        if solve_devs is None and not stacked:
            ys, Rks, reached, y_end, k_stop, stopped = _solve_euler(
                fr, y0, dtf, n_layers, save_layers, progress=progress, ode=ode
            )
        else:
            ys, Rks, reached, y_end, k_stop, stopped = _solve_euler_scaled(
                fr, y0, dtf, save_layers, devices=solve_devs, stacked=stacked, ode=ode
            )
        codes = np.where(np.asarray(stopped), Status.OVERFLOW.code, Status.OK.code)
        t_stop = np.asarray(k_stop, np.float64) * dtf
        stats = {
            "num_steps": np.asarray(k_stop),
            "num_accepted_steps": np.asarray(k_stop),
            "num_rejected_steps": np.zeros_like(np.asarray(k_stop)),
            "n_layers": n_layers,
        }
        # Standard coordinates: map to the original frame with the R^k the loop used.
        to_x = None if fr.coords == "modal" or ode or not fr.tracks_flow else np.asarray(Rks)
        solver_info = {"method": method, "dt": dtf, "layers": n_layers}
        if not ode:
            solver_info.update(fr.settings())
        if not residual:
            solver_info["residual"] = False
        y_stop = y_end
        reached = np.asarray(reached)
    else:
        discretisation = Continuous()
        ts_j = jnp.asarray(ts_np, dtype=dtype)
        solve_args = (
            fr,
            y0,
            ts_j,
            jnp.asarray(t1f, dtype),
            jnp.asarray(rtol, dtype),
            jnp.asarray(atol, dtype),
        )
        if solve_devs is None and not stacked and chunk is None and cost is None:
            ys, ts_out, t_stop, y_stop, codes, stats = _solve_adaptive(
                *solve_args,
                solver_name=method,
                max_steps=int(max_steps),
                progress=bool(progress),
            )
        else:
            ys, ts_out, t_stop, y_stop, codes, stats = _solve_adaptive_scaled(
                *solve_args,
                devices=solve_devs,
                stacked=stacked,
                chunk=chunk,
                cost=cost,
                solver_name=method,
                max_steps=int(max_steps),
                progress=False,
            )
        codes = np.asarray(codes)
        t_stop = np.asarray(t_stop, np.float64)
        ts_out = np.asarray(ts_out)
        reached = np.isfinite(ts_out)
        stats = {k: np.asarray(v) for k, v in stats.items()}
        to_x = None
        solver_info = {
            "method": method,
            "solver": SOLVERS[method].__name__,
            "controller": "PIDController",
            "pcoeff": PCOEFF,
            "icoeff": ICOEFF,
            "rtol": float(rtol),
            "atol": float(atol),
            "max_steps": int(max_steps),
        }
    if devs is not None:
        solver_info["devices"] = _devices.device_ids(devs)
        solver_info["shard"] = shard

    return Trajectory._from_solve(
        model=model,
        frame=frame,
        coords=fr.coords,
        ts_requested=ts_np,
        ys=ys,
        reached=reached,
        t_stop=t_stop,
        y_stop=y_stop,
        codes=codes,
        stats=stats,
        batched=batched,
        to_x=to_x,
        solver=solver_info,
        t1=t1f,
        x0=x0j if batched else x0j[0],
        discretisation=discretisation,
    )
