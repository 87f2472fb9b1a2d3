"""Lost in the middle: the kinetic theory's retrieval profile over source positions.

Contract. Causal attention with ALiBi-like weights ``e^{-(lambda/N)(j - k)}`` among
``N`` tokens on the circle, in the large-``N`` kinetic limit of Duerinckx, Geshkovski and
Rossi (2026, "Kinetic theory for Transformers and the lost-in-the-middle phenomenon";
borjanG/2026-lost-in-the-middle). A source at relative position ``s in (0, 1]`` is
retrieved at time ``t`` with the truncated soft-accuracy profile

    S_t(s) = sum_{k=1}^{modes} w_k c_lambda(s) psi_{a_k t}(Y_lambda(s)),

    a_k = k^2 I_k(beta),   w_k = exp(-pi^2 k^2 / (2 M^2)),
    c_lambda(s) = lambda e^{lambda s} / (e^lambda - 1),
    Y_lambda(s) = log((e^lambda - 1) / (e^{lambda s} - 1)),
    psi_c(y) = sum_{m >= 0} c^{m+1} y^m / (m! (m+1)!) = sqrt(c / y) I_1(2 sqrt(c y))

(``lambda = 0``: ``c = 1``, ``Y = log(1/s)``). ``I_k`` are modified Bessel functions
(``scipy.special.ive``, scaled so that nothing overflows). Near ``s = 0`` the profile
is high (primacy), and its slope at ``s = 1`` is positive (recency) until the threshold

    t_crit(beta) = 2 (1 - e^{-lambda}) sum_k w_k a_k / sum_k w_k a_k^2,

where that slope changes sign (``lost_in_middle_threshold``; the slope at ``s = 1`` is
``lambda^2 e^lambda / (e^lambda - 1) sum_k w_k a_k t (1 - e^lambda a_k t /
(2 (e^lambda - 1)))``, whose root is ``t_crit``). Closed forms in float64 numpy; nothing
simulates.

Measured on particles (``retrieval_profile``). ``S_t(s)`` is the correlation, at order
``1/N``, between the last token at time ``t`` and the source's initial token, for i.i.d.
uniform tokens: with ``theta_j`` the tokens' angles (``j = 1 .. N``, query ``j = N``),

    n E[cos m (theta_N(t) - theta_k(0))] -> g_{a_m}(t, 1; s),   k = s N,

the kinetic correlation whose sum ``sum_m w_m g_{a_m}`` is ``S_t(s)`` (linearising the
field about the uniform law gives ``dC_j / dt = a_m sum_{l < j} w_jl C_l`` for
``C_j = E[cos m (theta_j(t) - theta_k(0))]``, ``C_j(0) = delta_jk``; its continuum limit
is ``g``). The authors' own code (borjanG/2026-lost-in-the-middle) simulates the particles
(64 tokens from four clusters) only to draw their paths; every profile it plots is the
series above. ``retrieval_profile`` estimates the left side over a batch of systems, minus
its value at ``t = 0``, whose mean is exactly 0 for i.i.d. uniform tokens: the random
phases cancel while the last token has moved little (at ``N = 64``, ``beta = 1`` the
standard error falls eightfold at kinetic time 0.5, twofold at 1.5, and is 15% larger at
4, where the last token has travelled).
Time: the authors' field is
``beta sum_k w_jk sin(theta_k - theta_j) e^{beta cos(theta_k - theta_j)}`` with the
ALiBi weights normalised alone; softmax attention with ``ALiBi(lambda / N)``
(``Q = K = V = I`` on the circle) normalises by ``sum_k w_jk e^{beta cos}``, about
``I_0(beta)`` times theirs, so at first order its time ``t`` is the kinetic time
``t / (beta I_0(beta))``; the softmax's weight on the token itself (``e^beta`` in the
normaliser, no force) is a further ``O(1/N)`` difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from jaxtyping import Float

from .. import _checks

if TYPE_CHECKING:
    from ..dynamics.trajectory import Trajectory

__all__ = [
    "lost_in_middle_threshold",
    "lost_in_middle_profile",
    "RetrievalProfile",
    "retrieval_profile",
]


def _modes(beta: float, M: float, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a_k e^{-beta}, w_k)`` for ``k = 1 .. modes``: the rates scaled by ``e^{-beta}``
    (``scipy.special.ive``), finite at every beta (``e^beta`` alone overflows past 709)."""
    from scipy.special import ive

    k = np.arange(1, modes + 1, dtype=np.float64)
    return k**2 * ive(k, beta), _mode_weights(M, modes)


def _args(beta, lam, M, modes) -> tuple[float, float, float, int]:
    beta = _checks.positive("beta", beta)
    lam = _checks.number("lam", lam, lo=0.0)
    M, modes = _mode_args(M, modes)
    return beta, lam, M, modes


