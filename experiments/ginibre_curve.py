"""How generic is the hyperplane theorem's hypothesis? The fraction of d x d real Ginibre
matrices whose leading eigenvalue is real, positive and simple, against d, with Wilson
intervals (``attnflow.ginibre_fraction``).

    python experiments/ginibre_curve.py            # d = 2..8, 200,000 matrices each
    python experiments/ginibre_curve.py --quick    # d = 2..4, 20,000 matrices each

Change ``dims`` or ``samples`` and rerun; the same seed gives the same numbers.
"""

from __future__ import annotations

import argparse

import attnflow as af


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d = 2..4, 20,000 matrices each")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    dims = range(2, 5) if args.quick else range(2, 9)
    samples = 20_000 if args.quick else 200_000
    rows = []
    for d in dims:
        est = af.ginibre_fraction(d, samples, seed=args.seed)
        lo, hi = est.low, est.high
        rows.append({"d": d, "fraction": est.fraction, "interval": [lo, hi]})
        print(f"d = {d}: {est.fraction:.4f}  [{lo:.4f}, {hi:.4f}]")
    return rows


if __name__ == "__main__":
    main()
