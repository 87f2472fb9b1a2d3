"""Layer-norm placements as speed regulation: the equiangular model of each placement.

Contract. ``n <= d`` tokens start pairwise orthogonal on the sphere, ``Q = K = V = I``,
softmax at inverse temperature ``beta``. Every placement of ``Sphere`` (``"post"``,
``"pre"``, ``"peri"``, ``"ngpt"``, ``"mix"``, ``"scaled"``) treats all tokens alike, so the
tokens stay equiangular, ``<x_i, x_j> = gamma`` (``i != j``), and every residual stream has
the same norm ``r``. With ``Z = e^beta + (n - 1) e^{beta gamma}``, self weight
``a = e^beta / Z``, weight ``b = e^{beta gamma} / Z`` on each other token and
``F_i = a x_i + b sum_{j != i} x_j`` (the attention output at unit tokens):

    G      = <F_i, x_k> - <F_i, x_i> gamma = b (1 - gamma)(1 + (n - 1) gamma),
    c      = <F_i, x_i> = a + (n - 1) b gamma,
    |F_i|^2 = a^2 + 2 (n - 1) a b gamma + (n - 1) b^2 (1 + (n - 2) gamma).

Normalisation acts as a speed ``s`` on the post-LN flow ``gamma' = 2 G`` (Karagodin, Ge,
Polyanskiy and Rigollet 2025, "Normalization in attention dynamics"); in the limit of
small layer steps ``dt``:

    post    gamma' = 2 G                          (s = 1)
    pre     gamma' = 2 G / r,        r' = c       (the stream grows: s = 1 / r)
    peri    gamma' = 2 G / (r |F|),  r' = c / |F|
    ngpt    gamma' = 2 alpha G / |F|              (alpha = NGPT_ALPHA)
    mix     post for t < t_switch, then pre from r = 1
    scaled  pre with the stream read as N(y) / sigma, sigma = sqrt(1 + t / dt) (layer
            k = t / dt reads depth k + 1): G, c, |F| at beta / sigma^2, and
            gamma' = 2 G / (r sigma), r' = c / sigma.

Near one cluster (``gamma -> 1``: ``b -> 1/n``, ``c, |F| -> 1``) ``1 - gamma`` decays like
``e^{-2 t}`` (post), ``e^{-2 alpha t}`` (ngpt), ``t^{-2}`` (pre, peri and mix: ``r ~ t``)
and ``t^{-1}`` (scaled: ``r sigma ~ 2 t``); ``asymptotic_rate`` returns these.
``equiangular_layernorm`` integrates the system for ``u = log(1 - gamma)`` with scipy's
DOP853 (float64); nothing here simulates tokens.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from jaxtyping import Float
from scipy.integrate import solve_ivp

from .. import _checks

__all__ = ["EquiangularNorm", "equiangular_layernorm", "asymptotic_rate"]

# the placements and their constants (the dynamics' own values: see frames.Sphere)
PLACEMENTS = ("post", "pre", "peri", "ngpt", "mix", "scaled")
NGPT_ALPHA = 0.2


class EquiangularNorm(NamedTuple):
    """``gamma`` (the common inner product), ``gap = 1 - gamma`` (to full relative
    accuracy, also where ``gamma`` rounds to 1) and ``r`` (the common stream norm) at
    ``ts``."""

    ts: np.ndarray
    gamma: np.ndarray
    gap: np.ndarray
    r: np.ndarray
    layernorm: str


def asymptotic_rate(layernorm: str) -> tuple[str, float]:
    """How ``1 - gamma`` decays near one cluster: ``("exp", k)`` for ``e^{-k t}`` or
    ``("power", p)`` for ``t^{-p}``.

    Examples:
        >>> from attnflow.analysis import asymptotic_rate
        >>> asymptotic_rate("post"), asymptotic_rate("pre"), asymptotic_rate("scaled")
        (('exp', 2.0), ('power', 2.0), ('power', 1.0))
    """
    _checks.choice("layernorm", layernorm, PLACEMENTS)
    return {
        "post": ("exp", 2.0),
        "ngpt": ("exp", 2.0 * NGPT_ALPHA),
        "pre": ("power", 2.0),
        "peri": ("power", 2.0),
        "mix": ("power", 2.0),
        "scaled": ("power", 1.0),
    }[layernorm]


def _terms(gamma: float, n: int, beta: float) -> tuple[float, float, float]:
    """``(G / (1 - gamma), c, |F|)`` at ``gamma`` (softmax weights without overflow)."""
    # a = 1 / (1 + (n - 1) e^{-beta (1 - gamma)}), b = e^{-beta (1 - gamma)} a
    e = math.exp(-beta * (1.0 - gamma))
    a = 1.0 / (1.0 + (n - 1) * e)
    b = e * a
    g_over_gap = b * (1.0 + (n - 1) * gamma)
    c = a + (n - 1) * b * gamma
    f2 = a * a + 2 * (n - 1) * a * b * gamma + (n - 1) * b * b * (1 + (n - 2) * gamma)
    return g_over_gap, c, math.sqrt(max(f2, 0.0))


def equiangular_layernorm(
    n: int,
    beta: float,
    ts: Float[Any, " m"],
    layernorm: str = "post",
    *,
    t_switch: float | None = None,
    dt: float | None = None,
) -> EquiangularNorm:
    """The equiangular model of one layer-norm placement, in the small-step limit.

    Args:
        n: number of tokens, >= 2 (they start pairwise orthogonal).
        beta: inverse temperature, > 0.
        ts: sorted times >= 0.
        layernorm: ``"post"``, ``"pre"``, ``"peri"``, ``"ngpt"``, ``"mix"`` or
            ``"scaled"`` (see the module docstring).
        t_switch: ``"mix"`` only: the time of the switch from post- to pre-LN
            (``simulate`` switches after ``round(0.25 t1 / dt)`` layers).
        dt: ``"scaled"`` only: the layer step, which sets the depth ``t / dt``.

    Returns:
        An ``EquiangularNorm``: ``gamma``, ``1 - gamma`` and ``r`` at ``ts``.

    Examples:
        >>> import numpy as np
        >>> from attnflow.analysis import equiangular_layernorm
        >>> out = equiangular_layernorm(8, 1.0, [0.0, 10.0, 20.0], "pre")
        >>> out.gap.round(4).tolist(), out.r.round(2).tolist()
        ([1.0, 0.0177, 0.0041], [1.0, 9.31, 19.23])
    """
    n = _checks.integer("n", n, lo=2)
    beta = _checks.positive("beta", beta)
    _checks.choice("layernorm", layernorm, PLACEMENTS)
    t = np.asarray(_checks.real_array("ts", ts, ndim=1, shape_hint="(m,)"), np.float64)
    if t.size and (np.any(np.diff(t) < 0) or t[0] < 0):
        raise ValueError("ts must be sorted and >= 0.")
    if layernorm == "mix":
        if t_switch is None:
            raise ValueError("layernorm='mix' needs t_switch, the time of the switch to pre-LN.")
        t_switch = _checks.number("t_switch", t_switch, lo=0.0)
    elif t_switch is not None:
        raise ValueError(f"t_switch is for layernorm='mix' only; got layernorm={layernorm!r}.")
    if layernorm == "scaled":
        if dt is None:
            raise ValueError("layernorm='scaled' needs dt, the layer step that sets the depth.")
        dt = _checks.positive("dt", dt)
    elif dt is not None:
        raise ValueError(f"dt is for layernorm='scaled' only; got layernorm={layernorm!r}.")

    def rhs(time: float, state: np.ndarray) -> list[float]:
        u, log_r = state  # u = log(1 - gamma), r = e^{log_r}
        gamma = -math.expm1(u)
        r = math.exp(log_r)
        ln = layernorm
        if ln == "mix":
            ln = "post" if time < t_switch else "pre"  # type: ignore[operator]
        sigma = math.sqrt(1.0 + time / dt) if ln == "scaled" else 1.0  # type: ignore[operator]
        g, c, f = _terms(gamma, n, beta / (sigma * sigma))
        speed, grow = {
            "post": (1.0, 0.0),
            "pre": (1.0 / r, c),
            "peri": (1.0 / (r * f), c / f),
            "ngpt": (NGPT_ALPHA / f, 0.0),
            "scaled": (1.0 / (r * sigma), c / sigma),
        }[ln]
        return [-2.0 * g * speed, grow / r]

    u_at = np.zeros_like(t)  # log(1 - gamma)
    r = np.ones_like(t)
    if t.size and t[-1] > 0:
        # the mix switch is a kink: integrate each smooth piece on its own
        stops = sorted({0.0, float(t[-1])} | ({float(t_switch)} if layernorm == "mix" else set()))  # type: ignore[arg-type]
        stops = [s for s in stops if s <= t[-1]]
        state = np.array([0.0, 0.0])
        for lo, hi in zip(stops[:-1], stops[1:], strict=True):
            inside = (t >= lo) & (t <= hi)
            at = np.unique(np.concatenate([t[inside], [hi]]))
            sol = solve_ivp(
                rhs, (lo, hi), state, method="DOP853", rtol=1e-12, atol=1e-14, t_eval=at
            )
            if not sol.success:
                raise RuntimeError(f"the equiangular {layernorm} system failed: {sol.message}")
            where = np.searchsorted(at, t[inside])
            u_at[inside] = sol.y[0][where]
            r[inside] = np.exp(sol.y[1][where])
            state = sol.y[:, -1]
    return EquiangularNorm(ts=t, gamma=-np.expm1(u_at), gap=np.exp(u_at), r=r, layernorm=layernorm)
