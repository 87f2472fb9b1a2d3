"""The staircase of metastability: unit-speed steps of a model's flow on the circle, with
the merges that large beta makes numerically exact.

Contract. Geshkovski, Koubbi, Polyanskiy and Rigollet (2024, "Dynamic metastability in
the self-attention model"; their code HugoKoubbi/2024-transformers-dotm) follow USA on the
circle at beta from 500 to 4000 with time rescaled: each step moves the tokens a fixed
distance along the flow's direction, ``theta <- theta + lr log(beta) g / |g|``, so the
long plateaus near saddles (metastable states, which last like ``e^{c beta}``) take the
same time as the fast merges between them; the energy then climbs a staircase.
``staircase`` takes the same step for tokens ``x_i = (cos theta_i, sin theta_i)`` and
a model with ``V = I``:

    omega_i = sum_j P_ij sin(theta_j - theta_i),
    theta <- theta + ds * speed * omega / |omega|,

``P = model.attention(x)`` the model's own weights and ``omega_i`` the angular velocity
of the flow on the circle, ``<J x_i, sum_j P_ij x_j>``, summed term by term: a token
contributes exactly 0 to its own velocity and to that of a token at the same angle.
(Summed after the weights, as the sphere frame's field is, the self terms leave a
rounding residue of about ``1e-16``, while the pull between clusters at beta = 4000 is
far below it: the direction would be noise.) When ``|omega| < merge_below`` (a critical
point of the flow: the end of a merge), tokens closer than ``merge_angle`` are given
the same angle (that of the lowest-indexed one they are close to), as the authors do;
then they move together for ever. Rescaled time ``s`` counts ``ds`` per step (the
authors' ``lr``). The energy to read along it is
``attnflow.analysis.interaction_energy(x, beta, shifted=True)``, ``sum_c m_c^2 / n^2``
for clusters of ``m_c`` tokens far apart.

USA at beta in the thousands needs ``kernels.USA(shift=beta)`` (weights
``e^{beta(<x_i, x_j> - 1)} / n``, finite); the unit-speed direction does not depend on
that scale.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int

from .. import _checks
from ..dynamics.base import AbstractAttentionSystem, AbstractModel
from ..dynamics.frames import Sphere

__all__ = ["Staircase", "staircase", "authors_start"]


class Staircase(NamedTuple):
    """A unit-speed run: rescaled times ``s`` ``(m,)``, tokens ``x`` ``(m, n, 2)`` on the
    circle, ``distinct`` tokens (after merges) ``(m,)`` and the speed ``|omega|`` of the
    flow at each record ``(m,)``."""

    s: Float[np.ndarray, " m"]
    x: Float[np.ndarray, "m n 2"]
    distinct: Int[np.ndarray, " m"]
    flow_speed: Float[np.ndarray, " m"]


def authors_start(beta: float) -> Float[np.ndarray, "5 2"]:
    """The five tokens on the circle of the authors' staircase at ``beta``: angles
    ``0.5 (0, 0.5, 2, 4, 7) log(beta) / sqrt(beta)`` (mod pi).

    Examples:
        >>> from attnflow.studies.staircase import authors_start
        >>> authors_start(1000.0).round(3)[:2].tolist()
        [[1.0, 0.0], [0.999, 0.055]]
    """
    b = _checks.positive("beta", beta)
    theta = 0.5 * np.mod(np.array([0.0, 0.5, 2.0, 4.0, 7.0]) * math.log(b) / math.sqrt(b), math.pi)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def staircase(
    model: AbstractModel,
    x0: Float[Any, "n d"],
    *,
    ds: float,
    steps: int,
    speed: float = 1.0,
    record_every: int = 100,
    merge_below: float = 0.0,
    merge_angle: float = 0.0,
) -> Staircase:
    """Unit-speed steps of ``model``'s flow on the circle, with merges (module docstring).

    Args:
        model: a one-head model on ``d = 2`` with ``V = I`` whose weights are finite at
            the tokens (for USA at large beta, ``kernels.USA(shift=beta)``).
        x0: ``(n, 2)`` nonzero tokens (their angles are what moves).
        ds: rescaled time per step (the authors' ``lr``), > 0.
        steps: the number of steps, a multiple of ``record_every``.
        speed: the distance moved per unit of rescaled time (the authors: ``log beta``).
        record_every: steps between records.
        merge_below: merge only where ``|P|_F`` is below this (0: never merge).
        merge_angle: tokens closer than this angle (radians) are merged, >= 0.

    Returns:
        A ``Staircase`` with ``steps / record_every + 1`` records (the start first).

    Examples:
        >>> import jax, numpy as np
        >>> jax.config.update("jax_enable_x64", True)
        >>> import attnflow as af
        >>> from attnflow.studies.staircase import authors_start, staircase
        >>> beta = 500.0
        >>> model = af.IsotropicAttention(2, beta=beta, kernel=af.kernels.USA(shift=beta))
        >>> run = staircase(model, authors_start(beta), ds=1e-4, steps=2000, speed=np.log(beta))
        >>> energy = af.interaction_energy(run.x, beta, shifted=True)
        >>> run.x.shape, bool(np.all(np.diff(energy) > -1e-12))
        ((21, 5, 2), True)
    """
    if not isinstance(model, AbstractModel):
        raise ValueError(f"model must be an attnflow model; got {type(model).__name__}.")
    x = np.asarray(_checks.real_array("x0", x0, ndim=2, shape_hint="(n, d)"), np.float64)
    if x.shape[-1] != model.d:
        raise ValueError(f"x0 has tokens of dimension {x.shape[-1]}; the model's is {model.d}.")
    ds = _checks.positive("ds", ds)
    speed = _checks.positive("speed", speed)
    record_every = _checks.integer("record_every", record_every, lo=1)
    steps = _checks.integer("steps", steps, lo=record_every)
    if steps % record_every:
        raise ValueError(f"steps = {steps} must be a multiple of record_every = {record_every}.")
    merge_below = _checks.positive("merge_below", merge_below, allow_zero=True)
    merge_angle = _checks.number("merge_angle", merge_angle, lo=0.0, hi=math.pi)
    head = model if isinstance(model, AbstractAttentionSystem) else None
    V = head.value_matrix() if head is not None and model.stack_size is None else None
    if x.shape[-1] != 2 or V is None or not np.array_equal(np.asarray(V), np.eye(2)):
        raise ValueError(
            "staircase follows tokens on the circle under a head with V = I (the "
            "metastability paper's model): give x0 of shape (n, 2) and a one-head model with "
            "V = I, e.g. IsotropicAttention(2, beta=beta, kernel=kernels.USA(shift=beta))."
        )
    assert head is not None
    Sphere(head).check_tokens(x)
    dtype = model.dtype
    h = jnp.asarray(ds * speed, dtype)
    below = jnp.asarray(merge_below, dtype)
    eps = jnp.asarray(merge_angle, dtype)

    def tokens(theta):
        return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)

    def velocity(theta):
        P = head.attention(tokens(theta))  # the model's own weights
        omega = jnp.sum(P * jnp.sin(theta[None, :] - theta[:, None]), axis=1)
        return omega, jnp.sqrt(jnp.sum(omega * omega))

    def merge(theta):
        diff = theta[:, None] - theta[None, :]
        gap = jnp.abs(jnp.arctan2(jnp.sin(diff), jnp.cos(diff)))  # on the circle
        first = jnp.argmax(gap < eps, axis=1)  # the lowest index within the angle
        return theta[first]

    def step(_, theta):
        omega, norm = velocity(theta)
        theta = theta + h * omega / jnp.where(norm > 0, norm, 1.0)
        return jax.lax.cond((merge_below > 0) & (norm < below), merge, lambda t: t, theta)

    def record(theta, _):
        theta = jax.lax.fori_loop(0, record_every, step, theta)
        return theta, (theta, velocity(theta)[1])

    @jax.jit
    def run(theta0):
        _, (thetas, speeds) = jax.lax.scan(record, theta0, None, length=steps // record_every)
        return thetas, speeds

    theta0 = jnp.asarray(np.arctan2(x[:, 1], x[:, 0]), dtype)
    thetas, speeds = run(theta0)
    th = np.concatenate([np.asarray(theta0)[None], np.asarray(thetas)], axis=0)
    th = th.astype(np.float64)
    flow_speed = np.concatenate([[float(velocity(theta0)[1])], np.asarray(speeds, np.float64)])
    if not (np.all(np.isfinite(th)) and np.all(np.isfinite(flow_speed))):
        raise FloatingPointError(
            "the staircase run left the finite numbers (the model's weights overflowed): "
            "for USA at large beta use kernels.USA(shift=beta)."
        )
    xs = np.stack([np.cos(th), np.sin(th)], axis=-1)
    distinct = np.array([len(np.unique(t)) for t in th], np.int64)
    s = ds * record_every * np.arange(xs.shape[0], dtype=np.float64)
    return Staircase(s=s, x=xs, distinct=distinct, flow_speed=flow_speed)
