"""Observables of measures on the circle: particles and the mean-field density alike.

Contract. Tokens on the circle are a probability measure: the empirical measure
``1/n sum_j delta_{theta_j}`` of a ``Trajectory`` with ``d = 2`` (angles ``atan2(x_2,
x_1)``; the tokens' norms do not enter) or of an array of angles, or the density of a
``DensityTrajectory`` (``attnflow.solve_density``). The functions here take either and
mean the same number by it:

- ``fourier_modes``: ``c_k = int e^{-i k theta} dmu``, ``k = 0 .. kmax`` (the particles'
  ``1/n sum_j e^{-i k theta_j}``; a density's exact coefficients);
- ``circle_wasserstein``: the Wasserstein-1 distance on the circle (arc length), by the
  formula ``W1 = min_alpha int_0^{2 pi} |F(theta) - G(theta) - alpha| dtheta`` for the
  CDFs ``F``, ``G`` (the minimiser is a median of ``F - G``). Between the particles'
  angles and a uniform grid of ``grid`` angles the empirical CDF is constant and a
  density's CDF smooth, so the midpoint rule on that merged partition is second order;
- ``density_clusters``: the number of peaks of a density: local maxima (on the periodic
  grid refined ``refine`` times) at least ``level`` times the uniform density
  ``1/(2 pi)`` high and with a prominence of at least the uniform density.

The interaction energy of a density is ``interaction_energy`` (``analysis.sphere``):
``(1/(2 beta)) int int e^{beta cos(theta - theta')} drho drho = (1/(2 beta)) sum_k I_k(beta)
|c_k|^2``, the particles' ``(1/(2 beta n^2)) sum_{i,j} e^{beta <x_i, x_j>}`` for their
empirical measure.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from jaxtyping import Complex, Float

from .. import _checks

__all__ = ["fourier_modes", "circle_wasserstein", "density_clusters"]


def _is_density(obj: Any) -> bool:
    from ..dynamics.meanfield import DensityTrajectory

    return isinstance(obj, DensityTrajectory)


def _angles(obj: Any, save: int | None) -> np.ndarray:
    """Angles in ``[0, 2 pi)``: ``(m, n)`` (all saves) or ``(n,)`` (one save)."""
    mod = sys.modules.get("attnflow.dynamics.trajectory")
    x = obj.x if mod is not None and isinstance(obj, mod.Trajectory) else None
    if x is not None:
        x = np.asarray(x, np.float64)
        if x.ndim != 3 or x.shape[-1] != 2:
            raise ValueError(
                f"a Trajectory here needs one system of tokens in d = 2, shape (m, n, 2); "
                f"got {x.shape}."
            )
        th = np.arctan2(x[..., 1], x[..., 0])
    else:
        th = np.asarray(obj, np.float64)
        if th.ndim not in (1, 2) or th.shape[-1] < 1:
            raise ValueError(
                f"angles must be an array (n,) or (m, n), a Trajectory in d = 2 or a "
                f"DensityTrajectory; got {type(obj).__name__} of shape {th.shape}."
            )
    if not np.all(np.isfinite(th)):
        raise ValueError("the angles (or tokens) are not all finite.")
    th = np.mod(th, 2.0 * np.pi)
    if save is None or th.ndim == 1:
        return th
    return th[_checks.index("save", save, th.shape[0], what="saves")]


def fourier_modes(mu: Any, kmax: int) -> Complex[np.ndarray, "*m k"]:
    """The Fourier coefficients ``c_k = int e^{-i k theta} dmu``, ``k = 0 .. kmax``.

    Args:
        mu: a ``DensityTrajectory``, a ``Trajectory`` of one system in ``d = 2``, or angles
            ``(n,)`` / ``(m, n)``.
        kmax: the highest degree (>= 0; a density's coefficients are exact up to ``2 K``).

    Returns:
        ``(m, kmax + 1)`` (``(kmax + 1,)`` for angles ``(n,)``) complex; ``c_0 = 1``.

    Example:
        >>> import numpy as np
        >>> from attnflow.analysis import fourier_modes
        >>> c = fourier_modes(2 * np.pi * np.arange(8) / 8, 8)
        >>> np.round(abs(c), 12)[[0, 1, 8]]
        array([1., 0., 1.])
    """
    if _is_density(mu):
        return mu.coefficients(_checks.integer("kmax", kmax, lo=0, hi=2 * mu.model.modes))
    kmax = _checks.integer("kmax", kmax, lo=0)
    th = _angles(mu, None)
    k = np.arange(kmax + 1)
    return np.exp(-1j * th[..., None] * k).mean(axis=-2)


def _cdf_on(mu: Any, save: int, theta: np.ndarray) -> np.ndarray:
    if _is_density(mu):
        return mu.cdf(theta, save)
    th = np.sort(_angles(mu, save))
    return np.searchsorted(th, theta, side="right") / th.size


def _breaks(mu: Any, save: int) -> np.ndarray:
    return np.empty(0) if _is_density(mu) else _angles(mu, save)


def circle_wasserstein(a: Any, b: Any, *, save: int = -1, grid: int = 16384) -> float:
    """The Wasserstein-1 distance on the unit circle between two measures at one save.

    Args:
        a, b: each a ``DensityTrajectory``, a ``Trajectory`` of one system in ``d = 2``, or
            angles ``(n,)`` / ``(m, n)``.
        save: the saved time (index) read from each.
        grid: the uniform angles merged with the particles' (>= 64); the error of the
            midpoint rule falls like ``grid^{-2}``.

    Returns:
        ``W1`` in units of arc length (at most ``pi / 2`` for probability measures).

    Example:
        >>> import numpy as np
        >>> from attnflow.analysis import circle_wasserstein
        >>> round(circle_wasserstein(np.array([0.0]), np.array([1.0])), 12)
        1.0
    """
    grid = _checks.integer("grid", grid, lo=64)
    pts = np.concatenate(
        [np.linspace(0.0, 2.0 * np.pi, grid + 1), _breaks(a, save), _breaks(b, save)]
    )
    pts = np.unique(np.clip(pts, 0.0, 2.0 * np.pi))
    mid = 0.5 * (pts[1:] + pts[:-1])
    w = np.diff(pts)
    D = _cdf_on(a, save, mid) - _cdf_on(b, save, mid)
    order = np.argsort(D)
    cw = np.cumsum(w[order])
    alpha = D[order][np.searchsorted(cw, 0.5 * cw[-1])]
    return float(np.sum(w * np.abs(D - alpha)))


def density_clusters(traj: Any, *, level: float = 2.0, refine: int = 4) -> Float[np.ndarray, " m"]:
    """The number of peaks of a mean-field density at each save.

    A peak is a local maximum of ``rho`` on the periodic grid (refined ``refine`` times by
    exact trigonometric interpolation) at least ``level / (2 pi)`` high, with a prominence
    (``scipy.signal.find_peaks``, the circle unrolled three times) of at least ``1 / (2
    pi)``: ripples on a nearly uniform density are not clusters.

    Args:
        traj: a ``DensityTrajectory``.
        level: the height threshold in units of the uniform density (> 1).
        refine: the refinement of the grid (>= 1).

    Returns:
        ``(m,)`` integer counts (-1 at saves the solve never reached).

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)  # the solve needs float64
        >>> from attnflow.analysis import density_clusters
        >>> m = af.CircleMeanField(5.0, modes=32)
        >>> sol = af.solve_density(m, lambda th: np.exp(3 * np.cos(2 * th)), 0.1)
        >>> density_clusters(sol).tolist()
        [2, 2]
    """
    if not _is_density(traj):
        raise ValueError(
            f"traj must be a DensityTrajectory (attnflow.solve_density); got "
            f"{type(traj).__name__}. For tokens use count_clusters."
        )
    level = _checks.number("level", level, lo=1.0, lo_open=True)
    refine = _checks.integer("refine", refine, lo=1)
    n = traj.model.grid_size * refine
    theta = 2.0 * np.pi * np.arange(n) / n
    out = np.full(len(traj.ts), -1, np.int64)
    for k in np.flatnonzero(traj.reached):
        out[k] = periodic_peaks(traj.density_at(theta, int(k)), level)
    return out


def periodic_peaks(rho: Float[np.ndarray, " N"], level: float = 2.0) -> int:
    """The peaks of a density on the circle sampled at ``N`` equally spaced angles: local
    maxima at least ``level / (2 pi)`` high with a prominence (``scipy.signal.find_peaks``,
    the circle unrolled three times) of at least ``1 / (2 pi)``, the rule of
    ``density_clusters``."""
    from scipy.signal import find_peaks

    n = len(rho)
    u = 1.0 / (2.0 * np.pi)
    peaks, _ = find_peaks(np.tile(rho, 3), height=level * u, prominence=u)
    return int(np.count_nonzero((peaks >= n) & (peaks < 2 * n)))
