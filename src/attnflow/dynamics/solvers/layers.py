"""The fixed-step solvers and the package's one layer loop (``layer_loop``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ... import _checks, _exported
from ..._host import put
from .. import _devices
from ..noise import brownian_tolerance
from ..noise import check_noise as checked_noise
from ..status import Status
from ..terms import AbstractTime, Continuous, Layers, NoisyTerm, layer_term
from ._base import AbstractSolver, Run, Solution, bad_times, log_limit

__all__ = ["LayerSolver", "EulerODESolver", "EulerMaruyamaSolver", "layer_loop"]


# ================================================================ the layer loop
def layer_loop(
    term: Any,
    y0: Array,
    save_layers: Array,
    *,
    log_limit: float,
    max_layers: int,
    progress_every: int = 0,
    callback: Callable[[Any], None] | None = None,
    keys: Array | None = None,
) -> tuple[Array, Array, Array, Array, Array, Array]:
    """The package's one layer loop: ``term.step`` once per layer for a batch ``y0``
    ``(b, n, d)``, saving after the layers ``save_layers`` ``(m,)`` (sorted, at most
    ``max_layers``). The term owns ``R = I + dt V``, its powers and the value factor
    (``LayerTerm``, ``EulerTerm``); the clock ``(k, R^k)`` is shared by the batch. A
    system whose logits would leave the float range stops (its state is frozen) and is
    flagged; the loop ends early once every system has stopped. Reverse-mode
    differentiable (a checkpointed while loop). ``keys`` ``(b, 2)``: one key per system
    for a term that carries a state of its own (``NoisyTerm``: its Brownian path).

    Returns the saves ``(b, m, n, d)``, the carried ``R^k`` at each save ``(m, d, d)``,
    which saves each system reached ``(b, m)``, the final states, the layer where each
    stopped and whether it did."""
    setup = term.setup()
    step_batch = jax.vmap(
        lambda y, carry, clock: term.guarded_step(setup, clock, y, log_limit, carry),
        in_axes=(0, 0, None),
    )

    def body(state):
        y, carry, clock, stopped, k_stop = state
        k = clock[0]
        y_new, ok, carry = step_batch(y, carry, clock)
        newly = ~stopped & ~ok
        k_stop = jnp.where(newly, k, k_stop)
        stopped = stopped | ~ok
        y = jnp.where(stopped[:, None, None], y, y_new)
        if callback is not None:
            report = callback
            jax.lax.cond(
                (k + 1) % progress_every == 0,
                lambda: jax.debug.callback(report, k + 1),
                lambda: None,
            )
        return y, carry, term.tick(setup, clock), stopped, k_stop

    def advance(state, target):
        state = eqxi.while_loop(
            lambda s: (s[2][0] < target) & ~jnp.all(s[3]),
            body,
            state,
            max_steps=max(1, int(max_layers)),
            kind="checkpointed",
        )
        y, _, (_, Rk), stopped, _ = state
        return state, (y, Rk, ~stopped)

    b = y0.shape[0]
    clock0 = term.start(setup)
    carry0 = None if keys is None else jax.vmap(term.system_start)(keys)
    init = (y0, carry0, clock0, jnp.zeros((b,), bool), jnp.full((b,), -1, jnp.int32))
    final, (ys, Rks, reached) = jax.lax.scan(advance, init, save_layers)
    y_end, _, (k_end, _), stopped, k_stop = final
    k_stop = jnp.where(stopped, k_stop, k_end)
    # ys: (m, b, n, d) -> (b, m, n, d)
    return jnp.swapaxes(ys, 0, 1), Rks, jnp.swapaxes(reached, 0, 1), y_end, k_stop, stopped


_layer_loop_jit = eqx.filter_jit(layer_loop)


def _layer_rows(term, y0, save_layers, *, stacked: bool, **opts) -> tuple[Any, Any]:
    """The layer loop of a batch, system i with model i when ``stacked`` (a loop of one
    system per model); with one model, ``(rows, (R^k per device, layers reached))``."""
    if stacked:

        def one(tm, y):
            return layer_loop(tm, y[None], save_layers, **opts)

        ys, Rks, reached, y_end, k_stop, stopped = eqx.filter_vmap(one)(term, y0)
        # Rks: (b, m, d, d), one flow per model
        rows = (ys[:, 0], reached[:, 0], y_end[:, 0], k_stop[:, 0], stopped[:, 0])
        return (*rows, Rks), ()
    ys, Rks, reached, y_end, k_stop, stopped = layer_loop(term, y0, save_layers, **opts)
    # one R^k per device: the device whose loop ran furthest carries every save's
    return (ys, reached, y_end, k_stop, stopped), (Rks[None], jnp.max(k_stop)[None])


_layer_rows_jit = eqx.filter_jit(_layer_rows)


class _FixedStep(AbstractSolver):
    """A solver of fixed steps ``dt``, one per layer, through the layer loop."""

    dt: eqx.AbstractVar[float]
    ode: ClassVar[bool]

    def __check_init__(self):
        _checks.positive("dt", self.dt)

    @property
    def step_size(self) -> float | None:
        return float(self.dt)

    def discretisation(self) -> AbstractTime:
        """``Layers(dt)`` for the residual layers, ``Continuous()`` for a step of an ODE or
        an SDE (``ode``)."""
        return Continuous() if self.ode else Layers(float(self.dt))

    def plan(self, t1: float, ts: np.ndarray, *, chunk: Any = None, cost: Any = None) -> Any:
        if chunk is not None or cost is not None:
            raise ValueError(
                f"chunk and cost order the adaptive solves of a batch; method={self.name!r} "
                f"takes the same layers for every system (leave them None)."
            )
        layers = t1 / self.dt
        if not layers < 2**31:  # the loop counts layers in 32-bit integers
            raise ValueError(
                f"t1 / dt = {layers:.3g} layers is more than the loop can count (2^31); "
                f"choose a larger dt (or a smaller t1)."
            )
        n_layers = int(round(layers))
        if n_layers < 1 or abs(n_layers * self.dt - t1) > 1e-9 * max(1.0, t1):
            raise ValueError(
                f"t1 = {t1} is not a whole number of layers of dt = {self.dt}; choose t1 = k * dt."
            )
        save_layers = np.rint(np.asarray(ts, np.float64) / self.dt).astype(np.int64)
        if np.any(np.abs(save_layers * self.dt - ts) > 1e-9 * max(1.0, t1)):
            raise ValueError(f"ts must be multiples of dt = {self.dt} for method={self.name!r}.")
        return n_layers, save_layers

    def term(self, frame: Any, dtype: Any, noise: Any = None, t1: Any = None, n: int = 0) -> Any:
        """The layer-type term of the frame (``LayerTerm`` or ``EulerTerm``); with
        ``noise``, that term driven by it on ``[0, t1]`` for ``n`` tokens (``NoisyTerm``)."""
        base = layer_term(frame, self.dt, dtype, ode=self.ode)
        if noise is None:
            return base
        t1f = float(t1)
        return NoisyTerm(
            frame=base.frame,
            dt=base.dt,
            base=base,
            noise=noise.template(),
            level=jnp.asarray(noise.level(), dtype),
            t1=jnp.asarray(t1f, dtype),
            n_layers=jnp.asarray(int(round(t1f / self.dt)), jnp.int32),
            tol=jnp.asarray(brownian_tolerance(t1f, float(self.dt)), dtype),
            shape=noise.brownian_shape(int(n), frame.model.d),
            ode=self.ode,
            carries_flow=False,
        )

    def check_noise(self, noise: Any, frame: Any) -> None:
        if checked_noise(noise) is None:
            return
        if not frame.on_sphere or not (self.ode or frame.post_normalised):
            raise ValueError(
                "noise runs on the sphere: frame='sphere' with the post-layer-norm layers "
                "(layernorm='post', residual=True) or, with method='euler-maruyama', the SDE."
            )
        noise.check_model(frame.model)

    def info(self, plan: Any) -> dict:
        return {"method": self.name, "dt": float(self.dt), "layers": int(plan[0])}

    def integrate(
        self, frame: Any, y0: Array, ts: Array, t1: float, *, noise: Any = None
    ) -> Solution:
        n_layers, _ = self.plan(float(t1), np.zeros(0))
        self.check_noise(noise, frame)
        term = self.term(frame, y0.dtype, noise, t1, y0.shape[-2])
        save_layers = jnp.clip(jnp.round(ts / self.dt).astype(jnp.int32), 0, n_layers)
        ys, _, _, y_end, k_stop, stopped = layer_loop(
            term,
            y0[None],
            save_layers,
            log_limit=log_limit(y0.dtype),
            max_layers=n_layers,
            keys=None if noise is None else noise.key(0)[None],
        )
        code = jnp.where(stopped[0], Status.OVERFLOW.code, Status.OK.code)
        code = jnp.where(bad_times(ts, t1, self.dt), Status.FAILED.code, code)
        k = k_stop[0]
        return Solution(
            ts=ts,
            ys=ys[0],
            status=jnp.asarray(code, jnp.int32),
            t_stop=k.astype(y0.dtype) * term.dt,
            y_stop=y_end[0],
            num_steps=k,
            num_accepted_steps=k,
            num_rejected_steps=jnp.zeros((), jnp.int32),
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
        del chunk, cost  # refused by plan
        n_layers, save_layers = plan
        self.check_noise(noise, frame)
        term = self.term(frame, y0.dtype, noise, t1, y0.shape[-2])
        opts: dict[str, Any] = dict(log_limit=log_limit(y0.dtype), max_layers=n_layers)
        saves = put(save_layers, np.int32)
        if noise is not None:
            if devices is not None or stacked:
                raise ValueError(
                    "noise runs a batch of one model on one device: leave devices None "
                    "and give one unstacked model (attnflow.unstack(model, i))."
                )
            opts["keys"] = jax.vmap(noise.key)(jnp.arange(y0.shape[0]))
        if devices is None and not stacked:
            ys, Rks, reached, y_end, k_stop, stopped = _with_progress(
                term, y0, saves, n_layers, progress, opts
            )
        else:
            if stacked:  # one step per system, so that every leaf of the term is stacked
                term = eqx.tree_at(lambda t: t.dt, term, jnp.broadcast_to(term.dt, (y0.shape[0],)))
            rows: Any
            per_device: Any
            if devices is None:
                rows, per_device = _layer_rows_jit(term, y0, saves, stacked=stacked, **opts)
            else:
                rows, per_device = _devices.run_sharded(
                    _layer_rows, devices, term, y0, saves, batched_frame=stacked,
                    stacked=stacked, **opts,
                )  # fmt: skip
            if stacked:
                ys, reached, y_end, k_stop, stopped, Rks = rows
            else:
                ys, reached, y_end, k_stop, stopped = rows
                Rks_dev, k_far = per_device
                Rks = Rks_dev[int(np.argmax(np.asarray(k_far)))]
        k_stop = np.asarray(k_stop)
        return Run(
            ys=ys,
            reached=np.asarray(reached),
            t_stop=k_stop.astype(np.float64) * self.dt,
            y_stop=y_end,
            codes=np.where(np.asarray(stopped), Status.OVERFLOW.code, Status.OK.code),
            stats={
                "num_steps": k_stop,
                "num_accepted_steps": k_stop,
                "num_rejected_steps": np.zeros_like(k_stop),
                "n_layers": n_layers,
            },
            # standard coordinates: the frames are related by the R^k the loop used
            to_x=np.asarray(Rks) if term.carries_flow else None,
        )


def _with_progress(term, y0, saves, n_layers: int, progress: bool, opts: dict) -> Any:
    """The layer loop of one model on one device, with a progress bar of its layers.
    Without the bar and without noise keys, through ``attnflow._exported`` (a warm
    command reads the traced loop instead of tracing it)."""
    if not progress and "keys" not in opts:
        out = _exported.call(
            "layers", _layer_loop_jit, (term, y0, saves), dict(progress_every=0, **opts)
        )
        return jax.block_until_ready(out)
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
        out = _layer_loop_jit(
            term,
            y0,
            saves,
            progress_every=max(1, n_layers // 100) if progress else 0,
            callback=callback,
            **opts,
        )
        jax.block_until_ready(out)
    finally:
        if bar is not None:
            bar.n = n_layers
            bar.close()
    return out


class LayerSolver(_FixedStep):
    """Residual layers of step ``dt``, the discrete transformer: forward Euler in the
    original frame, the exactly rescaled layers ``z^k = (I + dt V)^{-k} x^k`` in the
    rescaled frame, the frame's own layer (its layer-norm placement) on the sphere."""

    dt: float = eqx.field(static=True, default=0.1)
    name: ClassVar[str] = "euler"
    ode: ClassVar[bool] = False

    def check_frame(self, frame: Any, dtype: Any) -> None:
        frame.check_layer_step(float(self.dt), dtype)


