"""Rank correlations and a bootstrap, vectorised, for ``attnflow.studies.importance``.

Contract. ``ranks`` are average ranks (``scipy.stats.rankdata(method="average")``, ties
share the mean of their places); ``pearson_rows(A, B)`` is the Pearson correlation of
every row of ``A`` with every row of ``B``, NaN where a row is constant (correlation
undefined); Spearman's rho is ``pearson_rows`` of the ranks (``spearman``, equal to
``scipy.stats.spearmanr``). ``bootstrap_mean`` is the percentile bootstrap of a mean over
the first axis, leaving NaN entries out of every mean.
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt
from jaxtyping import Float

from .. import _checks

__all__ = ["ranks", "pearson_rows", "spearman", "bootstrap_mean", "nanmean"]


def ranks(a: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (1-based)."""
    from scipy.stats import rankdata

    return rankdata(np.asarray(a, np.float64), method="average", axis=-1)


def pearson_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``(a, b)`` correlations of the rows of ``A`` ``(a, m)`` and ``B`` ``(b, m)``; NaN
    where a row is constant."""
    A, B = np.atleast_2d(np.asarray(A, np.float64)), np.atleast_2d(np.asarray(B, np.float64))
    a = A - A.mean(axis=-1, keepdims=True)
    b = B - B.mean(axis=-1, keepdims=True)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    ca = na <= 1e-12 * (np.abs(A).max(axis=-1) + 1e-300) * np.sqrt(A.shape[-1])
    cb = nb <= 1e-12 * (np.abs(B).max(axis=-1) + 1e-300) * np.sqrt(B.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (a @ b.T) / np.outer(na, nb)
    return np.where(ca[:, None] | cb[None, :], np.nan, np.clip(r, -1.0, 1.0))


def spearman(a: Float[npt.ArrayLike, " m"], b: Float[npt.ArrayLike, " m"]) -> float:
    """Spearman's rank correlation: the Pearson correlation of the average ranks (as
    ``scipy.stats.spearmanr``). NaN, by definition, when ``a`` or ``b`` is constant.

    Example:
        >>> round(spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]), 12)
        0.8
    """
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2:
        raise ValueError(f"a and b must be two (m,) arrays, m >= 2; got {x.shape}, {y.shape}.")
    return float(pearson_rows(ranks(x), ranks(y))[0, 0])


def nanmean(v: np.ndarray, axis: int = 0) -> np.ndarray:
    """``numpy.nanmean`` without the warning for all-NaN slices (their mean is NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(v, axis=axis)


def bootstrap_mean(
    values: Float[npt.ArrayLike, "s ..."],
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean over the first axis (sentences) and its percentile bootstrap interval
    (``n_boot`` resamples of the sentences with replacement). NaN entries are left out
    of every mean; a column with no defined entry has mean and interval NaN.

    Returns:
        ``(mean, low, high)``, each of the shape of ``values[0]``.

    Example:
        >>> m, lo, hi = bootstrap_mean(np.arange(10.0))
        >>> float(m), bool(lo < m < hi)
        (4.5, True)
    """
    v = np.asarray(values, np.float64)
    n_boot = _checks.integer("n_boot", n_boot, lo=1)
    level = _checks.number("level", level, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if v.ndim == 0 or v.shape[0] == 0:
        raise ValueError(f"values must have at least one row; got shape {v.shape}.")
    idx = np.random.default_rng(seed).integers(0, v.shape[0], size=(n_boot, v.shape[0]))
    boots = nanmean(v[idx], axis=1)
    a = (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanquantile(boots, a, axis=0), np.nanquantile(boots, 1 - a, axis=0)
    return nanmean(v, axis=0), lo, hi