def _mode_args(M, modes) -> tuple[float, int]:
    return _checks.positive("M", M), _checks.integer("modes", modes, lo=1)


def _mode_weights(M: float, modes: int) -> np.ndarray:
    """``w_k = exp(-pi^2 k^2 / (2 M^2))`` for ``k = 1 .. modes``."""
    k = np.arange(1, modes + 1, dtype=np.float64)
    return np.exp(-0.5 * (math.pi * k / M) ** 2)


def lost_in_middle_threshold(
    beta: float, *, lam: float = 1.0, M: float = 8.0, modes: int = 20
) -> float:
    """The time ``t_crit(beta)`` at which the retrieval profile's slope at the last
    position changes sign (the module docstring has the formula).

    Args:
        beta: inverse temperature, > 0.
        lam: the ALiBi decay ``lambda >= 0`` (weights ``e^{-(lambda/N)(j - k)}``).
        M: the width parameter of the mode weights ``w_k``.
        modes: Fourier modes kept.

    Returns:
        ``t_crit`` (float). ``lam = 0`` gives 0: without the decay the slope at ``s = 1``
        is ``-sum_k w_k (a_k t)^2 / 2 < 0`` for every ``t > 0`` (no recency). It falls
        like ``e^{-beta}`` and is computed from the scaled rates ``a_k e^{-beta}``, so it
        is finite at every beta (below the smallest float, past beta of about 745, 0).

    Examples:
        >>> from attnflow.analysis.position import lost_in_middle_threshold
        >>> round(lost_in_middle_threshold(1.0), 3)  # lambda = 1, M = 8, 20 modes
        2.457
    """
    beta, lam, M, modes = _args(beta, lam, M, modes)
    scaled, w = _modes(beta, M, modes)  # a_k = e^beta scaled_k: the ratio takes e^-beta
    ratio = np.sum(w * scaled) / np.sum(w * scaled * scaled)
    return float(2.0 * (-math.expm1(-lam)) * ratio * math.exp(-beta))


