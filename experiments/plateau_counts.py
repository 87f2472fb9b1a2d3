"""How many metastable clusters at large n: plateau counts against k*(beta) for n = 10^3
and beyond (the protocol of ``attnflow.experiments.fig_modes``, which runs n = 400).

Tokens i.i.d. uniform on the circle, Q = K = V = I, SA on the sphere (Tsit5, rtol 1e-8),
seeds as one batch per (n, beta). Time is read in units of T = log(sqrt n) / lambda_{k*};
the plateau count of a run is its most frequent cluster count (threshold 0.99) over
[3 T, 6 T]; per (n, beta) the mean and a 95% t-interval over seeds. Each finished (n, beta)
is written at once to ``OUT/plateau_counts.json`` (atomically), and a rerun skips what is
there: a killed run resumes without repeating or losing work.

    python experiments/plateau_counts.py --out results            # n = 1000, 3000
    python experiments/plateau_counts.py --n 10000 --betas 20 32 100 --seeds 2
    python experiments/plateau_counts.py --quick                  # n = 300, two betas
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

# the protocol's constants, plateau count and interval are fig_modes' own
from attnflow.experiments.fig_modes import (
    ATOL,
    PLATEAU,
    RTOL,
    SAVES,
    THRESHOLD,
    plateau_count,
    plateau_interval,
)

BETAS = (1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 20.0, 32.0, 100.0)


def _save(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, path)


def one(n: int, beta: float, seeds: int, seed: int) -> dict:
    """The plateau counts of ``seeds`` runs of ``n`` tokens at ``beta``."""
    import attnflow as af

    pred = af.predict_metastable(beta)
    T = pred.growth_time * math.log(math.sqrt(n))
    ts = np.linspace(0.0, PLATEAU[1] * T, SAVES)
    rng = np.random.default_rng([seed, n, int(round(beta * 1000))])
    angles = rng.uniform(0.0, 2 * math.pi, (seeds, n))
    x0 = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    started = time.perf_counter()
    traj = af.simulate(
        af.IsotropicAttention(2, beta=beta), x0, ts[-1], ts=ts, frame="sphere", rtol=RTOL, atol=ATOL
    )
    counts = np.asarray(af.count_clusters(traj, threshold=THRESHOLD))
    plateau = [plateau_count(ts / T, c) for c in counts]
    mean, lo, hi = plateau_interval(plateau)
    return dict(
        n=n,
        beta=beta,
        seeds=seeds,
        seed=seed,
        predicted_clusters=pred.clusters,
        T=T,
        plateau_counts=plateau,
        plateau_mean=mean,
        plateau_interval_95=[lo, hi],
        agrees=bool(lo - 1e-12 <= pred.clusters <= hi + 1e-12),
        statuses=[str(s) for s in traj.statuses],
        num_steps=np.asarray(traj.stats["num_steps"]).tolist(),
        seconds=time.perf_counter() - started,
    )


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 3000])
    ap.add_argument("--betas", type=float, nargs="+", default=list(BETAS))
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--quick", action="store_true", help="n = 300, beta = 3 and 10, 2 seeds")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.quick:
        args.n, args.betas, args.seeds = [300], [3.0, 10.0], 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "plateau_counts.json"
    rows: list[dict] = json.loads(path.read_text()) if path.exists() else []
    done = {(r["n"], r["beta"], r["seeds"], r["seed"]) for r in rows}
    for n in args.n:
        for beta in args.betas:
            if (n, beta, args.seeds, args.seed) in done:
                continue
            row = one(n, beta, args.seeds, args.seed)
            rows.append(row)
            _save(path, rows)
            lo, hi = row["plateau_interval_95"]
            print(
                f"n = {n:6d}  beta = {beta:5g}  k* = {row['predicted_clusters']:2d}  "
                f"plateaus {row['plateau_counts']}  mean {row['plateau_mean']:.2f} "
                f"[{lo:.2f}, {hi:.2f}]  ({row['seconds']:.0f} s)",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
