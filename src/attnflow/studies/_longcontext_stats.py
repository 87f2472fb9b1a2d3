"""The long-context study's statistics of one reading: one trained model at one length
(both tiers). The statistics across seeds and the decision rule are in
``_longcontext_rule``.

Contract. ``readout_stats`` takes an ``AttentionReadout`` and returns JSON-ready values
(``None`` where a number does not exist):

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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._stats import binomial_interval
from ..networks._readout import ROW_FIELDS, AttentionReadout

__all__ = ["HALVES", "SINK_THRESHOLD", "CAP_TOLERANCE", "readout_stats"]

HALVES = ("all", "present", "absent")
SINK_THRESHOLD = 0.3
CAP_TOLERANCE = 1e-5  # relative: float32 rounding of a row's weights and logits


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
