"""The numerics behind ``attnflow.analysis.rank``: argument checks, per-row statistics,
the rank rules and the doubly exponential fit.

Contract: the functions take arrays already checked by their caller in ``rank`` (the
``check_*`` functions are those checks: a ``ValueError`` naming the argument) and return
numpy values, except ``chunk_stats`` and the jitted ``traj_stats``, ``traj_stats_each``,
which take a model (or a stacked model, one per state) and tokens and return
JAX arrays; none of them reads a trajectory. The rank of a stack (``rank_stack``) is
decided, matrix by matrix, by the first rule that applies:

``"boolean"``
    the certificate, ``O(n^2)`` and no SVD: with ``B`` the nearest Boolean matrix,
    ``r`` its number of distinct attended columns, ``c_max, c_min`` the largest and
    smallest numbers of rows attending one column, and ``eps = ||P - B||_F``, the
    numerical rank of ``P`` is exactly ``r`` whenever
    ``eps < tol (sqrt(c_max) - eps)`` and ``sqrt(c_min) - eps > tol (sqrt(c_max) + eps)``
    (Weyl's inequality; the singular values of ``B`` are ``sqrt(c)``).
``"svd"``
    a full SVD, for ``max(r, n) <= svd_max_n`` (or always, with ``method="svd"``).
``"randomized"``
    subspace iteration with ``rank_cap`` columns and two power steps, an estimate
    capped at ``rank_cap``.

``RANK_METHODS`` names the rules by their codes (``"none"``: not computed).
``fit_double_exponential`` fits ``log(-log D)`` over the last run of saved times inside
the window ``[fit_min, fit_max]``, as ``attnflow.analysis.rank`` defines it.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import linregress

from .. import _checks

RANK_METHODS = ("boolean", "svd", "randomized", "none")
NORMS = ("inf", "l1")
# Per saved time, P is computed for at most this many matrix entries at once.
CHUNK_ELEMENTS = 2**24


# ----------------------------------------------------------------------- checks
def check_tol(tol: Any) -> float:
    """The rank tolerance, in ``(0, 1)``."""
    return _checks.number(
        "tol",
        tol,
        lo=0.0,
        hi=1.0,
        lo_open=True,
        hi_open=True,
        what="in (0, 1) (relative to the largest singular value)",
    )


def check_threshold(threshold: Any) -> float:
    """The leaders' column-mass threshold, ``> 0``."""
    return _checks.positive("leader_threshold", threshold)


def check_method(method: Any) -> str:
    """The rank method, ``"auto"`` or ``"svd"``."""
    return _checks.choice("method", method, ("auto", "svd"))


def check_P(P: Any, name: str = "P") -> np.ndarray:
    """An attention matrix or a stack ``(..., r, n)`` of them, as a floating array with
    no negative entry."""
    arr = _checks.real_array(name, P, shape_hint="(n, n), (r, n) or a stack (..., r, n)")
    if arr.ndim < 2:
        raise ValueError(
            f"{name} must have shape (n, n), (r, n) or a stack (..., r, n); got shape {arr.shape}."
        )
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if np.any(arr < 0):
        raise ValueError(f"{name} has negative entries; an attention matrix has entries in [0, 1].")
    return arr


# ------------------------------------------------------------ per-row statistics
def row_stats(P: np.ndarray, stochastic: bool):
    """Argmax, distance to e_argmax (inf and l1), squared l2 distance, per row."""
    k = np.argmax(P, axis=-1)
    pk = np.take_along_axis(P, k[..., None], axis=-1)[..., 0]
    off = P.copy()
    np.put_along_axis(off, k[..., None], 0.0, axis=-1)
    s = off.sum(-1)
    second = off.max(-1) if P.shape[-1] > 1 else np.zeros_like(pk)
    sq = (off * off).sum(-1)
    if stochastic:
        gap = s  # 1 - p_k, exactly, for a row that sums to one
        d_inf, d_l1 = s, 2.0 * s
    else:
        gap = np.abs(1.0 - pk)
        d_inf, d_l1 = np.maximum(gap, second), gap + s
    return k, d_inf, d_l1, gap * gap + sq


