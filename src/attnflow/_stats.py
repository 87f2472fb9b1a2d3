"""Binomial proportions and power-law fits.

Contract: ``binomial_interval`` returns confidence intervals ``(low, high)`` for ``count``
successes in ``samples`` trials, with ``0 <= low <= count/samples <= high <= 1``, exactly
0 for ``count = 0`` and 1 for ``count = samples``, for the Wilson score interval (no
continuity correction) or the exact Clopper-Pearson interval (beta quantiles, to the last
bits); arguments are checked first (``ValueError`` naming the argument). ``mean_interval``
gives the mean of a few independent values (seeds) with its Student t interval, and
``welch_difference`` the difference of two such means with Welch's interval; with no
spread the interval is the point itself, with one value it is ``None``. ``loglog_slope``
fits ``log y`` against ``log x`` by least squares and returns the slope with its standard
error. scipy is imported on the first call only. Below every layer: imports no module of
attnflow's layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _checks

__all__ = [
    "INTERVALS",
    "binomial_interval",
    "check_level",
    "interval_name",
    "loglog_slope",
    "mean_interval",
    "welch_difference",
]

INTERVALS = ("wilson", "clopper-pearson")


def binomial_interval(
    count: int, samples: int, *, level: float = 0.95, method: str = "wilson"
) -> tuple[float, float]:
    """Two-sided confidence interval for a binomial proportion (scipy).

    Args:
        count: successes, 0 <= count <= samples.
        samples: trials, >= 1.
        level: confidence level in (0, 1), 0.95 by default.
        method: ``"wilson"``: the Wilson score interval, the textbook one without
            continuity correction: the roots ``p`` of ``(count/samples - p)^2 = z^2 p
            (1 - p) / samples`` (``scipy.stats.binomtest(...).proportion_ci(method=
            "wilson")``; scipy's ``"wilsoncc"`` would add the continuity correction).
            ``"clopper-pearson"`` (alias ``"exact"``): the exact interval, ``P(X >= count
            | low) = P(X <= count | high) = (1 - level)/2``, i.e. the beta quantiles
            ``low = B^-1(alpha/2; count, samples - count + 1)``, ``high = B^-1(1 -
            alpha/2; count + 1, samples - count)`` (``scipy.stats.beta.ppf`` / ``.isf``,
            exact to the last bits; ``binomtest``'s ``method="exact"`` finds the same
            roots with ``brentq`` to an absolute 2e-12 only, which is a relative error of
            1e-5 for a bound near 1e-7). Conservative.

    Returns:
        ``(low, high)`` with ``0 <= low <= count/samples <= high <= 1`` (exactly 0 for
        ``count = 0`` and 1 for ``count = samples``).
    """
    from scipy.stats import beta, binomtest

    count = _checks.integer("count", count, lo=0)
    samples = _checks.integer("samples", samples, lo=1)
    if count > samples:
        raise ValueError(f"count must be <= samples; got {count} > {samples}.")
    level = check_level(level)
    method = interval_name(method)
    n, k = samples, count
    if method == "wilson":
        ci = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
        low, high = float(ci.low), float(ci.high)
    else:
        alpha = 1.0 - level
        low = float(beta.ppf(alpha / 2, k, n - k + 1)) if k > 0 else 0.0
        high = float(beta.isf(alpha / 2, k + 1, n - k)) if k < n else 1.0
    p = k / n
    # the exact end points; rounding must not push an end past p or out of [0, 1]
    low = 0.0 if k == 0 else min(max(low, 0.0), p)
    high = 1.0 if k == n else max(min(high, 1.0), p)
    return low, high


def check_level(level: Any) -> float:
    """``level`` as a float strictly between 0 and 1 (ValueError otherwise)."""
    return _checks.number(
        "level",
        level,
        lo=0.0,
        hi=1.0,
        lo_open=True,
        hi_open=True,
        what="strictly between 0 and 1 (e.g. 0.95)",
    )


def interval_name(method: str) -> str:
    """The canonical name of an interval method, one of ``INTERVALS`` (``"exact"``,
    ``"clopper"`` and ``"cp"`` name ``"clopper-pearson"``); ValueError otherwise."""
    m = str(method).lower().replace("_", "-")
    if m in ("exact", "clopper", "cp"):
        m = "clopper-pearson"
    if m not in INTERVALS:
        raise ValueError(
            f"interval must be one of {INTERVALS} ('exact' is an alias of "
            f"'clopper-pearson'); got {method!r}."
        )
    return m


def loglog_slope(x: Any, y: Any) -> tuple[float, float]:
    """The least-squares slope of ``log y`` against ``log x`` and its standard error
    (``scipy.stats.linregress``), for a fitted power law ``y ~ x^slope``.

    Examples:
        >>> [round(v, 6) for v in loglog_slope([1.0, 2.0, 4.0], [3.0, 1.5, 0.75])]
        [-1.0, 0.0]
    """
    from scipy import stats

    fit: Any = stats.linregress(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)))
    return float(fit.slope), float(fit.stderr)


def mean_interval(values: Any, *, level: float = 0.95) -> dict[str, Any]:
    """The mean of independent ``values`` (one per seed, say) with its two-sided Student t
    interval ``mean -+ t_{(1+level)/2, m-1} s / sqrt(m)`` (``scipy.stats.t``).

    Returns:
        ``{"mean", "sd" (ddof 1), "interval" ([low, high]; the point itself when every
        value is equal, ``None`` for a single value), "values", "m"}``.

    Examples:
        >>> r = mean_interval([0.5, 0.7, 0.6])
        >>> round(r["mean"], 12), [round(x, 4) for x in r["interval"]]
        (0.6, [0.3516, 0.8484])
    """
    from scipy import stats

    level = check_level(level)
    x = np.asarray(values, np.float64).ravel()
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"values must be one or more finite numbers; got {values!r}.")
    mean = float(x.mean())
    if x.size == 1:
        return dict(mean=mean, sd=None, interval=None, values=x.tolist(), m=1)
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        return dict(mean=mean, sd=0.0, interval=[mean, mean], values=x.tolist(), m=int(x.size))
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * sd / np.sqrt(x.size)
    return dict(
        mean=mean,
        sd=sd,
        interval=[float(mean - half), float(mean + half)],
        values=x.tolist(),
        m=int(x.size),
    )


def welch_difference(a: Any, b: Any, *, level: float = 0.95) -> dict[str, Any]:
    """``mean(a) - mean(b)`` with Welch's two-sided interval for two groups of
    independent values (seeds): unequal variances, standard error
    ``sqrt(s_a^2/m_a + s_b^2/m_b)``, Welch-Satterthwaite degrees of freedom, the t quantile
    from ``scipy.stats.t`` (the numbers of ``scipy.stats.ttest_ind(a, b,
    equal_var=False)``, written out so that a group without spread needs no special case).

    Returns:
        ``{"difference", "interval" ([low, high]; the point itself when neither group
        has spread, ``None`` when a group has one value), "df"}``.

    Examples:
        >>> r = welch_difference([0.9, 0.8, 0.85], [0.5, 0.6, 0.55])
        >>> round(r["difference"], 12), [round(x, 4) for x in r["interval"]]
        (0.3, [0.1867, 0.4133])
    """
    from scipy import stats

    level = check_level(level)
    x = np.asarray(a, np.float64).ravel()
    y = np.asarray(b, np.float64).ravel()
    for name, v in (("a", x), ("b", y)):
        if v.size == 0 or not np.all(np.isfinite(v)):
            raise ValueError(f"{name} must be one or more finite numbers.")
    d = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return dict(difference=d, interval=None, df=None)
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    if va + vb == 0.0:
        return dict(difference=d, interval=[d, d], df=None)
    df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * float(np.sqrt(va + vb))
    return dict(difference=d, interval=[d - half, d + half], df=float(df))