class EulerODESolver(_FixedStep):
    """Forward Euler of step ``dt`` on the frame's ODE, ``y <- y + dt field(t_k, y)``
    with ``t_k = k dt`` (the clustering paper's own scheme; ``method="euler-ode"``)."""

    dt: float = eqx.field(static=True, default=0.1)
    name: ClassVar[str] = "euler-ode"
    ode: ClassVar[bool] = True

    def check_noise(self, noise: Any, frame: Any) -> None:
        if noise is not None:
            raise ValueError(
                "noise with forward Euler on the SDE is method='euler-maruyama' "
                "(EulerMaruyamaSolver(dt)); method='euler-ode' is the deterministic step."
            )


class EulerMaruyamaSolver(_FixedStep):
    """Euler-Maruyama of step ``dt`` on the Ito SDE of a noise on the sphere
    (``method="euler-maruyama"``): ``y <- y + dt (field(y) - |y| c x) + |y| Proj_x(kick)``
    with the tokens ``x = N(y)`` (``terms.NoisyTerm``); it needs a noise object
    (``EulerODESolver`` is the same step without one)."""

    dt: float = eqx.field(static=True, default=0.1)
    name: ClassVar[str] = "euler-maruyama"
    ode: ClassVar[bool] = True

    def check_noise(self, noise: Any, frame: Any) -> None:
        if noise is None:
            raise ValueError(
                "method='euler-maruyama' integrates an SDE: give noise (Noise(sigma, seed) "
                "or TokenNoise(D, seed)); without noise, method='euler-ode' is the same step."
            )
        super().check_noise(noise, frame)
