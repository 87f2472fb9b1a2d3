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

Euler-Maruyama (``method="euler-maruyama"``, ``EulerMaruyamaSolver``): as the sphere
frame does, the solver holds a free state ``y`` with tokens ``x = N(y)`` and integrates
``dy_i = |y_i| dX_i(N(y))``, ``dX_i`` the SDE above: then ``|y_i|`` is conserved by the SDE
(``d|y|^2 = |y|^2 (2 <x, dX> + |dX|^2) = 0``) and ``N(y)`` solves it, while one Euler step
gives exactly ``N(y_{k+1}) = N(x_k + dX_k(x_k))``, the Euler-Maruyama step projected back
to the sphere. Both schemes keep ``|x_i| = 1`` to rounding; both converge to the SDE
with strong order 1/2 (the noise does not commute). The diffusion is applied to the
Brownian increment as an ``(n, d) x (d, d)`` product, no ``(n, d, d, d)`` array.

Both schemes run through the engine: ``simulate(..., frame="sphere", noise=Noise(...))``
and ``solve(..., noise=...)`` with a ``LayerSolver`` or an ``EulerMaruyamaSolver``, in the
package's one layer loop (``attnflow.dynamics.noise`` states what a noise object hands
the solvers; ``TokenNoise`` is the other one). ``simulate_noisy`` is the spelling of this
module, kept.

The Brownian path. ``W = B / sqrt(d)``, ``B`` a standard ``(d, d)`` Brownian motion, the
``diffrax.VirtualBrownianTree`` on ``[0, t1]`` of key
``jax.random.fold_in(jax.random.PRNGKey(seed), i)`` for system ``i`` of a batch (one
system is system 0), with tolerance ``t1 2^-depth``, ``depth = ceil(log2(t1 / dt)) + 1``
(at most ``dt / 2``). Both methods read it at the same times ``t_k``, those of diffrax's
``ConstantStepSize`` with ``dt0 = t1 / N`` for ``N = t1 / dt`` layers (``t_k = t1 k / N``,
``k dt`` to rounding), as ``B(t_{k+1}) - B(t_k)`` with ``B(t_k)`` carried from the step
before (one descent of the tree per step). So layers and SDE compare path by path.
The tree's values at the dyadic times ``t1 j 2^-l`` do not depend on its depth (once
it reaches level ``l``): runs with the same seed and ``t1``, and
``t1 / dt`` a power of two, see the same path at every step of the coarser run (exactly
to rounding when ``t1`` is a power of two, as in the strong-convergence checks; for other
``t1`` the times' own rounding can shift the path by about ``1e-8``).

A model that is not one attention head with one value matrix (multi-head, a block,
stacked weights, a gate) is refused by name: the contract needs ``m`` and ``F = m V^T``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .. import _checks
from .base import AbstractAttentionSystem, AbstractModel
from .noise import MAX_SEED, Noise, tree_depth, value_noise_layer
from .trajectory import Trajectory

__all__ = ["METHODS", "MAX_SEED", "Noise", "noisy_layer", "simulate_noisy", "tree_depth"]

# the schemes of ``simulate_noisy`` and the engine's methods that run them
METHODS = ("layers", "euler-maruyama")
_ENGINE_METHOD = {"layers": "euler", "euler-maruyama": "euler-maruyama"}


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
        sigma: the noise scale (traced values are fine).
        dW: the increment of ``W`` over the layer (entries of variance ``dt / d``).

    Returns:
        The tokens after the layer, on the sphere. With ``sigma = 0`` it is the sphere
        frame's ``N(model.layer(x, dt))`` (the noise term adds an exact zero).
    """
    x, dW = jnp.asarray(x, model.dtype), jnp.asarray(dW, model.dtype)
    return value_noise_layer(model, x, dt, sigma, dW)


def _check_head(model: Any) -> AbstractModel:
    """``model`` if it is one unstacked attnflow model, else ``ValueError``; that it is
    one head with a value matrix is the noise's own check (``Noise.check_model``), which
    the solver runs."""
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
    docstring for the layers, the SDE and the Brownian path): ``attnflow.simulate(model,
    x0, t1, frame="sphere", noise=noise, dt=dt, ts=ts, method=...)`` with ``"layers"``
    spelt ``"euler"``.

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
            ``"euler-maruyama"``: Euler-Maruyama on the Ito SDE.

    Returns:
        A ``Trajectory`` in the frame ``"sphere"``: ``traj.x`` the tokens at ``ts``;
        ``traj.solver`` records the engine's method (``"euler"`` for the layers),
        ``dt``, the number of layers and the noise (sigma, seed, the tree's depth and
        tolerance), which ``traj.save`` writes.

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
    from .simulate import simulate

    head = _check_head(model)
    if not isinstance(noise, Noise):
        raise ValueError(
            f"noise must be attnflow.dynamics.Noise(sigma, seed); got {type(noise).__name__}."
        )
    _checks.choice("method", method, METHODS)
    return simulate(
        head, x0, t1, ts=ts, frame="sphere", method=_ENGINE_METHOD[method], dt=dt, noise=noise
    )
