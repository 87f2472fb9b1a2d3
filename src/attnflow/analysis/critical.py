"""Critical attention scaling at long context: one attention layer on simplex tokens.

Contract. ``n`` unit tokens with pairwise inner products ``rho`` (``0 <= rho < 1``; the
regular simplex is ``rho = -1/(n-1)``, here the tokens share a common direction), one
softmax head with ``Q = K = V = I`` and inverse temperature ``beta = gamma log n``, no
residual: ``z_i = sum_j P_ij y_j``. Then (Chen, Lin, Polyanskiy and Rigollet 2026)

- the self-weight is ``p = P_ii = 1 / (1 + (n - 1) n^{-gamma (1 - rho)})``;
- ``P`` and the Gram matrix ``G = (1 - rho) I + rho 1 1^T`` commute, and ``P G P^T`` has
  the eigenvalue ``1 + (n - 1) rho`` on ``1`` and ``(p - q)^2 (1 - rho)`` on ``1^perp``
  (``q = (1 - p) / (n - 1)`` the other weights), so the outputs' cosine is

      cos(z_i, z_k) = B / A,  A = (1 + (n-1) rho) / n + (p - q)^2 (1 - rho) (1 - 1/n),
                              B = (1 + (n-1) rho) / n - (p - q)^2 (1 - rho) / n;

- as ``n -> infinity`` the cosine tends to 1 for ``gamma < gamma_c = 1 / (1 - rho)`` (the
  outputs collapse), to ``4 rho / (1 + 3 rho)`` at ``gamma_c`` (self-weight 1/2), and to
  ``rho`` above it (the geometry is kept).

``ssmax`` multiplies the logits by ``s log n``: with ``Q = K = I`` and ``beta = 1`` it is
this layer with ``gamma = s``, so its scale is critical at ``s = 1 / (1 - rho)``.
Everything above is closed form (float64 numpy, the self-weight through
``scipy.special.expit``, finite for any ``n``); nothing simulates.

Keys uniform on the sphere (``critical_beta_sphere``, ``critical_exponent_sphere``). One
query ``q`` and ``n`` keys ``k_j``, all i.i.d. uniform on ``S^{d-1}``, softmax weights
``w_j = e^{beta <q, k_j>} / sum_l e^{beta <q, k_l>}``. The largest weight is
``M(beta) = 1 / sum_j e^{-beta g_j}`` with the gaps ``g_j = c_max - <q, k_j> >= 0``, so
every term decreases in ``beta`` and ``M`` increases strictly from ``1/n`` (``beta = 0``)
to 1. The criterion: the critical ``beta_c(level)`` is where the expected largest weight
``E M(beta)`` reaches ``level`` (default 1/2, the self-weight at the simplex critical
point). The law ``beta_c ~ n^{2/(d-1)}`` is stated in arXiv 2605.08505 (not in Chen,
Lin, Polyanskiy and Rigollet's simplex paper): the
nearest key is at angle ``~ n^{-1/(d-1)}``, and ``beta (1 - cos) ~ 1`` there.

How it is measured. By rotation invariance ``q = e_1``; ``s = 1 - <q, k>`` is then
``2 B`` with ``B ~ Beta((d-1)/2, (d-1)/2)``. Only the smallest ``s`` matter, so a sample
is the ``K`` smallest order statistics of ``n`` draws, exactly distributed: ``U_(k) =
S_k / S_{n+1}`` (``S_k`` sums of standard exponentials, ``S_{n+1} - S_K ~ Gamma(n + 1 -
K)``) and ``s_(k) = 2 betaincinv(U_(k))``, each to full relative precision. The rest of
the sum is below ``(n - K) e^{-beta g_K}``; ``K`` grows until that is below ``1e-17`` at
every ``beta`` the root finder tries, so ``M`` is exact to float64 at any ``n``. One
seed draws ``samples`` independent (query, keys) sets, averages ``M`` over them and
solves ``mean M(beta) = level`` in ``log beta`` (``scipy.optimize.brentq``, relative
tolerance 1e-12); ``beta_c`` is the geometric mean over seeds with a 95% t-interval.

The limit. ``u_j = (n A)^{2/(d-1)} s_j`` (``A`` from ``P(s < S) ~ A S^{(d-1)/2}``) tends
to a Poisson process of intensity ``d(u^{(d-1)/2})``, so ``beta_c / n^{2/(d-1)}`` tends
to a constant: no logarithmic correction, only finite-``n`` ones of relative size
``n^{-2/(d-1)}`` (``d = 3`` has ``s`` exactly uniform and none to speak of). For
``d = 3`` the limit is closed: with ``a = 2 beta / n``,
``E M -> int_0^inf exp(-l - Ein(l) / a) dl`` (``Ein(l) = int_0^l (1 - e^{-y}) / y dy``;
shot noise over a unit-rate Poisson process): ``a_c = 0.79792`` at level 1/2, so
``beta_c / n -> 0.39896``.

``ssmax``'s scale against it: ``s log n`` is critical when it equals ``beta_c``, i.e.
``s_c(n) = beta_c / log n`` (``CriticalSphere.ssmax_scale``), which grows like
``n^{2/(d-1)} / log n``: a fixed ``s`` falls below the critical scale as ``n`` grows,
where for simplex tokens ``s_c = 1 / (1 - rho)`` does not depend on ``n``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from jaxtyping import Float, Int

from .. import _checks

__all__ = [
    "CriticalLayer",
    "CriticalSphere",
    "SphereExponent",
    "critical_beta_sphere",
    "critical_exponent_sphere",
    "critical_gamma",
    "critical_layer",
    "largest_weight",
    "simplex_tokens",
    "sphere_gaps",
]


@dataclasses.dataclass(frozen=True)
class CriticalLayer:
    """One layer on simplex tokens at ``beta = gamma log n`` (``critical_layer``).

    Attributes:
        gamma, rho, n: the set-up; ``beta = gamma log n``.
        self_weight: ``P_ii`` at this ``n``.
        cosine: the outputs' pairwise cosine at this ``n``.
        phase: ``"collapse"`` (``gamma < gamma_c``), ``"critical"`` or ``"preserved"``.
        limit_self_weight: the self-weight as ``n -> infinity`` (0, 1/2 or 1).
        limit_cosine: the cosine as ``n -> infinity`` (1, ``4 rho / (1 + 3 rho)``, rho).
    """

    gamma: float
    rho: float
    n: int
    beta: float
    self_weight: float
    cosine: float
    phase: str
    limit_self_weight: float
    limit_cosine: float


def critical_gamma(rho: float) -> float:
    """``gamma_c = 1 / (1 - rho)``: where ``beta = gamma log n`` turns critical."""
    rho = _checks.number("rho", rho, lo=0.0, hi=1.0, hi_open=True)
    return 1.0 / (1.0 - rho)


def critical_layer(gamma: float, rho: float, n: int) -> CriticalLayer:
    """The self-weight and the outputs' cosine of one layer at ``beta = gamma log n``.

    Args:
        gamma: the scale of ``beta`` in ``log n`` (> 0).
        rho: the tokens' pairwise inner product, ``0 <= rho < 1``.
        n: the number of tokens (>= 2).

    Returns:
        A ``CriticalLayer``: the finite-``n`` values and their limits.

    Example:
        >>> r = critical_layer(2.0, 0.5, 10**6)      # gamma_c = 2: critical
        >>> r.phase, round(r.self_weight, 6), round(r.limit_cosine, 6)
        ('critical', 0.5, 0.8)
    """
    from scipy import special

    gamma = _checks.positive("gamma", gamma)
    gc = critical_gamma(rho)
    n = _checks.integer("n", n, lo=2)
    beta = gamma * math.log(n)
    # p = 1 / (1 + (n - 1) e^{-beta (1 - rho)}), in logs
    p = float(special.expit(beta * (1.0 - rho) - math.log(n - 1)))
    q = (1.0 - p) / (n - 1)
    mean = (1.0 + (n - 1) * rho) / n
    spread = (p - q) ** 2 * (1.0 - rho)
    cosine = (mean - spread / n) / (mean + spread * (1.0 - 1.0 / n))
    if math.isclose(gamma, gc, rel_tol=1e-12):
        phase, lim_p, lim_c = "critical", 0.5, 4 * rho / (1 + 3 * rho)
    elif gamma < gc:
        phase, lim_p, lim_c = "collapse", 0.0, 1.0
    else:
        phase, lim_p, lim_c = "preserved", 1.0, rho
    return CriticalLayer(
        gamma=gamma,
        rho=rho,
        n=n,
        beta=beta,
        self_weight=p,
        cosine=float(cosine),
        phase=phase,
        limit_self_weight=lim_p,
        limit_cosine=float(lim_c),
    )


def simplex_tokens(n: int, rho: float, *, dtype: Any = np.float64) -> np.ndarray:
    """``n`` unit tokens in ``R^{n+1}`` with pairwise inner products ``rho``:
    ``y_i = sqrt(rho) e_0 + sqrt(1 - rho) e_i``.

    Example:
        >>> y = simplex_tokens(4, 0.25)
        >>> np.allclose(y @ y.T, 0.75 * np.eye(4) + 0.25)
        True
    """
    n = _checks.integer("n", n, lo=1)
    rho = _checks.number("rho", rho, lo=0.0, hi=1.0, hi_open=True)
    y = np.zeros((n, n + 1), dtype=dtype)
    y[:, 0] = math.sqrt(rho)
    y[np.arange(n), np.arange(1, n + 1)] = math.sqrt(1.0 - rho)
    return y


# ------------------------------------------------------------------ keys on the sphere
_TAIL = 1e-17  # the neglected part of sum_j e^{-beta g_j} (which is >= 1)


def largest_weight(beta: float, gaps: Float[Any, "*b k"]) -> Float[np.ndarray, "*b"]:
    """The largest softmax weight ``1 / sum_j e^{-beta g_j}`` of a query whose keys have
    the gaps ``g_j = max_l <q, k_l> - <q, k_j>`` (all ``>= 0``, one of them 0).

    Args:
        beta: the inverse temperature, ``>= 0``.
        gaps: ``(..., k)`` gaps (``inf`` for a key of zero weight).

    Returns:
        ``(...)``: the largest weight, in ``[1/k, 1]``.

    Example:
        >>> float(largest_weight(math.log(3.0), np.array([0.0, 1.0])))  # 1 / (1 + 1/3)
        0.75
    """
    b = _checks.positive("beta", beta, allow_zero=True)
    g = np.asarray(_checks.real_array("gaps", gaps, finite=False), np.float64)
    if np.any(g < 0) or np.any(np.isnan(g)):
        raise ValueError("gaps must be >= 0 (max_l <q, k_l> - <q, k_j>) and not NaN.")
    return 1.0 / np.exp(-b * g).sum(axis=-1)


def sphere_gaps(
    n: int, d: int, samples: int, *, keep: int | None = None, rng: Any = None
) -> Float[np.ndarray, "samples keep"]:
    """The ``keep`` smallest gaps ``g_(k) = s_(k) - s_(1)``, ``s = 1 - <q, k>``, of a query
    against ``n`` keys, query and keys i.i.d. uniform on ``S^{d-1}``, for ``samples``
    independent sets, sorted (``g_(1) = 0``): exact order statistics (module docstring).

    Args:
        n: keys per set (>= 1). d: the dimension (>= 2). samples: sets (>= 1).
        keep: how many of the smallest (default and at most ``n``).
        rng: a ``numpy.random.Generator`` or a seed.

    Returns:
        ``(samples, keep)``.

    Example:
        >>> g = sphere_gaps(10**9, 3, 2, keep=4, rng=0)
        >>> g.shape, bool(np.all(g[:, 0] == 0)), bool(np.all(np.diff(g, axis=1) >= 0))
        ((2, 4), True, True)
    """
    from scipy import special

    n = _checks.integer("n", n, lo=1)
    d = _checks.integer("d", d, lo=2)
    samples = _checks.integer("samples", samples, lo=1)
    k = n if keep is None else min(_checks.integer("keep", keep, lo=1), n)
    gen = np.random.default_rng(rng)
    e = gen.standard_exponential((samples, k))
    csum = np.cumsum(e, axis=1)
    rest = gen.standard_gamma(n + 1 - k, samples) if n + 1 > k else np.zeros(samples)
    u = csum / (csum[:, -1] + rest)[:, None]
    a = 0.5 * (d - 1)
    s = 2.0 * (u if d == 3 else special.betaincinv(a, a, u))
    return s - s[:, :1]


@dataclasses.dataclass(frozen=True)
class CriticalSphere:
    """The critical ``beta`` of one query against ``n`` uniform keys on ``S^{d-1}``.

    Attributes:
        n, d, level, samples: the set-up (``samples`` (query, keys) sets per seed).
        betas: ``(seeds,)`` the root of each seed's ``mean M(beta) = level``.
        beta_c: their geometric mean; ``interval``: its 95% t-interval over seeds.
        median: the median over seeds.
        scale: ``n^{2/(d-1)}``; ``ratio``: ``beta_c / scale``.
        ssmax_scale: ``beta_c / log n``, the critical ``s`` of ``ssmax`` at this ``n``.
        kept: the order statistics kept per set (the rest is below 1e-17).
    """

    n: int
    d: int
    level: float
    samples: int
    betas: np.ndarray
    beta_c: float
    interval: tuple[float, float]
    median: float
    scale: float
    ratio: float
    ssmax_scale: float
    kept: int


def _root(g: np.ndarray, n: int, level: float) -> tuple[float, bool]:
    """``beta`` with ``mean M(beta) = level`` over the rows of ``g``; whether the kept
    gaps sufficed at every ``beta`` tried."""
    from scipy.optimize import brentq

    k = g.shape[1]
    ok = [True]

    def f(logb: float) -> float:
        b = math.exp(logb)
        if k < n:  # the dropped keys: at most (n - k) e^{-beta g_k} each row
            ok[0] &= bool(np.all((n - k) * np.exp(-b * g[:, -1]) < _TAIL))
        return float(np.mean(1.0 / np.exp(-b * g).sum(axis=1))) - level

    second = np.median(g[:, 1]) if k > 1 else 1.0
    lo = hi = -math.log(max(second, 1e-300))
    while f(hi) < 0:
        hi += math.log(4.0)
    while f(lo) > 0:
        lo -= math.log(4.0)
    ok[0] = True  # only the bracket [lo, hi] matters from here
    f(lo)
    root = float(brentq(f, lo, hi, xtol=1e-13, rtol=1e-12))  # pyright: ignore[reportArgumentType]
    return math.exp(root), ok[0]


def critical_beta_sphere(
    n: int, d: int, *, level: float = 0.5, seeds: int = 8, samples: int = 64, seed: int = 0
) -> CriticalSphere:
    """The ``beta`` at which the expected largest attention weight of a uniform query
    against ``n`` uniform keys on ``S^{d-1}`` reaches ``level`` (module docstring).

    Args:
        n: keys (>= 2). d: the dimension (>= 2).
        level: the largest weight to reach, in ``(1/n, 1)``; 1/2 by default.
        seeds: independent estimates (>= 2, for the interval).
        samples: (query, keys) sets averaged per estimate (>= 1).
        seed: the base seed (estimate ``i`` uses ``SeedSequence([seed, i, n, d])``).

    Returns:
        A ``CriticalSphere``.

    Example:
        >>> r = critical_beta_sphere(1000, 3, seeds=4, samples=32)
        >>> 0.35 < r.ratio < 0.45  # beta_c -> 0.399 n for d = 3
        True
    """
    from scipy import stats

    n = _checks.integer("n", n, lo=2)
    d = _checks.integer("d", d, lo=2)
    lv = _checks.number("level", level, lo=1.0 / n, hi=1.0, lo_open=True, hi_open=True)
    seeds = _checks.integer("seeds", seeds, lo=2)
    samples = _checks.integer("samples", samples, lo=1)
    seed = _checks.integer("seed", seed, lo=0)
    betas, kept = [], 0
    for i in range(seeds):
        keep = min(n, 256)
        while True:
            rng = np.random.default_rng(np.random.SeedSequence([seed, i, n, d]))
            beta, ok = _root(sphere_gaps(n, d, samples, keep=keep, rng=rng), n, lv)
            if ok or keep == n:
                break
            keep = min(n, 4 * keep)
        betas.append(beta)
        kept = max(kept, keep)
    logs = np.log(betas)
    mean = float(np.mean(logs))
    half = float(stats.t.ppf(0.975, seeds - 1) * stats.sem(logs))
    scale = float(n) ** (2.0 / (d - 1))
    return CriticalSphere(
        n=n,
        d=d,
        level=lv,
        samples=samples,
        betas=np.asarray(betas),
        beta_c=math.exp(mean),
        interval=(math.exp(mean - half), math.exp(mean + half)),
        median=float(np.median(betas)),
        scale=scale,
        ratio=math.exp(mean) / scale,
        ssmax_scale=math.exp(mean) / math.log(n),
        kept=kept,
    )


@dataclasses.dataclass(frozen=True)
class SphereExponent:
    """The fit ``log beta_c = c + p log n`` over several ``n`` (``critical_exponent_sphere``).

    Attributes:
        d: the dimension; ``predicted``: ``2 / (d - 1)``.
        points: one ``CriticalSphere`` per ``n``.
        exponent: the fitted ``p`` (least squares over every seed's ``log beta``);
            ``interval``: its 95% t-interval.
        prefactor: ``e^c``.
        log_term, log_interval: the coefficient ``q`` of ``log log n`` in the fit
            ``c + p log n + q log log n`` (with ``p`` fixed at ``predicted``) and its
            95% interval: a logarithmic correction shows as ``q != 0``.
    """

    d: int
    predicted: float
    points: tuple[CriticalSphere, ...]
    exponent: float
    interval: tuple[float, float]
    prefactor: float
    log_term: float
    log_interval: tuple[float, float]


def critical_exponent_sphere(
    ns: Int[Any, " k"],
    d: int,
    *,
    level: float = 0.5,
    seeds: int = 8,
    samples: int = 64,
    seed: int = 0,
) -> SphereExponent:
    """``critical_beta_sphere`` at every ``n`` of ``ns`` and the fit of ``log beta_c``
    against ``log n``, to compare with ``2 / (d - 1)``.

    Args:
        ns: at least three distinct key counts (>= 3 each).
        d, level, seeds, samples, seed: as in ``critical_beta_sphere``.

    Returns:
        A ``SphereExponent``.

    Example:
        >>> fit = critical_exponent_sphere([100, 1000, 10000], 3, seeds=4, samples=16)
        >>> fit.interval[0] < fit.predicted < fit.interval[1]
        True
    """
    from scipy import stats

    arr = _checks.real_array("ns", ns, ndim=1, shape_hint="(a 1-d array of key counts)")
    sizes = [_checks.integer("ns[i]", v, lo=3) for v in arr.tolist()]
    if len(set(sizes)) < 3:
        raise ValueError(f"ns must hold at least three distinct sizes; got {sizes}.")
    d = _checks.integer("d", d, lo=2)
    pts = tuple(
        critical_beta_sphere(m, d, level=level, seeds=seeds, samples=samples, seed=seed)
        for m in sizes
    )
    x = np.concatenate([np.full(len(p.betas), math.log(p.n)) for p in pts])
    y = np.concatenate([np.log(p.betas) for p in pts])
    fit = stats.linregress(x, y)
    t = float(stats.t.ppf(0.975, len(x) - 2))
    p = float(fit.slope)  # pyright: ignore[reportAttributeAccessIssue]
    se = float(fit.stderr)  # pyright: ignore[reportAttributeAccessIssue]
    predicted = 2.0 / (d - 1)
    # the log correction: y - predicted x = c + q log x
    q_fit = stats.linregress(np.log(x), y - predicted * x)
    q = float(q_fit.slope)  # pyright: ignore[reportAttributeAccessIssue]
    q_se = float(q_fit.stderr)  # pyright: ignore[reportAttributeAccessIssue]
    return SphereExponent(
        d=d,
        predicted=predicted,
        points=pts,
        exponent=p,
        interval=(p - t * se, p + t * se),
        prefactor=math.exp(float(fit.intercept)),  # pyright: ignore[reportAttributeAccessIssue]
        log_term=q,
        log_interval=(q - t * q_se, q + t * q_se),
    )
