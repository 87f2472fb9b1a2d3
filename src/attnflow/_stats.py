"""Binomial proportions and power-law fits.

Contract: ``binomial_interval`` returns confidence intervals ``(low, high)`` for ``count``
successes in ``samples`` trials, with ``0 <= low <= count/samples <= high <= 1``, exactly
0 for ``count = 0`` and 1 for ``count = samples``, for the Wilson score interval (no
continuity correction) or the exact Clopper-Pearson interval (beta quantiles, to the last
bits); arguments are checked first (``ValueError`` naming the argument). ``loglog_slope``
fits ``log y`` against ``log x`` by least squares and returns the slope with its standard
error. scipy is imported on the first call only. Below every layer: imports no module of
attnflow's layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _checks

__all__ = ["INTERVALS", "binomial_interval", "check_level", "interval_name", "loglog_slope"]

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
