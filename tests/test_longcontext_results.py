"""The committed long-context results: the exploratory study (figures/longcontext.json)
and the confirmatory runs (figures/longcontext_confirmatory.json) have the seeds their
docs state, and every verdict follows from the per-model accuracies in the file by an
independent computation of the rule (scipy's Welch test, plain numpy means)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1] / "figures"
EXPLORATORY = ROOT / "longcontext.json"
CONFIRMATORY = ROOT / "longcontext_confirmatory.json"
BASELINE = {"A": "softmax", "B": "plain"}
CANDIDATES = ("qknorm+sink", "qknorm+gate")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _welch_low(a: list[float], b: list[float]) -> float:
    """The lower end of the 95% Welch interval of mean(a) - mean(b) (scipy)."""
    from scipy import stats

    a_, b_ = np.asarray(a), np.asarray(b)
    if a_.std() == 0 and b_.std() == 0:  # scipy's interval is undefined without spread
        return float(a_.mean() - b_.mean())
    with warnings.catch_warnings():  # accuracies equal in all but the last bits of a mean
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        res = stats.ttest_ind(a_, b_, equal_var=False)
        return float(res.confidence_interval(0.95).low)  # pyright: ignore[reportAttributeAccessIssue]


def _per_seed(data: dict, tier: str, variant: str, half: str, i: int) -> list[float]:
    models = [m for m in data["models"] if m["tier"] == tier and m["variant"] == variant]
    out = []
    for m in sorted(models, key=lambda m: m["seed"]):
        st = m["readings"]["plain"][i]
        assert st["accuracy"][half] == pytest.approx(st["correct"][half] / st["count"][half])
        out.append(st["accuracy"][half])
    return out


def _check_decisions(data: dict) -> None:
    for tier, result in data["tiers"].items():
        lengths = data["settings"][f"tier_{tier}"]["lengths"]
        base = BASELINE[tier]
        for half in ("all", "present", "absent"):
            stored = result["decision"][half]
            cost_at, closed = [], {c: [] for c in CANDIDATES}
            for i, n in enumerate(lengths[1:], start=1):
                b = _per_seed(data, tier, base, half, i)
                q = _per_seed(data, tier, "qknorm", half, i)
                if _welch_low(b, q) <= 0:
                    continue
                cost_at.append(n)
                gap = np.mean(b) - np.mean(q)
                for c in CANDIDATES:
                    x = _per_seed(data, tier, c, half, i)
                    if (np.mean(x) - np.mean(q)) / gap >= 0.75 and _welch_low(x, q) > 0:
                        closed[c].append(n)
            assert stored["cost_lengths"] == cost_at, (tier, half)
            for c in CANDIDATES:
                got = stored["candidates"][c]
                assert got["closed_at"] == closed[c], (tier, half, c)
                assert got["passes"] == (bool(cost_at) and closed[c] == cost_at), (tier, half, c)


def test_the_exploratory_study_has_five_seeds_and_its_verdicts_follow():
    data = _load(EXPLORATORY)
    assert data["settings"]["seeds"] == [0, 1, 2, 3, 4]
    for tier in data["tiers"]:
        for variant in data["settings"][f"tier_{tier}"]["variants"]:
            seeds = sorted(
                m["seed"] for m in data["models"] if m["tier"] == tier and m["variant"] == variant
            )
            assert seeds == [0, 1, 2, 3, 4], (tier, variant)
    _check_decisions(data)


def test_the_confirmatory_runs_use_fresh_seeds_and_their_verdicts_follow():
    data = _load(CONFIRMATORY)
    explored = _load(EXPLORATORY)["settings"]
    settings = data["settings"]
    assert settings["seeds"] == [100, 101, 102, 103, 104]
    assert not set(settings["seeds"]) & set(explored["seeds"])
    assert settings["eval_seed"] == 2027 != explored["eval_seed"]
    assert settings["descriptive_seeds"] == []
    assert sorted(data["tiers"]) == ["A", "B"]
    for tier in ("A", "B"):
        want = {BASELINE[tier], "qknorm", *CANDIDATES}
        assert set(settings[f"tier_{tier}"]["variants"]) == want
        assert settings[f"tier_{tier}"]["lengths"] == explored[f"tier_{tier}"]["lengths"]
    _check_decisions(data)
