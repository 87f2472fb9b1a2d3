"""The clustering paper's 128-token, 128-dimension experiment, timed.

Geshkovski et al. (2023) ran n = d = 128 tokens to T = 15 with dt = 0.1 (150 layers),
x0 uniform in [-0.5, 0.5]^128, Q = K = I and a symmetric V with no eigenvalue in (-1, 1)
(largest about 6.7): 12.8 s per step, 32 minutes on a GPU, with Python loops over tokens.

Here: attnflow's discrete transformer (method="euler", the same forward-Euler scheme, in
the rescaled frame with the exact discrete rescaling), float64 (the logits reach
e^{2 * 6.7 * 15} ~ e^200, beyond float32), timed cold (first call, compile included) and
warm; side by side, a vectorised numpy implementation of the same scheme in the same run.

    python benchmarks/bench_paper128.py [--repeats 3] [--adaptive]

``--adaptive`` also times the adaptive Tsit5 solve to T = 15 (slow: once the logits are
~e^100 the attention switches sharply and tokens near a switch force tiny steps).
"""

from __future__ import annotations

import argparse
import json
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow._meta import run_metadata  # noqa: E402


def numpy_euler(x0, V, dt, layers):
    """The same discrete transformer in vectorised numpy (original frame, Q = K = I)."""
    x = x0.copy()
    for _ in range(layers):
        L = x @ x.T
        L -= L.max(axis=1, keepdims=True)
        P = np.exp(L)
        P /= P.sum(axis=1, keepdims=True)
        x = x + dt * (P @ x) @ V.T
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adaptive", action="store_true")
    args = ap.parse_args()

    V = af.matrices.paper_128(args.seed)
    d = n = 128
    x0 = np.random.default_rng(args.seed).uniform(-0.5, 0.5, (n, d))
    model = af.Attention(np.eye(d), np.eye(d), V)
    dt, layers = 0.1, 150
    ts = np.round(np.arange(layers + 1) * dt, 12)

    t = time.perf_counter()
    traj = af.simulate(model, x0, 15.0, ts=ts, method="euler", dt=dt)
    jax.block_until_ready(traj.z)
    cold = time.perf_counter() - t
    warm = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        traj = af.simulate(model, x0, 15.0, ts=ts, method="euler", dt=dt)
        jax.block_until_ready(traj.z)
        warm.append(time.perf_counter() - t)
    np_times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        x_np = numpy_euler(x0, V, dt, layers)
        np_times.append(time.perf_counter() - t)
    err = float(np.abs(np.asarray(traj.x[-1]) - x_np).max() / np.abs(x_np).max())
    out = {
        "status": traj.status,
        "cold_s": cold,
        "warm_s": min(warm),
        "numpy_s": min(np_times),
        "numpy_over_attnflow": min(np_times) / min(warm),
        "relative_difference_vs_numpy": err,
        "lambda_max": float(np.linalg.eigvalsh(V)[-1]),
        "versions": run_metadata(),
    }
    if args.adaptive:
        t = time.perf_counter()
        tr = af.simulate(model, x0, 15.0, ts=ts, max_steps=200_000)
        jax.block_until_ready(tr.z)
        out["adaptive_s"] = time.perf_counter() - t
        out["adaptive_steps"] = int(tr.stats["num_steps"])
        out["adaptive_status"] = tr.status
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
