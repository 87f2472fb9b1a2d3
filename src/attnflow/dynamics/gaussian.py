"""The Gaussian closure of the mean-field equation of softmax attention.

Contract (Castin, Ablin, Carrillo and Peyre 2025, in attnflow's conventions). The
particles ``dx_i/dt = sum_j P_ij V x_j``, ``P_ij`` the softmax over ``j`` of
``beta <Q x_i, K x_j>``, have as ``n -> infinity`` the mean-field velocity at ``x``

    v(x) = V E_{y ~ mu_x}[y],    mu_x(dy) ∝ e^{beta x^T Q^T K y} mu(dy).

For a Gaussian ``mu = N(m, S)`` the tilted measure ``mu_x`` is the Gaussian
``N(m + beta S K^T Q x, S)``, so ``v(x) = V m + B x`` with ``B = beta V S K^T Q``: an affine
field, which maps a Gaussian to a Gaussian. The law stays ``N(m(t), S(t))`` with

    m' = V m + beta V S K^T Q m,
    S' = beta (V S K^T Q S + S Q^T K S V^T)

for any ``d`` and any ``(Q, K, V)``: the one mean-field prediction in general dimension
(``d = 1``, ``Q = K = V = 1``, ``beta = 1``, ``m = 0``: ``s' = 2 s^2``, ``s(t) = s_0 / (1 - 2
s_0 t)``). Particles sampled from ``N(m_0, S_0)`` follow it with a sampling error
``O(n^{-1/2})``. The covariance can blow up in finite time (as ``s_0 / (1 - 2 s_0 t)``
does): the solve then stops with its status, keeping what it computed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _checks
from .._precision import mm

__all__ = ["gaussian_closure", "GaussianClosure", "closure_field"]


@dataclasses.dataclass(frozen=True)
class GaussianClosure:
    """The Gaussian solution of the mean-field equation at the saved times.

    Attributes:
        ts: ``(m,)`` the times.
        means: ``(m, d)`` the means ``m(t)``.
        covs: ``(m, d, d)`` the covariances ``S(t)`` (symmetric).
        status: ``"ok"``, or why the solve stopped (the saves past it are NaN).
        beta: the inverse temperature.
    """

    ts: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    status: str
    beta: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def closure_field(Q: Array, K: Array, V: Array, beta: Any, m: Array, S: Array):
    """``(m', S')`` of the Gaussian closure (see the module docstring)."""
    M = mm(mm(S, K.T), Q)  # S K^T Q
    dm = mm(V, m) + beta * mm(V, mm(M, m))
    dS = beta * (mm(mm(V, M), S) + mm(mm(mm(mm(S, Q.T), K), S), V.T))
    return dm, 0.5 * (dS + dS.T)  # symmetric to rounding


@eqx.filter_jit
def _solve(Q, K, V, beta, m0, S0, ts, rtol, atol):
    import diffrax  # on first use: importing attnflow does not import diffrax

    def field(t, y, args):
        return closure_field(Q, K, V, beta, *y)

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Tsit5(),
        t0=jnp.zeros((), ts.dtype),
        t1=ts[-1],
        dt0=None,
        y0=(m0, S0),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=100_000,
        throw=False,
    )
    assert sol.ys is not None
    return sol.ys, sol.result == diffrax.RESULTS.successful


def gaussian_closure(
    Q: Float[Any, "d d"],
    K: Float[Any, "d d"],
    V: Float[Any, "d d"],
    mean: Float[Any, " d"],
    cov: Float[Any, "d d"],
    ts: Float[Any, " m"],
    *,
    beta: float = 1.0,
    rtol: float = 1e-10,
    atol: float = 1e-12,
) -> GaussianClosure:
    """The means and covariances at ``ts`` of the Gaussian that solves the mean-field
    equation of softmax attention from ``N(mean, cov)``.

    Args:
        Q, K, V: ``(d, d)`` real matrices (the head of ``attnflow.Attention(Q, K, V)``).
        mean: ``(d,)`` the initial mean.
        cov: ``(d, d)`` the initial covariance (symmetric, positive semidefinite).
        ts: sorted times ``>= 0`` at which to save.
        beta: the inverse temperature (> 0).
        rtol, atol: tolerances of the adaptive solve (diffrax Tsit5).

    Returns:
        A ``GaussianClosure``; the working precision is JAX's default float (float64
        with x64 on).

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)
        >>> g = af.gaussian_closure([[1.0]], [[1.0]], [[1.0]], [0.0], [[0.2]], [0.0, 1.0])
        >>> round(float(g.covs[-1, 0, 0]), 10)  # s0 / (1 - 2 s0 t) = 0.2 / 0.6
        0.3333333333
    """
    mats = [_checks.real_array(n, a, ndim=2, shape_hint="(d, d)") for n, a in zip("QKV", (Q, K, V))]
    d = mats[2].shape[0]
    for name, a in zip("QKV", mats):
        if a.shape != (d, d):
            raise ValueError(f"{name} must be ({d}, {d}) like V; got shape {a.shape}.")
    m0 = _checks.real_array("mean", mean, ndim=1, shape_hint=f"({d},)")
    S0 = _checks.real_array("cov", cov, ndim=2, shape_hint=f"({d}, {d})")
    if m0.shape != (d,) or S0.shape != (d, d):
        raise ValueError(f"mean must be ({d},) and cov ({d}, {d}); got {m0.shape} and {S0.shape}.")
    if not np.allclose(S0, S0.T, rtol=1e-12, atol=1e-14 * max(1.0, float(np.abs(S0).max()))):
        raise ValueError("cov must be symmetric.")
    if np.min(np.linalg.eigvalsh(0.5 * (S0 + S0.T))) < -1e-12 * max(1.0, float(np.abs(S0).max())):
        raise ValueError("cov must be positive semidefinite (a covariance).")
    b = _checks.positive("beta", beta)
    ts_np = _checks.real_array("ts", ts, ndim=1, shape_hint="(a 1-d array of times)")
    if np.any(np.diff(ts_np) < 0) or ts_np[0] < 0:
        raise ValueError("ts must be sorted times >= 0.")
    r = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    a = _checks.number("atol", atol, lo=0.0, lo_open=True)
    dtype = jnp.result_type(float)
    arr = [jnp.asarray(x, dtype) for x in (*mats, m0, S0, ts_np)]
    if float(ts_np[-1]) == 0.0:  # nothing to integrate
        means = np.repeat(m0[None], len(ts_np), 0)
        covs = np.repeat(S0[None], len(ts_np), 0)
        return GaussianClosure(ts_np, means, covs, "ok", b)
    Qj, Kj, Vj, mj, Sj, tj = arr
    (means, covs), ok = _solve(Qj, Kj, Vj, jnp.asarray(b, dtype), mj, Sj, tj, r, a)
    means, covs = np.array(means, np.float64), np.array(covs, np.float64)
    finite = np.all(np.isfinite(means), axis=-1) & np.all(np.isfinite(covs), axis=(-1, -2))
    status = (
        "ok"
        if bool(ok) and finite.all()
        else "failed (the covariance blew up or the solve stopped)"
    )
    means[~finite] = np.nan
    covs[~finite] = np.nan
    return GaussianClosure(ts_np, means, covs, status, b)
