"""Observables of tokens on the sphere: clustered pairs, clusters, the interaction energy,
the equiangular curve, Wendel's hemisphere probability and the Renyi centres of causal
attention (``renyi_centres``, which takes one configuration ``(n, d)``).

Every observable takes a ``Trajectory`` (any frame: its tokens ``traj.x`` are normalised
here, ``x_i / |x_i|``) or an array of tokens ``(m, n, d)`` or ``(b, m, n, d)``, and
returns one value per saved time, ``(m,)`` or ``(b, m)``. Inner products are the plain
``<x_i, x_j>`` of the normalised tokens (the geometry of [P]; Q and K do not enter).

The equiangular curve. Let ``n <= d`` tokens start pairwise orthogonal, with
``Q = K = V = I``. Every permutation of the tokens is realised by an orthogonal map of
``R^d`` that fixes the configuration, and the dynamics commute with orthogonal maps, so
the tokens stay equiangular: ``<x_i, x_j> = gamma(t)`` for all ``i != j``. With
``a = e^{beta}`` (self weight) and ``b = e^{beta gamma}`` (weight on another token),
``Z = a + (n - 1) b`` for SA (``Z = n`` for USA), ``v_i = (a x_i + b sum_{j != i} x_j) / Z``:

    ``<x_i, v_i> = (a + (n - 1) gamma b) / Z``,
    ``<x_k, v_i> = (a gamma + b (1 + (n - 2) gamma)) / Z``  (``k != i``),
    ``d gamma/dt = 2 <x_k, v_i - <x_i, v_i> x_i>``
    ``           = 2 b (1 - gamma)(1 + (n - 1) gamma) / Z``,  ``gamma(0) = 0``.

So ``gamma`` increases from 0 to 1 (one cluster) and never reaches it in finite time;
``equiangular_curve`` integrates this ODE for ``u = log(1 - gamma)`` (full relative
accuracy as gamma nears 1) with scipy's DOP853 at ``rtol = 1e-12``.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxtyping import Float, Int
from scipy.integrate import solve_ivp

from .. import _checks

if TYPE_CHECKING:
    pass

__all__ = [
    "clustered_fraction",
    "count_clusters",
    "interaction_energy",
    "equiangular_curve",
    "equiangular_rate",
    "equiangular_time",
    "wendel_probability",
    "gram",
    "renyi_centres",
]


def _unit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x / |x|, zero)`` along the last axis, with each token divided by its largest
    entry before squaring: the norms neither overflow (entries past 1e154) nor
    underflow (below 1e-154), so the directions are exact at any scale. ``zero`` marks
    tokens that are exactly zero (left NaN in the result); NaN tokens stay NaN."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        big = np.max(np.abs(x), axis=-1, keepdims=True)
        y = x / big
        return y / np.sqrt(np.sum(y * y, axis=-1, keepdims=True)), big[..., 0] == 0


def _real_tokens(name: str, x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if np.iscomplexobj(arr):
        raise ValueError(
            f"{name} must be real tokens; got a complex array (its imaginary parts would be "
            "dropped). Pass the real and imaginary parts as coordinates of real tokens."
        )
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
    ):
        raise ValueError(f"{name} must be a real numeric array; got dtype {arr.dtype}.")
    return np.asarray(arr, np.float64)


def _tokens_of(traj: Any) -> Any:
    """The tokens ``x`` of a ``Trajectory``, or ``traj`` itself (an array); a trajectory
    exists only once the dynamics are imported, so an array needs no JAX."""
    mod = sys.modules.get("attnflow.dynamics.trajectory")
    return traj.x if mod is not None and isinstance(traj, mod.Trajectory) else traj


def _is_density(traj: Any) -> bool:
    """Whether ``traj`` is a density on the circle (``attnflow.DensityTrajectory``)."""
    mod = sys.modules.get("attnflow.dynamics.meanfield")
    return mod is not None and isinstance(traj, mod.DensityTrajectory)


def _tokens(traj: Any) -> np.ndarray:
    """Normalised tokens ``(..., m, n, d)`` in float64 of a Trajectory or an array."""
    _checks.refuse_mean_field(
        traj, "this observable", "Its peaks: density_clusters; energy: interaction_energy."
    )
    x = _real_tokens("traj", _tokens_of(traj))
    if x.ndim not in (3, 4):
        raise ValueError(
            f"traj must be a Trajectory or tokens of shape (m, n, d) or (b, m, n, d); got "
            f"shape {x.shape}."
        )
    if x.shape[-2] < 2:
        raise ValueError(f"traj has n = {x.shape[-2]} token(s); pairs need n >= 2.")
    u, zero = _unit(x)  # NaN (a save never reached) is not zero
    if zero.any():
        where = np.argwhere(zero)[0]
        at = ", ".join(
            f"{name} {int(i)}"
            for name, i in zip(("system", "save", "token")[-len(where) :], where, strict=True)
        )
        raise ValueError(
            f"traj has a zero token ({at}): it has no direction, so no inner product on "
            "the sphere; the sphere observables need non-zero tokens."
        )
    return u


def gram(traj: Any) -> Float[np.ndarray, "*b m n n"]:
    """The inner products ``<x_i, x_j>`` of the normalised tokens, ``(..., m, n, n)``."""
    u = _tokens(traj)
    return np.einsum("...id,...jd->...ij", u, u)


def _threshold(threshold) -> float:
    return _checks.number("threshold", threshold, lo=-1.0, hi=1.0, hi_open=True)


def clustered_fraction(traj: Any, threshold: float = 0.999) -> Float[np.ndarray, "*b m"]:
    """The fraction of ordered pairs ``i != j`` with ``<x_i, x_j> > threshold``.

    Args:
        traj: a ``Trajectory`` or tokens ``(m, n, d)`` / ``(b, m, n, d)``; tokens are
            normalised first.
        threshold: in ``[-1, 1)``; 0.999 (the authors' phase diagram) by default.

    Returns:
        ``(m,)`` or ``(b, m)``: 1 when all tokens are within ``arccos(threshold)`` of each
        other, 0 when no pair is; NaN at saves a failed system never reached.
    """
    thr = _threshold(threshold)
    G = gram(traj)
    n = G.shape[-1]
    off = ~np.eye(n, dtype=bool)
    close = (G > thr) & off
    out = close.sum(axis=(-2, -1)) / (n * (n - 1))
    return np.where(np.isnan(G).any(axis=(-2, -1)), np.nan, out)


def count_clusters(traj: Any, threshold: float = 0.999) -> Int[np.ndarray, "*b m"]:
    """The number of clusters: connected components of the graph ``<x_i, x_j> > threshold``.

    On the circle (``d = 2``) by sorting, ``O(n log n)`` per save (``_count_on_circle``);
    otherwise vectorised over every system and save: the reflexive adjacency ``A`` is
    closed under paths by repeated squaring (``ceil(log2 n)`` boolean products), after which token
    ``i``'s component has ``s_i = sum_j A_ij`` members and the count is ``sum_i 1/s_i``
    (exact: each component contributes ``s * (1/s)``). The same components as
    ``scipy.sparse.csgraph.connected_components`` (tested).

    Args:
        traj: a ``Trajectory`` or tokens ``(m, n, d)`` / ``(b, m, n, d)``; or a mean-field
            ``DensityTrajectory``, whose clusters are its density's peaks
            (``density_clusters`` with its defaults; ``threshold`` does not apply).
        threshold: in ``[-1, 1)``; 0.999 by default.

    Returns:
        ``(m,)`` or ``(b, m)`` integers; -1 at saves a failed system never reached.
    """
    if _is_density(traj):
        if threshold != 0.999:
            raise ValueError(
                "threshold is an inner product of tokens; a density's peaks are counted "
                "by height: use analysis.density_clusters(traj, level=...)."
            )
        from .density import density_clusters

        return density_clusters(traj)
    thr = _threshold(threshold)
    u = _tokens(traj)
    if u.shape[-1] == 2:
        return _count_on_circle(u, thr)
    G = np.einsum("...id,...jd->...ij", u, u)
    n = G.shape[-1]
    missing = np.isnan(G).any(axis=(-2, -1))
    A = ((G > thr) | np.eye(n, dtype=bool)).astype(np.float32)
    for _ in range(max(1, math.ceil(math.log2(n)))):
        A = (np.matmul(A, A) > 0).astype(np.float32)
    count = np.rint((1.0 / A.sum(axis=-1)).sum(axis=-1)).astype(np.int64)
    return np.where(missing, -1, count)


def _count_on_circle(u: np.ndarray, thr: float) -> np.ndarray:
    """``count_clusters`` on the circle in ``O(n log n)``: sorted by angle, two tokens of
    one component are joined by a chain of neighbours, and a component ends at a gap
    between neighbours with ``<x_i, x_next> <= threshold``. Two tokens on either side of
    two such gaps are at least one gap apart both ways round (so unjoined), and a lone
    such gap leaves one arc: the count is ``max(1, number of gaps)``. The same
    components as the graph of the general path, whose pairs are the same inner
    products (tested)."""
    missing = np.isnan(u).any(axis=(-2, -1))
    order = np.argsort(np.arctan2(u[..., 1], u[..., 0]), axis=-1)
    s = np.take_along_axis(u, order[..., None], axis=-2)
    ip = np.sum(s * np.roll(s, -1, axis=-2), axis=-1)
    gaps = np.sum(~(ip > thr), axis=-1) if u.shape[-2] > 1 else np.zeros(u.shape[:-2], int)
    return np.where(missing, -1, np.maximum(1, gaps)).astype(np.int64)


def interaction_energy(
    traj: Any, beta: float, *, shifted: bool = False
) -> Float[np.ndarray, "*b m"]:
    """``E_beta = (1/(2 beta n^2)) sum_{i,j} e^{beta <x_i, x_j>}`` of the normalised tokens.

    With ``Q = K = V = I`` the USA dynamics is a gradient ascent of ``E_beta`` on the
    sphere (``dx_i/dt = n grad_{x_i} E_beta``), so it never decreases along them.
    ``2 beta E_beta`` is the mean of ``e^{beta <x_i, x_j>}`` over all ordered pairs, in
    ``[1, e^beta]`` (Jensen, with ``sum_{i,j} <x_i, x_j> = |sum_i x_i|^2 >= 0``):
    ``e^beta`` for one cluster, about ``e^beta / k`` at large beta for ``k`` equal,
    well-separated clusters (the staircase of the metastability paper).

    Args:
        traj: a ``Trajectory`` or tokens ``(m, n, d)`` / ``(b, m, n, d)``, or a mean-field
            ``DensityTrajectory`` (its measure's energy, ``(1/(2 beta)) sum_k I_k(beta)
            |c_k|^2`` over its exact Fourier coefficients).
        beta: the inverse temperature, > 0.
        shifted: return ``2 beta e^{-beta} E_beta = (1/n^2) sum_{i,j} e^{beta (<x_i,
            x_j> - 1)}`` instead, in ``(0, 1]``, finite at any beta (``E_beta``
            overflows float64 past beta ~ 700): ``sum_c m_c^2 / n^2`` for clusters of
            ``m_c`` tokens far apart at large beta, the levels of the staircase.

    Returns:
        ``(m,)`` or ``(b, m)``.
    """
    b = _checks.positive("beta", beta)
    if not isinstance(shifted, (bool, np.bool_)):
        raise ValueError(f"shifted must be True or False; got {shifted!r}.")
    from ..dynamics.meanfield import DensityTrajectory

    if isinstance(traj, DensityTrajectory):  # (1/(2 beta)) sum_k I_k(beta) |c_k|^2, exact
        from scipy.special import logsumexp

        from .._special import log_ive

        c2 = np.abs(traj.coefficients()) ** 2
        c2[..., 1:] *= 2.0
        with np.errstate(divide="ignore"):  # a zero coefficient: log 0 = -inf, weight 0
            log_sum = np.asarray(
                logsumexp(np.log(c2) + log_ive(np.arange(c2.shape[-1]), b), axis=-1)
            )
        return np.exp(log_sum) if shifted else np.exp(log_sum + b) / (2.0 * b)
    G = gram(traj)
    n = G.shape[-1]
    if shifted:
        return np.exp(b * (G - 1.0)).sum(axis=(-2, -1)) / (n * n)
    return np.exp(b * G).sum(axis=(-2, -1)) / (2.0 * b * n * n)


def equiangular_rate(gamma, n: int, beta: float, kernel: str = "softmax"):
    """``d gamma/dt`` of the equiangular configuration (module docstring):
    ``2 e^{beta gamma} (1 - gamma)(1 + (n - 1) gamma) / Z``, ``Z = e^beta + (n - 1)
    e^{beta gamma}`` (SA, ``kernel="softmax"``) or ``Z = n`` (``kernel="usa"``)."""
    g = np.asarray(gamma, np.float64)
    return (1.0 - g) * _rate_over_gap(g, n, beta, kernel)


def _rate_over_gap(g, n: int, beta: float, kernel: str):
    """``rate / (1 - gamma) = 2 e^{beta gamma} (1 + (n - 1) gamma) / Z``: smooth up to
    ``gamma = 1`` (no cancellation)."""
    if kernel == "softmax":
        # divided through by e^{beta gamma}: Z / b = e^{beta (1 - gamma)} + n - 1
        return 2.0 * (1.0 + (n - 1) * g) / (np.exp(beta * (1.0 - g)) + (n - 1))
    return 2.0 * np.exp(beta * g) * (1.0 + (n - 1) * g) / n


def _check_curve_args(n, beta, kernel):
    n = _checks.integer("n", n, lo=2)
    b = _checks.positive("beta", beta)
    _checks.choice("kernel", kernel, ("softmax", "usa"))
    return n, b


def equiangular_curve(
    n: int, beta: float, ts: Float[Any, " m"], *, kernel: str = "softmax"
) -> Float[np.ndarray, " m"]:
    """The common inner product ``gamma(t)`` of ``n`` tokens that start pairwise orthogonal
    (``n <= d``), ``Q = K = V = I``, on the sphere.

    ``d gamma/dt = 2 e^{beta gamma} (1 - gamma)(1 + (n - 1) gamma) / Z``,
    ``gamma(0) = 0``, with ``Z = e^beta + (n - 1) e^{beta gamma}`` for SA (softmax) and
    ``Z = n`` for USA (derivation in the module docstring), integrated for
    ``u = log(1 - gamma)`` by ``scipy.integrate.solve_ivp`` (DOP853, ``rtol = 1e-12``,
    ``atol = 1e-14``).

    Args:
        n: number of tokens, >= 2.
        beta: inverse temperature, > 0.
        ts: sorted times >= 0.
        kernel: ``"softmax"`` (SA) or ``"usa"``.

    Returns:
        ``(len(ts),)``: ``gamma`` at the times ``ts``.
    """
    n, b = _check_curve_args(n, beta, kernel)
    t = _checks.real_array("ts", ts, ndim=1, shape_hint="(a 1-d array of times)")
    t = np.asarray(t, np.float64)
    if t.size == 0:
        return t
    if np.any(np.diff(t) < 0) or t[0] < 0:
        raise ValueError("ts must be sorted and >= 0.")
    if t[-1] == 0:
        return np.zeros_like(t)

    # In u = log(1 - gamma) the approach to 1 keeps full relative accuracy:
    # du/dt = -rate(gamma) / (1 - gamma), gamma = -expm1(u).
    def rhs(_t, u):
        return -_rate_over_gap(-np.expm1(u), n, b, kernel)

    # Once 1 - gamma < e^{-60} (far below float64's resolution of 1) gamma is 1 to the
    # last bit: the solve stops there (at large beta, USA's approach, 1 - gamma ~
    # e^{-2 e^beta t}, is too steep for any step) and the rest of the curve is 1.
    def reached(_t, u):
        return u[0] + 60.0

    reached.terminal = True  # pyright: ignore[reportFunctionMemberAccess]
    reached.direction = -1  # pyright: ignore[reportFunctionMemberAccess]
    sol = solve_ivp(
        rhs,
        (0.0, float(t[-1])),
        np.array([0.0]),
        t_eval=t,
        method="DOP853",
        rtol=1e-12,
        atol=1e-14,
        events=reached,
    )
    if not sol.success:
        # at large beta gamma jumps from near 0 to near 1 within a time below the
        # spacing of the floats around t: invert the time integral instead
        return _curve_by_quadrature(t, n, b, kernel)
    out = np.ones_like(t)
    out[: sol.y.shape[1]] = 0.0 - np.expm1(sol.y[0])
    return out


def _curve_by_quadrature(t: np.ndarray, n: int, b: float, kernel: str) -> np.ndarray:
    """``gamma(t)`` by inverting ``t(gamma) = int_0^gamma dg / rate(g)``: with
    ``g = 1 - e^w`` the integral is ``T(u) = int_u^0 (1 - g) / rate(g) dw``, smooth in
    ``w``, and ``u = log(1 - gamma)`` solves ``T(u) = t`` (``brentq``); 1 past
    ``T(-60)``."""
    from scipy.integrate import quad
    from scipy.optimize import brentq

    def T(u: float) -> float:
        def f(w: float) -> float:  # e^w / rate(g) = 1 / (rate(g) / (1 - g)), 1 - g = e^w
            return 1.0 / float(_rate_over_gap(-math.expm1(w), n, b, kernel))

        return quad(f, u, 0.0, limit=400, epsabs=0.0, epsrel=1e-12)[0]

    end = T(-60.0)
    out = np.empty_like(t)
    for i, ti in enumerate(t):
        if ti <= 0:
            out[i] = 0.0
        elif ti >= end:
            out[i] = 1.0
        else:
            u = brentq(lambda v, ti=ti: T(v) - ti, -60.0, 0.0, xtol=1e-14)
            out[i] = -math.expm1(float(u))  # pyright: ignore[reportArgumentType]
    return out


def equiangular_time(
    n: int, beta: float, level: float = 0.999, *, kernel: str = "softmax"
) -> float:
    """The time at which the equiangular curve reaches ``gamma = level`` (in ``(0, 1)``):
    ``int_0^level dg / rate(g)``, by ``scipy.integrate.quad``. The boundary that the phase
    diagram of the clustered-pair fraction is compared with."""
    from scipy.integrate import quad

    n, b = _check_curve_args(n, beta, kernel)
    lv = _checks.number("level", level, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    val, _ = quad(
        lambda g: 1.0 / equiangular_rate(g, n, b, kernel),
        0.0,
        lv,
        limit=200,
        epsabs=0,
        epsrel=1e-11,
    )
    return float(val)


def wendel_probability(n: int, d: int) -> float:
    """Wendel (1962): the probability that ``n`` i.i.d. uniform points on ``S^{d-1}`` lie in
    some open hemisphere, ``2^{-(n-1)} sum_{k=0}^{d-1} C(n-1, k)`` (1 when ``n <= d``)."""
    n = _checks.integer("n", n, lo=1)
    d = _checks.integer("d", d, lo=1)
    # exact integers, each binomial from the one before (one big-integer product per
    # term, not a fresh C(n-1, k)); the quotient of two integers is correctly rounded
    term = total = 1
    for k in range(min(d, n) - 1):
        term = term * (n - 1 - k) // (k + 1)
        total += term
    return total / 2 ** (n - 1)


def renyi_centres(
    x: Float[Any, "n d"], *, beta: float | None = None, delta: float | None = None
) -> np.ndarray:
    """The Renyi centres of tokens in causal order (Karagodin, Polyanskiy and Rigollet
    2024): the first token is a centre, and each later token is one when it is farther
    than ``delta`` (Euclidean, on the normalised tokens) from every earlier centre. Under
    causal attention at large ``beta`` these are the metastable cluster centres, with
    ``delta = 4 beta^{-1/2}``; about ``beta^{(d-1)/2}`` of them.

    Args:
        x: tokens ``(n, d)`` in their causal order (normalised here).
        beta: the inverse temperature, for ``delta = 4 / sqrt(beta)``.
        delta: the separation itself (give exactly one of ``beta`` and ``delta``).

    Returns:
        The indices of the centres, increasing (``0`` first).

    Example:
        >>> x = np.array([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [-1.0, 0.0]])
        >>> renyi_centres(x, delta=0.5).tolist()
        [0, 2, 3]
    """
    if (beta is None) == (delta is None):
        raise ValueError("give exactly one of beta (delta = 4 / sqrt(beta)) and delta.")
    if delta is None:
        delta = 4.0 / math.sqrt(_checks.positive("beta", beta))
    else:
        delta = _checks.positive("delta", delta)
    u = _real_tokens("x", x)
    if u.ndim != 2 or u.shape[0] < 1:
        raise ValueError(f"x must be tokens of shape (n, d); got shape {u.shape}.")
    if not np.all(np.isfinite(u)):
        raise ValueError("x must hold finite, nonzero tokens (they are normalised).")
    u, zero = _unit(u)  # exact directions at any scale of the tokens
    if zero.any():
        raise ValueError(
            f"x has a zero token (token {int(np.argmax(zero))}): it has no direction; "
            "x must hold finite, nonzero tokens (they are normalised)."
        )
    centres = np.empty_like(u)
    found = [0]
    centres[0] = u[0]
    for i in range(1, u.shape[0]):
        dist = np.linalg.norm(centres[: len(found)] - u[i], axis=1)
        if dist.min() > delta:
            centres[len(found)] = u[i]
            found.append(i)
    return np.asarray(found, dtype=np.int64)
