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
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax.core as jax_core
import jax.numpy as jnp
from jaxtyping import ArrayLike, Float

from .. import _checks
from .._host import put
from . import _devices, _inputs
from ._inputs import check_ts, check_x0
from .base import AbstractModel
from .fields import choose_field
from .frames import FRAMES, LAYERNORMS, AbstractFrame, frame_maker
from .noise import check_noise
from .noise import record as noise_record
from .propagator import fresh
from .solvers import (
    FIXED,
    ICOEFF,
    MAX_STEPS_LIMIT,
    PCOEFF,
    SOLVERS,
    AbstractSolver,
    LayerSolver,
    make_solver,
)
from .trajectory import Trajectory

__all__ = ["simulate", "SOLVERS", "MAX_STEPS_LIMIT", "FIXED", "FRAMES", "PCOEFF", "ICOEFF"]


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
    solver: AbstractSolver | None = None,
    noise: Any = None,
    field: str = "auto",
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
            ``AdaptiveSolver(rtol, atol, max_steps, method)``, ``LayerSolver(dt)``
            (``method="euler"``), ``EulerODESolver(dt)`` (``method="euler-ode"``) or
            ``EulerMaruyamaSolver(dt)`` (``method="euler-maruyama"``, with noise).
            The keywords are spellings of these objects (``make_solver``). Passing both
            a solver and any of those keywords is a ``ValueError``.
        noise: a noise object on the sphere (``frame="sphere"``): ``dynamics.Noise(sigma,
            seed)``, random value matrices of one head (``attnflow.dynamics.stochastic``),
            or ``dynamics.TokenNoise(D, seed)``, independent ``sqrt(2 D) dW_i`` on every
            token; ``method="euler"`` the stochastic post-layer-norm layers,
            ``"euler-maruyama"`` their SDE (``attnflow.dynamics.noise``). System ``i``
            of a batch follows the path of key ``fold_in(PRNGKey(seed), i)``; recorded in
            ``traj.solver["noise"]``.
        field: how the sphere frame in the plane evaluates the field: ``"auto"`` (the
            exact O(n K) Fourier field of ``attnflow.dynamics.fields.circle`` where it
            applies and its error bound is below 1e-9, else the model's own dense or
            tiled field), ``"circle"`` (asked for: a ``ValueError`` says why it does not
            apply) or ``"dense"``. The choice is recorded in ``traj.solver["field"]``.

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
        _check_noise_door(noise, frame, method, solver, dt, devices, shard)
        adaptive = _given(rtol=rtol, atol=atol, max_steps=max_steps)
        if adaptive:
            raise ValueError(
                f"{', '.join(adaptive)} set the adaptive solver's steps; a noisy run takes "
                f"fixed steps dt (leave them at their defaults)."
            )
    # the solver as an object: the keywords are its spellings
    solver = _solver_of(solver, method, dt, rtol, atol, max_steps)
    _inputs.check_flags(residual=residual, progress=progress)
    is_layers = isinstance(solver, LayerSolver)
    if layernorm is not None:
        _checks.choice("layernorm", layernorm, LAYERNORMS)
        if frame != "sphere" or not is_layers:
            raise ValueError(
                f"layernorm={layernorm!r} places the layer normalisation of the "
                f"discrete sphere frame: it needs frame='sphere' and method='euler'; "
                f"got frame={frame!r}, method={solver.name!r}."
            )
    ln = "post" if layernorm is None else layernorm
    if not residual and (not is_layers or frame not in ("original", "sphere")):
        raise ValueError(
            f"residual=False (layers without the skip connection) needs method='euler' and "
            f"frame='original' (or 'sphere': x <- N(P(x)), pure attention with layer "
            f"norm); got method={solver.name!r}, frame={frame!r}."
        )
    frame_of = frame_maker(frame, ln, t1=t1, dt=solver.step_size, residual=residual)
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
    field_info: dict = {}
    if frame == "sphere":
        _checks.choice("field", field, ("auto", "circle", "dense"))
        if stacked or shard == "tokens" or ln == "scaled":
            if field == "circle":
                raise ValueError(
                    "field='circle' serves one unstacked model on unit tokens: not stacked "
                    "weights, shard='tokens' or layernorm='scaled'."
                )
            field_info = {"field": "dense"}
        else:
            prefer = field if noise is None else noise.field_preference(field)
            fast, field_info = choose_field(model, int(x0.shape[-2]), prefer=prefer)
            if fast is not model:
                fr = frame_of(fast)
    elif field != "auto":
        _checks.choice("field", field, ("auto", "dense"))
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
    t1f = _checks.positive("t1", t1)
    ts_np = check_ts(ts, t1f)
    plan = solver.plan(t1f, ts_np, chunk=chunk, cost=cost)
    dtype = model.dtype
    solver.check_frame(fr, dtype)
    solver.check_noise(noise, fr)
    _checks.warn_float64_cast(x0)
    x0j = put(x0 if batched else x0[None], dtype)
    # At t = 0 every frame's state is the tokens' (normalised on the sphere).
    if stacked:
        y0 = eqx.filter_vmap(lambda f, x: f.initial_state(x))(fr, x0j)
    else:
        y0 = fr.initial_state(x0j)

    run = solver.run(
        fr,
        y0,
        ts_np,
        t1f,
        plan,
        devices=solve_devs,
        stacked=stacked,
        chunk=chunk,
        cost=cost,
        progress=bool(progress),
        noise=noise,
    )
    solver_info = solver.info(plan)
    if is_layers:
        solver_info.update(fr.settings())
    if not residual:
        solver_info["residual"] = False
    solver_info.update(field_info)
    if noise is not None:
        step = solver.step_size
        assert step is not None  # the noisy solvers have fixed steps
        solver_info["noise"] = noise_record(noise, t1f, step)
    if devs is not None:
        solver_info["devices"] = _devices.device_ids(devs)
        solver_info["shard"] = shard

    traj = Trajectory._from_solve(
        model=model,
        frame=frame,
        coords=fr.coords,
        ts_requested=ts_np,
        ys=run.ys,
        reached=run.reached,
        t_stop=run.t_stop,
        y_stop=run.y_stop,
        codes=run.codes,
        stats=run.stats,
        batched=batched,
        to_x=run.to_x,
        solver=solver_info,
        t1=t1f,
        x0=x0j if batched else put(x0, dtype),
        discretisation=solver.discretisation(),
        frame_object=fr,
    )
    return dataclasses.replace(traj, wall_seconds=time.perf_counter() - started)


