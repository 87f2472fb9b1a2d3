"""The long-context study's statistics and its pre-registered decision rule (both tiers).

Contract. Every function takes plain numbers or an ``AttentionReadout`` and returns
JSON-ready values (``None`` where a number does not exist: a halving length not
reached, a fit of a constant):

- ``readout_stats(readout)``: per half (``"all"``, ``"present"``, ``"absent"``) the
  count, accuracy and 95% Wilson interval (``attnflow._stats.binomial_interval``); per
  half and per (layer, head) the mean over the half's answer rows of ``entropy``,
  ``entropy_norm`` (entropy over ``log(visible)``), ``first_mass``, ``sink_mass`` (the
  learned sink column), ``total_sink`` (their sum), ``logit_spread``, ``gate``, and for
  present rows ``needle_mass``, ``needle_gap``, the dispersion cap
  ``1 / (1 + (n - 1) e^{-delta})`` at the row's measured spread ``delta`` (the largest
  share any key of that row can have) and the gap floor ``1 / (1 + (n - 1) e^{-g})`` at
  its needle gap ``g`` (the least share of a needle ``g`` above every other key, for
  rows without a sink); ``cap_check``: the largest ``needle - cap`` and ``floor -
  needle`` over present rows and whether both are within float32 rounding
  (``CAP_TOLERANCE`` of the cap); the fraction of heads whose mean first-token mass
  (``first_heads``, Gu et al. 2025's threshold) and total sink mass (``sink_heads``)
  exceed ``SINK_THRESHOLD``.
- ``halving_length(lengths, accuracy)``: the length at which the accuracy first falls
  to half its value at the first length, linear in ``log n`` between the measured
  lengths; ``None`` when it does not.
- ``fit_line(x, y)``: ``scipy.stats.linregress`` with ``r2 = rvalue^2``.
- ``pooled(counts)``: correct and total summed over seeds, with the interval.
- ``decide(table, ...)``: the rule of docs/longcontext.md (see its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._stats import binomial_interval
from ..networks._readout import ROW_FIELDS, AttentionReadout

__all__ = [
    "HALVES",
    "SINK_THRESHOLD",
    "CAP_TOLERANCE",
    "readout_stats",
    "halving_length",
    "fit_line",
    "pooled",
    "decide",
    "RULE",
]

HALVES = ("all", "present", "absent")
SINK_THRESHOLD = 0.3
CAP_TOLERANCE = 1e-5  # relative: float32 rounding of a row's weights and logits
RULE = (
    "The QK-norm cost goes away when QK norm + sink or QK norm + gate, at 16x and at 64x "
    "the training length, has an accuracy within or above the 95% interval of the model "
    "without QK norm, or closes at least 75% of the gap between QK norm and the model "
    "without it (at both lengths). Judged on all queries, then on each half."
)


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if x.size else None


def _share(d: np.ndarray, n: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + (n - 1.0) * np.exp(-d))


def readout_stats(r: AttentionReadout) -> dict[str, Any]:
    """The statistics of one readout (see the module docstring).

    Examples:
        >>> import numpy as np
        >>> from attnflow.networks._readout import AttentionReadout
        >>> one = np.ones((1, 1, 2), np.float32)
        >>> r = AttentionReadout(4, np.array([True, False]), np.array([True, False]),
        ...     np.array([4, 4]), np.log(4) * one, 0 * one, 0 * one, 0.25 * np.array(
        ...     [[[1.0, 0.0]]]), 0 * one, 0 * one, one)
        >>> s = readout_stats(r)
        >>> every = s["heads"].get("all")
        >>> s["accuracy"], every.get("entropy_norm")
        ({'all': 0.5, 'present': 1.0, 'absent': 0.0}, [[1.0]])
    """
    r.check()
    present = np.asarray(r.present, bool)
    n = np.asarray(r.visible, np.float64)
    masks = {"all": np.ones_like(present), "present": present, "absent": ~present}
    out: dict[str, Any] = {
        "length": int(r.length),
        "count": {},
        "correct": {},
        "accuracy": {},
        "interval": {},
    }
    right = np.asarray(r.correct, bool)
    for half, m in masks.items():
        k, t = int(right[m].sum()), int(m.sum())
        out["count"][half], out["correct"][half] = t, k
        out["accuracy"][half] = k / t if t else None
        out["interval"][half] = list(binomial_interval(k, t)) if t else None
    f = {name: np.asarray(getattr(r, name), np.float64) for name in ROW_FIELDS}
    f["entropy_norm"] = f["entropy"] / np.log(np.maximum(n, 2.0))[None, None, :]
    f["total_sink"] = f["first_mass"] + f["sink_mass"]
    f["cap"] = _share(f["logit_spread"], n[None, None, :])
    f["floor"] = _share(f["needle_gap"], n[None, None, :])
    layers, heads, _ = r.shape
    rows = (
        "entropy",
        "entropy_norm",
        "first_mass",
        "sink_mass",
        "total_sink",
        "logit_spread",
        "gate",
    )
    out["heads"] = {}
    for half, m in masks.items():
        names = rows + (("needle_mass", "needle_gap", "cap", "floor") if half == "present" else ())
        out["heads"][half] = {
            name: [[_mean(f[name][a, h][m]) for h in range(heads)] for a in range(layers)]
            for name in names
        }
    p = present
    excess = (f["needle_mass"] - f["cap"])[..., p]
    no_sink = (f["sink_mass"] == 0)[..., p]
    short = np.where(no_sink, f["floor"][..., p] - f["needle_mass"][..., p], -np.inf)
    cap_scale = np.maximum(f["cap"][..., p], 1e-30)
    out["cap_check"] = dict(
        max_excess=float(excess.max()) if excess.size else None,
        max_floor_shortfall=float(short.max()) if short.size and np.isfinite(short.max()) else None,
        cap_ok=bool(np.all(excess <= CAP_TOLERANCE * cap_scale)),
        floor_ok=bool(np.all(short <= CAP_TOLERANCE * np.maximum(f["floor"][..., p], 1e-30))),
    )
    first = f["first_mass"].mean(axis=-1)
    total = f["total_sink"].mean(axis=-1)
    out["first_heads"] = float(np.mean(first > SINK_THRESHOLD))
    out["sink_heads"] = float(np.mean(total > SINK_THRESHOLD))
    return out


def halving_length(lengths: Sequence[float], accuracy: Sequence[float | None]) -> float | None:
    """The length at which ``accuracy`` first falls to half its first value, linear in
    ``log n`` between measured lengths; ``None`` when it never does (or the first value is
    missing or 0).

    Examples:
        >>> halving_length([64, 256, 1024], [0.9, 0.6, 0.3])  # 0.45 halfway, on log n
        512.0
    """
    if len(lengths) != len(accuracy) or not len(lengths):
        raise ValueError("lengths and accuracy must be sequences of the same nonzero length.")
    a0 = accuracy[0]
    if a0 is None or a0 <= 0:
        return None
    target = a0 / 2
    for i in range(1, len(lengths)):
        a, b = accuracy[i - 1], accuracy[i]
        if a is None or b is None:
            return None
        if b <= target:
            x0, x1 = math.log(lengths[i - 1]), math.log(lengths[i])
            t = 1.0 if a == b else (a - target) / (a - b)
            return float(round(math.exp(x0 + t * (x1 - x0)), 9))
    return None


def fit_line(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Least-squares line of ``y`` on ``x`` (``scipy.stats.linregress``): slope,
    intercept, ``r2``, ``p``, ``points``; ``r2`` is ``None`` (with ``why``) for fewer than
    three points or a constant ``x`` or ``y``."""
    from scipy import stats

    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[keep], ya[keep]
    base: dict[str, Any] = dict(points=int(xa.size))
    if xa.size < 3 or np.ptp(xa) == 0 or np.ptp(ya) == 0:
        return dict(
            base,
            slope=None,
            intercept=None,
            r2=None,
            p=None,
            why="fewer than three points, or a constant x or y",
        )
    fit: Any = stats.linregress(xa, ya)
    return dict(
        base,
        slope=float(fit.slope),
        intercept=float(fit.intercept),
        r2=float(fit.rvalue) ** 2,
        p=float(fit.pvalue),
    )


