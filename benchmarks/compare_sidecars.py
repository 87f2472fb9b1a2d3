"""Compare two folders of figure sidecars (``figures/*.json``) number by number: a
refactor changes no number beyond rounding.

For every sidecar present in both folders, every number at the same place of the two
JSON trees is compared; the report gives, per figure, the largest relative difference
``|a - b| / max(|a|, |b|, floor)`` (``floor`` keeps numbers near zero from dividing by
rounding), where it occurs, and whether the trees differ in shape (keys, lengths, types).
Keys that record the run rather than its numbers (times, versions, builds, dates, paths)
are skipped.

Run:  python benchmarks/compare_sidecars.py BEFORE AFTER [--floor 1e-12] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

SKIP = {
    "seconds",
    "wall_seconds",
    "time",
    "date",
    "created",
    "versions",
    "attnflow_build",
    "attnflow",
    "python",
    "jax",
    "host",
    "machine",
    "command",
    "path",
    "git",
}


def _walk(a: Any, b: Any, where: str, floor: float, out: dict) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in SKIP:
                continue
            if k not in a or k not in b:
                out["shape"].append(f"{where}/{k}: only in {'after' if k in b else 'before'}")
                continue
            _walk(a[k], b[k], f"{where}/{k}", floor, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out["shape"].append(f"{where}: length {len(a)} before, {len(b)} after")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{where}[{i}]", floor, out)
    elif isinstance(a, bool) or isinstance(b, bool):
        if a != b:
            out["shape"].append(f"{where}: {a!r} before, {b!r} after")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        x, y = float(a), float(b)
        if math.isnan(x) and math.isnan(y):
            return
        if x == y:
            return
        if not (math.isfinite(x) and math.isfinite(y)):
            out["shape"].append(f"{where}: {x!r} before, {y!r} after")
            return
        rel = abs(x - y) / max(abs(x), abs(y), floor)
        if rel > out["max"]:
            out["max"], out["at"], out["values"] = rel, where, (x, y)
        out["changed"] += 1
    elif a != b:
        out["shape"].append(f"{where}: {a!r} before, {b!r} after")


def compare(before: Path, after: Path, floor: float) -> dict:
    report = {}
    for path in sorted(after.glob("*.json")):
        old = before / path.name
        if not old.exists() or path.name == "index.json":
            continue
        out: dict[str, Any] = {"max": 0.0, "at": None, "values": None, "changed": 0, "shape": []}
        _walk(json.loads(old.read_text()), json.loads(path.read_text()), "", floor, out)
        report[path.stem] = out
    return report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--floor", type=float, default=1e-12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = compare(args.before, args.after, args.floor)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for name, r in report.items():
        shape = ""
        if r["shape"]:
            shape = f"; {len(r['shape'])} structural difference(s): {r['shape'][:3]}"
        print(
            f"{name:24s} max rel {r['max']:.2e} over {r['changed']} changed number(s)"
            f"{' at ' + str(r['at']) + ' ' + str(r['values']) if r['at'] else ''}{shape}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