def _check_noise_door(
    noise: Any, frame: str, method: str, solver: Any, dt: Any, devices: Any, shard: str
) -> None:
    """The door's checks of a noisy run, each naming its argument (the solver's
    ``check_noise`` then checks the frame and the model)."""
    check_noise(noise)
    if frame != "sphere":
        raise ValueError(
            f"noise puts the tokens on the sphere (layer-normalised stochastic layers): "
            f"pass frame='sphere'; got frame={frame!r}."
        )
    if solver is None and method not in ("euler", "euler-maruyama"):
        raise ValueError(
            f"with noise, method is 'euler' (the stochastic layers) or 'euler-maruyama' "
            f"(the limit SDE); got method={method!r}."
        )
    if solver is None and dt is None:
        raise ValueError(f"dt is required with noise: the step of method={method!r}.")
    if devices is not None or shard != "batch":
        raise ValueError(
            "devices and shard cannot be combined with noise: a noisy batch runs on one "
            "device (each system with its own Brownian path)."
        )


# simulate's defaults of the keywords that spell a solver
_SOLVER_DEFAULTS: dict[str, Any] = dict(
    method="adaptive", dt=None, rtol=1e-6, atol=1e-9, max_steps=100_000
)


def _given(**values: Any) -> list[str]:
    """The names of the solver keywords in ``values`` set away from their defaults."""
    return [
        name
        for name, value in values.items()
        if value is not _SOLVER_DEFAULTS[name] and value != _SOLVER_DEFAULTS[name]
    ]


def _solver_of(
    solver: Any, method: Any, dt: Any, rtol: Any, atol: Any, max_steps: Any
) -> AbstractSolver:
    """The solver object: ``solver`` itself (the keywords left at their defaults), or the
    one the keywords spell (``make_solver``)."""
    if solver is None:
        return make_solver(method, dt, rtol, atol, max_steps)
    given = _given(method=method, dt=dt, rtol=rtol, atol=atol, max_steps=max_steps)
    if given:
        raise ValueError(
            f"solver={solver!r} already fixes the solve; leave {', '.join(given)} at the "
            f"default (set them on the solver object) or drop solver."
        )
    if not isinstance(solver, AbstractSolver):
        raise ValueError(
            f"solver must be an attnflow solver object (AdaptiveSolver, LayerSolver, "
            f"EulerODESolver, EulerMaruyamaSolver) or None (method and its keywords); got "
            f"{type(solver).__name__}."
        )
    return solver
