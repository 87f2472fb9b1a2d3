"""The beta-t phase diagram of tokens on the sphere, batched over betas and systems.

``phase_diagram`` runs the authors' scheme (borjanG/2023-transformers-rotf,
phase-diagrams.py): ``n`` tokens uniform on ``S^{d-1}``, post-LN layers
``x <- N(x + dt sum_j P_ij V x_j)`` of step ``dt`` (``attnflow.dynamics.frames.Sphere``,
the same step ``simulate(..., frame="sphere", method="euler")`` takes), and records the
fraction of ordered pairs ``i != j`` with ``<x_i, x_j> > threshold`` over all systems of
each beta, at every saved time.

All betas and systems run in one compiled call: beta is an array leaf of the model
(``eqx.tree_at``), mapped with ``jax.lax.map`` one beta at a time (or in vmapped blocks of
``beta_batch`` betas), so no beta value recompiles and the memory is that of one block. The
fraction is computed inside the loop: the tokens are never stored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Float

from .. import _checks
from ..dynamics.frames import LAYERNORMS, Sphere
from ..dynamics.isotropic import IsotropicAttention
from ..dynamics.model import Attention

__all__ = ["PhaseDiagram", "phase_diagram"]


@dataclasses.dataclass(frozen=True)
class PhaseDiagram:
    """The clustered-pair fraction over ``(beta, t)``.

    Attributes:
        betas: ``(B,)`` inverse temperatures.
        ts: ``(m,)`` saved times (multiples of ``dt``, 0 included).
        fraction: ``(B, m)`` fraction of ordered pairs ``i != j`` of all systems of a beta
            with ``<x_i, x_j> > threshold``.
        one_cluster: ``(B, m)`` fraction of systems whose every pair is above the
            threshold.
        n, d, systems, dt, threshold, layernorm, seed, dtype: the set-up.
    """

    betas: np.ndarray
    ts: np.ndarray
    fraction: np.ndarray
    one_cluster: np.ndarray
    n: int
    d: int
    systems: int
    dt: float
    threshold: float
    layernorm: str
    seed: int
    dtype: str


@eqx.filter_jit
def _run(
    model, betas, keys, dt, every, n_saves, threshold, *, shape, beta_batch, layernorm, chunk, span
):
    systems, n, d = shape
    off = ~jnp.eye(n, dtype=bool)

    def observe(y):  # (s, n, d) -> per-system pair fraction, its mean, one-cluster fraction
        G = jnp.einsum("sid,sjd->sij", y, y)
        close = (G > threshold) & off[None]
        frac = jnp.sum(close, axis=(1, 2)) / (n * (n - 1))
        return frac, (jnp.mean(frac), jnp.mean(frac == 1))

    def one_beta(args):
        beta, key = args
        m = eqx.tree_at(lambda a: a.beta, model, beta)
        frame = Sphere(m, layernorm)
        step = jax.vmap(lambda y: frame.step(y, None, dt, None))

        def layers(y):
            return jax.lax.fori_loop(0, every, lambda _, u: step(u), y)

        x0 = jax.random.normal(key, (systems, n, d), dtype=model.dtype)
        if span:  # the starts' coordinates in an orthonormal basis of their span
            x0 = jnp.swapaxes(jnp.linalg.qr(jnp.swapaxes(x0, 1, 2), mode="r"), 1, 2)
        y = jax.vmap(frame.initial_state)(x0)
        frac0, first = observe(frame.tokens(y))

        if chunk is None:

            def save_all(y, _):
                y = layers(y)
                return y, observe(frame.tokens(y))[1]

            _, rest = jax.lax.scan(save_all, y, None, length=n_saves - 1)
        else:
            nc = -(-systems // chunk)

            def save(carry, _):
                # The systems whose every pair is clustered stay so (see phase_diagram):
                # gather the others to the front, step only the chunks holding one of them.
                y, done = carry
                order = jnp.argsort(done, stable=True)
                pad = jnp.concatenate([order, jnp.full(nc * chunk - systems, order[-1])])
                live = (~done[pad]).reshape(nc, chunk).any(axis=1)
                parts = y[pad].reshape(nc, chunk, *y.shape[1:])
                parts = jax.lax.map(
                    lambda a: jax.lax.cond(a[1], layers, lambda u: u, a[0]), (parts, live)
                )
                y = y.at[order].set(parts.reshape(nc * chunk, *y.shape[1:])[:systems])
                frac, out = observe(frame.tokens(y))
                return (y, done | (frac == 1)), out

            _, rest = jax.lax.scan(save, (y, frac0 == 1), None, length=n_saves - 1)
        return tuple(jnp.concatenate([f[None], r]) for f, r in zip(first, rest, strict=True))

    if beta_batch == 1:  # a plain map: no batch axis over beta in the step
        return jax.lax.map(one_beta, (betas, keys))
    return jax.lax.map(one_beta, (betas, keys), batch_size=beta_batch)


def phase_diagram(
    betas: Float[Any, " B"],
    *,
    n: int = 32,
    d: int = 2,
    systems: int = 1024,
    t1: float = 30.0,
    dt: float = 0.1,
    save_every: int = 5,
    threshold: float = 0.999,
    layernorm: str = "post",
    Q: Any = None,
    K: Any = None,
    V: Any = None,
    dtype: Any = None,
    seed: int = 0,
    beta_batch: int = 1,
    skip_clustered: bool | None = None,
    chunk: int = 256,
    in_span: bool | None = None,
) -> PhaseDiagram:
    """The clustered-pair fraction of ``systems`` random starts per beta, over time.

    Args:
        betas: the inverse temperatures, ``(B,)``, each > 0.
        n, d: tokens and dimension.
        systems: independent starts per beta (uniform on the sphere: normalised
            Gaussians, a fresh draw per beta from ``seed``).
        t1: final time, a whole number of layers ``dt``.
        dt: the layer step.
        save_every: layers between saved times.
        threshold: the inner product above which a pair counts as clustered.
        layernorm: ``"post"`` (the authors' scheme) or another placement of
            ``attnflow.dynamics.frames.Sphere``.
        Q, K, V: ``(d, d)`` weights (default the identity, through
            ``IsotropicAttention``, which skips the products by the identity).
        dtype: working precision (default that of ``Q, K, V``: float64 with x64 on);
            ``np.float32`` halves the time, and a threshold of 0.999 is far above its
            rounding.
        seed: the random starts.
        beta_batch: betas per vmapped block (the memory of one block is about
            ``beta_batch * systems * n * (d + n)`` numbers). The default 1 runs the betas
            one after the other, each vmapped over its systems only: a second batch axis
            (over beta) made every step 1.4x (d = 2) to 2.6x (d = 128) slower on the CPU.
        skip_clustered: stop stepping a system once every pair of it is above the
            threshold. Exact where it applies: with ``V = I``, a row-stochastic kernel and
            ``layernorm`` ``"post"`` or ``"ngpt"``, each new token is a positive
            combination of the old ones, so the new tokens lie in the cone of the old,
            and two unit vectors of that cone have an inner product at least the old
            smallest one (when it is > 0): a one-cluster system stays one, and its
            fraction stays 1. The systems still to move are gathered into chunks of
            ``chunk`` systems and a chunk with none is not stepped; the fractions are
            those of stepping every system (tested). ``None`` (the default) skips
            where it is exact and not otherwise; ``True`` where it is not exact is a
            ``ValueError``.
        chunk: systems per chunk when skipping.
        in_span: run each system in the ``n``-dimensional span of its start, where
            ``d > n``. Exact with ``Q = K = V = I``: every placement of the layer norm
            maps tokens to combinations of tokens scaled by their norms, so the tokens
            stay in the span of the start, and the layer commutes with rotations, so
            the coordinates in an orthonormal basis of that span (``R^T`` of the QR
            factorisation ``x0^T = U R``) follow the same layers with inner products,
            hence fractions, those of the tokens in ``R^d`` (to rounding: a pair within
            rounding of the threshold may count otherwise). The products cost ``n / d``
            of those in ``R^d``. ``None`` (the default) runs in the span where it is
            exact and ``d > n``; ``True`` where it is not exact is a ``ValueError``.

    Returns:
        A ``PhaseDiagram``.
    """
    b = np.asarray(_checks.real_array("betas", betas, ndim=1, shape_hint="(B,)"), np.float64)
    if b.size == 0 or np.any(b <= 0):
        raise ValueError("betas must be a non-empty 1-d array of numbers > 0.")
    n = _checks.integer("n", n, lo=2)
    d = _checks.integer("d", d, lo=1)
    systems = _checks.integer("systems", systems, lo=1)
    t1 = _checks.positive("t1", t1)
    dt = _checks.positive("dt", dt)
    save_every = _checks.integer("save_every", save_every, lo=1)
    threshold = _checks.number("threshold", threshold, lo=-1.0, hi=1.0, hi_open=True)
    _checks.choice("layernorm", layernorm, LAYERNORMS)
    if layernorm in ("mix", "scaled"):
        raise ValueError(
            f"layernorm={layernorm!r} depends on the layer's depth, which the phase "
            f"diagram's loop does not carry; use one of 'post', 'pre', 'peri', 'ngpt', "
            f"or attnflow.simulate(..., frame='sphere', method='euler', "
            f"layernorm={layernorm!r}) for the runs themselves."
        )
    beta_batch = _checks.integer("beta_batch", beta_batch, lo=1)
    chunk = _checks.integer("chunk", chunk, lo=1)
    layers = int(round(t1 / dt))
    if abs(layers * dt - t1) > 1e-9 * max(1.0, t1) or layers % save_every:
        raise ValueError(
            f"t1 = {t1} must be a whole number of layers dt = {dt}, and that number a "
            f"multiple of save_every = {save_every}."
        )
    isotropic = Q is None and K is None and V is None
    if in_span and not isotropic:
        raise ValueError(
            "in_span=True needs Q = K = V = I (the layers then commute with rotations); "
            "Q, K or V was given. Pass in_span=None or False."
        )
    # the systems run in the span of their start: n coordinates, where there are fewer
    span = isotropic and d > n and in_span is not False
    if isotropic:  # the papers' identity weights, fast path
        model: Attention | IsotropicAttention = IsotropicAttention(n if span else d, dtype=dtype)
    else:
        eye = np.eye(d)
        mats = [eye if A is None else np.asarray(A) for A in (Q, K, V)]
        if dtype is not None:
            mats = [np.asarray(A, dtype) for A in mats]
        model = Attention(*mats)
    n_saves = layers // save_every + 1
    exact = (
        layernorm in ("post", "ngpt")
        and threshold > 0
        and (V is None or np.array_equal(np.asarray(V), np.eye(d)))
        and model.kernel.row_stochastic
    )
    if skip_clustered and not exact:
        raise ValueError(
            "skip_clustered=True needs V = I, a row-stochastic kernel, layernorm 'post' or "
            f"'ngpt' and threshold > 0 (a clustered system then stays clustered); got "
            f"layernorm={layernorm!r}, threshold={threshold}"
            f"{'' if V is None else ', V given'}. Pass skip_clustered=None or False."
        )
    skip = exact if skip_clustered is None else skip_clustered
    keys = jax.random.split(jax.random.PRNGKey(seed), b.size)
    frac, one = _run(
        model,
        jnp.asarray(b, model.dtype),
        keys,
        jnp.asarray(dt, model.dtype),
        save_every,
        n_saves,
        jnp.asarray(threshold, model.dtype),
        shape=(systems, n, d),
        beta_batch=min(beta_batch, b.size),
        layernorm=layernorm,
        chunk=min(chunk, systems) if skip else None,
        span=span,
    )
    return PhaseDiagram(
        betas=b,
        ts=np.arange(n_saves) * save_every * dt,
        fraction=np.asarray(frac, np.float64),
        one_cluster=np.asarray(one, np.float64),
        n=n,
        d=d,
        systems=systems,
        dt=dt,
        threshold=threshold,
        layernorm=layernorm,
        seed=seed,
        dtype=np.dtype(model.dtype).name,
    )
