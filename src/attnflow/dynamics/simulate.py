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

The states saved before a failure, and the state where the solve stopped, are kept.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float

from .. import _checks
from . import _devices, _inputs
from ._inputs import FIXED, MAX_STEPS_LIMIT, check_tolerances, check_ts, check_x0
from .base import AbstractModel
from .propagator import fresh
from .frames import FRAMES, LAYERNORMS, AbstractFrame, frame_maker
from .solve import ICOEFF, PCOEFF, SOLVERS, AdaptiveSolver, LayerSolver, adaptive_solve
from .solve import log_limit as _log_limit
from .stochastic import simulate_with_noise
from .terms import AbstractTime, Continuous, FlowTerm, Layers, layer_term
from .trajectory import Status, Trajectory

__all__ = ["simulate", "SOLVERS", "MAX_STEPS_LIMIT", "FIXED"]


# --------------------------------------------------------------------- adaptive path
@eqx.filter_jit
def _solve_adaptive(term: FlowTerm, y0, ts, t1, rtol, atol, *, solver_name, max_steps, progress):
    """``adaptive_solve`` of every system of the batch ``y0`` ``(b, n, d)`` (vmapped: each
    system chooses its own steps)."""

    def one(y):
        sol = adaptive_solve(
            term,
            y,
            ts,
            t1,
            rtol,
            atol,
            method=solver_name,
            max_steps=max_steps,
            progress=progress,
        )
        stats = {
            "num_steps": sol.num_steps,
            "num_accepted_steps": sol.num_accepted_steps,
            "num_rejected_steps": sol.num_rejected_steps,
        }
        return sol.ys, sol.ts, sol.t_stop, sol.y_stop, sol.status, stats

    if y0.shape[0] == 1:
        # One system: no vmap. Batching diffrax's loops costs ~40% more trace and
        # compile time, which dominates a first small simulate.
        return jax.tree_util.tree_map(lambda a: a[None], one(y0[0]))
    return jax.vmap(one)(y0)


# ------------------------------------------------------------------ fixed-step path
def _solve_euler(term, y0, n_layers: int, save_layers: np.ndarray, *, progress):
    bar = None
    callback: Callable[[Any], None] | None = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_layers, unit="layer", desc="attnflow euler")

        def _advance(k) -> None:
            bar.n = int(k)
            bar.refresh()

        callback = _advance

    try:
        out = _euler_loop(
            term,
            y0,
            jnp.asarray(save_layers, jnp.int32),
            log_limit=_log_limit(y0.dtype),
            progress_every=max(1, n_layers // 100) if progress else 0,
            callback=callback,
        )
        jax.block_until_ready(out)
    finally:
        if bar is not None:
            bar.n = n_layers
            bar.close()
    return out


@eqx.filter_jit
def _euler_loop(term, y0, save_layers, *, log_limit, progress_every, callback):
    """One layer per step (``term.step``) for a batch ``y0`` ``(b, n, d)``, saving after
    the layers ``save_layers``; the term owns ``R = I + dt V``, its powers and the value
    factor (``LayerTerm``, ``EulerTerm``). A system whose logits would leave the float
    range stops (its state is frozen) and is flagged; the loop ends early once every
    system has stopped. Returns the saves ``(b, m, n, d)``, the carried ``R^k`` at each
    save ``(m, d, d)``, which saves each system reached, the final states, the layer
    where each stopped and whether it did."""
    setup = term.setup()

    step_batch = jax.vmap(
        lambda y, clock: term.guarded_step(setup, clock, y, log_limit), in_axes=(0, None)
    )

    def body(state):
        y, clock, stopped, k_stop = state
        k = clock[0]
        y_new, ok = step_batch(y, clock)
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
        return y, term.tick(setup, clock), stopped, k_stop

    def advance(state, target):
        state = jax.lax.while_loop(lambda s: (s[1][0] < target) & ~jnp.all(s[2]), body, state)
        y, (_, Rk), stopped, _ = state
        return state, (y, Rk, ~stopped)

    b = y0.shape[0]
    clock0 = term.start(setup)
    init = (y0, clock0, jnp.zeros((b,), bool), jnp.full((b,), -1, jnp.int32))
    final, (ys, Rks, reached) = jax.lax.scan(advance, init, save_layers)
    y_end, (k_end, _), stopped, k_stop = final
    k_stop = jnp.where(stopped, k_stop, k_end)
    # ys: (m, b, n, d) -> (b, m, n, d)
    return jnp.swapaxes(ys, 0, 1), Rks, jnp.swapaxes(reached, 0, 1), y_end, k_stop, stopped


# ------------------------------------------------- devices and stacked weights
# Wrappers around the two solves above, which run unchanged: for stacked weights they
# are vmapped over the term's leaves (system i with model i); with devices, the batch
# (and the stacked leaves) are sharded over a mesh and each device runs its own loop.
def _adaptive_rows(term, y0, ts, t1, rtol, atol, *, stacked, chunk=None, **kw) -> tuple[Any, Any]:
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

        dyn, static = eqx.partition(term, eqx.is_array)
        if not stacked:  # one term for every chunk
            dyn = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (nc, *a.shape)), dyn)
        else:
            dyn = jax.tree_util.tree_map(cut, dyn)

        def run(c):
            tm = eqx.combine(c[0], static)
            if stacked:
                return _adaptive_rows(tm, c[1], ts, t1, rtol, atol, stacked=True, **kw)[0]
            return _solve_adaptive(tm, c[1], ts, t1, rtol, atol, **kw)

        return jax.tree_util.tree_map(glue, jax.lax.map(run, (dyn, cut(y0)))), ()
    if stacked:

        def one(tm, y):
            return _solve_adaptive(tm, y[None], ts, t1, rtol, atol, **kw)

        out = eqx.filter_vmap(one)(term, y0)
        out = jax.tree_util.tree_map(lambda a: a[:, 0], out)
    else:
        out = _solve_adaptive(term, y0, ts, t1, rtol, atol, **kw)
    return out, ()


