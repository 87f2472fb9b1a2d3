"""Compare two folders of figure sidecars (``figures/*.json``) number by number: a
refactor changes no number beyond rounding.

For every sidecar present in both folders, every number at the same place of the two
JSON trees is compared; the report gives, per figure, the largest relative difference
``|a - b| / max(|a|, |b|, floor)`` (``floor`` keeps numbers near zero from dividing by
rounding), where it occurs, and whether the trees differ in shape (keys, lengths, types).
Keys that record the run rather than its numbers (times, versions, builds, dates, paths)
are skipped (``attnflow.experiments._compare``, the runner's own comparison).

Run:  python benchmarks/compare_sidecars.py BEFORE AFTER [--floor 1e-12] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnflow.experiments._compare import differences


def compare(before: Path, after: Path, floor: float) -> dict:
    report = {}
    for path in sorted(after.glob("*.json")):
        old = before / path.name
        if not old.exists() or path.name == "index.json":
            continue
        report[path.stem] = differences(
            json.loads(old.read_text()), json.loads(path.read_text()), floor
        )
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