# ------------------------------------------------------------------------ rank
def certify(k: np.ndarray, fro2: np.ndarray, n_cols: int, tol: float):
    """Boolean certificate for a stack of matrices.

    Args:
        k: ``(N, r)`` argmax column of each row; fro2: ``(N, r)`` squared l2 distance of
        each row to ``e_k``.

    Returns:
        ``(rank (N,), certified (N,) bool)``.
    """
    N, r = k.shape
    counts = np.zeros((N, n_cols), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(N), r), k.reshape(-1)), 1)
    distinct = (counts > 0).sum(-1)
    cmax = counts.max(-1).astype(np.float64)
    cmin = np.where(counts > 0, counts, np.iinfo(np.int64).max).min(-1).astype(np.float64)
    # A little slack for the rounding in the computation of eps itself.
    eps = np.sqrt(fro2.sum(-1).astype(np.float64)) * (1.0 + 1e-6)
    ok_small = eps < tol * (np.sqrt(cmax) - eps)
    ok_large = np.sqrt(cmin) - eps > tol * (np.sqrt(cmax) + eps)
    return distinct, ok_small & ok_large


def rank_svd(Ps: np.ndarray, tol: float) -> np.ndarray:
    """Numerical ranks of a stack ``(N, r, n)`` from full SVDs."""
    s = np.linalg.svd(Ps, compute_uv=False)
    top = s[..., :1]
    return np.where(top[..., 0] > 0, (s > tol * top).sum(-1), 0)


def rank_randomized(P: np.ndarray, tol: float, cap: int, rng) -> int:
    """Subspace-iteration estimate of the numerical rank, capped at ``cap``."""
    r, n = P.shape
    k = min(cap + 8, r, n)
    Y = P @ rng.standard_normal((n, k)).astype(P.dtype)
    for _ in range(2):
        Y, _ = np.linalg.qr(Y)
        Y, _ = np.linalg.qr(P.T @ Y)
        Y = P @ Y
    Qm, _ = np.linalg.qr(Y)
    s = np.linalg.svd(Qm.T @ P, compute_uv=False)
    if s[0] <= 0:
        return 0
    return int(min((s > tol * s[0]).sum(), cap))