def _euler_rows(term, y0, save_layers, *, stacked: bool, log_limit: float) -> tuple[Any, Any]:
    opts: dict[str, Any] = dict(log_limit=log_limit, progress_every=0, callback=None)
    if stacked:

        def one(tm, y):
            return _euler_loop(tm, y[None], save_layers, **opts)

        ys, Rks, reached, y_end, k_stop, stopped = eqx.filter_vmap(one)(term, y0)
        # Rks: (b, m, d, d), one flow per model
        rows = (ys[:, 0], reached[:, 0], y_end[:, 0], k_stop[:, 0], stopped[:, 0])
        return (*rows, Rks), ()
    ys, Rks, reached, y_end, k_stop, stopped = _euler_loop(term, y0, save_layers, **opts)
    # one R^k per device: the device whose loop ran furthest carries every save's
    return (ys, reached, y_end, k_stop, stopped), (Rks[None], jnp.max(k_stop)[None])


_adaptive_stacked = eqx.filter_jit(_adaptive_rows)
_euler_stacked = eqx.filter_jit(_euler_rows)


def _solve_euler_scaled(term, y0, save_layers, *, devices, stacked):
    """``_solve_euler`` for stacked weights and/or on several devices (no progress
    bar). Returns the same six outputs; ``Rks`` is ``(b, m, d, d)`` when stacked."""
    if stacked:  # one step per system, so that every leaf of the term is stacked
        term = eqx.tree_at(lambda t: t.dt, term, jnp.broadcast_to(term.dt, (y0.shape[0],)))
    args = (jnp.asarray(save_layers, jnp.int32),)
    kw: dict[str, Any] = dict(stacked=stacked, log_limit=_log_limit(y0.dtype))
    rows: Any
    per_device: Any
    if devices is None:
        rows, per_device = _euler_stacked(term, y0, *args, **kw)
    else:
        rows, per_device = _devices.run_sharded(
            _euler_rows, devices, term, y0, *args, batched_frame=stacked, **kw
        )
    if stacked:
        ys, reached, y_end, k_stop, stopped, Rks = rows
    else:
        ys, reached, y_end, k_stop, stopped = rows
        Rks_dev, k_far = per_device
        Rks = Rks_dev[int(np.argmax(np.asarray(k_far)))]
    return ys, Rks, reached, y_end, k_stop, stopped


