"""The one engine's costs, side by side in one run (the machine's load recorded):

1. The sphere phase diagram's step: attnflow's post-LN layer of the sphere frame
   (``Sphere.step`` of an ``IsotropicAttention``, the step ``studies.sphere`` runs)
   against a hand-written post-LN step ``x <- (x + dt softmax(beta x x^T) x) / |.|``,
   both in one jitted ``fori_loop`` over the same batch (float32, 256 systems, n = 32,
   d = 128, 100 layers; the best of 5 timed runs after a compiled warm-up).
2. A warm command-line simulate (``attnflow simulate --n 8 --t1 5 --json``, every program
   read from the compilation cache, Python's bytecode written) against JAX's own start-up
   (``python -c "import jax; jax.numpy.zeros(1).block_until_ready()"``): medians of 25
   interleaved pairs, and the quartiles of the pairs' own ratios (JAX's start-up alone
   moves by a third from run to run on this machine).

Run:  python benchmarks/bench_engine.py [--quick]
Writes benchmarks/results/engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import RESULTS, machine

import attnflow as af
from attnflow.dynamics.frames import Sphere


def _time(fn, *args, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))  # compile
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def sphere_step(systems: int, n: int, d: int, layers: int, beta: float = 4.0) -> dict:
    dt = 0.1
    model = af.IsotropicAttention(d, beta=beta, dtype=np.float32)
    frame = Sphere(model, "post")
    step = jax.vmap(lambda y: frame.step(y, None, dt, None))

    @jax.jit
    def attnflow_loop(x):
        return jax.lax.fori_loop(0, layers, lambda _, u: step(u), x)

    @jax.jit
    def hand_loop(x):
        def one(u):
            L = beta * (u @ u.T)
            P = jax.nn.softmax(L, axis=-1)
            v = u + dt * (P @ u)
            return v * jax.lax.rsqrt(jnp.sum(v * v, axis=-1, keepdims=True))

        return jax.lax.fori_loop(0, layers, lambda _, u: jax.vmap(one)(u), x)

    x0 = jax.random.normal(jax.random.PRNGKey(0), (systems, n, d), jnp.float32)
    x0 = x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)
    load0 = os.getloadavg()[0]
    t_af = _time(attnflow_loop, x0)
    t_hand = _time(hand_loop, x0)
    load1 = os.getloadavg()[0]
    diff = float(jnp.max(jnp.abs(attnflow_loop(x0) - hand_loop(x0))))
    per = systems * layers
    return {
        "systems": systems,
        "n": n,
        "d": d,
        "layers": layers,
        "attnflow_s": t_af,
        "hand_s": t_hand,
        "attnflow_us_per_system_step": 1e6 * t_af / per,
        "hand_us_per_system_step": 1e6 * t_hand / per,
        "ratio": t_af / t_hand,
        "max_abs_difference": diff,
        "load_avg_1min": [load0, load1],
    }


def _wall(cmd: list[str], env: dict, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return out


def cli_start(repeats: int) -> dict:
    cache = tempfile.mkdtemp(prefix="attnflow-bench-cache-")
    env = {**os.environ, "ATTNFLOW_CACHE_DIR": cache, "ATTNFLOW_COMPILATION_CACHE": "1"}
    # warm as a user's second run is: Python's bytecode cache too (a machine that sets
    # PYTHONDONTWRITEBYTECODE would compile attnflow's modules from source every time,
    # while JAX's installed modules have their bytecode)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    sim = [sys.executable, "-m", "attnflow", "simulate", "--n", "8", "--t1", "5", "--json"]
    jax_only = [sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"]
    subprocess.run(sim, env=env, check=True, capture_output=True)  # fills the cache
    load0 = os.getloadavg()[0]
    # interleaved, so that both see the same machine
    t_sim, t_jax = [], []
    for _ in range(repeats):
        t_sim += _wall(sim, env, 1)
        t_jax += _wall(jax_only, env, 1)
    load1 = os.getloadavg()[0]
    pairs = [a / b for a, b in zip(t_sim, t_jax)]
    return {
        "simulate_s": t_sim,
        "jax_start_s": t_jax,
        "simulate_median_s": statistics.median(t_sim),
        "jax_start_median_s": statistics.median(t_jax),
        "ratio": statistics.median(t_sim) / statistics.median(t_jax),
        # each pair ran back to back: its ratio sees one state of the machine
        "pair_ratios": pairs,
        "pair_ratio_quartiles": statistics.quantiles(pairs, n=4),
        "load_avg_1min": [load0, load1],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--cases", nargs="+", choices=("sphere_step", "cli"), default=["sphere_step", "cli"]
    )
    args = ap.parse_args()
    sizes = dict(systems=32, n=32, d=16, layers=20) if args.quick else {}
    res: dict = {"machine": machine()}
    if "sphere_step" in args.cases:
        full = {"systems": 256, "n": 32, "d": 128, "layers": 100}
        res["sphere_step"] = sphere_step(**(full | sizes))
    if "cli" in args.cases:
        res["cli"] = cli_start(2 if args.quick else 25)
    print(json.dumps(res, indent=1))
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        name = "engine.json" if len(args.cases) == 2 else f"engine_{'_'.join(args.cases)}.json"
        (RESULTS / name).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