def pooled(counts: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """``(correct, total)`` pairs (one per seed) summed: correct, total, accuracy and the
    95% Wilson interval."""
    k = sum(int(c) for c, _ in counts)
    t = sum(int(n) for _, n in counts)
    if t == 0:
        return dict(correct=0, total=0, accuracy=None, interval=None)
    return dict(correct=k, total=t, accuracy=k / t, interval=list(binomial_interval(k, t)))


def decide(
    table: Mapping[str, Mapping[int, tuple[int, int]]],
    *,
    baseline: str,
    qknorm: str = "qknorm",
    candidates: Sequence[str] = ("qknorm+sink", "qknorm+gate"),
    train_length: int = 64,
    factors: Sequence[int] = (16, 64),
    closure: float = 0.75,
) -> dict[str, Any]:
    """The pre-registered rule on pooled counts: ``table`` maps each variant to a mapping
    of lengths to ``(correct, total)``.

    A candidate passes at a length when its accuracy is at least the lower end of the
    baseline's 95% Wilson interval, or when it closes at least ``closure`` of the gap
    ``baseline - qknorm`` (a positive gap); it passes the rule when it passes at every
    length ``factor * train_length``. The cost goes away when any candidate passes. A
    cost exists at a length when QK norm is below the baseline's interval there.

    Returns:
        ``{"rule", "lengths", "cost" (per length: gap, qknorm below the interval),
        "candidates" (per candidate: per length numbers, passes), "goes_away",
        "passed_by", "no_cost"}``; ``ValueError`` naming a missing variant or length.

    Examples:
        >>> t = {"softmax": {1024: (90, 100), 4096: (80, 100)},
        ...      "qknorm": {1024: (50, 100), 4096: (20, 100)},
        ...      "qknorm+sink": {1024: (85, 100), 4096: (70, 100)}}
        >>> decide(t, baseline="softmax", candidates=("qknorm+sink",))["goes_away"]
        True
    """
    lengths = [int(f) * int(train_length) for f in factors]
    for name in (baseline, qknorm, *candidates):
        if name not in table:
            raise ValueError(f"table has no variant {name!r}; it has {sorted(table)}.")
        missing = [n for n in lengths if n not in table[name]]
        if missing:
            raise ValueError(f"table[{name!r}] has no length {missing[0]} (needed by the rule).")
    base = {n: pooled([table[baseline][n]]) for n in lengths}
    qk = {n: pooled([table[qknorm][n]]) for n in lengths}
    cost = []
    for n in lengths:
        gap = base[n]["accuracy"] - qk[n]["accuracy"]
        cost.append(dict(length=n, gap=gap, below=qk[n]["accuracy"] < base[n]["interval"][0]))
    result: dict[str, Any] = dict(rule=RULE, lengths=lengths, cost=cost, candidates={})
    for cand in candidates:
        rows, ok = [], True
        for n, c in zip(lengths, cost):
            acc = pooled([table[cand][n]])["accuracy"]
            within = acc >= base[n]["interval"][0]
            frac = (acc - qk[n]["accuracy"]) / c["gap"] if c["gap"] > 0 else None
            closes = frac is not None and frac >= closure
            rows.append(
                dict(
                    length=n,
                    accuracy=acc,
                    baseline=base[n]["accuracy"],
                    baseline_interval=base[n]["interval"],
                    qknorm=qk[n]["accuracy"],
                    closed_fraction=frac,
                    within=bool(within),
                    closes=bool(closes),
                    passes=bool(within or closes),
                )
            )
            ok = ok and (within or closes)
        result["candidates"][cand] = dict(per_length=rows, passes=bool(ok))
    result["passed_by"] = [c for c, v in result["candidates"].items() if v["passes"]]
    result["goes_away"] = bool(result["passed_by"])
    result["no_cost"] = not any(c["below"] for c in cost)
    return result