def _solve_adaptive_scaled(term, y0, *args, devices, stacked, chunk=None, cost=None, **kw) -> Any:
    """``_solve_adaptive`` for stacked weights, on several devices, in chunks, and/or
    with the systems ordered by a cost estimate (results in the given order)."""
    where = None
    if cost is not None:
        perm, where = _devices.balanced_order(cost, 1 if devices is None else len(devices))
        take = jnp.asarray(perm)
        y0 = y0[take]
        if stacked:
            dyn, static = eqx.partition(term, eqx.is_array)
            term = eqx.combine(jax.tree_util.tree_map(lambda a: a[take], dyn), static)
    rows: Any
    if devices is None:
        rows, _ = _adaptive_stacked(term, y0, *args, stacked=stacked, chunk=chunk, **kw)
    else:
        rows, _ = _devices.run_sharded(
            _adaptive_rows,
            devices,
            term,
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
    solver: AdaptiveSolver | LayerSolver | None = None,
    noise: Any = None,
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
        residual: ``False`` drops the skip connection (``method="euler"``, original or
            sphere frame): each of the ``t1 / dt`` layers maps ``x <- model.pure_layer(x)``,
            ``x_i <- sum_j P_ij V x_j`` for one head, and on the sphere
            ``x <- N(model.pure_layer(x))``. ``traj.z`` is then not defined.
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
            ``x <- N(x + 0.2 dt N(F(x)))``, ``"mix"`` (Mix-LN: ``"post"`` on the first
            quarter of the layers, ``"pre"`` after), ``"scaled"`` (pre-LN with layer
            ``k`` reading ``N(y) / sqrt(k + 1)``). Only with ``frame="sphere"`` and
            ``method="euler"``.
        solver: the solver as an object, instead of ``method``, ``dt``, ``rtol``,
            ``atol`` and ``max_steps`` (the same objects that ``attnflow.solve`` takes):
            ``AdaptiveSolver(rtol, atol, max_steps, method)`` or ``LayerSolver(dt)``
            (``method="euler"``). Passing both a solver and any of those keywords is a
            ``ValueError``.
        noise: ``dynamics.Noise(sigma, seed)``, random value matrices (``frame="sphere"``;
            ``method="euler"`` the layers, ``"euler-maruyama"`` their SDE: ``stochastic``).

    A stacked model (``attnflow.stack(models)``, or ``Attention`` with weights of shape
    ``(b, d, d)``) pairs system ``i`` of ``x0`` ``(b, n, d)`` with model ``i`` (an
    ``(n, d)`` ``x0`` is shared by all ``b``); the result is a batch, and
    ``traj.system(i)`` is system ``i`` with its own model.

    Returns:
        A ``Trajectory``. The solve never raises on failure: see ``traj.status`` and
        ``traj.raise_for_status()``.

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)
        >>> model = af.Attention(np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"])
        >>> x0 = np.random.default_rng(0).uniform(-5, 5, (20, 2))
        >>> traj = af.simulate(model, x0, 10.0, ts=np.linspace(0, 10, 101))
        >>> traj.status, traj.x.shape
        ('ok', (101, 20, 2))
        >>> layers = af.simulate(model, x0, 10.0, method="euler", dt=0.1)  # 100 layers
    """
    started = time.perf_counter()
    if not isinstance(model, AbstractModel):
        raise ValueError(
            f"model must be an attnflow model such as attnflow.Attention; "
            f"got {type(model).__name__}."
        )
    _checks.choice("frame", frame, FRAMES)
    model = fresh(model)  # the propagator's cache built from the model's own V
    if noise is not None:
        extra: dict[str, Any] = dict(layernorm=layernorm not in (None, "post"), chunk=chunk)
        extra.update(solver=solver, devices=devices, cost=cost is not None, residual=not residual)
        return simulate_with_noise(
            model, x0, t1, noise=noise, frame=frame, method=method, dt=dt, ts=ts, others=extra
        )  # a progress bar is not drawn for these
    if solver is not None:
        method, dt, rtol, atol, max_steps = _inputs.solver_options(
            solver, method, dt, rtol, atol, max_steps
        )
    _checks.choice("method", method, (*SOLVERS, *FIXED))
    _inputs.check_flags(residual=residual, progress=progress)
    if layernorm is not None:
        _checks.choice("layernorm", layernorm, LAYERNORMS)
        if frame != "sphere" or method != "euler":
            raise ValueError(
                f"layernorm={layernorm!r} places the layer normalisation of the "
                f"discrete sphere frame: it needs frame='sphere' and method='euler'; "
                f"got frame={frame!r}, method={method!r}."
            )
    ln = "post" if layernorm is None else layernorm
    if not residual and (method != "euler" or frame not in ("original", "sphere")):
        raise ValueError(
            f"residual=False (layers without the skip connection) needs method='euler' and "
            f"frame='original' (or 'sphere': x <- N(P(x)), pure attention with layer "
            f"norm); got method={method!r}, frame={frame!r}."
        )
    frame_of = frame_maker(frame, ln, t1=t1, dt=dt, residual=residual)
    # checks that the model supports the frame
    fr: AbstractFrame = frame_of(model)
    # every argument is checked before any work (and before the metadata is built)
    devs = _devices.resolve_devices(devices)
    _checks.choice("shard", shard, _devices.SHARDS)
    size = model.stack_size
    stacked = size is not None
    if stacked:  # system i with model i: the frame holds one model per system
        fr = eqx.filter_vmap(frame_of)(model)
    x0 = check_x0(model, x0)
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
        fr = frame_of(sharded_model)
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
    if (chunk is not None or cost is not None) and method in FIXED:
        raise ValueError(
            f"chunk and cost order the adaptive solves of a batch; method={method!r} takes "
            f"the same layers for every system (leave them None)."
        )
    t1f = _checks.positive("t1", t1)
    ts_np = check_ts(ts, t1f)
    if method not in FIXED:
        rtol, atol = check_tolerances(rtol, atol)
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

    if method in FIXED:
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
        if not ode:
            fr.check_layer_step(dtf, dtype)
        term = layer_term(fr, dtf, y0.dtype, ode=ode)
        if solve_devs is None and not stacked:
            ys, Rks, reached, y_end, k_stop, stopped = _solve_euler(
                term, y0, n_layers, save_layers, progress=progress
            )
        else:
            ys, Rks, reached, y_end, k_stop, stopped = _solve_euler_scaled(
                term, y0, save_layers, devices=solve_devs, stacked=stacked
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
        to_x = np.asarray(Rks) if term.carries_flow else None
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
            FlowTerm(fr),
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

    traj = Trajectory._from_solve(
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
    return dataclasses.replace(traj, wall_seconds=time.perf_counter() - started)
