"""The long-context study across seeds: accuracies with their spread, and the decision rule.

Contract. Every function takes plain numbers and returns JSON-ready values (``None``
where a number does not exist: a halving length not reached, a fit of a constant, an
interval from a single seed):

- ``across_seeds(values)``: the mean of per-seed accuracies with its 95% Student t
  interval (clipped to [0, 1]), the standard deviation and the values
  (``attnflow._stats.mean_interval``). The seeds are the unit: rows of one model are not
  independent draws of the variant, so intervals are never pooled over rows.
- ``pooled(counts)``: correct and total summed over seeds with the Wilson interval, kept
  as a description of the rows read (not for inference).
- ``halving_length(lengths, accuracy)``: the length at which the accuracy first falls
  to half its value at the first length, linear in ``log n`` between the measured
  lengths; ``None`` when it does not.
- ``fit_line(x, y)``: ``scipy.stats.linregress`` with ``r2 = rvalue^2``.
- ``decide(table, ...)``: the rule ``RULE`` on per-seed accuracies (see its docstring).
- ``summarise(models, setup, tier)``: one tier of a study from its model entries: the
  per-seed accuracies and their summary per reading, variant and half, the fits, the
  cap check, the decision on all queries and on each half, and the verdict in a
  sentence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._stats import binomial_interval, mean_interval, welch_difference
from ._longcontext_stats import HALVES

__all__ = [
    "RULE",
    "CLOSURE",
    "BASELINE",
    "CANDIDATES",
    "COMBINED",
    "across_seeds",
    "pooled",
    "halving_length",
    "fit_line",
    "decide",
    "summarise",
]

BASELINE = {"A": "softmax", "B": "plain"}
CANDIDATES = ("qknorm+sink", "qknorm+gate")
COMBINED = "qknorm+sink+gate"
_MEANS = (
    "entropy",
    "entropy_norm",
    "total_sink",
    "sink_mass",
    "first_mass",
    "logit_spread",
    "gate",
)
_PRESENT_MEANS = ("needle_mass", "needle_gap", "cap")

CLOSURE = 0.75
RULE = (
    "At every length read above the training length, QK norm has a cost when the 95% "
    "Welch interval (across seeds) of the accuracy of the model without QK norm minus that "
    "of QK norm lies above 0. A candidate (QK norm + sink, QK norm + gate) closes the cost "
    "at such a length when its mean accuracy closes at least 75% of the gap between the "
    "two means and the 95% Welch interval of the candidate minus QK norm lies above 0. "
    "The cost goes away with a candidate when it closes the cost at every length where "
    "there is one. Judged on all queries, then on each half (key present, key absent)."
)


def across_seeds(values: Sequence[float]) -> dict[str, Any]:
    """Per-seed accuracies: ``{"mean", "interval" (95% t, clipped to [0, 1]; ``None`` for
    one seed), "sd", "values"}``.

    Examples:
        >>> r = across_seeds([1.0, 0.9, 1.0])
        >>> round(r["mean"], 4), r["interval"][1]
        (0.9667, 1.0)
    """
    r = mean_interval(values)
    iv = r["interval"]
    clipped = None if iv is None else [max(0.0, iv[0]), min(1.0, iv[1])]
    return dict(mean=r["mean"], interval=clipped, sd=r["sd"], values=r["values"])


def pooled(counts: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """``(correct, total)`` pairs (one per seed) summed: correct, total, accuracy and the
    95% Wilson interval of the rows (a description, not an interval for the variant)."""
    k = sum(int(c) for c, _ in counts)
    t = sum(int(n) for _, n in counts)
    if t == 0:
        return dict(correct=0, total=0, accuracy=None, interval=None)
    return dict(correct=k, total=t, accuracy=k / t, interval=list(binomial_interval(k, t)))


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


def _above_zero(diff: dict[str, Any]) -> bool:
    return diff["interval"] is not None and diff["interval"][0] > 0.0


def decide(
    table: Mapping[str, Mapping[int, Sequence[float]]],
    *,
    baseline: str,
    qknorm: str = "qknorm",
    candidates: Sequence[str] = ("qknorm+sink", "qknorm+gate"),
    train_length: int = 64,
    lengths: Sequence[int] | None = None,
    closure: float = CLOSURE,
) -> dict[str, Any]:
    """The rule ``RULE`` on per-seed accuracies: ``table`` maps each variant to a mapping
    of lengths to its accuracies, one per seed (at least two seeds per variant).

    At each length of ``lengths`` (default: every length of the baseline's table above
    ``train_length``), QK norm has a cost when Welch's 95% interval of ``baseline -
    qknorm`` lies above 0. A candidate closes it there when its mean closes at least
    ``closure`` of the gap of the means and Welch's interval of ``candidate - qknorm``
    lies above 0; it passes the rule when it closes the cost at every length with a cost
    (and there is one). The cost goes away when any candidate passes.

    Returns:
        ``{"rule", "lengths", "cost" (per length: the gap and its interval, ``cost``),
        "cost_lengths", "candidates" (per candidate: per length numbers, ``closed_at``,
        ``passes``), "goes_away", "passed_by", "no_cost"}``; ``ValueError`` naming a
        missing variant or length, or a variant with fewer than two seeds.

    Examples:
        >>> t = {"softmax": {256: [0.9, 0.92, 0.88]},
        ...      "qknorm": {256: [0.5, 0.55, 0.45]},
        ...      "qknorm+sink": {256: [0.85, 0.9, 0.86]}}
        >>> d = decide(t, baseline="softmax", candidates=("qknorm+sink",))
        >>> d["cost_lengths"], d["goes_away"]
        ([256], True)
    """
    if lengths is None:
        lengths = sorted(int(n) for n in table.get(baseline, {}) if int(n) > int(train_length))
    lengths = [int(n) for n in lengths]
    if not lengths:
        raise ValueError(f"table[{baseline!r}] has no length above the training length.")
    for name in (baseline, qknorm, *candidates):
        if name not in table:
            raise ValueError(f"table has no variant {name!r}; it has {sorted(table)}.")
        missing = [n for n in lengths if n not in table[name]]
        if missing:
            raise ValueError(f"table[{name!r}] has no length {missing[0]} (needed by the rule).")
        few = [n for n in lengths if len(table[name][n]) < 2]
        if few:
            raise ValueError(
                f"table[{name!r}][{few[0]}] has {len(table[name][few[0]])} seed(s); the rule "
                "needs at least two per variant (intervals are across seeds)."
            )
    cost = []
    for n in lengths:
        gap = welch_difference(table[baseline][n], table[qknorm][n])
        cost.append(
            dict(
                length=n,
                baseline=float(np.mean(table[baseline][n])),
                qknorm=float(np.mean(table[qknorm][n])),
                gap=gap["difference"],
                gap_interval=gap["interval"],
                cost=_above_zero(gap),
            )
        )
    with_cost = [c["length"] for c in cost if c["cost"]]
    result: dict[str, Any] = dict(
        rule=RULE, lengths=lengths, cost=cost, cost_lengths=with_cost, candidates={}
    )
    for cand in candidates:
        rows = []
        for n, c in zip(lengths, cost):
            gain = welch_difference(table[cand][n], table[qknorm][n])
            frac = gain["difference"] / c["gap"] if c["gap"] > 0 else None
            closes = bool(c["cost"] and frac is not None and frac >= closure and _above_zero(gain))
            rows.append(
                dict(
                    length=n,
                    accuracy=float(np.mean(table[cand][n])),
                    gain=gain["difference"],
                    gain_interval=gain["interval"],
                    closed_fraction=frac,
                    closes=closes,
                )
            )
        closed_at = [r["length"] for r in rows if r["closes"]]
        passes = bool(with_cost) and closed_at == with_cost
        result["candidates"][cand] = dict(per_length=rows, closed_at=closed_at, passes=passes)
    result["passed_by"] = [c for c, v in result["candidates"].items() if v["passes"]]
    result["goes_away"] = bool(result["passed_by"])
    result["no_cost"] = not with_cost
    return result


def _head_mean(stats: dict, half: str, name: str) -> float | None:
    vals = [v for row in stats["heads"][half].get(name, []) for v in row if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarise(models: list[dict], setup: dict, tier: str) -> dict[str, Any]:
    """One tier of a study from its model entries (``run_study``'s, with their
    ``readings``) and its ``setup`` (``variants``, ``lengths``, ``train_length``): per
    reading, variant and half the accuracy of every seed, their mean and interval, the
    pooled rows, the halving length and the mean row statistics; the fits of accuracy on
    sink mass and on entropy; the cap check; the rule's decision and its verdict (no
    decision when the rule's variants or a second seed are missing)."""
    lengths = setup["lengths"]
    summary: dict[str, Any] = {}
    for reading in ("plain", "scaled"):
        per: dict[str, Any] = {}
        for variant in setup["variants"]:
            runs = [e for e in models if e["variant"] == variant and reading in e["readings"]]
            if not runs:
                continue
            per[variant] = {}
            for half in HALVES:
                per_seed = [
                    [e["readings"][reading][i]["accuracy"][half] for e in runs]
                    for i in range(len(lengths))
                ]
                seeds_stats = [
                    across_seeds([float(x) for x in col]) if None not in col else None
                    for col in per_seed
                ]
                rows = [
                    pooled(
                        [
                            (
                                e["readings"][reading][i]["correct"][half],
                                e["readings"][reading][i]["count"][half],
                            )
                            for e in runs
                        ]
                    )
                    for i in range(len(lengths))
                ]
                acc = [None if st is None else st["mean"] for st in seeds_stats]
                out: dict[str, Any] = dict(
                    lengths=lengths,
                    seeds=[e["seed"] for e in runs],
                    accuracy=acc,
                    interval=[None if st is None else st["interval"] for st in seeds_stats],
                    sd=[None if st is None else st["sd"] for st in seeds_stats],
                    per_seed=per_seed,
                    pooled_accuracy=[r["accuracy"] for r in rows],
                    pooled_interval=[r["interval"] for r in rows],
                    correct=[r["correct"] for r in rows],
                    total=[r["total"] for r in rows],
                    halving_length=halving_length(lengths, acc),
                )
                names = _MEANS + (_PRESENT_MEANS if half == "present" else ())
                for name in names:
                    col = []
                    for i in range(len(lengths)):
                        v = [_head_mean(e["readings"][reading][i], half, name) for e in runs]
                        v = [x for x in v if x is not None]
                        col.append(sum(v) / len(v) if v else None)
                    out[name] = col
                per[variant][half] = out
            per[variant]["sink_heads"] = [
                sum(e["readings"][reading][i]["sink_heads"] for e in runs) / len(runs)
                for i in range(len(lengths))
            ]
            per[variant]["first_heads"] = [
                sum(e["readings"][reading][i]["first_heads"] for e in runs) / len(runs)
                for i in range(len(lengths))
            ]
        summary[reading] = per
    fits: dict[str, Any] = {}
    for half in HALVES:
        pts: list[tuple[float, float, float]] = []
        for st in (st for e in models for st in e["readings"]["plain"]):
            a, b = st["accuracy"][half], _head_mean(st, half, "total_sink")
            c = _head_mean(st, half, "entropy_norm")
            if a is not None and b is not None and c is not None:
                pts.append((float(a), b, c))
        fits[half] = dict(
            sink_mass=fit_line([p[1] for p in pts], [p[0] for p in pts]),
            entropy_norm=fit_line([p[2] for p in pts], [p[0] for p in pts]),
            points=[[p[1], p[2], p[0]] for p in pts],
        )
    checks = [st["cap_check"] for e in models for r in e["readings"].values() for st in r]
    excess = [c["max_excess"] for c in checks if c["max_excess"] is not None]
    shortfall = [c["max_floor_shortfall"] for c in checks if c["max_floor_shortfall"] is not None]
    cap = dict(
        cap_ok=all(c["cap_ok"] for c in checks),
        floor_ok=all(c["floor_ok"] for c in checks),
        max_excess=max(excess) if excess else None,
        max_floor_shortfall=max(shortfall) if shortfall else None,
    )
    decision = {}
    base, n0 = BASELINE[tier], setup["train_length"]
    available = set(summary["plain"])
    wanted = {base, "qknorm", *CANDIDATES, COMBINED}
    missing = sorted(wanted - {COMBINED} - available)
    few = sorted(
        v
        for v in wanted - {COMBINED} - set(missing)
        if len(summary["plain"][v]["all"]["seeds"]) < 2
    )
    if missing or few:
        why = (
            f"the rule needs the variants {missing}, not trained here"
            if missing
            else f"the rule needs at least two seeds per variant ({few[0]} has one)"
        )
        return dict(summary=summary, fits=fits, cap=cap, decision=None, verdict=why)
    for half in HALVES:
        table = {
            v: dict(zip(lengths, summary["plain"][v][half]["per_seed"])) for v in wanted & available
        }
        decision[half] = decide(table, baseline=base, candidates=CANDIDATES, train_length=n0)
        if COMBINED in available:
            decision[half]["combined"] = decide(
                table, baseline=base, candidates=(COMBINED,), train_length=n0
            )["candidates"][COMBINED]
    return dict(
        summary=summary, fits=fits, cap=cap, decision=decision, verdict=_verdict(decision, base)
    )


def _closed(h: dict[str, Any]) -> str:
    parts = [
        f"{c} at n = {', '.join(str(n) for n in v['closed_at'])}"
        for c, v in h["candidates"].items()
        if v["closed_at"] and not v["passes"]
    ]
    return f", closed only by {' and by '.join(parts)}" if parts else ""


def _verdict(decision: dict[str, Any], base: str) -> str:
    d = decision["all"]
    if d["no_cost"]:
        head = f"no QK-norm cost at any length read (QK norm not below {base})"
    elif d["goes_away"]:
        head = f"the QK-norm cost goes away with {' and '.join(d['passed_by'])}"
    else:
        lengths = ", ".join(str(n) for n in d["cost_lengths"])
        head = (
            f"the QK-norm cost (at n = {lengths}) does not go away with a sink or a gate"
            + _closed(d)
        )
    parts = []
    for half in ("absent", "present"):
        h = decision[half]
        if h["no_cost"]:
            parts.append(f"{half} half: no cost")
        elif h["goes_away"]:
            parts.append(f"{half} half: closed by {' and '.join(h['passed_by'])}")
        else:
            parts.append(f"{half} half: not closed{_closed(h)}")
    return f"{head} ({'; '.join(parts)})."
