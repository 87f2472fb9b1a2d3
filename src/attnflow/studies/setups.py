"""Set-ups shared by the figure scripts and the movies.

``simulate_tokens`` runs the authors' set-up (n tokens uniform in a cube, Q = K = I,
dt = 0.1, every layer saved) with attnflow's discrete transformer; ``euler_saves`` puts
saved times on the layer grid; ``MOVIE_CASES`` names the cases of ``attnflow animate``.
How attnflow's scheme relates to the authors' script is explained once, in the docs
(``docs/figures.md``, "Set-up and scheme", and ``docs/simulate.md``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import numpy.typing as npt
from jaxtyping import Float

from .. import _checks
from ..dynamics.model import Attention
from ..dynamics.simulate import simulate
from ..io.matrices import named

if TYPE_CHECKING:
    from ..dynamics.trajectory import Trajectory

__all__ = ["MOVIE_CASES", "MovieCase", "case_matrix", "euler_saves", "simulate_tokens"]


def euler_saves(t1: float, dt: float, saves: int | None = None) -> Float[np.ndarray, " m"]:
    """Saved times of the discrete transformer, on its layer grid.

    Args:
        t1: final time (rounded to a whole number of layers).
        dt: layer step.
        saves: how many times to save, spread evenly over ``[0, t1]``; ``None`` (or more
            than there are layers) saves every layer.

    Returns:
        The saved times, increasing, ``0`` and ``t1`` included; every one a multiple of
        ``dt``, as ``simulate(method="euler")`` requires.
    """
    layers = int(round(t1 / dt))
    if saves is None or saves >= layers + 1:
        k = np.arange(layers + 1)
    else:
        k = np.unique(np.rint(np.linspace(0, layers, saves)).astype(int))
    return k * dt


def simulate_tokens(
    V: Float[npt.ArrayLike, "d d"],
    *,
    n: int = 20,
    seed: int = 0,
    t1: float = 12.0,
    dt: float = 0.1,
    method: str = "euler",
    frame: str = "rescaled",
    scale: float = 5.0,
    saves: int | None = None,
    Q: Float[npt.ArrayLike, "k d"] | None = None,
    K: Float[npt.ArrayLike, "k d"] | None = None,
    batch: int | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 100_000,
) -> tuple[Trajectory, dict[str, Any]]:
    """Simulate ``n`` tokens uniform in ``[-scale, scale]^d`` under one head.

    By default the authors' tokens, weights and step (Q = K = I, ``dt = 0.1``, every layer
    saved) with attnflow's discrete transformer (``method="euler"``: one layer
    ``x_i <- x_i + dt sum_j P_ij V x_j`` per step, rescaled exactly). That is not the
    scheme of the authors' script; both are first order and agree as ``dt -> 0``, not
    step by step (``docs/figures.md``, "Set-up and scheme").

    Args:
        V: value matrix.
        n: number of tokens.
        seed: the tokens are ``numpy.random.default_rng(seed).uniform(-scale, scale,
            (n, d))`` (``(batch, n, d)`` for a batch).
        t1: final time (a whole number of layers for ``"euler"``).
        dt: layer step of ``method="euler"``.
        method: ``"euler"`` or an adaptive solver name (``"adaptive"``: Tsit5).
        frame: ``"rescaled"`` or ``"original"``.
        scale: half the side of the cube of initial tokens.
        saves: number of saved times (default: every layer for Euler, 121 otherwise).
        Q: query matrix; default the identity.
        K: key matrix; default the identity.
        batch: simulate this many independent systems at once (one batch).
        rtol: relative tolerance of an adaptive solver.
        atol: absolute tolerance of an adaptive solver.
        max_steps: step budget of an adaptive solver.

    Returns:
        ``(traj, params)``: the ``Trajectory`` and a JSON-ready dict of every parameter
        (seed, n, d, t1, Q, K, V, x0 recipe, frame, solver, tolerances, saves, status,
        seconds, propagator).
    """
    n = _checks.integer("n", n, lo=1)
    seed = _checks.integer("seed", seed, lo=0)
    scale = _checks.positive("scale", scale)
    if batch is not None:
        batch = _checks.integer("batch", batch, lo=1)
    if saves is not None:
        saves = _checks.integer("saves", saves, lo=1)
    V = np.asarray(_checks.real_array("V", V, ndim=2), dtype=np.float64)
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
class MovieCase(TypedDict):
    """A named case of ``attnflow animate``: what to simulate and how to draw it."""

    V: str
    """The value matrix, a name of ``attnflow.io.matrices.named``."""
    d: int
    """Dimension of the tokens (2 or 3)."""
    t1: float
    """Final time."""
    frame: str
    """``"rescaled"`` or ``"original"``."""
    draw: str
    """What ``animate`` draws over the tokens: ``"hull"``, ``"levels"`` or ``"none"``."""
    title: str
    """The line above the picture (mathtext)."""


MOVIE_CASES: dict[str, MovieCase] = {
    "polytope": MovieCase(
        V="identity",
        d=2,
        t1=12.0,
        frame="rescaled",
        draw="hull",
        title=r"$V=I$, $d=2$: clustering to the vertices of a polytope",
    ),
    "polytope-3d": MovieCase(
        V="identity",
        d=3,
        t1=12.0,
        frame="rescaled",
        draw="hull",
        title=r"$V=I$, $d=3$: clustering to the vertices of a polytope",
    ),
    "hyperplanes": MovieCase(
        V="paper-2d",
        d=2,
        t1=12.0,
        frame="rescaled",
        draw="levels",
        title=r"paper 2x2 $V$ ($\lambda_1=1.348$): three parallel lines",
    ),
    "hyperplanes-3d": MovieCase(
        V="paper-3d-re-pos",
        d=3,
        t1=12.0,
        frame="rescaled",
        draw="levels",
        title=r"paper 3x3 $V$ ($\lambda_1=1.078$): parallel planes",
    ),
    "origin": MovieCase(
        V="neg-identity",
        d=2,
        t1=30.0,
        frame="original",
        draw="none",
        title=r"$V=-I$: every token tends to 0 (original frame)",
    ),
}
"""The named cases of ``attnflow animate`` (and of the figures' movies)."""


def case_matrix(case: MovieCase) -> Float[np.ndarray, "d d"]:
    """The value matrix of a ``MOVIE_CASES`` entry.

    Args:
        case: an entry of ``MOVIE_CASES``.

    Returns:
        ``V``, ``(d, d)`` float64.
    """
    return named(case["V"], case["d"])