def _psi(c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``psi_c(y) = sqrt(c / y) I_1(2 sqrt(c y))``, and its series near ``c y = 0``."""
    from scipy.special import ive

    cy = c * y
    small = cy < 1e-8
    safe = np.where(small, 1.0, cy)
    zs = 2.0 * np.sqrt(safe)
    big = c * ive(1, zs) * np.exp(zs) / np.sqrt(safe)  # sqrt(c/y) I_1(z) = c I_1(z) / sqrt(cy)
    return np.where(small, c * (1.0 + cy / 2.0 + cy * cy / 12.0), big)


def lost_in_middle_profile(
    s: Float[Any, " m"],
    t: float,
    beta: float,
    *,
    lam: float = 1.0,
    M: float = 8.0,
    modes: int = 20,
) -> np.ndarray:
    """The truncated soft-accuracy profile ``S_t(s)`` at source positions ``s``.

    Args:
        s: relative source positions in ``(0, 1]`` (1 the most recent).
        t: time (depth), ``>= 0``.
        beta, lam, M, modes: as in ``lost_in_middle_threshold``.

    Returns:
        ``S_t(s)``, same shape as ``s`` (float64).

    Examples:
        >>> import numpy as np
        >>> from attnflow.analysis.position import lost_in_middle_profile
        >>> S = lost_in_middle_profile(np.linspace(0.02, 1.0, 50), 1.0, 1.0)
        >>> bool(S[0] > S.min() < S[-1])  # primacy, a minimum in the middle, recency
        True
    """
    beta, lam, M, modes = _args(beta, lam, M, modes)
    t = _checks.number("t", t, lo=0.0)
    s_arr = np.asarray(s, np.float64)
    if s_arr.size and (np.any(~np.isfinite(s_arr)) or np.any(s_arr <= 0) or np.any(s_arr > 1)):
        raise ValueError("s must hold relative positions in (0, 1] (1 the most recent).")
    if lam == 0:
        coef = np.ones_like(s_arr)
        y = np.log(1.0 / s_arr)
    else:
        coef = lam * np.exp(lam * s_arr) / math.expm1(lam)
        y = np.log(math.expm1(lam) / np.expm1(lam * s_arr))
    y = np.maximum(y, 0.0)  # s = 1 gives 0 up to rounding
    scaled, w = _modes(beta, M, modes)
    with np.errstate(over="ignore", invalid="ignore"):  # reported below, by name
        c = (scaled * np.exp(beta) * t).reshape((-1,) + (1,) * s_arr.ndim)
        out = np.sum(w.reshape(c.shape) * coef * _psi(c, y[None]), axis=0)
    if not np.all(np.isfinite(out)):
        raise ValueError(
            f"the profile at beta = {beta:g}, t = {t:g} exceeds the float64 range (it grows "
            f"like exp(2 sqrt(a_k t log(1/s))) with a_k = k^2 I_k(beta), about e^beta); use a "
            f"smaller t or beta, or positions s nearer 1."
        )
    return out


class RetrievalProfile(NamedTuple):
    """The retrieval profile measured on particles (``retrieval_profile``).

    Attributes:
        t: ``(m,)`` the saved times, in the model's time.
        s: ``(k,)`` the relative source positions ``(j + 1) / n`` of the tokens
            ``j = 0 .. n - 2`` (``k = n - 1``; the query is the last token, ``n - 1``), or
            with ``window`` their means over each window of sources.
        S: ``(m, k)`` the profile: the mean over the systems of
            ``n sum_m w_m [cos m (theta_q(t) - theta_j(0)) - cos m (theta_q(0) -
            theta_j(0))]`` (averaged over the window's sources); 0 at ``t = 0``.
        stderr: ``(m, k)`` its standard error over the systems (NaN for one system).
        systems: how many systems were averaged.
    """

    t: Float[np.ndarray, " m"]
    s: Float[np.ndarray, " k"]
    S: Float[np.ndarray, "m k"]
    stderr: Float[np.ndarray, "m k"]
    systems: int


def _circle_tokens(traj: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The saved times and the tokens of a sphere-frame trajectory on the circle as unit
    complex numbers ``(b, m, n)``, checked (``name``: the argument, for the errors)."""
    from ..dynamics.trajectory import Trajectory as _Trajectory

    if not isinstance(traj, _Trajectory):
        raise ValueError(
            f"{name} must be an attnflow.Trajectory (of attnflow.simulate) or a list of "
            f"them; got {type(traj).__name__}."
        )
    if traj.frame != "sphere" or traj.d != 2:
        raise ValueError(
            f"{name} must hold tokens on the circle: simulated with frame='sphere' and "
            f"d = 2 (the profile's modes are the circle's cos(m theta)); got "
            f"frame={traj.frame!r}, d = {traj.d}."
        )
    if traj.n < 2:
        raise ValueError(f"{name} must hold n >= 2 tokens (sources and a query); got n = {traj.n}.")
    failed = sorted({str(s) for s in traj.statuses if s != "ok"})
    if failed:
        raise ValueError(
            f"{name} has systems that stopped before t1 (status {', '.join(failed)}; see "
            f"its statuses): a profile averages whole runs."
        )
    ts = np.asarray(traj.ts, np.float64)
    if ts[0] != 0:
        raise ValueError(
            f"{name} must save the start, ts[0] = 0 (the sources are the initial tokens); "
            f"got ts[0] = {float(ts[0])!r}: simulate with ts=[0, ...]."
        )
    x = np.asarray(traj.x, np.float64)
    x = x if traj.batched else x[None]
    z = x[..., 0] + 1j * x[..., 1]
    return ts, z / np.abs(z)


def _samples(z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``Y_k(t)`` of systems ``z`` ``(b, m, n)`` (unit complex tokens), ``(b, m, n - 1)``."""
    u = z[:, :, -1:] * np.conj(z[:, :1, :-1])  # e^{i (theta_q(t) - theta_k(0))}
    u0 = u[:, :1]
    y = np.zeros(u.shape)
    p, p0 = np.ones_like(u), np.ones_like(u0)
    for wm in w:
        p, p0 = p * u, p0 * u0  # e^{i m (...)}, m = 1, 2, ...
        y += wm * (np.real(p) - np.real(p0))
    return z.shape[-1] * y


# values (systems x times x sources) per block of the computation: each of its arrays
# stays below 64 MB whatever the batch
_BLOCK_VALUES = 2**22


def retrieval_profile(
    traj: Trajectory | Sequence[Trajectory],
    *,
    M: float = 8.0,
    modes: int = 20,
    window: int = 1,
) -> RetrievalProfile:
    """The lost-in-the-middle retrieval profile measured on simulated particles.

    For each system (tokens on the circle, ``x_j = (cos theta_j, sin theta_j)``), each
    saved time ``t`` and each source ``k = 0 .. n - 2``:

        Y_k(t) = n sum_{m=1}^{modes} w_m [cos m (theta_q(t) - theta_k(0))
                                          - cos m (theta_q(0) - theta_k(0))],

    ``q = n - 1`` the last token, ``w_m = e^{-pi^2 m^2 / (2 M^2)}`` (as in
    ``lost_in_middle_profile``); ``S`` is its mean over the systems, ``stderr`` its
    standard error. For i.i.d. uniform initial tokens the subtracted term has mean 0, and
    as ``n -> infinity`` ``S`` tends to the kinetic ``S_tau(s)`` at ``s = (k + 1) / n``
    and the kinetic time ``tau`` (the module docstring has the derivation, and why for
    softmax attention ``tau = t / (beta I_0(beta))``). The angles are the tokens' own:
    nothing is simulated and no attention is evaluated here.

    Args:
        traj: a trajectory of ``attnflow.simulate(model, x0, t1, frame="sphere", ts=...)``
            with ``d = 2`` and ``ts[0] = 0``, one system or a batch ``(b, n, 2)``, every
            system ``"ok"``; or a list of such batches with the same ``n`` and saved
            times, pooled (a large ensemble simulated in pieces). The estimate needs many
            systems: at ``n = 64``, ``beta = 1`` the standard error of one source is
            about ``0.12 n / sqrt(b)`` at kinetic time 0.5 and ``n / sqrt(b)`` by 4. The
            model is typically causal with ``mask=attnflow.masks.ALiBi(lambda / n)``.
        M: the width parameter of the mode weights, > 0.
        modes: Fourier modes summed, >= 1.
        window: average ``Y`` over consecutive windows of this many sources, in each
            system before the statistics (so ``stderr`` is the window's own); must
            divide the ``n - 1`` sources. Default 1: every source.

    Returns:
        ``RetrievalProfile(t, s, S, stderr, systems)``.

    Examples:
        >>> import jax, numpy as np, attnflow as af
        >>> from attnflow.masks import ALiBi
        >>> from attnflow.analysis import retrieval_profile
        >>> jax.config.update("jax_enable_x64", True)
        >>> n, I = 8, np.eye(2)
        >>> model = af.Attention(I, I, I, beta=1.0, mask=ALiBi(1.0 / n))  # lambda = 1
        >>> th = np.random.default_rng(0).uniform(0, 2 * np.pi, (16, n))  # 16 systems
        >>> x0 = np.stack([np.cos(th), np.sin(th)], axis=-1)
        >>> traj = af.simulate(model, x0, 1.0, ts=[0.0, 0.5, 1.0], frame="sphere")
        >>> prof = retrieval_profile(traj)
        >>> prof.S.shape, prof.s.tolist()[:3], prof.systems
        ((3, 7), [0.125, 0.25, 0.375], 16)
        >>> float(np.abs(prof.S[0]).max())  # nothing is retrieved at t = 0
        0.0
    """
    M, modes = _mode_args(M, modes)
    window = _checks.integer("window", window, lo=1)
    w = _mode_weights(M, modes)
    many = isinstance(traj, (list, tuple))
    parts = list(traj) if many else [traj]
    if not parts:
        raise ValueError("traj must be a trajectory or a non-empty list of them; got [].")
    ts, n = np.zeros(0), 0
    count, mean, m2 = 0, np.zeros(0), np.zeros(0)  # pooled (Chan et al.'s update)
    for i, part in enumerate(parts):
        name = f"traj[{i}]" if many else "traj"
        t_i, z = _circle_tokens(part, name)
        if i == 0:
            ts, n = t_i, z.shape[-1]
            if (n - 1) % window:
                raise ValueError(
                    f"window must divide the n - 1 = {n - 1} sources of {name}; got "
                    f"window = {window}."
                )
            mean = m2 = np.zeros((ts.size, (n - 1) // window))
        elif t_i.shape != ts.shape or np.any(t_i != ts) or z.shape[-1] != n:
            raise ValueError(
                f"{name} must have the n and the saved times of traj[0] (n = {n}, "
                f"{ts.size} times) to be pooled; got n = {z.shape[-1]}, {t_i.size} times."
            )
        step = max(1, _BLOCK_VALUES // (z.shape[1] * z.shape[2]))
        for j in range(0, z.shape[0], step):
            y = _samples(z[j : j + step], w)
            y = y.reshape(*y.shape[:-1], -1, window).mean(axis=-1)
            nb, mb = y.shape[0], y.mean(axis=0)
            delta = mb - mean
            total = count + nb
            mean = mean + delta * (nb / total)
            m2 = m2 + ((y - mb) ** 2).sum(axis=0) + delta**2 * (count * nb / total)
            count = total
    if count > 1:
        stderr = np.sqrt(m2 / (count - 1) / count)
    else:
        stderr = np.full(mean.shape, np.nan)
    return RetrievalProfile(
        t=ts,
        s=(np.arange(1, n, dtype=np.float64) / n).reshape(-1, window).mean(axis=-1),
        S=mean,
        stderr=stderr,
        systems=int(count),
    )
