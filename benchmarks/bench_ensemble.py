"""Uneven ensembles: one batched attnflow call against a loop of scipy's solve_ivp.

256 systems of n = 32 tokens, d = 2, V = Q = K = I, tokens uniform in [-1, 1]^2, t1 = 10,
rtol 1e-6, atol 1e-9, float64. The systems need very different numbers of steps (under
``vmap`` every system of one loop pays for the slowest one), so attnflow is timed

- ``vmap``: one loop for the whole batch (the default);
- ``chunk=c``: consecutive chunks of c systems, each with its own loop;
- ``probe + cost``: a loose-tolerance run (rtol 1e-2, timed and included) gives each
  system's step count, the batch is sorted by it and run in chunks (``cost=``);
- ``rerun + cost``: the same with the step counts of an earlier run at the same
  tolerances (a repeated sweep; the probe costs nothing there);
- the same on 2 forced host devices (``devices=``), where the machine has the cores.

against ``scipy.integrate.solve_ivp(method="RK45")`` with a vectorised numpy field of the
same ODE (the rescaled frame, attnflow's default: ``dZ/dt = P Z - Z``,
``P = softmax(e^{2t} Z Z^T)`` row-wise). The variants are timed in alternation
(best of ``--rounds``), scipy once per round; the load average is recorded before and
after. Every attnflow variant returns the same numbers (checked: largest difference).

    python benchmarks/bench_ensemble.py [--quick] [--rounds 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import argparse
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import save  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import attnflow as af  # noqa: E402


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def scipy_loop(xs, t1, rtol, atol):
    n, d = xs.shape[1:]

    def f(t, y):
        Z = y.reshape(n, d)
        L = Z @ Z.T
        L *= np.exp(2.0 * t)
        L -= L.max(axis=1, keepdims=True)
        np.exp(L, out=L)
        L /= L.sum(axis=1, keepdims=True)
        return (L @ Z - Z).ravel()

    out, nfev = [], 0
    for x in xs:
        sol = solve_ivp(f, (0.0, t1), x.ravel(), method="RK45", rtol=rtol, atol=atol, t_eval=[t1])
        out.append(sol.y[:, -1].reshape(n, d))
        nfev += sol.nfev
    return np.stack(out), nfev


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 systems, 2 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    b = 64 if args.quick else 256
    rounds = args.rounds or (2 if args.quick else 3)
    n, d, t1, rtol, atol = 32, 2, 10.0, 1e-6, 1e-9
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    xs = np.random.default_rng(0).uniform(-1, 1, (b, n, d))
    model = af.Attention(np.eye(d), np.eye(d), np.eye(d))
    devs = jax.local_devices()

    def run(**kw):
        traj = af.simulate(model, xs, t1, rtol=rtol, atol=atol, **kw)
        jax.block_until_ready(traj.state)
        return traj

    ref = run()
    steps = np.asarray(ref.stats["num_steps"])
    say(f"{b} systems: steps {steps.min()}-{steps.max()} (median {np.median(steps):g})")

    def probe_then(chunk, **kw):
        def go():
            p = af.simulate(model, xs, t1, rtol=1e-2, atol=1e-5, **kw)
            return run(chunk=chunk, cost=np.asarray(p.stats["num_steps"]), **kw)

        return go

    variants = {
        "vmap": lambda: run(),
        "chunk=1 (a loop per system)": lambda: run(chunk=1),
        "chunk=16": lambda: run(chunk=16),
        "chunk=32": lambda: run(chunk=32),
        "probe + cost, chunk=16": probe_then(16),
        "rerun + cost, chunk=16": lambda: run(chunk=16, cost=steps),
        "rerun + cost, chunk=32": lambda: run(chunk=32, cost=steps),
    }
    if len(devs) >= 2:
        variants["2 devices, vmap"] = lambda: run(devices=devs[:2])
        variants["2 devices, rerun + cost, chunk=16"] = lambda: run(
            devices=devs[:2], chunk=16, cost=steps
        )
    diffs = {}
    for name, f in variants.items():  # compile and check
        t = time.perf_counter()
        traj = f()
        diffs[name] = float(np.abs(np.asarray(traj.state) - np.asarray(ref.state)).max())
        say(f"{name}: first call {time.perf_counter() - t:.2f} s, max difference {diffs[name]:.2g}")
    times = {k: [] for k in variants}
    times["scipy loop"] = []
    x_sp, nfev = None, 0
    for r in range(rounds):
        for name, f in variants.items():
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        x_sp, nfev = scipy_loop(xs, t1, rtol, atol)
        times["scipy loop"].append(time.perf_counter() - t)
        say(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in times.items()))
    # The floor of any loop: the field evaluations the adaptive solves make (each
    # system's own count: 6 per accepted or rejected Dormand-Prince step, less FSAL),
    # at the cost of one batched evaluation of all systems, with no loop around them.
    evals = int(np.sum(np.asarray(ref.stats["num_steps"]) * 6 + 1))
    field = jax.jit(jax.vmap(lambda z: model.vector_field(z)))
    zs = jax.numpy.asarray(xs)
    jax.block_until_ready(field(zs))
    reps = 50
    t = time.perf_counter()
    for _ in range(reps):
        jax.block_until_ready(field(zs))
    per_eval = (time.perf_counter() - t) / (reps * b)
    floor = evals * per_eval
    say(f"field floor: {evals} evaluations x {per_eval * 1e6:.2f} us = {floor:.3f} s")
    best = {k: min(v) for k, v in times.items()}
    sp = best["scipy loop"]
    assert x_sp is not None
    x_af = np.asarray(ref.z[:, -1])
    rel = float(np.max(np.abs(x_af - x_sp)) / np.abs(x_sp).max())
    out = {
        "systems": b,
        "n": n,
        "d": d,
        "t1": t1,
        "rtol": rtol,
        "atol": atol,
        "frame": "rescaled (both sides)",
        "steps": {
            "min": int(steps.min()),
            "median": float(np.median(steps)),
            "max": int(steps.max()),
            "masked_fraction_vmap": float(1 - steps.mean() / steps.max()),
        },
        "scipy_field_evals_per_system": nfev / b,
        "seconds_best": best,
        "seconds_all": times,
        "speedup_vs_scipy": {k: sp / v for k, v in best.items() if k != "scipy loop"},
        "field_floor": {
            "evaluations": evals,
            "seconds_per_system_evaluation": per_eval,
            "seconds": floor,
            "speedup_vs_scipy_at_the_floor": sp / floor,
        },
        "max_difference_between_variants": diffs,
        "relative_difference_vs_scipy": rel,
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "wall_s": time.perf_counter() - t_start,
        "command": "python benchmarks/bench_ensemble.py" + (" --quick" if args.quick else ""),
    }
    save("ensemble_quick" if args.quick else "ensemble", out)


if __name__ == "__main__":
    main()
