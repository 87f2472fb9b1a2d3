"""Shared set-ups of the figures and movies: the authors' tokens and weights, run with
attnflow's discrete transformer, and the named movie cases.

``simulate_tokens(V, ...)``   n tokens uniform in [-scale, scale]^d, Q = K = I, dt = 0.1,
                              every layer saved (see its docstring for the scheme).
``euler_saves(t1, dt, ...)``  saved times on the layer grid.
``MOVIE_CASES``               named cases for ``attnflow animate``.
"""

from __future__ import annotations

import time

import numpy as np

from ..dynamics.model import Attention
from ..dynamics.simulate import simulate
from ..io.matrices import named

__all__ = ["MOVIE_CASES", "case_matrix", "euler_saves", "simulate_tokens"]


def euler_saves(t1: float, dt: float, saves: int | None = None) -> np.ndarray:
    """Saved times for the discrete transformer: every layer, or ``saves`` layers spread
    evenly over ``[0, t1]`` (always multiples of ``dt``, as ``simulate`` requires)."""
    layers = int(round(t1 / dt))
    if saves is None or saves >= layers + 1:
        k = np.arange(layers + 1)
    else:
        k = np.unique(np.rint(np.linspace(0, layers, saves)).astype(int))
    return k * dt


def simulate_tokens(
    V,
    *,
    n: int = 20,
    seed: int = 0,
    t1: float = 12.0,
    dt: float = 0.1,
    method: str = "euler",
    frame: str = "rescaled",
    scale: float = 5.0,
    saves: int | None = None,
    Q=None,
    K=None,
    batch: int | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 100_000,
):
    """Simulate ``n`` tokens uniform in ``[-scale, scale]^d`` under one head.

    By default the authors' tokens, weights and step -- Q = K = I, ``dt = 0.1``, every
    layer saved -- with attnflow's discrete transformer (``method="euler"``): one layer
    ``x_i <- x_i + dt sum_j P_ij V x_j`` per step, rescaled exactly, ``z^k = R^{-k} x^k``
    with ``R = I + dt V``, i.e. ``z_i <- z_i + dt sum_j P_ij(R^k z) R^{-1} V (z_j - z_i)``.
    That is not the authors' scheme. Their public script (``clustering-Tformers.py``) is
    written as RK4 steps of 0.1 with the attention matrix frozen within each step, but
    each stage shifts every token by the same vector and the field depends only on the
    differences ``z_j - z_i``, so the four stages coincide: it is forward Euler of the
    continuous rescaled ODE, ``z_i <- z_i + dt sum_j P_ij(e^{t_k V} z) V (z_j - z_i)``.
    Both are first-order schemes for the same ODE; they agree as ``dt -> 0``, not step
    by step.

    Args:
        V: ``(d, d)`` value matrix.
        n, seed, scale: tokens ``numpy.random.default_rng(seed).uniform(-scale, scale,
            (n, d))`` (or ``(batch, n, d)``).
        t1: final time (a whole number of layers for ``"euler"``).
        dt: layer step for ``method="euler"``.
        method: ``"euler"`` or an adaptive solver name (``"adaptive"``: Tsit5).
        frame: ``"rescaled"`` or ``"original"``.
        saves: number of saved times (default: every layer for Euler, 121 otherwise).
        Q, K: default the identity.
        batch: simulate a batch of independent systems.
        rtol, atol, max_steps: adaptive solver settings.

    Returns:
        ``(traj, params)``: the ``Trajectory`` and a JSON-ready dict of every parameter
        (seed, n, d, t1, Q, K, V, solver, tolerances, x0 recipe, frame, seconds).
    """
    V = np.asarray(V, dtype=np.float64)
    d = V.shape[0]
    Q = np.eye(d) if Q is None else np.asarray(Q, dtype=np.float64)
    K = np.eye(d) if K is None else np.asarray(K, dtype=np.float64)
    rng = np.random.default_rng(seed)
    shape = (n, d) if batch is None else (batch, n, d)
    x0 = rng.uniform(-scale, scale, size=shape)
    model = Attention(Q, K, V)
    if method == "euler":
        ts = euler_saves(t1, dt, saves)
    else:
        ts = np.linspace(0.0, t1, 121 if saves is None else saves)
    t0 = time.perf_counter()
    traj = simulate(
        model,
        x0,
        t1,
        ts=ts,
        frame=frame,
        method=method,
        dt=dt if method == "euler" else None,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
    )
    seconds = time.perf_counter() - t0
    params = {
        "seed": int(seed),
        "n": int(n),
        "d": int(d),
        "t1": float(t1),
        "batch": batch,
        "Q": Q.tolist(),
        "K": K.tolist(),
        "V": V.tolist(),
        "x0": f"numpy.random.default_rng({seed}).uniform(-{scale:g}, {scale:g}, {shape})",
        "frame": frame,
        "solver": dict(traj.solver),
        "tolerances": (
            {"rtol": None, "atol": None, "note": "fixed-step Euler: none"}
            if method == "euler"
            else {"rtol": rtol, "atol": atol}
        ),
        "saves": int(len(ts)),
        "status": traj.status,
        "seconds": round(seconds, 3),
        "propagator": model.propagator.method,
    }
    return traj, params


# ---------------------------------------------------------------------- movies
MOVIE_CASES = {
    "polytope": dict(
        V="identity",
        d=2,
        t1=12.0,
        frame="rescaled",
        draw="hull",
        title=r"$V=I$, $d=2$: clustering to the vertices of a polytope",
    ),
    "polytope-3d": dict(
        V="identity",
        d=3,
        t1=12.0,
        frame="rescaled",
        draw="hull",
        title=r"$V=I$, $d=3$: clustering to the vertices of a polytope",
    ),
    "hyperplanes": dict(
        V="paper-2d",
        d=2,
        t1=12.0,
        frame="rescaled",
        draw="levels",
        title=r"paper 2x2 $V$ ($\lambda_1=1.348$): three parallel lines",
    ),
    "hyperplanes-3d": dict(
        V="paper-3d-re-pos",
        d=3,
        t1=12.0,
        frame="rescaled",
        draw="levels",
        title=r"paper 3x3 $V$ ($\lambda_1=1.078$): parallel planes",
    ),
    "origin": dict(
        V="neg-identity",
        d=2,
        t1=30.0,
        frame="original",
        draw="none",
        title=r"$V=-I$: every token tends to 0 (original frame)",
    ),
}


def case_matrix(case: dict) -> np.ndarray:
    """The value matrix of a ``MOVIE_CASES`` entry."""
    return named(case["V"], case["d"])
