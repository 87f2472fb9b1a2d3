"""The mean-field limit on the circle: the continuity equation of the token density.

Contract. ``CircleMeanField(beta, kernel="softmax", modes=K)`` is the limit ``n -> infinity``
of ``simulate(IsotropicAttention(2, beta=beta, kernel=kernel), x0, t1, frame="sphere")``:
tokens at angles ``theta_i`` with ``dtheta_i/dt = sum_j w_ij sin(theta_j - theta_i)``, their
empirical measure replaced by a probability density ``rho(t, theta)`` (``int rho dtheta =
1``) that solves

    d_t rho + d_theta (rho v[rho]) = 0,   u = G * rho,   G(phi) = e^{beta cos phi},
    SA  (``kernel="softmax"``): v = d_theta u / (beta u),
    USA (``kernel="usa"``):     v = d_theta u / beta,

(``u(theta) = int G(theta - theta') rho(theta') dtheta'``; ``d_theta G(theta - theta') =
-beta sin(theta - theta') G``, so ``v`` is the particles' velocity with ``1/n sum_j``
replaced by ``int . rho``). With ``diffusion = D > 0`` (tokens with independent noise
``sqrt(2 D) dW_i``, ``attnflow.dynamics.TokenNoise``) the equation gains ``+ D d_theta^2
rho`` on its right-hand side.

The scheme. ``rho = q^2`` with ``q`` a real trigonometric polynomial of degree ``K``
(``modes``), held by its values on ``N = 4 K + 4`` equispaced angles; the solver integrates

    d_t q = -(1/2) [d_theta (v q) + v d_theta q]   (then projected on the degrees <= K),

which is the continuity equation for ``q^2`` in skew-symmetric form; diffusion adds
``D d_theta^2 (q^2) / (2 q)`` (the same equation for ``rho = q^2``: ``2 q d_t q = d_t rho``),
with ``d_theta^2 (q^2)`` exact on the grid (degree ``2 K``) and the quotient taken on the
grid, which needs ``q > 0``: diffusion keeps a positive density positive, and a grid
value of ``q`` at or below zero gives no diffusion there (a zero density stays
unresolved rather than NaN). Consequences:

- positivity: ``rho = q^2 >= 0`` always, by construction;
- mass: the Fourier derivative (Nyquist mode zeroed) is skew-symmetric in the grid inner
  product and the projection is orthogonal, so ``d/dt sum_j q_j^2 = 0`` exactly for the
  semi-discrete system; the time integrator keeps it to its tolerance (``mass`` reports
  it at every save, it is never renormalised);
- dealiasing: ``q^2`` has degree ``2 K`` and ``N > 4 K``, so the Fourier coefficients of
  ``rho`` up to degree ``2 K`` are exact, hence ``u``'s (``G``'s coefficients are
  ``I_k(beta)``, kept up to ``2 K``) and USA's ``v``; ``v q`` and ``v d_theta q`` then
  alias only onto degrees above ``K``, which the projection drops (the cubic "1/2 rule").
  SA's quotient ``d_theta u / u`` is evaluated on the grid; ``u`` is positive and its
  coefficients fall like ``I_k(beta)``;
- time: diffrax's adaptive solvers (``AdaptiveSolver``), the same core and status codes
  as ``simulate`` (ok, max_steps, nonfinite, failed).

Resolution. A spectral solution is only as good as its last modes: ``tail`` is, at each
save, the share of ``q``'s L2 norm in the degrees above ``3 K / 4``; a save is
``resolved`` when ``tail <= tail_tol`` (1e-6 by default; keep the solver's rtol well below
it). A solve that reaches ``t1`` with a save not resolved has status ``"unresolved"`` (not
``"ok"``), ``solve_density`` warns, and ``raise_for_status`` raises, naming ``modes`` to
increase.
Clusters are peaks of width ``~ beta^{-1/2}`` at first and narrower as they contract, so
every run is resolved only up to some time.

``solve_density`` returns a ``DensityTrajectory``: the saved ``q``, the density and its
Fourier coefficients ``c_k = int e^{-i k theta} rho dtheta`` (``c_0`` the mass, the
particles' ``1/n sum_j e^{-i k theta_j}``), the CDF, save and load.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _checks
from .solve import AdaptiveSolver, adaptive_solve
from .status import BY_CODE, SimulationError, Status


def _file():  # the density files (the io layer), imported when a method needs them
    from ..io import density_file

    return density_file


__all__ = ["CircleMeanField", "DensityTrajectory", "solve_density"]

KERNELS = ("softmax", "usa")
TAIL_TOL = 1e-6
# The status of a solve that reached t1 with a save whose tail is above tail_tol.
UNRESOLVED = "unresolved"


class CircleMeanField(eqx.Module):
    """The token density of isotropic attention on the circle (``Q = K = V = I``).

    Args:
        beta: the inverse temperature, > 0 (USA: at most 700, its velocity scales as
            ``e^beta``).
        kernel: ``"softmax"`` (SA) or ``"usa"`` (no denominator, ``Z_i = n``).
        modes: ``K``, the highest Fourier degree of ``q = sqrt(rho)`` (>= 4); the grid has
            ``4 K + 4`` angles.
        diffusion: ``D >= 0``, the coefficient of the Laplacian ``D d_theta^2 rho``
            (independent noise on every token); ``0``, the default, is the noiseless
            equation (the same program as before).

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)  # the solve needs float64
        >>> m = af.CircleMeanField(5.0, modes=32)
        >>> rho0 = lambda th: (1 + 1e-3 * np.cos(3 * th)) / (2 * np.pi)
        >>> sol = af.solve_density(m, rho0, 1.0)
        >>> float(sol.mass[-1])  # doctest: +ELLIPSIS
        1.0...
    """

    mean_field: ClassVar[bool] = True  # a density, not tokens: token analyses refuse it
    beta: Any  # a 0-d float64 array: a new beta is a new value, not a new program
    kernel: str = eqx.field(static=True)
    modes: int = eqx.field(static=True)
    weights: Float[Array, " r"]  # 2 pi I_k(beta) e^{-beta} for k = 0 .. N/2 (0 above 2K)
    scale: Float[Array, ""]  # what multiplies d_theta u_scaled: 1/beta or e^beta/beta
    diffusion: float = eqx.field(static=True)

    def __init__(
        self, beta: float, kernel: str = "softmax", *, modes: int = 64, diffusion: float = 0.0
    ):
        from .._special import log_ive

        b = _checks.positive("beta", beta)
        self.beta = np.asarray(b, np.float64)
        self.kernel = _checks.choice("kernel", kernel, KERNELS)
        self.modes = _checks.integer("modes", modes, lo=4, hi=1 << 16)
        self.diffusion = _checks.number("diffusion", diffusion, lo=0.0)
        if self.kernel == "usa" and b > 700.0:
            raise ValueError(
                f"beta = {b!r} is too large for kernel='usa': its velocity scales "
                f"as e^beta, past float64 at beta ~ 709; use kernel='softmax' or beta <= 700."
            )
        k = np.arange(self.grid_size // 2 + 1)
        # I_k(beta) e^{-beta} in logs: finite at every beta (scipy's ive is NaN past
        # 2^30), exactly 0 only where it underflows float64
        w = 2.0 * math.pi * np.exp(log_ive(k, b))
        w[k > 2 * self.modes] = 0.0
        self.weights = jnp.asarray(w)
        sc = 1.0 / b if self.kernel == "softmax" else math.exp(b) / b
        self.scale = jnp.asarray(sc)

    @property
    def grid_size(self) -> int:
        """``N = 4 K + 4``, the number of grid angles."""
        return 4 * self.modes + 4

    def grid(self) -> Float[np.ndarray, " N"]:
        """The grid angles ``2 pi j / N``, ``j = 0 .. N - 1``."""
        return 2.0 * np.pi * np.arange(self.grid_size) / self.grid_size

    def describe(self) -> dict[str, Any]:
        """The set-up as plain JSON values (saved with a run)."""
        return {
            "family": "circle-mean-field",
            "beta": float(self.beta),
            "kernel": self.kernel,
            "modes": self.modes,
            "diffusion": self.diffusion,
        }

    # ------------------------------------------------------------------ the field
    def _derivative(self, f: Array) -> Array:
        n = self.grid_size
        F = jnp.fft.rfft(f)
        k = jnp.arange(n // 2 + 1, dtype=f.dtype)
        F = F * jax.lax.complex(jnp.zeros_like(k), k)  # i k
        return jnp.fft.irfft(F.at[-1].set(0.0), n=n)

    def _project(self, f: Array) -> Array:
        n = self.grid_size
        F = jnp.fft.rfft(f)
        keep = jnp.arange(n // 2 + 1) <= self.modes
        return jnp.fft.irfft(jnp.where(keep, F, jnp.zeros_like(F)), n=n)

    def velocity(self, q: Float[Array, " N"]) -> Float[Array, " N"]:
        """``v[rho]`` on the grid for ``rho = q^2``."""
        n = self.grid_size
        U = jnp.fft.rfft(q * q)
        U = U * self.weights.astype(U.dtype)  # (G * rho) e^{-beta}, exact to degree 2K
        u = jnp.fft.irfft(U, n=n)
        du = self._derivative(u)
        if self.kernel == "softmax":
            return self.scale * du / u
        return self.scale * du

    def field(self, t: Any, q: Float[Array, " N"]) -> Float[Array, " N"]:
        """``d_t q`` (skew-symmetric form, projected on the degrees <= K)."""
        v = self.velocity(q)
        rate = -0.5 * (self._derivative(v * q) + v * self._derivative(q))
        if self.diffusion > 0.0:
            curvature = self._derivative(self._derivative(q * q))  # d_theta^2 rho, exact
            positive = q > 0.0
            safe = jnp.where(positive, q, 1.0)
            rate = rate + self.diffusion * jnp.where(positive, curvature / (2.0 * safe), 0.0)
        return self._project(rate)

    def log_bound(self, t: Any, q: Array) -> Array:
        """No logits are exponentiated on the grid (``I_k`` are scaled): ``0``."""
        return jnp.zeros((), q.dtype)


class DensityTrajectory(eqx.Module):
    """A mean-field solve: ``q = sqrt(rho)`` on the grid at the saved times.

    Attributes:
        model: the ``CircleMeanField``.
        ts: ``(m,)`` the saved times.
        q: ``(m, N)`` ``sqrt(rho)`` on ``model.grid()`` (saves after a stop hold ``inf``).
        status: ``"ok"``; ``"unresolved"`` when the solve reached ``t1`` but a save is
            not resolved (see ``resolved``); otherwise why the solve stopped
            (``attnflow.Status`` vocabulary: the saves before the stop are kept).
        t_stop: where the solve stopped (``t1`` when ok).
        num_steps: the solver's steps.
    """

    mean_field: ClassVar[bool] = True
    model: CircleMeanField
    ts: np.ndarray
    q: np.ndarray
    status: str
    t_stop: float
    num_steps: int
    tail_tol: float = TAIL_TOL

    @property
    def theta(self) -> Float[np.ndarray, " N"]:
        """The grid angles."""
        return self.model.grid()

    @property
    def reached(self) -> np.ndarray:
        """``(m,)`` whether the solve reached each save (finite values)."""
        return np.all(np.isfinite(self.q), axis=-1)

    @property
    def density(self) -> Float[np.ndarray, "m N"]:
        """``rho = q^2`` on the grid, ``(m, N)``."""
        return self.q * self.q

    @property
    def mass(self) -> Float[np.ndarray, " m"]:
        """``int rho dtheta`` at each save (1 up to the time integrator's error)."""
        return self.density.mean(axis=-1) * 2.0 * np.pi

    def _q_coefficients(self) -> np.ndarray:
        return np.fft.rfft(self.q, axis=-1)[..., : self.model.modes + 1]

    @property
    def tail(self) -> Float[np.ndarray, " m"]:
        """The share of ``q``'s L2 norm in the degrees above ``3 K / 4``, per save."""
        Q = np.abs(self._q_coefficients()) ** 2
        Q[..., 1:] *= 2.0
        cut = (3 * self.model.modes) // 4
        with np.errstate(invalid="ignore"):
            return np.sqrt(Q[..., cut + 1 :].sum(-1) / Q.sum(-1))

    @property
    def resolved(self) -> np.ndarray:
        """``(m,)`` whether each save is resolved (``tail <= tail_tol``)."""
        return self.reached & (self.tail <= self.tail_tol)

    def coefficients(self, kmax: int | None = None) -> np.ndarray:
        """``(m, kmax + 1)`` complex ``c_k = int e^{-i k theta} rho dtheta``, ``k = 0 ..
        kmax`` (default ``2 K``: exact, ``rho`` has degree ``2 K``)."""
        top = 2 * self.model.modes
        kmax = top if kmax is None else _checks.integer("kmax", kmax, lo=0, hi=top)
        c = np.fft.rfft(self.density, axis=-1) * (2.0 * np.pi / self.model.grid_size)
        return c[..., : kmax + 1]

    def density_at(self, theta: Any, save: int = -1) -> np.ndarray:
        """``rho`` at any angles ``theta`` at one save (exact trigonometric interpolation)."""
        k = _checks.index("save", save, len(self.ts), what="saves")
        c = self.coefficients()[k]
        th = np.asarray(theta, np.float64)
        deg = np.arange(c.size)
        terms = np.exp(1j * np.multiply.outer(th, deg)) * c
        return (terms[..., 0].real + 2.0 * terms[..., 1:].real.sum(-1)) / (2.0 * np.pi)

    def cdf(self, theta: Any, save: int = -1) -> np.ndarray:
        """``F(theta) = int_0^theta rho`` at one save, for ``theta`` in ``[0, 2 pi]``."""
        k = _checks.index("save", save, len(self.ts), what="saves")
        c = self.coefficients()[k]
        th = np.asarray(theta, np.float64)
        deg = np.arange(1, c.size)
        # int_0^th e^{i k s} ds = (e^{i k th} - 1) / (i k)
        w = (np.exp(1j * np.multiply.outer(th, deg)) - 1.0) / (1j * deg)
        return (c[0].real * th + 2.0 * (w * c[1:]).real.sum(-1)) / (2.0 * np.pi)

    def raise_for_status(self) -> DensityTrajectory:
        """Return ``self`` when the solve reached ``t1`` resolved at every save; raise
        ``SimulationError`` saying what to change otherwise."""
        if self.status not in (Status.OK, UNRESOLVED):
            raise SimulationError(
                f"the mean-field solve stopped with status {self.status!r} at t = "
                f"{self.t_stop:.6g}; the saves before it are kept (raise max_steps for "
                f"'max_steps', more modes for 'nonfinite')."
            )
        if not np.all(self.resolved):
            first = int(np.argmin(self.resolved))
            raise SimulationError(
                f"the density is not resolved from t = {self.ts[first]:.6g} on (tail "
                f"{self.tail[first]:.3g} > {self.tail_tol:g}): use more modes (now "
                f"{self.model.modes}) or a smaller t1."
            )
        return self

    def save(self, path: Any) -> Path:
        """Write the run (``q``, times and set-up as JSON metadata, hashed) to an ``.npz``
        file, atomically; ``DensityTrajectory.load`` reads it back bit for bit."""
        return _file().save(self, path)

    @classmethod
    def load(cls, path: Any) -> DensityTrajectory:
        """Read a run written by ``save`` (its hash checked; another format is refused)."""
        return _file().load(cls, path)


@eqx.filter_jit
def _solve(model, q0, ts, t1, rtol, atol, method, max_steps):
    return adaptive_solve(model, q0, ts, t1, rtol, atol, method=method, max_steps=max_steps)


def _initial_q(model: CircleMeanField, rho0: Any) -> np.ndarray:
    th = model.grid()
    if callable(rho0):
        vals = np.asarray(rho0(th), np.float64)
    else:
        vals = np.asarray(rho0, np.float64)
    if vals.shape != th.shape:
        raise ValueError(
            f"rho0 must be a function of the angle or its values on model.grid() (shape "
            f"({th.size},)); got shape {vals.shape}."
        )
    if not np.all(np.isfinite(vals)) or np.any(vals < 0) or not vals.sum() > 0:
        raise ValueError("rho0 must be finite, >= 0 and not all zero on model.grid().")
    q = np.sqrt(vals / (vals.mean() * 2.0 * np.pi))
    Q = np.fft.rfft(q)
    Q[model.modes + 1 :] = 0.0
    q = np.fft.irfft(Q, n=th.size)
    return q / math.sqrt(np.mean(q * q) * 2.0 * np.pi)  # unit mass of the kept q^2


def solve_density(
    model: CircleMeanField,
    rho0: Callable[[np.ndarray], np.ndarray] | Any,
    t1: float,
    *,
    ts: Any = None,
    solver: AdaptiveSolver | None = None,
    tail_tol: float = TAIL_TOL,
) -> DensityTrajectory:
    """Integrate the mean-field continuity equation on the circle from ``rho0`` to ``t1``.

    Args:
        model: a ``CircleMeanField``.
        rho0: the initial density: a function of the angle (vectorised) or its values on
            ``model.grid()``; finite and >= 0; scaled to a probability density (any
            positive multiple describes the same tokens). Its square root is kept to
            degree ``modes`` (``DensityTrajectory.tail`` at ``t = 0`` says how well).
        t1: the final time, > 0.
        ts: the saved times in ``[0, t1]``, increasing (default ``[0, t1]``).
        solver: an ``AdaptiveSolver`` (default Tsit5, ``rtol = 1e-9``, ``atol = 1e-12``).
        tail_tol: the resolution threshold of ``DensityTrajectory.resolved``.

    Returns:
        A ``DensityTrajectory``; warns (``RuntimeWarning``) when a save is not resolved.

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)  # the solve needs float64
        >>> m = af.CircleMeanField(5.0, modes=32)
        >>> sol = af.solve_density(m, lambda th: 1 + 1e-4 * np.cos(3 * th), 2.0)
        >>> sol.status
        'ok'
    """
    if not isinstance(model, CircleMeanField):
        raise ValueError(f"model must be a CircleMeanField; got {type(model).__name__}.")
    t1 = _checks.positive("t1", t1)
    if ts is None:
        ts_np = np.array([0.0, t1])
    else:
        ts_np = np.asarray(ts, np.float64).reshape(-1)
        if (
            ts_np.size == 0
            or not np.all(np.isfinite(ts_np))
            or np.any(np.diff(ts_np) < 0)
            or ts_np[0] < 0
            or ts_np[-1] > t1
        ):
            raise ValueError(f"ts must be increasing finite times in [0, t1 = {t1}].")
    solver = AdaptiveSolver(rtol=1e-9, atol=1e-12) if solver is None else solver
    if not isinstance(solver, AdaptiveSolver):
        raise ValueError(
            f"solver must be an attnflow.AdaptiveSolver; got {type(solver).__name__} (the "
            f"density has no layers)."
        )
    tail_tol = _checks.number("tail_tol", tail_tol, lo=0.0, hi=1.0, lo_open=True)
    if not jax.config.read("jax_enable_x64"):
        raise ValueError(
            "solve_density needs JAX's x64 mode (the spectral tail is judged far below "
            "float32 rounding): jax.config.update('jax_enable_x64', True)."
        )
    q0 = _initial_q(model, rho0)
    sol = _solve(
        model,
        jnp.asarray(q0),
        jnp.asarray(ts_np),
        t1,
        solver.rtol,
        solver.atol,
        solver.method,
        solver.max_steps,
    )
    out = DensityTrajectory(
        model=model,
        ts=ts_np,
        q=np.asarray(sol.ys),
        status=str(BY_CODE[int(sol.status)]),
        t_stop=float(sol.t_stop),
        num_steps=int(sol.num_steps),
        tail_tol=tail_tol,
    )
    ok = out.resolved | ~out.reached
    if not np.all(ok):
        first = float(ts_np[int(np.argmin(ok))])
        if out.status == Status.OK:
            out = eqx.tree_at(lambda o: o.status, out, UNRESOLVED)
        warnings.warn(
            f"the density is not resolved from t = {first:.6g} on (tail above {tail_tol:g}): "
            f"use more modes than {model.modes} or a smaller t1.",
            RuntimeWarning,
            stacklevel=2,
        )
    return out
