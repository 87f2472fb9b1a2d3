"""Attention rank tracking: follow ``P(t)`` to a Boolean low-rank matrix and find the leaders.

In ``d = 1`` with ``V > 0`` and ``QK > 0`` the clustering paper (Geshkovski, Letrouit,
Polyanskiy, Rigollet 2023) proves that the attention matrix ``P(t)`` converges to a
Boolean matrix in which every row except at most one is ``e_1`` or ``e_n`` (rank at most
3; rank 1 or 2 for almost every start), doubly exponentially fast. This module measures
that, for any trajectory (any ``d``, any ``V``):

``track_rank(traj)``
    at every saved time: the numerical rank of ``P``, its distance to the nearest Boolean
    row-stochastic matrix, which token each row attends to; at the last time the leaders;
    and a straight-line fit of ``log(-log D(t))`` against ``t`` (the doubly exponential
    law ``D ~ exp(-c e^{r t})`` is a line of slope ``r``).

Matrix-level functions, usable on any attention matrix ``(n, n)`` or stack ``(..., r, n)``:
``rank_of``, ``boolean_distance``, ``nearest_boolean``, ``leaders_of``.

Definitions (the numbers users cite)
------------------------------------
Numerical rank
    ``rank(P) = #{k : sigma_k(P) > tol * sigma_1(P)}`` (tolerance relative to the largest
    singular value; ``0`` for the zero matrix).
Boolean distance of a row ``p`` (entries in ``[0, 1]``)
    the distance to the nearest Boolean row-stochastic row ``e_k``; for every norm used
    here the nearest one is ``e_k`` with ``k = argmax_j p_j``. ``norm="inf"`` (default):
    ``||p - e_k||_inf = 1 - p_k``; ``norm="l1"``: ``||p - e_k||_1 = 2 (1 - p_k)`` (for
    row-stochastic rows). For row-stochastic rows ``1 - p_k`` is computed as the
    off-argmax mass ``sum_{j != k} p_j``, which is exact to relative rounding far below
    machine epsilon (down to the smallest normal float), where ``1 - p_k`` itself would be
    rounded to 0 near ``1e-16``. The distance of a matrix is the max over its rows.
Leaders
    the tokens ``j`` whose column of the last attention matrix carries mass
    ``sum_i P_ij > leader_threshold`` (default ``0.5``). In a Boolean matrix column masses
    are whole numbers (how many rows attend ``j``), and a column that no row attends has
    mass at most ``n D`` (``D`` the inf-norm Boolean distance), so the rule is exact once
    ``D < leader_threshold / n`` (``leaders_settled``).
Cluster distance
    the mass a row puts outside its leader's cluster, ``sum_{j : a_j != a_i} P_ij``, where
    ``a_i = argmax_j P_ij`` (the cluster of a leader is the set of tokens that attend it).
    It measures convergence to the block structure without the collapse of followers onto
    their leader, and decays faster than the Boolean distance (see below). It is a
    diagnostic: its fit (``cluster_rate``) is meaningful once the attended tokens no
    longer change; check ``cluster_r2``.

The doubly exponential fit
--------------------------
``y(t) = log(-log D(t))`` is fitted by least squares to ``rate * t + intercept`` over the
*fit window*: the last run of consecutive saved times with ``fit_min <= D <= fit_max``.
Defaults: ``fit_max = 1e-10`` (the law is asymptotic; shallower windows see the
transient, which bends the line up), ``fit_min = 1e3 * finfo.tiny``, about ``2e-305`` in
float64 and ``1e-35`` in float32, so that ``D`` is a normal float of the working
precision: in float64 the window is ``log(-log D)`` in ``[3.1, 6.55]``, in float32
``[3.1, 4.4]``. Reported: ``rate`` (slope), ``intercept``, ``r2``, ``rate_stderr``, the
window ``[t_start, t_end]`` and the number of points; NaN where fewer than
``min_fit_points`` saved times are in the window (save more times: ``ts=`` of
``simulate``). A law that holds shows ``r2`` close to 1; a line bent by a transient shows
a smaller ``r2`` and a larger ``rate``.

``log_boolean_distance`` is computed from the logits (``logsumexp`` of the off-argmax
logits minus ``logsumexp`` of the row), so it stays finite long after ``D`` underflows to
0; it is exact for the computed states, but late in a run the states themselves are only
as accurate as the solver, and follower-leader gaps below the solver tolerance make it
noise. That is why the fit stops at ``fit_min`` by default; pass ``fit_min=0`` to fit
the logit-based values to the end of the run (with tight ``rtol``/``atol``).

What is measured rather than proved about the fitted slopes (``lambda`` against
``2 lambda``, the cluster distance, discrete time) is in ``docs/rank.md``.

Cost and the large-``n`` rule
-----------------------------
The Boolean certificate costs ``O(n^2)`` per matrix and no SVD: with ``B`` the nearest
Boolean matrix, ``r`` its number of distinct attended columns, ``c_max, c_min`` the largest
and smallest numbers of rows attending one column, and ``eps = ||P - B||_F``, the singular
values of ``B`` are ``sqrt(c)`` for its column counts, so by Weyl's inequality the numerical
rank of ``P`` is exactly ``r`` whenever

    eps < tol (sqrt(c_max) - eps)    and    sqrt(c_min) - eps > tol (sqrt(c_max) + eps).

With ``tol = 1e-6`` this holds once the Boolean distance is below about ``1e-6``. Other
matrices: a full SVD (``O(n^3)``) when ``n <= svd_max_n`` (default 1024); above it a
randomized estimate (subspace iteration with ``rank_cap`` columns, default 64, two power
steps, ``O(n^2 rank_cap)``), reported with
``rank_method = "randomized"`` and ``rank_exact = False``, and ``rank = rank_cap`` means
"at least ``rank_cap``". ``rank_method`` says which rule gave each number.

Precision
---------
Followers approach their leader like ``e^{-lambda t}`` in the rescaled frame. In float32
they coincide with it to the last bit after ``t ~ 13 / lambda`` (tokens of size 1): the
logits of the copies are then equal, rows split evenly over them, the Boolean distance
jumps to ``1 - 1/k`` and ``leaders_settled`` becomes False. Use x64 for long runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jaxtyping import Float, Int, Shaped

from .. import _checks
from ..dynamics.stack import unstack
from . import _rank_numerics
from ._rank_numerics import (
    NORMS,
    RANK_METHODS,
    check_method,
    check_P,
    check_threshold,
    check_tol,
    chunk_stats,
    fit_double_exponential,
    last_reached,
    rank_stack,
    row_stats,
)

if TYPE_CHECKING:
    from ..dynamics.trajectory import Trajectory

__all__ = [
    "RankTrack",
    "track_rank",
    "rank_of",
    "boolean_distance",
    "nearest_boolean",
    "leaders_of",
    "RANK_METHODS",
]


# ------------------------------------------------------------- matrix functions
def boolean_distance(
    P: Float[npt.ArrayLike, "*b r n"],
    *,
    norm: str = "inf",
    stochastic: bool = True,
    per_row: bool = False,
) -> Float[np.ndarray, "*b"] | Float[np.ndarray, "*b r"]:
    """Distance of ``P`` to the nearest Boolean row-stochastic matrix.

    Args:
        P: attention matrix ``(r, n)`` (usually ``(n, n)``) or a stack ``(..., r, n)``,
            entries in ``[0, 1]``.
        norm: ``"inf"`` (default): per row ``max_j |P_ij - B_ij|``; ``"l1"``: per row
            ``sum_j |P_ij - B_ij|``. ``B`` is the nearest Boolean row-stochastic matrix,
            ``B_i = e_{argmax_j P_ij}`` (nearest in both norms).
        stochastic: whether the rows of ``P`` sum to one (any softmax attention). Then the
            per-row distance is computed from the off-argmax mass ``sum_{j != k} P_ij``
            (``inf``: that mass; ``l1``: twice it), exact to relative rounding down to the
            smallest normal float. With ``False`` the general formulas
            ``max(|1 - P_ik|, max_{j != k} P_ij)`` and ``|1 - P_ik| + sum_{j != k} P_ij``
            are used, which resolve only down to about machine epsilon.
        per_row: return the ``(..., r)`` per-row distances instead of their max.

    Returns:
        ``(...)`` max over rows (or ``(..., r)`` per row), as a numpy array. A Boolean
        row-stochastic matrix has distance exactly 0.
    """
    norm = _checks.choice("norm", norm, NORMS)
    P = check_P(P)
    _, d_inf, d_l1, _ = row_stats(P, bool(stochastic))
    d = d_inf if norm == "inf" else d_l1
    return d if per_row else d.max(-1)


def nearest_boolean(P: Float[npt.ArrayLike, "*b r n"]) -> Float[np.ndarray, "*b r n"]:
    """The nearest Boolean row-stochastic matrix: ``B_i = e_{argmax_j P_ij}``.

    Args:
        P: ``(..., r, n)``, entries in ``[0, 1]``.

    Returns:
        ``(..., r, n)`` array of 0.0 and 1.0 (ties go to the smallest column index).
    """
    P = check_P(P)
    k = np.argmax(P, axis=-1)
    B = np.zeros(P.shape, dtype=P.dtype)
    np.put_along_axis(B, k[..., None], 1.0, axis=-1)
    return B


def leaders_of(P: Float[npt.ArrayLike, "r n"], threshold: float = 0.5) -> Int[np.ndarray, " k"]:
    """Tokens that receive attention: columns of ``P`` with mass ``sum_i P_ij > threshold``.

    Args:
        P: one attention matrix ``(r, n)``.
        threshold: column-mass threshold (> 0). The default 0.5 is exact for a matrix
            within inf-norm Boolean distance ``0.5 / r`` of a Boolean one.

    Returns:
        Sorted ``int`` array of column indices.
    """
    P = check_P(P)
    if P.ndim != 2:
        raise ValueError(f"P must be one matrix (r, n) here; got shape {P.shape}.")
    th = check_threshold(threshold)
    return np.flatnonzero(P.sum(0) > th)


def rank_of(
    P: Float[npt.ArrayLike, "*b r n"],
    tol: float = 1e-6,
    *,
    method: str = "auto",
    svd_max_n: int = 1024,
    rank_cap: int = 64,
    seed: int = 0,
    return_method: bool = False,
) -> Int[np.ndarray, "*b"] | tuple[Int[np.ndarray, "*b"], Shaped[np.ndarray, "*b"]]:
    """Numerical rank of an attention matrix or a stack of them.

    ``rank = #{k : sigma_k(P) > tol * sigma_1(P)}``.

    Args:
        P: ``(r, n)`` (usually ``(n, n)``) or a stack ``(..., r, n)``, entries in ``[0, 1]``.
        tol: relative tolerance in ``(0, 1)``; meaningful above about ``n * eps`` of the
            working precision (``eps = 2.2e-16`` in float64, ``1.2e-7`` in float32).
        method: ``"auto"`` (default): the Boolean certificate where it applies (no SVD,
            exact; see the module docstring), else an SVD up to ``svd_max_n``, else a
            randomized estimate. ``"svd"``: always a full SVD.
        svd_max_n: largest ``max(r, n)`` for which ``"auto"`` runs a full SVD.
        rank_cap: columns of the randomized estimate; it reports at most ``rank_cap``.
        seed: seed of the randomized estimate.
        return_method: also return the ``(...)`` array of method names
            (``"boolean"``, ``"svd"``, ``"randomized"``).

    Returns:
        ``(...)`` integer array (a numpy scalar array for one matrix), and the methods if
        asked.
    """
    tol = check_tol(tol)
    method = check_method(method)
    svd_max_n = _checks.integer("svd_max_n", svd_max_n, lo=1)
    rank_cap = _checks.integer("rank_cap", rank_cap, lo=1)
    P = check_P(P)
    lead = P.shape[:-2]
    Ps = P.reshape((-1,) + P.shape[-2:])
    k, _, _, fro2 = row_stats(Ps, stochastic=bool(np.allclose(Ps.sum(-1), 1.0)))
    rank, code = rank_stack(
        Ps,
        k,
        fro2,
        tol,
        svd_max_n=svd_max_n,
        rank_cap=rank_cap,
        rng=np.random.default_rng(seed),
        method=method,
    )
    rank = rank.reshape(lead)
    if return_method:
        return rank, np.asarray(RANK_METHODS, dtype=object)[code].reshape(lead).astype(str)
    return rank


# ----------------------------------------------------------------------- result
@dataclasses.dataclass(frozen=True, eq=False)
class RankTrack:
    """Rank, Boolean distance and leaders of the attention matrix along a trajectory.

    Shapes: ``m`` saved times, ``n`` tokens; a batched trajectory adds a leading axis
    ``b`` to every per-system field (``leaders`` is then a tuple of ``b`` arrays). Saved
    times a failed system never reached, and saves whose tokens are not finite, have
    ``rank = -1`` and NaN distances ("reached" below means reached with finite tokens).

    Attributes:
        ts: ``(m,)`` saved times.
        rank: ``(b?, m)`` numerical rank of ``P`` with tolerance ``tol`` relative to the
            largest singular value.
        rank_method: ``(b?, m)`` which rule gave it: ``"boolean"`` (certificate, exact, no
            SVD), ``"svd"``, ``"randomized"`` (estimate), ``"none"`` (not reached).
        rank_exact: ``(b?, m)`` False only for randomized estimates and unreached times.
        boolean_distance: ``(b?, m)`` max over rows of the distance of ``P_i`` to the
            nearest Boolean row-stochastic row ``e_{argmax}``, in the norm ``norm``.
        log_boolean_distance: ``(b?, m)`` its natural log, from the logits for softmax
            (finite beyond the float range of ``boolean_distance``).
        row_distance: ``(b?, m, n)`` the per-row distances.
        attends_to: ``(b?, m, n)`` ``argmax_j P_ij``: the token each row attends to.
        n_attended: ``(b?, m)`` number of distinct attended tokens (rank of the nearest
            Boolean matrix).
        cluster_distance: ``(b?, m)`` max over rows of the mass outside the row's leader's
            cluster (see the module docstring); ``log_cluster_distance`` its log.
        column_mass: ``(b?, n)`` column sums of ``P`` at the last reached time.
        leaders: token indices with ``column_mass > leader_threshold`` (sorted ``int``
            array; a tuple of arrays for a batch). ``leader_mask``: ``(b?, n)`` bool.
        leaders_settled: ``(b?,)`` whether the last Boolean distance is below
            ``leader_threshold / n`` (then the leader set is exact).
        rate, intercept, r2, rate_stderr: ``(b?,)`` the line ``log(-log D) = rate * t +
            intercept`` fitted over the window; ``fit_window`` ``(b?, 2)`` its
            ``[t_start, t_end]``; ``fit_points`` ``(b?,)`` how many saved times.
        cluster_rate, cluster_r2, cluster_fit_window, cluster_fit_points: the same fit of
            the cluster distance.
        lambda_max: largest real part of the eigenvalues of ``V``: the rate scale
            (``(b,)``, one per system, for a run of stacked weights).
        tol, norm, leader_threshold, fit_min, fit_max: the settings used.
        statuses: the trajectory's status per system.
    """

    ts: np.ndarray
    rank: np.ndarray
    rank_method: np.ndarray
    rank_exact: np.ndarray
    boolean_distance: np.ndarray
    log_boolean_distance: np.ndarray
    row_distance: np.ndarray
    attends_to: np.ndarray
    n_attended: np.ndarray
    cluster_distance: np.ndarray
    log_cluster_distance: np.ndarray
    column_mass: np.ndarray
    leaders: Any
    leader_mask: np.ndarray
    leaders_settled: np.ndarray
    rate: np.ndarray
    intercept: np.ndarray
    r2: np.ndarray
    rate_stderr: np.ndarray
    fit_window: np.ndarray
    fit_points: np.ndarray
    cluster_rate: np.ndarray
    cluster_intercept: np.ndarray
    cluster_r2: np.ndarray
    cluster_fit_window: np.ndarray
    cluster_fit_points: np.ndarray
    lambda_max: float | np.ndarray
    tol: float
    norm: str
    leader_threshold: float
    fit_min: float
    fit_max: float
    batched: bool
    statuses: tuple

    @property
    def final_rank(self):
        """Rank at the last reached saved time, ``int`` or ``(b,)``."""
        r = np.where(self.rank >= 0, self.rank, -1)
        last = last_reached(r >= 0)
        out = np.take_along_axis(np.atleast_2d(r), last[:, None], axis=-1)[:, 0]
        return out if self.batched else int(out[0])

    def to_dict(self) -> dict:
        """Every field as plain Python / numpy values, for JSON (same names)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "leaders" and self.batched:
                v = [np.asarray(a) for a in v]
            out[f.name] = v
        out["final_rank"] = self.final_rank
        return out

    def summary(self) -> str:
        """A few human lines: final rank, distance, leaders and the fit."""
        lines = []
        systems = range(len(self.statuses)) if self.batched else [None]
        for i in systems:
            g = (lambda a, i=i: a[i]) if self.batched else (lambda a: a)
            rank = g(self.rank)
            reached = rank >= 0
            last = int(np.flatnonzero(reached)[-1]) if reached.any() else 0
            pre = f"system {i}: " if self.batched else ""
            lines.append(
                f"{pre}t = {float(self.ts[last]):.4g}: rank {int(rank[last])}, Boolean "
                f"distance {float(g(self.boolean_distance)[last]):.3e} "
                f"(log {float(g(self.log_boolean_distance)[last]):.4g}), leaders "
                f"{np.asarray(g(self.leaders)).tolist()}"
                f"{'' if bool(g(self.leaders_settled)) else ' (not settled)'}"
            )
            w = g(self.fit_window)
            lines.append(
                f"{pre}fit log(-log D) = {float(g(self.rate)):.4f} t + "
                f"{float(g(self.intercept)):.4f}, r2 = {float(g(self.r2)):.6f}, "
                f"window [{float(w[0]):.4g}, {float(w[1]):.4g}], "
                f"{int(g(self.fit_points))} points (lambda_max = "
                f"{float(np.asarray(self.lambda_max).reshape(-1)[i or 0]):.4g})"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"RankTrack(m={len(self.ts)}, batched={self.batched}, "
            f"final_rank={self.final_rank!r}, tol={self.tol:g}, norm={self.norm!r})"
        )


