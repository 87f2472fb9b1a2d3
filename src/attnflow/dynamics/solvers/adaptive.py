"""The adaptive solver: diffrax's Runge-Kutta methods with the overflow event, one
system (``adaptive_solve``) or a batch, stacked weights, chunks and devices."""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ... import _checks, _exported
from ..._host import put
from .. import _devices
from ..status import Status
from ..terms import AbstractTime, Continuous, FlowTerm
from ._base import (
    ICOEFF,
    MAX_STEPS_LIMIT,
    PCOEFF,
    SOLVER_CLASSES,
    SOLVERS,
    AbstractSolver,
    Run,
    Solution,
    bad_times,
    log_limit,
    own_error_mode,
    status_code,
)

__all__ = ["AdaptiveSolver", "adaptive_solve"]


# ============================================================== the adaptive solver
def adaptive_solve(
    term: Any,
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
    """One adaptive solve of ``term`` (a ``field(t, y)`` and a ``log_bound(t, y)``: a
    ``FlowTerm``, or ``CircleMeanField`` for a density) from ``y0``: diffrax's
    ``diffeqsolve`` with the overflow event, two save streams (the times ``ts`` and the
    state where the solve stopped), ``throw=False`` and ``RecursiveCheckpointAdjoint``.
    ``rtol`` and ``atol`` may be traced."""
    limit = log_limit(y0.dtype)

    def overflow(t, y, args, **kwargs):
        return (term.log_bound(t, y) > limit) | ~jnp.all(jnp.isfinite(y))

    # The term is closed over rather than passed as ``args``: diffrax warns about
    # complex leaves in ``args`` (the propagator holds complex eigenvectors).
    with own_error_mode():
        sol = _diffeqsolve(term, y0, ts, t1, rtol, atol, overflow, method, max_steps, progress)
    assert sol.ts is not None and sol.ys is not None  # both save streams were asked for
    (ts_saved, ts_stop), (ys, ys_stop) = sol.ts, sol.ys
    code = status_code(sol.result, ys_stop[0])
    code = jnp.where(bad_times(ts, t1), Status.FAILED.code, code)
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


def _diffeqsolve(term, y0, ts, t1, rtol, atol, overflow, method, max_steps, progress) -> Any:
    import diffrax

    return diffrax.diffeqsolve(
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


@eqx.filter_jit
def _adaptive_batch(term, y0, ts, t1, rtol, atol, *, solver_name, max_steps, progress):
    """``adaptive_solve`` of every system of the batch ``y0`` ``(b, n, d)`` (vmapped: each
    system chooses its own steps)."""

    def one(y):
        sol = adaptive_solve(
            term, y, ts, t1, rtol, atol, method=solver_name, max_steps=max_steps, progress=progress
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
            return _adaptive_batch(tm, c[1], ts, t1, rtol, atol, **kw)

        return jax.tree_util.tree_map(glue, jax.lax.map(run, (dyn, cut(y0)))), ()
    if stacked:

        def one(tm, y):
            return _adaptive_batch(tm, y[None], ts, t1, rtol, atol, **kw)

        out = eqx.filter_vmap(one)(term, y0)
        out = jax.tree_util.tree_map(lambda a: a[:, 0], out)
    else:
        out = _adaptive_batch(term, y0, ts, t1, rtol, atol, **kw)
    return out, ()


_adaptive_stacked = eqx.filter_jit(_adaptive_rows)


class AdaptiveSolver(AbstractSolver):
    """An adaptive Runge-Kutta solve: ``method`` (a name of ``SOLVERS``: ``"tsit5"``,
    ``"dopri5"``, ``"dopri8"``, ``"bosh3"``, ``"heun"``; ``"adaptive"`` is Tsit5) with
    tolerances ``rtol``, ``atol`` (``0 <= rtol < 1``, ``atol >= 0``, not both 0) and at
    most ``max_steps`` steps (``simulate``'s defaults). Diffrax's ``diffeqsolve`` with the
    overflow event, differentiated by ``RecursiveCheckpointAdjoint`` (exact
    discretise-then-optimise gradients of the steps taken, also under ``vmap``)."""

    rtol: float = eqx.field(static=True, default=1e-6)
    atol: float = eqx.field(static=True, default=1e-9)
    max_steps: int = eqx.field(static=True, default=100_000)
    method: str = eqx.field(static=True, default="tsit5")
    name: ClassVar[str] = "adaptive"

    def __check_init__(self):
        _checks.choice("method", self.method, tuple(SOLVERS))
        r = _checks.number("rtol", self.rtol, lo=0.0, hi=1.0, hi_open=True)
        a = _checks.number("atol", self.atol, lo=0.0)
        if r == 0.0 and a == 0.0:
            raise ValueError(
                "rtol and atol are both 0: no step would ever be accepted; give "
                "rtol > 0 (e.g. 1e-6) or atol > 0."
            )
        _checks.integer("max_steps", self.max_steps, lo=1, hi=MAX_STEPS_LIMIT)

    def discretisation(self) -> AbstractTime:
        return Continuous()

    def info(self, plan: Any) -> dict:
        del plan
        return {
            "method": self.method,
            "solver": SOLVER_CLASSES[self.method],
            "controller": "PIDController",
            "pcoeff": PCOEFF,
            "icoeff": ICOEFF,
            "rtol": float(self.rtol),
            "atol": float(self.atol),
            "max_steps": int(self.max_steps),
        }

    def integrate(
        self, frame: Any, y0: Array, ts: Array, t1: float, *, noise: Any = None
    ) -> Solution:
        self.check_noise(noise, frame)
        return adaptive_solve(
            FlowTerm(frame),
            y0,
            ts,
            jnp.asarray(t1, y0.dtype),
            self.rtol,
            self.atol,
            method=self.method,
            max_steps=self.max_steps,
        )

    def run(
        self,
        frame: Any,
        y0: Array,
        ts: np.ndarray,
        t1: float,
        plan: Any,
        *,
        devices: Any = None,
        stacked: bool = False,
        chunk: int | None = None,
        cost: Any = None,
        progress: bool = False,
        noise: Any = None,
    ) -> Run:
        del plan
        self.check_noise(noise, frame)
        dtype = y0.dtype
        # tolerances as arrays: a new value does not recompile
        args = (
            FlowTerm(frame),
            y0,
            put(ts, dtype),
            put(t1, dtype),
            put(self.rtol, dtype),
            put(self.atol, dtype),
        )
        kw: dict[str, Any] = dict(solver_name=self.method, max_steps=int(self.max_steps))
        if devices is None and not stacked and chunk is None and cost is None:
            kw["progress"] = bool(progress)
            out = _exported.call("adaptive", _adaptive_batch, args, kw)
        else:
            out = self._scaled(args, devices, stacked, chunk, cost, kw)
        ys, ts_out, t_stop, y_stop, codes, stats = out
        return Run(
            ys=ys,
            reached=np.isfinite(np.asarray(ts_out)),
            t_stop=np.asarray(t_stop, np.float64),
            y_stop=y_stop,
            codes=np.asarray(codes),
            stats={k: np.asarray(v) for k, v in stats.items()},
        )

    @staticmethod
    def _scaled(args, devices, stacked, chunk, cost, kw) -> Any:
        """Stacked weights, several devices, chunks and/or the systems ordered by a cost
        estimate (results in the given order)."""
        term, y0, *rest = args
        where = None
        if cost is not None:
            perm, where = _devices.balanced_order(cost, 1 if devices is None else len(devices))
            take = jnp.asarray(perm)
            y0 = y0[take]
            if stacked:
                dyn, static = eqx.partition(term, eqx.is_array)
                term = eqx.combine(jax.tree_util.tree_map(lambda a: a[take], dyn), static)
        opts = dict(stacked=stacked, chunk=chunk, progress=False, **kw)
        if devices is None:
            rows, _ = _adaptive_stacked(term, y0, *rest, **opts)
        else:
            rows, _ = _devices.run_sharded(
                _adaptive_rows, devices, term, y0, *rest, batched_frame=stacked, **opts
            )
        if where is not None:
            back = jnp.asarray(where)
            rows = jax.tree_util.tree_map(lambda a: a[back], rows)
        return rows