def rank_stack(
    Ps: np.ndarray,
    k: np.ndarray,
    fro2: np.ndarray,
    tol: float,
    *,
    svd_max_n: int,
    rank_cap: int,
    rng,
    method: str,
):
    """Ranks of a stack ``(N, r, n)`` with per-row stats; returns (rank, method codes)."""
    N, r, n = Ps.shape
    rank = np.zeros(N, dtype=np.int64)
    code = np.full(N, RANK_METHODS.index("svd"), dtype=np.int8)
    if method in ("auto", "boolean"):
        distinct, cert = certify(k, fro2, n, tol)
        rank[cert] = distinct[cert]
        code[cert] = RANK_METHODS.index("boolean")
        todo = np.flatnonzero(~cert)
    else:
        todo = np.arange(N)
    if todo.size == 0:
        return rank, code
    if method == "svd" or (method in ("auto", "boolean") and max(r, n) <= svd_max_n):
        step = max(1, CHUNK_ELEMENTS // (r * n))
        for a in range(0, todo.size, step):
            idx = todo[a : a + step]
            rank[idx] = rank_svd(Ps[idx], tol)
        code[todo] = RANK_METHODS.index("svd")
    else:
        for i in todo:
            rank[i] = rank_randomized(Ps[i], tol, rank_cap, rng)
        code[todo] = RANK_METHODS.index("randomized")
    return rank, code


# -------------------------------------------------------- trajectory statistics
def _one_stats(model, x, stochastic: bool) -> dict:
    """The attention of tokens ``x`` ``(n, d)`` and its per-row statistics, all through the
    model's seam (its own attention, argmax and log-masses)."""
    P = model.attention(x)
    n = P.shape[-1]
    k = model.attention_argmax(x, P)
    hot = jax.nn.one_hot(k, n, dtype=bool)
    off = jnp.where(hot, 0.0, P)
    s = off.sum(-1)
    pk = jnp.take_along_axis(P, k[:, None], axis=-1)[:, 0]
    sq = (off * off).sum(-1)
    second = off.max(-1)
    # Cluster of a leader: the tokens that attend it. Mass outside the row's cluster.
    same = k[None, :] == k[:, None]  # (i, j): token j attends the leader of row i
    out_mass = jnp.where(same, 0.0, P).sum(-1)
    log_off = model.attention_log_mass(x, P, ~hot)
    log_out = model.attention_log_mass(x, P, ~same)
    gap = s if stochastic else jnp.abs(1.0 - pk)
    d_inf = s if stochastic else jnp.maximum(gap, second)
    d_l1 = 2.0 * s if stochastic else gap + s
    return dict(
        P=P,
        k=k,
        d_inf=d_inf,
        d_l1=d_l1,
        fro2=gap * gap + sq,
        log_off=log_off,
        out=out_mass,
        log_out=log_out,
        colmass=P.sum(0),
    )


@eqx.filter_jit
def traj_stats(model, x, stochastic: bool):
    """Tokens ``x`` ``(c, n, d)`` (original frame) -> ``P`` and per-row statistics of one
    model (``_one_stats`` of each state)."""
    return jax.vmap(lambda xi: _one_stats(model, xi, stochastic))(x)


def chunk_stats(model, head: int | None, systems, x, stochastic: bool):
    """The statistics of states ``x`` ``(c, n, d)`` of head ``head`` of ``model``; for a
    stacked model (``attnflow.stack``) state ``c`` is read with model ``systems[c]``."""
    if model.stack_size is None:
        return traj_stats(model.head(head), x, stochastic)
    dyn, static = eqx.partition(model, eqx.is_array)
    each = jax.tree_util.tree_map(lambda a: a[systems], dyn)
    return traj_stats_each(eqx.combine(each, static), head, x, stochastic)


@eqx.filter_jit
def traj_stats_each(models, head: int | None, x, stochastic: bool):
    """As ``traj_stats``, state ``c`` with head ``head`` of model ``c``: ``models`` is
    stacked (``attnflow.stack``) along the same leading axis as ``x`` ``(c, n, d)``."""
    return eqx.filter_vmap(lambda m, xi: _one_stats(m.head(head), xi, stochastic))(models, x)


def fit_double_exponential(
    ts: np.ndarray,
    logD: np.ndarray,
    valid: np.ndarray,
    fit_min: float,
    fit_max: float,
    min_points: int,
) -> dict:
    """Least-squares line through ``log(-log D)`` on the last run within the window."""
    nan = float("nan")
    out = dict(rate=nan, intercept=nan, r2=nan, rate_stderr=nan, window=(nan, nan), points=0)
    log_lo = -np.inf if fit_min == 0 else math.log(fit_min)
    inside = valid & (logD <= math.log(fit_max)) & (logD >= log_lo) & np.isfinite(logD)
    idx = np.flatnonzero(inside)
    if idx.size == 0:
        return out
    # last maximal run of consecutive saved indices
    breaks = np.flatnonzero(np.diff(idx) != 1)
    run = idx[breaks[-1] + 1 :] if breaks.size else idx
    out["points"] = int(run.size)
    out["window"] = (float(ts[run[0]]), float(ts[run[-1]]))
    if run.size < min_points:
        return out
    t = ts[run].astype(np.float64)
    y = np.log(-logD[run].astype(np.float64))
    if np.all(t == t[0]):
        return out
    fit: Any = linregress(t, y)
    slope, intercept, rvalue = float(fit.slope), float(fit.intercept), float(fit.rvalue)
    # The slope's standard error from the residuals of scipy's line: scipy's own
    # ``stderr`` is sqrt((1 - r^2) s_yy / s_xx / (m - 2)), whose 1 - r^2 cancels when the
    # law holds (r^2 = 1 - 1e-10 leaves it ~1e-6 relative accuracy, 1 - 1e-14 none).
    res = y - (intercept + slope * t)
    sxx = float(((t - t.mean()) ** 2).sum())
    out.update(
        rate=slope,
        intercept=intercept,
        # a constant y has no R^2 (scipy reports r = 0 for it)
        r2=rvalue**2 if np.any(y != y[0]) else nan,
        rate_stderr=math.sqrt(float((res**2).sum()) / (run.size - 2) / sxx)
        if run.size > 2
        else nan,
    )
    return out


# ------------------------------------------------------------------ saved times
def last_reached(reached2d) -> np.ndarray:
    """Per system ``(b,)``: the index of the last reached save (0 when none is)."""
    r = np.atleast_2d(reached2d)
    m = r.shape[-1]
    idx = m - 1 - np.argmax(r[:, ::-1], axis=-1)
    return np.where(r.any(-1), idx, 0)