# ------------------------------------------------------------------------ main
def track_rank(
    traj: Trajectory,
    *,
    tol: float = 1e-6,
    norm: str = "inf",
    leader_threshold: float = 0.5,
    fit_max: float = 1e-10,
    fit_min: float | None = None,
    min_fit_points: int = 3,
    method: str = "auto",
    svd_max_n: int = 1024,
    rank_cap: int = 64,
    seed: int = 0,
    head: int | None = None,
) -> RankTrack:
    """Follow the attention matrix of a trajectory to its Boolean limit.

    Args:
        traj: an ``attnflow.Trajectory`` (one system or a batch) from ``simulate``. The
            attention at saved time ``k`` is ``traj.model``'s kernel of the logits of
            ``traj.x[k]``, the same matrix as ``traj.attention(k)``.
        tol: relative tolerance of the numerical rank, in ``(0, 1)``:
            ``rank = #{sigma_k > tol * sigma_1}``.
        norm: ``"inf"`` (default, ``1 - max_j P_ij`` per row) or ``"l1"`` (twice that) for
            the Boolean distance.
        leader_threshold: column-mass threshold for the leaders (> 0).
        fit_max: upper end of the fit window for ``D`` (in ``(0, 1)``; default 1e-10):
            the law is asymptotic, so only ``D <= fit_max`` is fitted.
        fit_min: lower end (``>= 0``, ``< fit_max``); default ``1e3 * finfo(dtype).tiny``.
            ``0`` fits the logit-based values down to the end of the run.
        min_fit_points: fewest saved times a fit needs (>= 2); fewer give NaN.
        method: ``"auto"`` or ``"svd"``: see ``rank_of``.
        svd_max_n, rank_cap, seed: see ``rank_of``.
        head: for a ``MultiHeadAttention`` (or a ``Block`` of one), the head whose
            attention matrix is tracked, along the joint trajectory (required when there
            are several heads). The growth rate of the fit is the rescaling matrix W's.

    Returns:
        A ``RankTrack``.

    Example:
        >>> import jax, numpy as np, attnflow as af
        >>> jax.config.update("jax_enable_x64", True)
        >>> model = af.Attention(np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"])
        >>> x0 = np.random.default_rng(0).uniform(-5, 5, (20, 2))
        >>> traj = af.simulate(model, x0, 10.0, ts=np.linspace(0, 10, 101))
        >>> rt = af.track_rank(traj)
        >>> rt.final_rank, rt.leaders.tolist()  # P(10) is Boolean: two leaders
        (2, [1, 13])
    """
    from ..dynamics.trajectory import Trajectory as _Trajectory

    if not isinstance(traj, _Trajectory):
        raise ValueError(
            f"traj must be an attnflow.Trajectory; got {type(traj).__name__}. "
            f"For a plain matrix use rank_of / boolean_distance."
        )
    tol = check_tol(tol)
    norm = _checks.choice("norm", norm, NORMS)
    th = check_threshold(leader_threshold)
    method = check_method(method)
    svd_max_n = _checks.integer("svd_max_n", svd_max_n, lo=1)
    rank_cap = _checks.integer("rank_cap", rank_cap, lo=1)
    min_fit_points = _checks.integer("min_fit_points", min_fit_points, lo=2)
    seed = _checks.integer("seed", seed, lo=0)
    fmax = _checks.number("fit_max", fit_max, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    dtype = np.dtype(traj.x.dtype)
    if fit_min is None:
        fmin = 1e3 * float(np.finfo(dtype).tiny)
    else:
        fmin = _checks.number(
            "fit_min", fit_min, lo=0.0, hi=fmax, hi_open=True, what=f"in [0, fit_max = {fmax})"
        )

    stacked = traj.stacked  # system i has its own model i (attnflow.stack)
    model = (unstack(traj.model, 0) if stacked else traj.model).head(head)  # class facts
    stochastic = model.rows_sum_to_one
    ts = np.asarray(traj.ts)
    x = traj.x if traj.batched else traj.x[None]  # (b, m, n, d)
    reached = np.asarray(traj.reached, bool).reshape(x.shape[0], x.shape[1])
    # A save whose tokens are not finite (an overflowed or non-finite stop state) has no
    # attention matrix: it counts as not reached (rank -1, NaN distances), never as a
    # number computed from NaN.
    reached = reached & np.asarray(jnp.all(jnp.isfinite(x), axis=(-2, -1)))
    b, m, n, _ = x.shape
    rng = np.random.default_rng(seed)

    rank = np.full((b, m), -1, np.int64)
    code = np.full((b, m), RANK_METHODS.index("none"), np.int8)
    d_row = np.full((b, m, n), np.nan, dtype)
    logD = np.full((b, m), np.nan, np.float64)
    att = np.full((b, m, n), -1, np.int64)
    out_max = np.full((b, m), np.nan, dtype)
    log_out = np.full((b, m), np.nan, np.float64)
    colmass = np.full((b, n), np.nan, dtype)
    last = last_reached(reached)

    chunk = max(1, _rank_numerics.CHUNK_ELEMENTS // max(1, n * n))
    flat_x = jnp.reshape(x, (b * m, n, x.shape[-1]))
    flat_reached = reached.reshape(-1)
    todo = np.flatnonzero(flat_reached)
    for a in range(0, todo.size, chunk):
        idx = todo[a : a + chunk]
        # pad to a fixed chunk size so that one compilation serves every chunk
        pad = np.concatenate([idx, np.full(min(chunk, todo.size) - idx.size, idx[-1])])
        st = jax.device_get(chunk_stats(traj.model, head, pad // m, flat_x[pad], stochastic))
        st = {key: np.asarray(v)[: idx.size] for key, v in st.items()}
        bi, mi = np.divmod(idx, m)
        Pc = np.asarray(st["P"])
        kc = np.asarray(st["k"])
        r_c, code_c = rank_stack(
            Pc,
            kc,
            np.asarray(st["fro2"]),
            tol,
            svd_max_n=svd_max_n,
            rank_cap=rank_cap,
            rng=rng,
            method=method,
        )
        rank[bi, mi] = r_c
        code[bi, mi] = code_c
        dr = np.asarray(st["d_inf"] if norm == "inf" else st["d_l1"])
        d_row[bi, mi] = dr
        lo = np.asarray(st["log_off"], np.float64)
        lo_o = np.asarray(st["log_out"], np.float64)
        if norm == "l1":
            lo = lo + math.log(2.0)
            lo_o = lo_o + math.log(2.0)
        logD[bi, mi] = lo.max(-1)
        att[bi, mi] = kc
        out_max[bi, mi] = np.asarray(st["out"]).max(-1)
        log_out[bi, mi] = lo_o.max(-1)
        is_last = mi == last[bi]
        if is_last.any():
            colmass[bi[is_last]] = np.asarray(st["colmass"])[is_last]

    D = np.max(d_row, axis=-1)
    srt = np.sort(att, axis=-1)
    n_att = np.where(reached, 1 + (np.diff(srt, axis=-1) != 0).sum(-1), -1).astype(np.int64)
    if norm == "l1" and stochastic:
        out_dist = 2.0 * out_max
    else:
        out_dist = out_max
    leader_mask = colmass > th
    leaders = tuple(np.flatnonzero(leader_mask[i]) for i in range(b))
    D_last = np.take_along_axis(D, last[:, None], axis=-1)[:, 0]
    D_last_inf = D_last / (2.0 if norm == "l1" else 1.0)
    settled = reached.any(-1) & (D_last_inf < th / n)

    fits = [
        fit_double_exponential(ts, logD[i], reached[i], fmin, fmax, min_fit_points)
        for i in range(b)
    ]
    cfits = [
        fit_double_exponential(ts, log_out[i], reached[i], fmin, fmax, min_fit_points)
        for i in range(b)
    ]

    def col(fs: list[dict], key: str, dt: Any = np.float64) -> np.ndarray:
        return np.asarray([f[key] for f in fs], dt)

    # the growth rate of the rescaling (V's largest real part), the scale of the fit
    prop = traj.model.propagator  # declared by every model (None: no rescaled frame)
    if prop is None:
        lam: Any = float("nan")
    else:
        lam = np.max(np.linalg.eigvals(np.asarray(prop.V, np.float64)).real, axis=-1)
        lam = lam if stacked else float(lam)  # stacked: one per system

    one = (lambda a: a) if traj.batched else (lambda a: a[0])
    return RankTrack(
        ts=ts,
        rank=one(rank),
        rank_method=one(np.asarray(RANK_METHODS)[code]),
        rank_exact=one(np.isin(code, [RANK_METHODS.index("boolean"), RANK_METHODS.index("svd")])),
        boolean_distance=one(D),
        log_boolean_distance=one(logD),
        row_distance=one(d_row),
        attends_to=one(att),
        n_attended=one(n_att),
        cluster_distance=one(out_dist),
        log_cluster_distance=one(log_out),
        column_mass=one(colmass),
        leaders=leaders if traj.batched else leaders[0],
        leader_mask=one(leader_mask),
        leaders_settled=one(settled),
        rate=one(col(fits, "rate")),
        intercept=one(col(fits, "intercept")),
        r2=one(col(fits, "r2")),
        rate_stderr=one(col(fits, "rate_stderr")),
        fit_window=one(col(fits, "window")),
        fit_points=one(col(fits, "points", np.int64)),
        cluster_rate=one(col(cfits, "rate")),
        cluster_intercept=one(col(cfits, "intercept")),
        cluster_r2=one(col(cfits, "r2")),
        cluster_fit_window=one(col(cfits, "window")),
        cluster_fit_points=one(col(cfits, "points", np.int64)),
        lambda_max=lam,
        tol=tol,
        norm=norm,
        leader_threshold=th,
        fit_min=fmin,
        fit_max=fmax,
        batched=bool(traj.batched),
        statuses=tuple(traj.statuses),
    )
