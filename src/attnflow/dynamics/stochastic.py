"""Stochastic transformers: random value matrices in the diffusion scaling.

Fedorov, Sander, Elie, Marion and Lauriere (2026), "Clustering in deep stochastic
transformers" (arXiv 2601.21942), let the value matrices of a deep layer-normalised
transformer be random, as at initialisation, and scale them so that the depth limit is a
diffusion. This module simulates that model in attnflow's conventions. The contract
below is our own derivation in those conventions, not a transcription of the paper.

Contract
--------
Tokens ``x_i`` on ``S^{d-1}``, one attention head of the model with value matrix ``V``,
its attention weights ``P`` (read from the model: ``model.attend``), the attention
average ``m_i = sum_j P_ij x_j`` and the model's field ``F_i = sum_j P_ij V x_j``
(``model.value_map(m)``). ``W`` is a ``d x d`` matrix Brownian motion whose entries are
independent with variance ``t / d`` (the usual ``1/d`` initialisation scale), one
``W`` for all tokens; ``dW_k`` is its increment over layer ``k``; ``N(u) = u / |u|``;
``Proj_x y = y - <x, y> x``.

Layers (``method="layers"``), one per step ``dt``::

    x_i <- N(x_i + dt F_i(x) + sigma dW_k m_i(x))

that is a post-layer-norm layer of value matrix ``V + sigma dW_k / dt``. With
``sigma = 0`` it is the deterministic layer of ``simulate(..., frame="sphere",
method="euler")`` (``layernorm="post"``), to rounding.

Their limit ``dt -> 0``, the Ito SDE on the sphere::

    dx_i = Proj_{x_i}(F_i) dt + sigma Proj_{x_i}(dW m_i) - c sigma^2 |m_i|^2 x_i dt,
    c = (d - 1) / (2 d).

Derivation: for ``|x| = 1``, ``N(x + D) = x + D - <x,D> x - <x,D> D - |D|^2 x / 2 +
3 <x,D>^2 x / 2 + O(|D|^3)``. With ``D = dt F + sigma dW m`` the second-order terms are
those of ``xi = sigma dW m``, whose covariance is ``E[xi xi^T] = sigma^2 |m|^2 I dt / d``;
replacing ``xi xi^T`` by it (Ito) gives ``-<x,xi> xi -> -sigma^2 |m|^2 x dt / d``,
``|xi|^2 -> sigma^2 |m|^2 dt`` and ``<x,xi>^2 -> sigma^2 |m|^2 dt / d``, which sum to
``-c sigma^2 |m|^2 x dt``. The same term is what keeps ``|x_i| = 1``: by Ito,
``d|x|^2 = 2 <x, dx> + |dx|^2 = -2 c sigma^2 |m|^2 dt + sigma^2 |m|^2 (d - 1) dt / d = 0``.

Euler-Maruyama (``method="euler-maruyama"``): diffrax's ``Euler`` on
``MultiTerm(ODETerm(drift), noise)``, the noise a diffrax term of its own that applies
the diffusion to the Brownian increment (``dB -> ...``: an ``(n, d) x (d, d)`` product, no
``(n, d, d, d)`` array), at fixed steps ``dt`` (``ConstantStepSize``). As the sphere frame
does, the solver holds a free state ``y`` with tokens ``x = N(y)`` and integrates
``dy_i = |y_i| dX_i(N(y))``, ``dX_i`` the SDE above: then ``|y_i|`` is conserved by the SDE
(``d|y|^2 = |y|^2 (2 <x, dX> + |dX|^2) = 0``) and ``N(y)`` solves it, while one Euler step
gives exactly ``N(y_{k+1}) = N(x_k + dX_k(x_k))``, the Euler-Maruyama step projected back
to the sphere. Both schemes keep ``|x_i| = 1`` to rounding; both converge to the SDE
with strong order 1/2 (the noise does not commute).

The Brownian path. ``W = B / sqrt(d)``, ``B`` a standard ``(d, d)`` Brownian motion, the
``diffrax.VirtualBrownianTree`` on ``[0, t1]`` of key
``jax.random.fold_in(jax.random.PRNGKey(seed), i)`` for system ``i`` of a batch (one
system is system 0), with tolerance ``t1 2^-depth``, ``depth = ceil(log2(t1 / dt)) + 1``
(at most ``dt / 2``). Both methods read it at the same times ``t_k``, those of diffrax's
``ConstantStepSize`` with ``dt0 = t1 / N`` for ``N = t1 / dt`` layers (``t_k = t1 k / N``,
``k dt`` to rounding): Euler-Maruyama through ``B.evaluate(t_k, t_{k+1})``, the layers
as ``B(t_{k+1}) - B(t_k)`` with ``B(t_k)`` carried from the layer before (one descent of
the tree per layer instead of two; the same increment to rounding). So layers and SDE
compare path by path. The tree's values at the dyadic times ``t1 j 2^-l`` do not depend on
its depth (once it reaches level ``l``): runs with the same seed and ``t1``, and
``t1 / dt`` a power of two, see the same path at every step of the coarser run (exactly
to rounding when ``t1`` is a power of two, as in the strong-convergence checks; for other
``t1`` the times' own rounding can shift the path by about ``1e-8``).

A model that is not one attention head with one value matrix (multi-head, a block,
stacked weights, a gate) is refused by name: the contract needs ``m`` and ``F = m V^T``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .. import _checks
from ._inputs import check_ts, check_x0
from .base import AbstractAttentionSystem, AbstractModel
from .frames import Sphere, normalize_rows
from .status import Status
from .terms import Continuous, Layers
from .trajectory import Trajectory

__all__ = [
    "METHODS",
    "MAX_SEED",
    "Noise",
    "noisy_layer",
    "simulate_noisy",
    "simulate_with_noise",
    "tree_depth",
]

# the schemes of ``simulate_noisy``
METHODS = ("layers", "euler-maruyama")
# seeds are what ``jax.random.PRNGKey`` takes with x64 on or off
MAX_SEED = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Noise:
    """The noise of a stochastic transformer: its scale and the seed of its path.

    Args:
        sigma: the scale ``sigma`` of the random value matrices, ``V + sigma dW / dt`` in
            a layer of step ``dt`` (``dW`` of entries of variance ``dt / d``); finite,
            ``>= 0``. ``0`` is the deterministic model.
        seed: the seed of the Brownian path, an integer in ``[0, MAX_SEED]``; system ``i``
            of a batch has the key ``fold_in(PRNGKey(seed), i)``.

    Invalid input raises ``ValueError`` naming the argument.

    Example:
        >>> Noise(0.5, seed=3)
        Noise(sigma=0.5, seed=3)
    """

    sigma: float
    seed: int = 0

    def __post_init__(self) -> None:
        sigma = _checks.number("sigma", self.sigma, lo=0.0)
        if isinstance(self.seed, (bool, np.bool_)) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(
                f"seed must be an integer in [0, {MAX_SEED}]; got {self.seed!r} "
                f"({type(self.seed).__name__})."
            )
        seed = _checks.integer("seed", self.seed, lo=0, hi=MAX_SEED)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "seed", seed)

    def key(self, system: Any = 0) -> Array:
        """The key of system ``system``'s path (an integer, or an integer array inside
        ``jax.vmap``): ``fold_in(PRNGKey(seed), system)``."""
        return jax.random.fold_in(jax.random.PRNGKey(self.seed), system)

    def path(
        self, t1: float, d: int, dt: float, *, system: int = 0, dtype: Any = None
    ) -> diffrax.VirtualBrownianTree:
        """The standard ``(d, d)`` Brownian motion ``B`` of system ``system`` on
        ``[0, t1]`` for steps ``dt`` (``W = B / sqrt(d)``; see the module docstring).

        Example:
            >>> B = Noise(1.0, seed=0).path(1.0, 3, 0.125)
            >>> B.evaluate(0.0, 0.125).shape
            (3, 3)
        """
        t1f = _checks.positive("t1", t1)
        dtf = _checks.positive("dt", dt)
        d = _checks.integer("d", d, lo=1)
        dtype = jnp.zeros((), dtype).dtype  # None: the default float
        tol = t1f * 2.0 ** -tree_depth(t1f, dtf)
        return _tree(self.key(system), jnp.asarray(t1f, dtype), jnp.asarray(tol, dtype), d)

    def describe(self) -> dict:
        """What a saved run records of the noise (JSON-ready)."""
        return {"sigma": self.sigma, "seed": self.seed}


def tree_depth(t1: float, dt: float) -> int:
    """The depth of the Brownian tree of a run: ``ceil(log2(t1 / dt)) + 1``, so that its
    tolerance ``t1 2^-depth`` is at most ``dt / 2`` (at least 1)."""
    return max(1, math.ceil(math.log2(t1 / dt) - 1e-9) + 1)


def _tree(key: Array, t1: Array, tol: Array, d: int) -> diffrax.VirtualBrownianTree:
    """The standard ``(d, d)`` Brownian motion on ``[0, t1]`` of ``key`` (dtype of ``t1``)."""
    shape = jax.ShapeDtypeStruct((d, d), t1.dtype)
    return diffrax.VirtualBrownianTree(jnp.zeros_like(t1), t1, tol, shape, key)


def _tangent(x: Array, v: Array) -> Array:
    """``Proj_{x_i} v_i = v_i - <x_i, v_i> x_i`` row by row."""
    return v - jnp.sum(x * v, axis=-1, keepdims=True) * x


def noisy_layer(
    model: AbstractAttentionSystem,
    x: Float[ArrayLike, "n d"],
    dt: Any,
    *,
    sigma: Any,
    dW: Float[ArrayLike, "d d"],
) -> Float[Array, "n d"]:
    """One stochastic layer: ``x_i <- N(x_i + dt F_i(x) + sigma dW m_i(x))``.

    Args:
        model: one attention head (``m = model.attend(x, x)``, ``F = model.value_map``).
        x: the tokens, on the sphere.
        dt: the layer step.
        sigma: the noise scale.
        dW: the increment of ``W`` over the layer (entries of variance ``dt / d``).

    Returns:
        The tokens after the layer, on the sphere. With ``sigma = 0`` it is the sphere
        frame's ``N(model.layer(x, dt))`` (the noise term adds an exact zero).
    """
    x, dW = jnp.asarray(x, model.dtype), jnp.asarray(dW, model.dtype)
    m = model.attend(x, x)
    u = x + model.value_map(dt * m)
    return normalize_rows(u + sigma * (m @ dW.T))


class _CommonNoise(diffrax.AbstractTerm):
    """The diffusion of the free state ``y``: ``dB -> |y_i| sigma Proj_{x_i}(m_i dB^T) /
    sqrt(d)`` for the standard ``(d, d)`` Brownian motion ``B`` of ``path``. ``vf`` is the
    map's data ``(gain, x, m)`` and ``prod`` applies it to an increment: an
    ``(n, d) x (d, d)`` product, no ``(n, d, d, d)`` array. ``average`` (``m`` of the
    tokens) is held as a function, not the model: the solver then sees no complex leaf of
    the model (its eigendecomposition) and does not warn about complex states."""

    average: Any = eqx.field(static=True)
    sigma: Array
    path: Any
    scale: float = eqx.field(static=True)

    def vf(self, t: Any, y: Array, args: Any) -> tuple[Array, Array, Array]:
        del t, args
        r = jnp.linalg.norm(y, axis=-1, keepdims=True)
        x = normalize_rows(y)
        return r * (self.sigma * self.scale), x, self.average(x)

    def contr(self, t0: Any, t1: Any, **kwargs: Any) -> Array:
        return self.path.evaluate(t0, t1, **kwargs)

    def prod(self, vf: tuple[Array, Array, Array], control: Array) -> Array:
        gain, x, m = vf
        return gain * _tangent(x, m @ control.T)


def _em_terms(model: AbstractAttentionSystem, sigma: Array, path: Any) -> diffrax.MultiTerm:
    """The drift and diffusion of the free state ``y`` (tokens ``N(y)``)."""
    d = model.d
    c = (d - 1) / (2 * d)
    scale = 1.0 / math.sqrt(d)  # W = B / sqrt(d)

    def parts(y):
        r = jnp.linalg.norm(y, axis=-1, keepdims=True)
        x = normalize_rows(y)
        return r, x, model.attend(x, x)

    def drift(t, y, args):
        del t, args
        r, x, m = parts(y)
        F = model.value_map(m)
        corr = c * sigma**2 * jnp.sum(m * m, axis=-1, keepdims=True)
        return r * (_tangent(x, F) - corr * x)

    noise = _CommonNoise(average=lambda x: model.attend(x, x), sigma=sigma, path=path, scale=scale)
    return diffrax.MultiTerm(diffrax.ODETerm(drift), noise)


def _times(k: Array, n_layers: Array, h: Array, t1: Array) -> Array:
    """The step times ``t_k`` of diffrax's ``ConstantStepSize`` (0.7) on ``[0, t1]`` with
    ``dt0 = h = t1 / n_layers``: ``h`` after one step, ``t1 (k / n_layers)`` after ``k``,
    ``t1`` after the last. The layers read the path at the same times."""
    ratio = k.astype(t1.dtype) / n_layers.astype(t1.dtype)
    t = jnp.where(k == 1, h, t1 * ratio)
    t = jnp.where(k == n_layers, t1, t)
    return jnp.where(k == 0, jnp.zeros_like(t1), t)


@eqx.filter_jit
def _run(model, sigma, dt, t1, n_layers, tol, y0, keys, save_idx, *, method: str):
    """Every system of ``y0`` ``(b, n, d)`` with its own key: the states after the layers
    ``save_idx`` ``(b, m, n, d)``, a status code and the number of steps per system.
    The step count, times and tolerance are traced: a new ``dt`` does not recompile."""
    d = y0.shape[-1]
    h = t1 / n_layers.astype(t1.dtype)

    def one_layers(y, key):
        path = _tree(key, t1, tol, d)
        scale = 1.0 / math.sqrt(d)

        def body(k, carry):
            # B(t_{k+1}) - B(t_k), B(t_k) carried: one tree descent per layer where
            # path.evaluate(t_k, t_{k+1}) takes two (the same increment to rounding)
            x, B_k = carry
            B_next = path.evaluate(_times(k + 1, n_layers, h, t1))
            x = noisy_layer(model, x, dt, sigma=sigma, dW=(B_next - B_k) * scale)
            return x, B_next

        def segment(carry, target):
            x, B_k, k = carry
            x, B_k = jax.lax.fori_loop(k, target, body, (x, B_k))
            return (x, B_k, target), x

        start = (y, jnp.zeros((d, d), y.dtype), jnp.zeros_like(n_layers))
        _, ys = jax.lax.scan(segment, start, save_idx)
        return ys, jnp.asarray(Status.OK.code, jnp.int32), n_layers

    def one_em(y, key):
        sol = diffrax.diffeqsolve(
            _em_terms(model, sigma, _tree(key, t1, tol, d)),
            diffrax.Euler(),
            t0=jnp.zeros_like(t1),
            t1=t1,
            dt0=h,
            y0=y,
            saveat=diffrax.SaveAt(ts=_times(save_idx, n_layers, h, t1)),
            stepsize_controller=diffrax.ConstantStepSize(),
            max_steps=None,
            throw=False,
        )
        steps = sol.stats["num_steps"]
        ok = (sol.result == diffrax.RESULTS.successful) & (steps == n_layers)
        code = jnp.where(ok, Status.OK.code, Status.FAILED.code).astype(jnp.int32)
        assert sol.ys is not None
        return sol.ys, code, steps

    return jax.vmap(one_layers if method == "layers" else one_em)(y0, keys)


def _check_head(model: Any) -> AbstractAttentionSystem:
    """``model`` if it is one attention head with one value matrix, else ``ValueError``."""
    if not isinstance(model, AbstractModel):
        raise ValueError(
            f"model must be an attnflow model, one attention head such as "
            f"attnflow.Attention; got {type(model).__name__}."
        )
    if model.stack_size is not None:
        raise ValueError(
            f"model has stacked weights ({model.stack_size} heads along a batch axis); "
            f"simulate_noisy takes one attention head: pass attnflow.unstack(model, i)."
        )
    if not isinstance(model, AbstractAttentionSystem) or model.num_heads != 1:
        heads = model.num_heads
        parts = [f"{heads} head{'s' if heads != 1 else ''}"]
        if heads >= 1 and not model.pure_attention:
            parts.append("a feed-forward term")
        if model.beyond_attention:
            parts.append(model.beyond_attention)
        hint = "; model.head(h) is head h alone" if heads >= 1 else ""
        raise ValueError(
            f"model must be one attention head with a value matrix (attnflow.Attention, "
            f"IsotropicAttention): the noise is a random value matrix, V + sigma dW / dt, "
            f"of one head; got {type(model).__name__} ({', '.join(parts)}){hint}."
        )
    if model.value_matrix() is None:
        raise ValueError(
            f"model ({type(model).__name__}) has no value matrix (value_matrix() is "
            f"None): the noise is a random value matrix, V + sigma dW / dt."
        )
    return model


def simulate_noisy(
    model: AbstractAttentionSystem,
    x0: Float[ArrayLike, "*b n d"],
    t1: float,
    *,
    noise: Noise,
    dt: float,
    ts: Float[ArrayLike, " m"] | None = None,
    method: str = "layers",
) -> Trajectory:
    """The stochastic transformer on the sphere from ``x0`` to ``t1`` (see the module
    docstring for the layers, the SDE and the Brownian path).

    Args:
        model: one attention head with a value matrix (``attnflow.Attention``,
            ``IsotropicAttention``, any kernel and mask).
        x0: initial tokens ``(n, d)``, or a batch ``(b, n, d)`` of systems, each with its
            own Brownian path (system ``i``: key ``fold_in(PRNGKey(seed), i)``). Every
            row is put on the sphere; a zero row is a ``ValueError``.
        t1: final time, a whole number of steps ``dt``.
        noise: ``Noise(sigma, seed)``.
        dt: the layer step (``method="layers"``) or the Euler-Maruyama step.
        ts: sorted save times in ``[0, t1]``, multiples of ``dt``; default ``[0, t1]``.
        method: ``"layers"``: ``x_i <- N(x_i + dt F_i + sigma dW_k m_i)``;
            ``"euler-maruyama"``: diffrax's Euler on the Ito SDE.

    Returns:
        A ``Trajectory`` in the frame ``"sphere"``: ``traj.x`` the tokens at ``ts``;
        ``traj.solver`` records the method, ``dt``, the number of layers and the noise
        (sigma, seed, the tree's depth and tolerance), which ``traj.save`` writes. A
        system whose state is not finite is flagged ``"nonfinite"``, never hidden.

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> from attnflow.dynamics import Noise, simulate_noisy
        >>> jax.config.update("jax_enable_x64", True)
        >>> model = af.IsotropicAttention(3, beta=1.0)
        >>> x0 = np.random.default_rng(0).normal(size=(8, 3))
        >>> traj = simulate_noisy(model, x0, 1.0, noise=Noise(0.5, seed=0), dt=0.125)
        >>> recorded = traj.solver["noise"]
        >>> traj.x.shape, recorded["seed"]
        ((2, 8, 3), 0)
    """
    started = time.perf_counter()
    head = _check_head(model)
    if not isinstance(noise, Noise):
        raise ValueError(
            f"noise must be attnflow.dynamics.Noise(sigma, seed); got {type(noise).__name__}."
        )
    _checks.choice("method", method, METHODS)
    x0c = check_x0(head, x0)
    Sphere(head).check_tokens(x0c)
    t1f = _checks.positive("t1", t1)
    dtf = _checks.positive("dt", dt)
    n_layers = int(round(t1f / dtf))
    if n_layers < 1 or abs(n_layers * dtf - t1f) > 1e-9 * max(1.0, t1f):
        raise ValueError(
            f"dt = {dtf} does not divide t1 = {t1f} into whole layers; choose t1 = k * dt."
        )
    ts_np = check_ts(ts, t1f)
    save_idx = np.rint(ts_np / dtf).astype(np.int64)
    if np.any(np.abs(save_idx * dtf - ts_np) > 1e-9 * max(1.0, t1f)):
        raise ValueError(f"ts must be multiples of dt = {dtf}; got {ts_np.tolist()[:8]}.")
    dtype = head.dtype
    _checks.warn_float64_cast(x0c)
    batched = x0c.ndim == 3
    x0j = jnp.asarray(x0c, dtype)
    if not batched:
        x0j = x0j[None]
    b = x0j.shape[0]
    y0 = normalize_rows(x0j)
    keys = jax.vmap(noise.key)(jnp.arange(b))
    depth = tree_depth(t1f, dtf)
    sigma = jnp.asarray(noise.sigma, dtype)
    ys, codes, steps = _run(
        head,
        sigma,
        jnp.asarray(dtf, dtype),
        jnp.asarray(t1f, dtype),
        jnp.asarray(n_layers, jnp.int32),
        jnp.asarray(t1f * 2.0**-depth, dtype),
        y0,
        keys,
        jnp.asarray(save_idx, jnp.int32),
        method=method,
    )
    ys = np.asarray(ys)
    codes = np.asarray(codes)
    steps = np.asarray(steps)
    finite = np.all(np.isfinite(ys), axis=(1, 2, 3))
    codes = np.where((codes == Status.OK.code) & ~finite, Status.NONFINITE.code, codes)
    stats = {
        "num_steps": steps,
        "num_accepted_steps": steps,
        "num_rejected_steps": np.zeros_like(steps),
        "n_layers": n_layers,
    }
    solver_info: dict[str, Any] = {
        "method": method,
        "dt": dtf,
        "layers": n_layers,
        "noise": {
            **noise.describe(),
            "brownian": "diffrax.VirtualBrownianTree, W = B / sqrt(d)",
            "keys": "fold_in(PRNGKey(seed), system)",
            "depth": depth,
            "tol": t1f * 2.0**-depth,
        },
    }
    if method == "layers":
        solver_info["layernorm"] = "post"
    else:
        solver_info.update(solver="diffrax.Euler", stepsize_controller="ConstantStepSize")
    traj = Trajectory._from_solve(
        model=head,
        frame="sphere",
        coords="standard",
        ts_requested=ts_np,
        ys=ys,
        reached=np.ones((b, ts_np.size), bool),
        t_stop=np.full((b,), t1f),
        y_stop=ys[:, -1],
        codes=codes,
        stats=stats,
        batched=batched,
        to_x=None,
        solver=solver_info,
        t1=t1f,
        x0=x0j if batched else x0j[0],
        discretisation=Layers(dtf) if method == "layers" else Continuous(),
    )
    return dataclasses.replace(traj, wall_seconds=time.perf_counter() - started)


def simulate_with_noise(
    model: Any,
    x0: Any,
    t1: float,
    *,
    noise: Noise,
    frame: str,
    method: str,
    dt: Any,
    ts: Any,
    others: dict[str, Any],
) -> Trajectory:
    """``attnflow.simulate(..., noise=...)``: ``simulate_noisy`` with ``method="euler"``
    read as the layers and ``"euler-maruyama"`` as the SDE; the frame must be the sphere
    and ``others`` (the keywords that the noisy solve has no use for) at their defaults."""
    if frame != "sphere":
        raise ValueError(
            f"noise puts the tokens on the sphere (layer-normalised stochastic layers): "
            f"pass frame='sphere'; got frame={frame!r}."
        )
    if method not in ("euler", "euler-maruyama"):
        raise ValueError(
            f"with noise, method is 'euler' (the stochastic layers) or 'euler-maruyama' "
            f"(the limit SDE, diffrax's Euler); got method={method!r}."
        )
    given = sorted(k for k, v in others.items() if v)
    if given:
        raise ValueError(
            f"{', '.join(given)} cannot be combined with noise: the noisy solve runs the "
            f"post-layer-norm layers (or their SDE) of one system or a batch on one device."
        )
    if dt is None:
        raise ValueError(f"dt is required with noise: the step of method={method!r}.")
    scheme = "layers" if method == "euler" else "euler-maruyama"
    return simulate_noisy(model, x0, t1, noise=noise, dt=dt, ts=ts, method=scheme)
