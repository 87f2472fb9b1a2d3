"""Integrate the particle system: the one place that calls diffrax.

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

import math
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from . import kernels as _kernels
from .model import Attention, Dynamics, _warn_float64_cast
from .trajectory import STATUS_CODES, Trajectory

__all__ = ["simulate", "SOLVERS"]

# name -> diffrax solver class (adaptive, with an embedded error estimate)
SOLVERS = {
    "adaptive": diffrax.Tsit5,
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "dopri8": diffrax.Dopri8,
    "bosh3": diffrax.Bosh3,
    "heun": diffrax.Heun,
}
_FIXED = ("euler",)
FRAMES = ("rescaled", "original")

# Logits are stopped this factor (in log) below the largest finite float.
_LOG_MARGIN = 4.0


def _log_limit(dtype) -> float:
    return float(np.log(np.finfo(np.dtype(dtype)).max)) - _LOG_MARGIN


# --------------------------------------------------------------------------- checks
def _positive_float(name: str, value, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except Exception:
        raise ValueError(f"{name} must be a positive number; got {value!r}.") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be a positive finite number; got {value!r}.")
    return v


def _check_x0(model: Attention, x0) -> np.ndarray | Array:
    if isinstance(x0, jax.core.Tracer):
        arr = x0
    else:
        try:
            arr = np.asarray(x0)
        except Exception as exc:
            raise ValueError(f"x0 must be an (n, d) or (b, n, d) array: {exc}") from None
        if np.issubdtype(arr.dtype, np.complexfloating):
            raise ValueError("x0 must be real; got a complex array.")
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"x0 must be a real numeric array; got dtype {arr.dtype}.")
    if arr.ndim not in (2, 3):
        raise ValueError(
            f"x0 must have shape (n, d) or (b, n, d); got shape {tuple(arr.shape)}."
        )
    if arr.shape[-1] != model.d:
        raise ValueError(
            f"x0 has token dimension {arr.shape[-1]} but the model has d = {model.d}; "
            f"x0 must be (n, {model.d}) or (b, n, {model.d})."
        )
    if arr.shape[-2] < 1 or (arr.ndim == 3 and arr.shape[0] < 1):
        raise ValueError(f"x0 must hold at least one token; got shape {tuple(arr.shape)}.")
    if not isinstance(arr, jax.core.Tracer) and not np.all(np.isfinite(arr)):
        raise ValueError("x0 has non-finite entries (NaN or inf); all tokens must be finite.")
    return arr


def _check_ts(ts, t1: float) -> np.ndarray:
    if ts is None:
        return np.array([0.0, t1])
    arr = np.asarray(ts, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 1:
        raise ValueError(f"ts must be a non-empty 1-d array of times; got shape {arr.shape}.")
    if not np.all(np.isfinite(arr)):
        raise ValueError("ts has non-finite entries.")
    if np.any(np.diff(arr) < 0):
        raise ValueError("ts must be sorted in increasing order.")
    tol = 1e-12 * max(1.0, t1)
    if arr[0] < -tol or arr[-1] > t1 + tol:
        raise ValueError(f"ts must lie within [0, t1] = [0, {t1}]; got [{arr[0]}, {arr[-1]}].")
    return np.clip(arr, 0.0, t1)


# --------------------------------------------------------------------- adaptive path
# Step-size control: the classical I controller (diffrax's defaults pcoeff=0, icoeff=1;
# scipy's RK45 does the same). A PI controller (0.3, 0.3) took 9% fewer steps on the
# n = 1024, d = 64 benchmark, but made a batched solve and the same systems solved one
# by one take different steps (accept/reject decisions at an error ratio ~1 flip on
# the rounding of batched matmuls), so it is not the default.
PCOEFF, ICOEFF = 0.0, 1.0

@eqx.filter_jit
def _solve_adaptive(dyn, y0, ts, t1, rtol, atol, *, solver_name, max_steps, progress):
    # The dynamics are closed over rather than passed as ``args``: diffrax warns about
    # complex leaves in ``args`` (the propagator holds complex eigenvectors).
    term = diffrax.ODETerm(lambda t, y, args: dyn(t, y))
    solver = SOLVERS[solver_name]()
    log_limit = _log_limit(y0.dtype)

    def overflow(t, y, args, **kwargs):
        return (dyn.log_bound(t, y) > log_limit) | ~jnp.all(jnp.isfinite(y))

    event = diffrax.Event(overflow)
    controller = diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=PCOEFF, icoeff=ICOEFF)
    meter = diffrax.TqdmProgressMeter() if progress else diffrax.NoProgressMeter()
    # Two save streams: the requested times, and the state where the solve stopped.
    saveat = diffrax.SaveAt(subs=(diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)))

    def one(y):
        sol = diffrax.diffeqsolve(
            term, solver, t0=jnp.zeros((), ts.dtype), t1=t1, dt0=None, y0=y, args=None,
            saveat=saveat, stepsize_controller=controller,
            event=event, max_steps=max_steps, throw=False, progress_meter=meter,
        )
        res = sol.result
        (ts_saved, ts_stop), (ys, ys_stop) = sol.ts, sol.ys
        t_stop, y_stop = ts_stop[0], ys_stop[0]
        finite = jnp.all(jnp.isfinite(y_stop))
        code = jnp.where(
            res == diffrax.RESULTS.successful, 0,
            jnp.where(res == diffrax.RESULTS.event_occurred, jnp.where(finite, 1, 3),
                      jnp.where(res == diffrax.RESULTS.max_steps_reached, 2, 4)))
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
def _solve_euler(dyn, y0, dt, n_layers: int, save_layers: np.ndarray, *, progress):
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_layers, unit="layer", desc="attnflow euler")

        def callback(k):
            bar.n = int(k)
            bar.refresh()
    else:
        callback = None
    # Per-mode factors of the discrete rescaled update, (I + dt B)^{-1} B, exact.
    prop = dyn.model.propagator
    step_re = step_im = None
    if dyn.coords == "modal":
        mu = np.asarray(prop.mu_re, np.float64) + 1j * np.asarray(prop.mu_im, np.float64)
        c = mu / (1.0 + dt * mu)
        step_re, step_im = (jnp.asarray(v, y0.dtype) for v in (c.real, c.imag))
    try:
        out = _euler_loop(dyn, y0, jnp.asarray(dt, y0.dtype), jnp.asarray(save_layers, jnp.int32),
                          step_re, step_im, log_limit=_log_limit(y0.dtype),
                          progress_every=max(1, n_layers // 100) if progress else 0,
                          callback=callback)
        jax.block_until_ready(out)
    finally:
        if bar is not None:
            bar.n = n_layers
            bar.close()
    return out


@eqx.filter_jit
def _euler_loop(dyn, y0, dt, save_layers, step_re, step_im, *, log_limit, progress_every,
                callback):
    """Forward Euler, one step per layer, for a batch ``y0`` ``(b, n, d)``.

    Original frame: ``x <- x + dt P x V^T``. Rescaled frame, with ``R = I + dt V``:
    ``z <- z + dt (P z - z) (R^{-1} V)^T``, ``P`` taken at ``x = R^k z``; in modal
    coordinates ``R^k`` and ``R^{-1} V`` act mode by mode (exact), otherwise ``R^k`` is
    carried as a matrix product. A system whose logits would leave the float range stops
    (its state is frozen) and is flagged.
    """
    model = dyn.model
    prop = model.propagator
    d = model.d
    eye = jnp.eye(d, dtype=y0.dtype)
    R = eye + dt * model.V
    RinvV = jnp.linalg.solve(R, model.V)  # (= V R^{-1}: they commute)

    def step_one(y, k, Rk):
        if dyn.frame == "original":
            x = y
            q, kk = x @ model.Q.T, x @ model.K.T
        elif dyn.coords == "modal":
            we = prop.modal_scale(y, *prop.power_multipliers(k, dt))
            q, kk = we @ dyn.QT.T, we @ dyn.KT.T
        else:
            x = y @ Rk.T
            q, kk = x @ model.Q.T, x @ model.K.T
        ok = _log_bound_ok(q, kk, model.beta, log_limit, model.kernel, model.kernel_params)
        Py = _kernels.attend(model.kernel, q, kk, model.beta, y, block=model.block,
                             params=model.kernel_params)
        if dyn.frame == "original":
            y_new = y + dt * Py @ model.V.T
        elif dyn.coords == "modal":
            y_new = y + dt * prop.modal_scale(Py - y, step_re, step_im)
        else:
            y_new = y + dt * (Py - y) @ RinvV.T
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
            jax.lax.cond((k + 1) % progress_every == 0,
                         lambda: jax.debug.callback(callback, k + 1),
                         lambda: None)
        Rk = Rk if dyn.coords == "modal" else R @ Rk
        return y, Rk, k + 1, stopped, k_stop

    def advance(state, target):
        state = jax.lax.while_loop(lambda s: (s[2] < target) & ~jnp.all(s[3]), body, state)
        y, Rk, k, stopped, _ = state
        return state, (y, Rk, ~stopped)

    b = y0.shape[0]
    init = (y0, eye, jnp.zeros((), jnp.int32), jnp.zeros((b,), bool),
            jnp.full((b,), -1, jnp.int32))
    final, (ys, Rks, reached) = jax.lax.scan(advance, init, save_layers)
    y_end, _, k_end, stopped, k_stop = final
    k_stop = jnp.where(stopped, k_stop, k_end)
    # ys: (m, b, n, d) -> (b, m, n, d)
    return jnp.swapaxes(ys, 0, 1), Rks, jnp.swapaxes(reached, 0, 1), y_end, k_stop, stopped


def _log_bound_ok(q, k, beta, log_limit, kernel="softmax", kernel_params=None):
    from .model import log_logit_bound

    return log_logit_bound(q, k, beta, kernel=kernel, kernel_params=kernel_params) <= log_limit


# ------------------------------------------------------------------------- public
def simulate(
    model: Attention,
    x0,
    t1,
    *,
    ts=None,
    frame: str = "rescaled",
    method: str = "adaptive",
    dt=None,
    rtol=1e-6,
    atol=1e-9,
    max_steps: int = 100_000,
    progress: bool = False,
) -> Trajectory:
    """Integrate the self-attention particle system from ``x0`` to time ``t1``.

    Args:
        model: an ``attnflow.Attention``.
        x0: initial tokens, ``(n, d)``, or a batch ``(b, n, d)`` of independent systems.
            Cast to the model's working precision.
        t1: final time (> 0). For ``method="euler"`` a whole number of layers ``dt``.
        ts: sorted times in ``[0, t1]`` at which to save the state; default ``[0, t1]``.
            For ``"euler"`` they must be multiples of ``dt`` (layer indices).
        frame: ``"rescaled"`` integrates ``z = e^{-tV} x``; ``"original"`` integrates ``x``.
        method: ``"adaptive"`` (Tsit5 with an I step-size controller, ``PCOEFF`` and
            ``ICOEFF``; also ``"tsit5"``, ``"dopri5"``, ``"dopri8"``, ``"bosh3"``,
            ``"heun"``) or ``"euler"``: the discrete-time transformer, one forward-Euler
            step of size ``dt`` per layer, with the exact discrete rescaling
            ``z^k = (I + dt V)^{-k} x^k`` in the rescaled frame.
        dt: layer step for ``"euler"`` (required there, ignored otherwise).
        rtol, atol: tolerances of the adaptive step-size controller.
        max_steps: step budget of the adaptive solver, per system.
        progress: show a progress bar.

    Returns:
        A ``Trajectory``. The solve never raises on failure: see ``traj.status`` and
        ``traj.raise_for_status()``.
    """
    if not isinstance(model, Attention):
        raise ValueError(f"model must be an attnflow.Attention; got {type(model).__name__}.")
    if frame not in FRAMES:
        raise ValueError(f"frame must be one of {FRAMES}; got {frame!r}.")
    if frame == "rescaled" and not _kernels.row_stochastic(model.kernel):
        raise ValueError(
            f"kernel {model.kernel!r} is not row-stochastic (its rows need not sum to 1), "
            f"and the rescaled frame dz_i/dt = sum_j P_ij V (z_j - z_i) assumes they do; "
            f"use frame='original' with kernel {model.kernel!r}."
        )
    if method not in SOLVERS and method not in _FIXED:
        raise ValueError(
            f"method must be 'adaptive', 'euler' or a solver name in {tuple(SOLVERS)}; "
            f"got {method!r}."
        )
    x0 = _check_x0(model, x0)
    batched = x0.ndim == 3
    t1f = _positive_float("t1", t1)
    ts_np = _check_ts(ts, t1f)
    dtype = model.dtype
    _warn_float64_cast(x0)
    x0j = jnp.asarray(x0, dtype=dtype)
    if not batched:
        x0j = x0j[None]
    # At t = 0 both frames coincide: z(0) = x(0).
    dyn = Dynamics(model, frame)
    y0 = dyn.state_from_tokens(x0j)

    if method in _FIXED:
        if dt is None:
            raise ValueError("dt is required for method='euler': the layer step, e.g. dt=0.1.")
        dtf = _positive_float("dt", dt)
        n_layers = int(round(t1f / dtf))
        if n_layers < 1 or abs(n_layers * dtf - t1f) > 1e-9 * max(1.0, t1f):
            raise ValueError(
                f"t1 = {t1f} is not a whole number of layers of dt = {dtf}; "
                f"choose t1 = k * dt."
            )
        save_layers = np.rint(ts_np / dtf).astype(np.int64)
        if np.any(np.abs(save_layers * dtf - ts_np) > 1e-9 * max(1.0, t1f)):
            raise ValueError(f"ts must be multiples of dt = {dtf} for method='euler'.")
        if frame == "rescaled":
            R = np.eye(model.d) + dtf * np.asarray(model.V, np.float64)
            if np.linalg.cond(R) > 1.0 / np.finfo(np.dtype(dtype)).eps:
                raise ValueError(
                    f"I + dt V is singular for dt = {dtf} (V has an eigenvalue near "
                    f"{-1 / dtf:g}): the discrete rescaling does not exist. Use "
                    f"frame='original' or another dt."
                )
        ys, Rks, reached, y_end, k_stop, stopped = _solve_euler(
            dyn, y0, dtf, n_layers, save_layers, progress=progress)
        codes = np.where(np.asarray(stopped), STATUS_CODES.index("overflow"), 0)
        t_stop = np.asarray(k_stop, np.float64) * dtf
        ts_b = np.broadcast_to(save_layers * dtf, (y0.shape[0], len(save_layers)))
        stats = {
            "num_steps": np.asarray(k_stop),
            "num_accepted_steps": np.asarray(k_stop),
            "num_rejected_steps": np.zeros_like(np.asarray(k_stop)),
            "n_layers": n_layers,
        }
        # Standard coordinates: map to the original frame with the R^k the loop used.
        to_x = None if dyn.coords == "modal" else np.asarray(Rks)
        solver_info = {"method": "euler", "dt": dtf, "layers": n_layers}
        y_stop = y_end
        reached = np.asarray(reached)
    else:
        ts_j = jnp.asarray(ts_np, dtype=dtype)
        ys, ts_out, t_stop, y_stop, codes, stats = _solve_adaptive(
            dyn, y0, ts_j, jnp.asarray(t1f, dtype), jnp.asarray(rtol, dtype),
            jnp.asarray(atol, dtype), solver_name=method,
            max_steps=int(max_steps), progress=bool(progress),
        )
        codes = np.asarray(codes)
        t_stop = np.asarray(t_stop, np.float64)
        ts_out = np.asarray(ts_out)
        reached = np.isfinite(ts_out)
        ts_b = np.broadcast_to(ts_np, reached.shape)
        stats = {k: np.asarray(v) for k, v in stats.items()}
        to_x = None
        solver_info = {"method": method, "solver": SOLVERS[method].__name__,
                       "controller": "PIDController", "pcoeff": PCOEFF,
                       "icoeff": ICOEFF, "rtol": float(rtol),
                       "atol": float(atol), "max_steps": int(max_steps)}

    return Trajectory._from_solve(
        model=model, frame=frame, coords=dyn.coords, ts_requested=ts_np, ys=ys, reached=reached,
        t_stop=t_stop, y_stop=y_stop, codes=codes, stats=stats, batched=batched,
        to_x=to_x, solver=solver_info, t1=t1f, x0=x0j if batched else x0j[0],
    )
