"""Many weight triples in one call: a stacked model against a loop of compiled calls.

``b`` random triples (Q, K = I + 0.3 N(0, 1), V = 0.5 N(0, 1)), d = 4, one start of
n = 16 tokens uniform in [-1, 1]^4 each, t1 = 4, float64, attnflow's defaults (Tsit5,
rescaled frame in modal coordinates, rtol 1e-6, atol 1e-9):

- ``loop``: ``for i: simulate(Attention(Q[i], K[i], V[i]), x0[i], t1)`` (compiled once:
  same shapes), the way a sweep over triples was written before;
- ``stacked``: ``simulate(Attention(Q, K, V), x0, t1)`` with ``(b, d, d)`` weights;
- ``stacked, chunk=16``: the same in chunks of 16 systems, each with its own loop.

Timed warm (best of ``--rounds``, in alternation); the load average before and after is
recorded; the largest difference between the stacked and the looped states is reported.

    python benchmarks/bench_stacked.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import save  # noqa: E402

import attnflow as af  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 triples, 2 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    b = 64 if args.quick else 256
    rounds = args.rounds or (2 if args.quick else 3)
    n, d, t1 = 16, 4, 4.0
    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    Q = np.eye(d) + 0.3 * rng.standard_normal((b, d, d))
    K = np.eye(d) + 0.3 * rng.standard_normal((b, d, d))
    V = 0.5 * rng.standard_normal((b, d, d))
    x0 = rng.uniform(-1, 1, (b, n, d))
    heads = [af.Attention(Q[i], K[i], V[i], propagator="eig") for i in range(b)]
    build = time.perf_counter()
    stacked = af.stack(heads)
    build = time.perf_counter() - build

    def loop():
        return [np.asarray(af.simulate(h, x0[i], t1).state) for i, h in enumerate(heads)]

    def one_call(**kw):
        return np.asarray(af.simulate(stacked, x0, t1, **kw).state)

    variants = {"loop": loop, "stacked": one_call, "stacked, chunk=16": lambda: one_call(chunk=16)}
    first = {}
    for k, f in variants.items():
        t = time.perf_counter()
        f()
        first[k] = time.perf_counter() - t
    times = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    ref = np.stack(loop())
    diff = {
        k: float(np.nanmax(np.abs(one_call(**kw) - ref)))
        for k, kw in (("stacked", {}), ("stacked, chunk=16", {"chunk": 16}))
    }
    best = {k: min(v) for k, v in times.items()}
    out = {
        "triples": b,
        "n": n,
        "d": d,
        "t1": t1,
        "seconds_best": best,
        "seconds_first_call": first,
        "seconds_stack_models": build,
        "speedup_vs_loop": {k: best["loop"] / v for k, v in best.items() if k != "loop"},
        "max_difference_vs_loop": diff,
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "command": "python benchmarks/bench_stacked.py" + (" --quick" if args.quick else ""),
    }
    save("stacked_quick" if args.quick else "stacked", out)


if __name__ == "__main__":
    main()
